// activations.cu: the book's activation kernels, their derivatives, and MaskMult.
//
// Every kernel here is elementwise over n elements with one signature
//     (in0, in1, in2, out, n, a, b, code, vec)
// (unused inputs are passed as in0 and never read). `out` may alias an input, as the book's
// host does for derivatives. Launch: 1-D grid-stride, any grid; vec != 0 only when every
// pointer is 16-byte aligned.
//
//   LineActivation      y = a*x + b            (with b = 0 it is also the linear derivative)
//   SigmoidActivation   y = a / (1 + exp(-x)) - b
//   SigmoidDerivative   a == 0 ? 0 : z*(1 - z/a)*g,  z = clamp(y + b, 0, a)
//   TanhActivation      y = tanh(x)
//   TanhDerivative      (1 - y*y)*g
//   LReLUActivation     y = x > 0 ? x : a*x
//   LReLUDerivative     (y > 0 ? 1 : a)*g
//   SwishActivation     y = x / (1 + exp(-b*x))
//   SwishDerivative     (b*y + (1 - b*y)/(1 + exp(-b*x)))*g     (in0 = y, in1 = g, in2 = x)
//   MaskMult            out = x*mask
#include "common.cuh"

template <typename T> struct LineOp {
    static __device__ T apply(T x, T, T, const EwParams<T>& p) { return p.a * x + p.b; }
};
template <typename T> struct SigmoidOp {
    static __device__ T apply(T x, T, T, const EwParams<T>& p) {
        return p.a / (T(1) + ck_exp(-x)) - p.b;
    }
};
template <typename T> struct SigmoidDerivOp {
    static __device__ T apply(T y, T g, T, const EwParams<T>& p) {
        if (p.a == T(0)) return T(0);
        const T z = ck_clamp(y + p.b, T(0), p.a);
        return z * (T(1) - z / p.a) * g;
    }
};
template <typename T> struct TanhOp {
    static __device__ T apply(T x, T, T, const EwParams<T>&) { return ck_tanh(x); }
};
template <typename T> struct TanhDerivOp {
    static __device__ T apply(T y, T g, T, const EwParams<T>&) { return (T(1) - y * y) * g; }
};
template <typename T> struct LReLUOp {
    static __device__ T apply(T x, T, T, const EwParams<T>& p) { return x > T(0) ? x : p.a * x; }
};
template <typename T> struct LReLUDerivOp {
    static __device__ T apply(T y, T g, T, const EwParams<T>& p) {
        return (y > T(0) ? T(1) : p.a) * g;
    }
};
template <typename T> struct SwishOp {
    static __device__ T apply(T x, T, T, const EwParams<T>& p) {
        return x / (T(1) + ck_exp(-p.b * x));
    }
};
template <typename T> struct SwishDerivOp {
    static __device__ T apply(T y, T g, T x, const EwParams<T>& p) {
        const T by = p.b * y;
        return (by + (T(1) - by) / (T(1) + ck_exp(-p.b * x))) * g;
    }
};
template <typename T> struct MaskMultOp {
    static __device__ T apply(T x, T m, T, const EwParams<T>&) { return x * m; }
};

#define CK_ELEMENTWISE(NAME, NIN, OP)                                                      \
    template <typename T>                                                                  \
    __global__ void NAME(const T* in0, const T* in1, const T* in2, T* out, long long n,    \
                         T a, T b, int code, int vec) {                                    \
        const EwParams<T> p = {a, b, code};                                                \
        ew_map<T, NIN, OP<T> >(in0, in1, in2, out, n, p, vec);                             \
    }

CK_ELEMENTWISE(line_activation, 1, LineOp)
CK_ELEMENTWISE(sigmoid_activation, 1, SigmoidOp)
CK_ELEMENTWISE(sigmoid_derivative, 2, SigmoidDerivOp)
CK_ELEMENTWISE(tanh_activation, 1, TanhOp)
CK_ELEMENTWISE(tanh_derivative, 2, TanhDerivOp)
CK_ELEMENTWISE(lrelu_activation, 1, LReLUOp)
CK_ELEMENTWISE(lrelu_derivative, 2, LReLUDerivOp)
CK_ELEMENTWISE(swish_activation, 1, SwishOp)
CK_ELEMENTWISE(swish_derivative, 3, SwishDerivOp)
CK_ELEMENTWISE(mask_mult, 2, MaskMultOp)
