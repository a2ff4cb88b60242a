// losses.cu: output-layer gradients, elementwise over n elements.
//
// Gradients hold the descent direction -dL/do. Signature as in activations.cu:
//     (in0 = target, in1 = outputs, in2 unused, out = gradients, n, a = eps, b unused, code, vec)
// `out` may alias target or outputs.
//
// calc_output_gradient<T, BOOK> (the book's CalcOutputGradient), code = loss_function:
//   0: t - o      1: 2*(t - o)
//   2: standard t/(o + eps)                     book  -t/(o + 1e-37)*log(o + 1e-37)
//   3: standard (t - o)/(o*(1 - o) + eps)       book  (t - o)/(o*(o - 1) + 1e-37)
//   other: t - o
// article_output_gradient<T> (the article's CaclOutputGradient), code = activation:
//   0 (tanh):    (clamp(t,-1,1) - o)*(1 + o)*(1 - (o == 1 ? 0.99 : o))
//   1 (sigmoid): (clamp(t, 0,1) - o)*(o == 0 ? 0.01 : o)*(1 - (o == 1 ? 0.99 : o))
//   other:       t - o   (the article writes 0 here: no gradient at all for a linear output)
#include "common.cuh"

template <typename T, bool BOOK> struct OutputGradOp {
    static __device__ T apply(T t, T o, T, const EwParams<T>& p) {
        const T tiny = T(1.0e-37f);
        switch (p.code) {
            case 1: return T(2) * (t - o);
            case 2: return BOOK ? -t / (o + tiny) * ck_log(o + tiny) : t / (o + p.a);
            case 3: return BOOK ? (t - o) / (o * (o - T(1)) + tiny) : (t - o) / (o * (T(1) - o) + p.a);
            default: return t - o;  // case 0 and any other code
        }
    }
};

template <typename T> struct ArticleOutputGradOp {
    static __device__ T apply(T t, T o, T, const EwParams<T>& p) {
        const T hi = T(1) - (o == T(1) ? T(0.99) : o);
        switch (p.code) {
            case 0: return (ck_clamp(t, T(-1), T(1)) - o) * (T(1) + o) * hi;
            case 1: return (ck_clamp(t, T(0), T(1)) - o) * (o == T(0) ? T(0.01) : o) * hi;
            default: return t - o;
        }
    }
};

template <typename T, bool BOOK>
__global__ void calc_output_gradient(const T* in0, const T* in1, const T* in2, T* out,
                                     long long n, T a, T b, int code, int vec) {
    const EwParams<T> p = {a, b, code};
    ew_map<T, 2, OutputGradOp<T, BOOK> >(in0, in1, in2, out, n, p, vec);
}

template <typename T>
__global__ void article_output_gradient(const T* in0, const T* in1, const T* in2, T* out,
                                        long long n, T a, T b, int code, int vec) {
    const EwParams<T> p = {a, b, code};
    ew_map<T, 2, ArticleOutputGradOp<T> >(in0, in1, in2, out, n, p, vec);
}
