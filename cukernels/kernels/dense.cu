// dense.cu: the fully connected layer's kernels (book chapter and article).
//
// Layout (the documents' contract): W is row-major (N, I + 1), the bias in the last column.
// Inputs x are (B, I), gradients g are (B, N), all row-major and contiguous; a batch behaves
// as B single-vector calls in a row, and for every (b, row) the kernels below do the same
// arithmetic in the same order whatever B is, so a batch gives the same bits as B calls.
// act: -1 none (the book), 0 tanh, 1 sigmoid, other: none (the article's codes).
//
//   perceptron_feed_forward  y[b,n] = act(sum_i x[b,i]*W[n,i] + W[n,I])
//       one warp per row n (blockDim/32 rows a block), CK_GEMV_UNROLL loads in flight per lane,
//       batch in chunks of 4 per pass over W.
//   dense_bias_act           y[b,n] = act(y[b,n] + W[n,I])   (epilogue after a cuBLAS GEMM)
//   hidden_gradient_partial  part[s,b,i] = sum_{o in slice s} g[b,o]*W[o,i]    (i < I)
//       grid (ceil(I/blockDim), S): one thread per column i, coalesced rows of W, CK_GEMV_UNROLL
//       rows in flight; the rows are cut into S slices so that a single vector fills the GPU.
//   hidden_gradient_finish   gi[b,i] = epilogue(sum_s part[s,b,i]) in slice order (no atomics)
//       epilogue for the article (code 0 tanh, 1 sigmoid, with o = outputs[b,i]):
//       c = clamp(sum + o, lo, 1); (c - o)*f'(o) with the article's guards; otherwise sum.
//   calc_delta_weights       dW[n,j] += sum_b (j < I ? x[b,j] : 1)*g[b,n]     (j <= I)
//   delta_bias               dW[n,I] += sum_b g[b,n]   (after a cuBLAS GEMM did j < I)
//   article_update_weights   for b in order: u = lr*g[b,n]*(j < I ? x[b,j] : 1) + mom*dW[n,j];
//                            dW[n,j] = u; W[n,j] += u
//       the three last ones: grid (ceil((I+1)/blockDim), Y), rows grid-strided by Y,
//       CK_ROW_UNROLL rows per thread per pass.
#include "common.cuh"

#ifndef CK_GEMV_UNROLL
#define CK_GEMV_UNROLL 8   // loads of W in flight per lane (feed-forward) or thread (hidden)
#endif
#ifndef CK_ROW_UNROLL
#define CK_ROW_UNROLL 4    // rows per thread per pass in the (row, column) kernels
#endif

template <typename T>
__device__ __forceinline__ T dense_act(T s, int act) {
    if (act == 0) return ck_tanh(s);
    if (act == 1) return T(1) / (T(1) + ck_exp(-s));
    return s;
}

template <typename T>
__global__ void perceptron_feed_forward(const T* x, const T* W, T* y, int B, int N, int I, int act) {
    const int lane = threadIdx.x & 31, U = CK_GEMV_UNROLL;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    const T* wr = W + n * (long long)(I + 1);
    for (int b0 = 0; b0 < B; b0 += 4) {
        const int nb = min(4, B - b0);
        const T* xb = x + (long long)b0 * I;
        T acc[4] = {T(0), T(0), T(0), T(0)};
        int i = lane;
        for (; i + 32 * (U - 1) < I; i += 32 * U) {     // U loads of W in flight
            T wv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) wv[u] = wr[i + 32 * u];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (j < nb) acc[j] += xb[(long long)j * I + i + 32 * u] * wv[u];
        }
        for (; i < I; i += 32) {
            const T wv = wr[i];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j < nb) acc[j] += xb[(long long)j * I + i] * wv;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j < nb) {
                const T s = warp_sum(acc[j]);
                if (lane == 0) y[(long long)(b0 + j) * N + n] = dense_act(s + wr[I], act);
            }
        }
    }
}

template <typename T>
__global__ void dense_bias_act(const T* W, T* y, int B, int N, int I, int act) {
    const long long total = (long long)B * N;
    for (long long k = ck_tid(); k < total; k += ck_stride()) {
        const long long n = k % N;
        y[k] = dense_act(y[k] + W[n * (I + 1) + I], act);
    }
}

