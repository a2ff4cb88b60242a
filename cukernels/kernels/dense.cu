// dense.cu: the fully connected layer's kernels (book chapter and article).
//
// Layout (the documents' contract): W is row-major (N, I + 1), the bias in the last column.
// Inputs x are (B, I), gradients g are (B, N), all row-major and contiguous; a batch behaves
// as B single-vector calls in a row, and for every (b, row) the kernels below do the same
// arithmetic in the same order whatever B is, so a batch gives the same bits as B calls.
// act: -1 none (the book), 0 tanh, 1 sigmoid, other: none (the article's codes).
//
//   perceptron_feed_forward  y[b,n] = act(sum_i x[b,i]*W[n,i] + W[n,I])
//       one block per row n, 16-byte loads of the row, batch in chunks of 4 per pass over W.
//   dense_bias_act           y[b,n] = act(y[b,n] + W[n,I])   (epilogue after a cuBLAS GEMM)
//   hidden_gradient_partial  part[s,b,i] = sum_{o in slice s} g[b,o]*W[o,i]    (i < I)
//       grid (ceil(I/blockDim), S): one thread per column i, coalesced rows of W, CK_COL_UNROLL
//       rows in flight; the rows are cut into S slices so that a single vector fills the GPU.
//   hidden_gradient_finish   gi[b,i] = epilogue(sum_s part[s,b,i]) in slice order (no atomics)
//       epilogue for the article (code 0 tanh, 1 sigmoid, with o = outputs[b,i]):
//       c = clamp(sum + o, lo, 1); (c - o)*f'(o) with the article's guards; otherwise sum.
//   calc_delta_weights       dW[n,j] += sum_b (j < I ? x[b,j] : 1)*g[b,n]     (j <= I)
//       flat over dW, 1-D grid-stride, 16-byte packs.
//   delta_bias               dW[n,I] += sum_b g[b,n]   (after a cuBLAS GEMM did j < I)
//   article_update_weights   for b in order: u = lr*g[b,n]*(j < I ? x[b,j] : 1) + mom*dW[n,j];
//                            dW[n,j] = u; W[n,j] += u
//       flat over W and dW like calc_delta_weights.
#include "common.cuh"

// Rendered from Python (cukernels/dense.py): CK_GEMV_UNROLL, the 16-byte packs of a row in
// flight per thread (feed-forward); CK_COL_UNROLL, the rows of W in flight per thread
// (hidden gradient; the host cuts slices to multiples of it).

// Row and column of flat index k of a row-major matrix with rows of L elements, from a
// double reciprocal and one correction step (exact for k < 2^53).
__device__ __forceinline__ void flat_row_col(long long k, long long L, double inv_L,
                                             long long& n, long long& j) {
    n = (long long)((double)k * inv_L);
    j = k - n * L;
    if (j < 0) { --n; j += L; } else if (j >= L) { ++n; j -= L; }
}

template <typename T>
__device__ __forceinline__ T dense_act(T s, int act) {
    if (act == 0) return ck_tanh(s);
    if (act == 1) return T(1) / (T(1) + ck_exp(-s));
    return s;
}

// One block per row n; the row (I + 1 elements, the bias last, times an input of 1) is read
// with 16-byte loads from its first 16-byte boundary on (vec != 0: W's base is aligned),
// scalars before and after. Fixed per-thread order and block tree: same bits for any B.
template <typename T>
__device__ __forceinline__ T dense_term(const T* xb, int e, int I, T w) {
    return (e < I ? xb[e] : T(1)) * w;
}

