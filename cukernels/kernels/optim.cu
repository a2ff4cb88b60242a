// optim.cu: the book's weight-update kernels, in place, elementwise over n weights.
//
// Conventions: D (delta_weights) accumulates the descent direction -dL/dw summed over a
// batch; every update reads d = D / batch, changes the weights, updates its moment arrays
// and sets D to zero. One signature for all:
//     (D, w, s1, s2, n, batch, lr, beta1, beta2, l1, l2, eps, c1, c2, vec)
// s1/s2 are the moment arrays (unused ones are passed as w and never touched).
// Launch: 1-D grid-stride, any grid; vec != 0 only when every pointer is 16-byte aligned.
// Each weight is owned by one thread for the whole update: no races, bitwise repeatable.
//
// BOOK = false (standard):  reg(w) = w - lr*(l1*sign(w) + l2*w)  (decoupled, lr-scaled)
//   SGD       w = reg(w) + lr*d
//   Momentum  m = lr*d + beta1*m;  w = reg(w) + m
//   AdaGrad   G += d*d;  w = reg(w) + lr*d/(sqrt(G) + eps)
//   RMSProp   G = beta1*G + (1-beta1)*d*d;  w = reg(w) + lr*d/(sqrt(G) + eps)
//   AdaDelta  G = beta2*G + (1-beta2)*d*d;  u = d*sqrt(W + eps)/sqrt(G + eps);
//             W = beta1*W + (1-beta1)*u*u;  w = reg(w) + lr*u          (s1 = W, s2 = G)
//   Adam      M = beta1*M + (1-beta1)*d;  V = beta2*V + (1-beta2)*d*d;
//             w = reg(w) + c1*M/(sqrt(V)*c2 + eps)
//             with c1 = lr/(1 - beta1^t), c2 = 1/sqrt(1 - beta2^t) from the host
// BOOK = true: the book's formulas as written: reg(w) = w - (l1 + l2*w), 1e-37 in place of
//   eps, AdaGrad without the gradient factor, AdaDelta over squared weights, Adam's bias
//   correction by (1 - beta) with no step counter.
#include "common.cuh"

template <typename T> struct OptParams {
    T batch, lr, beta1, beta2, l1, l2, eps, c1, c2;
};

template <typename T, bool BOOK>
__device__ __forceinline__ T regularize(T w, const OptParams<T>& p) {
    if (BOOK) return w - (p.l1 + p.l2 * w);
    return w - p.lr * (p.l1 * ck_sign(w) + p.l2 * w);
}

template <typename T, bool BOOK> struct SGDOp {
    static __device__ void apply(T D, T& w, T&, T&, const OptParams<T>& p) {
        if (BOOK) { w = regularize<T, BOOK>(w, p); w += (p.lr / p.batch) * D; }
        else      { const T d = D / p.batch; w = regularize<T, BOOK>(w, p) + p.lr * d; }
    }
};
template <typename T, bool BOOK> struct MomentumOp {
    static __device__ void apply(T D, T& w, T& m, T&, const OptParams<T>& p) {
        const T d = D / p.batch;
        w = regularize<T, BOOK>(w, p);
        m = p.lr * d + p.beta1 * m;
        w += m;
    }
};
template <typename T, bool BOOK> struct AdaGradOp {
    static __device__ void apply(T D, T& w, T& G, T&, const OptParams<T>& p) {
        const T d = D / p.batch;
        w = regularize<T, BOOK>(w, p);
        G += d * d;
        if (BOOK) w += p.lr / ck_sqrt(G + T(1.0e-37f));
        else      w += p.lr * d / (ck_sqrt(G) + p.eps);
    }
};
template <typename T, bool BOOK> struct RMSPropOp {
    static __device__ void apply(T D, T& w, T& G, T&, const OptParams<T>& p) {
        const T d = D / p.batch;
        w = regularize<T, BOOK>(w, p);
        G = p.beta1 * G + (T(1) - p.beta1) * d * d;
        w += p.lr * d / (ck_sqrt(G) + (BOOK ? T(1.0e-37f) : p.eps));
    }
};
template <typename T, bool BOOK> struct AdaDeltaOp {
    static __device__ void apply(T D, T& w, T& W, T& G, const OptParams<T>& p) {
        const T d = D / p.batch;
        w = regularize<T, BOOK>(w, p);
        if (BOOK) {
            W = p.beta1 * W + (T(1) - p.beta1) * w * w;
            G = p.beta2 * G + (T(1) - p.beta2) * d * d;
            w += d * ck_sqrt(W) / (ck_sqrt(G) + T(1.0e-37f));
        } else {
            G = p.beta2 * G + (T(1) - p.beta2) * d * d;
            const T u = d * ck_sqrt(W + p.eps) / ck_sqrt(G + p.eps);
            W = p.beta1 * W + (T(1) - p.beta1) * u * u;
            w += p.lr * u;
        }
    }
};
template <typename T, bool BOOK> struct AdamOp {
    static __device__ void apply(T D, T& w, T& M, T& V, const OptParams<T>& p) {
        const T d = D / p.batch;
        M = p.beta1 * M + (T(1) - p.beta1) * d;
        V = p.beta2 * V + (T(1) - p.beta2) * d * d;
        w = regularize<T, BOOK>(w, p);
        if (BOOK) {
            const T m = M / (T(1) - p.beta1), v = V / (T(1) - p.beta2);
            w += p.lr * m / (ck_sqrt(v) + T(1.0e-37f));
        } else {
            w += p.c1 * M / (ck_sqrt(V) * p.c2 + p.eps);
        }
    }
};