template <typename T>
__global__ void hidden_gradient_partial(const T* W, const T* g, T* part, int B, int N, int I,
                                        int rows_per_slice) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, U = CK_GEMV_UNROLL;
    if (i >= I) return;
    const int s = blockIdx.y;
    const int o0 = s * rows_per_slice, o1 = min(N, o0 + rows_per_slice);
    for (int b0 = 0; b0 < B; b0 += 4) {
        const int nb = min(4, B - b0);
        T acc[4] = {T(0), T(0), T(0), T(0)};
        int o = o0;
        for (; o + U <= o1; o += U) {                  // U rows of W in flight
            T wv[U];
#pragma unroll
            for (int u = 0; u < U; ++u) wv[u] = W[(long long)(o + u) * (I + 1) + i];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (j < nb) acc[j] += g[(long long)(b0 + j) * N + o + u] * wv[u];
        }
        for (; o < o1; ++o) {
            const T wv = W[(long long)o * (I + 1) + i];
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (j < nb) acc[j] += g[(long long)(b0 + j) * N + o] * wv;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j)
            if (j < nb) part[((long long)s * B + b0 + j) * I + i] = acc[j];
    }
}

template <typename T>
__device__ __forceinline__ T article_hidden_epilogue(T sum, T o, int act) {
    const T hi = T(1) - (o == T(1) ? T(0.99) : o);
    if (act == 0) return (ck_clamp(sum + o, T(-1), T(1)) - o) * (T(1) + o) * hi;
    if (act == 1) return (ck_clamp(sum + o, T(0), T(1)) - o) * (o == T(0) ? T(0.01) : o) * hi;
    return sum;
}

// `part` may alias `gi` when slices == 1 (the cuBLAS path's in-place epilogue).
template <typename T>
__global__ void hidden_gradient_finish(const T* part, const T* outs, T* gi, int B, int I,
                                       int slices, int act) {
    const long long total = (long long)B * I;
    for (long long k = ck_tid(); k < total; k += ck_stride()) {
        T s = part[k];
        for (int sl = 1; sl < slices; ++sl) s += part[(long long)sl * total + k];
        gi[k] = act >= 0 ? article_hidden_epilogue(s, outs[k], act) : s;
    }
}

template <typename T>
__global__ void calc_delta_weights(const T* x, T* dW, const T* g, int B, int N, int I) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, R = CK_ROW_UNROLL;
    if (j > I) return;
    const long long step = gridDim.y;
    for (long long n0 = blockIdx.y; n0 < N; n0 += step * R) {
        T acc[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {                  // R rows' loads in flight
            const long long n = n0 + r * step;
            if (n < N) acc[r] = dW[n * (I + 1) + j];
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const long long n = n0 + r * step;
            if (n < N) {
                for (int b = 0; b < B; ++b)
                    acc[r] += (j < I ? x[(long long)b * I + j] : T(1)) * g[(long long)b * N + n];
                dW[n * (I + 1) + j] = acc[r];
            }
        }
    }
}

template <typename T>
__global__ void delta_bias(T* dW, const T* g, int B, int N, int I) {
    for (long long n = ck_tid(); n < N; n += ck_stride()) {
        T acc = dW[n * (I + 1) + I];
        for (int b = 0; b < B; ++b) acc += g[(long long)b * N + n];
        dW[n * (I + 1) + I] = acc;
    }
}

template <typename T>
__global__ void article_update_weights(T* W, const T* g, const T* x, T* dW, int B, int N, int I,
                                       T lr, T momentum) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, R = CK_ROW_UNROLL;
    if (j > I) return;
    const long long step = gridDim.y;
    for (long long n0 = blockIdx.y; n0 < N; n0 += step * R) {
        T w[R], d[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const long long n = n0 + r * step;
            if (n < N) { w[r] = W[n * (I + 1) + j]; d[r] = dW[n * (I + 1) + j]; }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const long long n = n0 + r * step;
            if (n < N) {
                for (int b = 0; b < B; ++b) {
                    d[r] = lr * g[(long long)b * N + n] * (j < I ? x[(long long)b * I + j] : T(1))
                           + momentum * d[r];
                    w[r] += d[r];
                }
                W[n * (I + 1) + j] = w[r];
                dW[n * (I + 1) + j] = d[r];
            }
        }
    }
}