template <typename T>
__global__ void perceptron_feed_forward(const T* x, const T* W, T* y, int B, int N, int I, int act,
                                        int vec) {
    __shared__ T scratch[32];
    const int V = Pack16<T>::N, U = CK_GEMV_UNROLL, L = I + 1, nt = blockDim.x;
    const long long n = blockIdx.x;
    const T* wr = W + n * L;
    const int head = vec ? (int)((V - (n * L) % V) % V) : L;  // scalars before the first pack
    const int packs = head < L ? (L - head) / V : 0;
    const int tail = head + packs * V;
    for (int b0 = 0; b0 < B; b0 += 4) {
        const int nb = min(4, B - b0);
        const T* xb = x + (long long)b0 * I;
        T acc[4] = {T(0), T(0), T(0), T(0)};
        for (int e = threadIdx.x; e < min(head, L); e += nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) if (j < nb) acc[j] += dense_term(xb + (long long)j * I, e, I, wr[e]);
        for (int p0 = threadIdx.x; p0 < packs; p0 += nt * U) {
            T w[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (p0 + u * nt < packs) load16(wr + head + (p0 + u * nt) * V, w[u]);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (p0 + u * nt < packs) {
                    const int e0 = head + (p0 + u * nt) * V;
#pragma unroll
                    for (int v = 0; v < V; ++v)
#pragma unroll
                        for (int j = 0; j < 4; ++j)
                            if (j < nb) acc[j] += dense_term(xb + (long long)j * I, e0 + v, I, w[u][v]);
                }
            }
        }
        for (int e = tail + threadIdx.x; e < L; e += nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) if (j < nb) acc[j] += dense_term(xb + (long long)j * I, e, I, wr[e]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j < nb) {                      // nb is uniform across the block
                const T s = block_reduce<T, false>(acc[j], scratch);
                if (threadIdx.x == 0) y[(long long)(b0 + j) * N + n] = dense_act(s, act);
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
    const int i = blockIdx.x * blockDim.x + threadIdx.x, U = CK_COL_UNROLL;
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

// Flat pass over the N*(I + 1) elements of one or two W-shaped arrays (contiguous, in place):
// 16-byte packs when vec != 0, the row n and column j of each element from flat_row_col;
// op(n, j, a, b) updates the element a (and b of the second array, when TWO).
template <typename T, bool TWO, class Op>
__device__ __forceinline__ void flat_map(T* A, T* Bm, int N, int I, double inv_L, int vec,
                                         const Op& op) {
    const int V = Pack16<T>::N;
    const long long L = I + 1, total = (long long)N * L, S = ck_stride();
    long long head = 0;
    if (vec) {
        const long long packs = total / V;
        for (long long c = ck_tid(); c < packs; c += S) {
            T a[V], b[V];
            load16(A + c * V, a);
            if (TWO) load16(Bm + c * V, b);
            long long n, j;
            flat_row_col(c * V, L, inv_L, n, j);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                op(n, j, a[v], b[v]);
                if (++j == L) { j = 0; ++n; }
            }
            store16(A + c * V, a);
            if (TWO) store16(Bm + c * V, b);
        }
        head = packs * V;
    }
    for (long long k = head + ck_tid(); k < total; k += S) {
        long long n, j;
        flat_row_col(k, L, inv_L, n, j);
        T a = A[k], b = TWO ? Bm[k] : T(0);
        op(n, j, a, b);
        A[k] = a;
        if (TWO) Bm[k] = b;
    }
}

// dW[n, j] += sum_b [x, 1][b, j]*g[b, n], the batch summed in order.
template <typename T> struct DeltaOp {
    const T *x, *g;
    int B, N, I;
    __device__ void operator()(long long n, long long j, T& acc, T&) const {
        for (int b = 0; b < B; ++b)
            acc += (j < I ? x[(long long)b * I + j] : T(1)) * g[(long long)b * N + n];
    }
};

template <typename T>
__global__ void calc_delta_weights(const T* x, T* dW, const T* g, int B, int N, int I,
                                   double inv_L, int vec) {
    flat_map<T, false>(dW, dW, N, I, inv_L, vec, DeltaOp<T>{x, g, B, N, I});
}

template <typename T>
__global__ void delta_bias(T* dW, const T* g, int B, int N, int I) {
    for (long long n = ck_tid(); n < N; n += ck_stride()) {
        T acc = dW[n * (I + 1) + I];
        for (int b = 0; b < B; ++b) acc += g[(long long)b * N + n];
        dW[n * (I + 1) + I] = acc;
    }
}

// The article's momentum step, B samples in a row: u = lr*g*[x, 1] + momentum*u; w += u.
template <typename T> struct ArticleOp {
    const T *g, *x;
    int B, N, I;
    T lr, momentum;
    __device__ void operator()(long long n, long long j, T& w, T& d) const {
        for (int b = 0; b < B; ++b) {
            d = lr * g[(long long)b * N + n] * (j < I ? x[(long long)b * I + j] : T(1)) + momentum * d;
            w += d;
        }
    }
};

template <typename T>
__global__ void article_update_weights(T* W, const T* g, const T* x, T* dW, int B, int N, int I,
                                       T lr, T momentum, double inv_L, int vec) {
    flat_map<T, true>(W, dW, N, I, inv_L, vec, ArticleOp<T>{g, x, B, N, I, lr, momentum});
}