// The update of n weights by threads tid, tid + S, ... (the whole grid for one tensor, one
// block for a chunk of a tensor list). NS: how many moment arrays the rule keeps (0, 1 or
// 2). Same scheme as ew_map: CK_UNROLL 16-byte packs per thread per iteration, all loads
// before the first use. Each element's arithmetic is Op::apply alone, so which thread
// updates an element, and in which launch, never changes its bits.
template <typename T, int NS, class Op>
__device__ __forceinline__ void opt_map(T* D, T* w, T* s1, T* s2, long long n,
                                        const OptParams<T>& p, int vec, long long tid,
                                        long long S) {
    const int V = Pack16<T>::N, U = CK_UNROLL;
    long long head = 0;
    if (vec) {
        const long long packs = n / V;
        for (long long c0 = tid; c0 < packs; c0 += S * U) {
            T d[U][V], ww[U][V], a[U][V], b[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long i = (c0 + u * S) * V;
                if (c0 + u * S < packs) {
                    load16(D + i, d[u]);
                    load16(w + i, ww[u]);
                    if (NS > 0) load16(s1 + i, a[u]);
                    if (NS > 1) load16(s2 + i, b[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long i = (c0 + u * S) * V;
                if (c0 + u * S < packs) {
#pragma unroll
                    for (int j = 0; j < V; ++j) Op::apply(d[u][j], ww[u][j], a[u][j], b[u][j], p);
#pragma unroll
                    for (int j = 0; j < V; ++j) d[u][j] = T(0);
                    store16(w + i, ww[u]);
                    if (NS > 0) store16(s1 + i, a[u]);
                    if (NS > 1) store16(s2 + i, b[u]);
                    store16(D + i, d[u]);
                }
            }
        }
        head = packs * V;
    }
    for (long long i = head + tid; i < n; i += S) {
        T ww = w[i], a = NS > 0 ? s1[i] : T(0), b = NS > 1 ? s2[i] : T(0);
        Op::apply(D[i], ww, a, b, p);
        w[i] = ww;
        if (NS > 0) s1[i] = a;
        if (NS > 1) s2[i] = b;
        D[i] = T(0);
    }
}

// The tensor-list form (cukernels.multi): one launch updates every tensor of a list. The
// table holds, per tensor, MT_FIELDS 64-bit words: the addresses of D, w, s1 and s2, the
// element count n, the first chunk's block, and vec (its four arrays 16-byte aligned).
// Block b updates chunk (b - first) of tensor chunk_tensor[b]: `chunk` elements (a multiple
// of 16 bytes' worth, so every chunk keeps its tensor's alignment), fewer in the last.
template <typename T, int NS, class Op>
__device__ __forceinline__ void opt_multi(const long long* __restrict__ table,
                                          const int* __restrict__ chunk_tensor,
                                          long long chunk, const OptParams<T>& p) {
    const long long* e = table + (long long)chunk_tensor[blockIdx.x] * MT_FIELDS;
    const long long start = ((long long)blockIdx.x - e[MT_FIRST]) * chunk;
    const long long n = min(chunk, e[MT_N] - start);
    T* D = reinterpret_cast<T*>(e[MT_D]) + start;
    T* w = reinterpret_cast<T*>(e[MT_W]) + start;
    T* s1 = NS > 0 ? reinterpret_cast<T*>(e[MT_S1]) + start : w;
    T* s2 = NS > 1 ? reinterpret_cast<T*>(e[MT_S2]) + start : w;
    opt_map<T, NS, Op>(D, w, s1, s2, n, p, (int)e[MT_VEC], threadIdx.x, blockDim.x);
}

#define CK_UPDATE(NAME, NS, OP)                                                              \
    template <typename T, bool BOOK>                                                         \
    __global__ void NAME(T* D, T* w, T* s1, T* s2, long long n, T batch, T lr, T beta1,      \
                         T beta2, T l1, T l2, T eps, T c1, T c2, int vec) {                  \
        const OptParams<T> p = {batch, lr, beta1, beta2, l1, l2, eps, c1, c2};               \
        opt_map<T, NS, OP<T, BOOK> >(D, w, s1, s2, n, p, vec, ck_tid(), ck_stride());        \
    }                                                                                        \
    template <typename T, bool BOOK>                                                         \
    __global__ void NAME##_multi(const long long* table, const int* chunk_tensor,            \
                                 long long chunk, T batch, T lr, T beta1, T beta2, T l1,     \
                                 T l2, T eps, T c1, T c2) {                                  \
        const OptParams<T> p = {batch, lr, beta1, beta2, l1, l2, eps, c1, c2};               \
        opt_multi<T, NS, OP<T, BOOK> >(table, chunk_tensor, chunk, p);                      \
    }

CK_UPDATE(sgd_update, 0, SGDOp)
CK_UPDATE(momentum_update, 1, MomentumOp)
CK_UPDATE(adagrad_update, 1, AdaGradOp)
CK_UPDATE(rmsprop_update, 1, RMSPropOp)
CK_UPDATE(adadelta_update, 2, AdaDeltaOp)
CK_UPDATE(adam_update, 2, AdamOp)
