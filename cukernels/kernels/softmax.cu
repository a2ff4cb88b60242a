// softmax.cu: row-wise SoftMax and its derivative over `rows` rows of `cols` elements
// (row-major, contiguous).
//
//   softmax_activation   y = exp(x - max(x)) * (1/sum(exp(x - max(x))))  (max subtracted: no
//                        overflow for any finite input; one division per row)
//   softmax_derivative   input_gr = y*(g - sum(y*g))                   (the book's formula
//                        sum_j y_j*g_j*(delta_ij - y_i), in O(cols) per row)
//
// Two launch shapes:
//  * <T, G, PT, V> "cached" kernels: a group of G threads per row keeps the row in registers,
//    PT units per thread of V contiguous elements (V = 16/sizeof(T), one 16-byte load, when
//    cols % V == 0 and the base is 16-byte aligned; else V = 1), for cols <= G*PT*V.
//    G <= 32: 32/G rows per warp, blockDim/G rows per block, sub-warp shuffles;
//    G > 32: one block of G threads per row. One read and one write per element.
//  * "_long" kernels: one block per row, any cols; the row is read twice (online max/sum,
//    then the write pass).
// Reductions use a fixed tree (shuffles, then one warp over the block's warps), so the
// result is bitwise repeatable. Each thread writes only elements it read, after the row's
// reductions: `y` may alias `x`, and input_gr may alias output_gr.
#include "common.cuh"

template <typename T> __device__ __forceinline__ T ck_neg_inf();
template <> __device__ __forceinline__ float ck_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double ck_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// Sum/max over the G lanes of a row's group (G <= 32: aligned sub-warp groups; the whole
// warp takes part, so every lane must reach the call).
template <typename T, int G, bool IS_MAX>
__device__ __forceinline__ T row_reduce(T v, T* scratch) {
    if constexpr (G > 32) {
        return block_reduce<T, IS_MAX>(v, scratch);
    } else {
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) {
            const T w = __shfl_xor_sync(0xffffffffu, v, o);
            v = IS_MAX ? ck_max(v, w) : v + w;
        }
        return v;
    }
}

// Load unit k of this lane's share of a row: V elements at ((k*G + lane)*V), or fill.
template <typename T, int G, int V>
__device__ __forceinline__ void load_unit(const T* r, int k, int lane, int cols, T fill, T (&v)[V]) {
    const int e = (k * G + lane) * V;
    if (V > 1 && e < cols) {           // cols % V == 0: the whole unit is inside the row
        T q[Pack16<T>::N];
        load16(r + e, q);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = q[j];
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = e + j < cols ? r[e + j] : fill;
    }
}
template <typename T, int G, int V>
__device__ __forceinline__ void store_unit(T* r, int k, int lane, int cols, const T (&v)[V]) {
    const int e = (k * G + lane) * V;
    if (V > 1 && e < cols) {
        T q[Pack16<T>::N];
#pragma unroll
        for (int j = 0; j < V; ++j) q[j] = v[j];
        store16(r + e, q);
    } else {
#pragma unroll
        for (int j = 0; j < V; ++j) if (e + j < cols) r[e + j] = v[j];
    }
}

// The row of this thread's group and its lane in the group; `cols_here` is 0 for a group
// past the last row (it still takes part in the shuffles, and reads and writes nothing).
template <int G>
__device__ __forceinline__ long long group_row(long long rows, int cols, int& lane, int& cols_here) {
    long long row;
    if (G > 32) { lane = threadIdx.x; row = blockIdx.x; }
    else { lane = threadIdx.x % G; row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / G; }
    cols_here = row < rows ? cols : 0;
    return row < rows ? row : 0;
}

template <typename T, int G, int PT, int V>
__global__ void softmax_activation(const T* x, T* y, long long rows, int cols) {
    static_assert(V == 1 || V == Pack16<T>::N, "V is 1 or a 16-byte pack");
    __shared__ T scratch[32];
    int lane, nc;
    const long long row = group_row<G>(rows, cols, lane, nc);
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    const T ninf = ck_neg_inf<T>();
    T v[PT][V];
    T m = ninf;
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        load_unit<T, G, V>(xr, k, lane, nc, ninf, v[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) m = ck_max(m, v[k][j]);
    }
    m = row_reduce<T, G, true>(m, scratch);
    T s = T(0);
#pragma unroll
    for (int k = 0; k < PT; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) {
            v[k][j] = (k * G + lane) * V + j < nc ? ck_exp(v[k][j] - m) : T(0);
            s += v[k][j];
        }
    const T inv = T(1) / row_reduce<T, G, false>(s, scratch);   // one division per row
#pragma unroll
    for (int k = 0; k < PT; ++k) {
#pragma unroll
        for (int j = 0; j < V; ++j) v[k][j] = v[k][j] * inv;
        store_unit<T, G, V>(yr, k, lane, nc, v[k]);
    }
}

template <typename T>
__global__ void softmax_activation_long(const T* x, T* y, long long rows, int cols) {
    __shared__ T scratch[32];
    const long long row = blockIdx.x;
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    const T ninf = ck_neg_inf<T>();
    T m = ninf, s = T(0);  // running max and sum of exp(x - m) over this thread's elements
    for (int idx = threadIdx.x; idx < cols; idx += blockDim.x) {
        const T v = xr[idx];
        if (v > m) { s = s * ck_exp(m - v) + T(1); m = v; }
        else if (v != ninf) { s += ck_exp(v - m); }
    }
    const T M = block_reduce<T, true>(m, scratch);
    s = m == ninf ? T(0) : s * ck_exp(m - M);
    const T inv = T(1) / block_reduce<T, false>(s, scratch);
    for (int idx = threadIdx.x; idx < cols; idx += blockDim.x) yr[idx] = ck_exp(xr[idx] - M) * inv;
}

template <typename T, int G, int PT, int V>
__global__ void softmax_derivative(const T* y, const T* g, T* out, long long rows, int cols) {
    __shared__ T scratch[32];
    int lane, nc;
    const long long row = group_row<G>(rows, cols, lane, nc);
    const T* yr = y + row * cols;
    const T* gr = g + row * cols;
    T* orow = out + row * cols;
    T yv[PT][V], gv[PT][V];
    T dot = T(0);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        load_unit<T, G, V>(yr, k, lane, nc, T(0), yv[k]);
        load_unit<T, G, V>(gr, k, lane, nc, T(0), gv[k]);
#pragma unroll
        for (int j = 0; j < V; ++j) dot += yv[k][j] * gv[k][j];
    }
    dot = row_reduce<T, G, false>(dot, scratch);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
#pragma unroll
        for (int j = 0; j < V; ++j) yv[k][j] = yv[k][j] * (gv[k][j] - dot);
        store_unit<T, G, V>(orow, k, lane, nc, yv[k]);
    }
}

template <typename T>
__global__ void softmax_derivative_long(const T* y, const T* g, T* out, long long rows, int cols) {
    __shared__ T scratch[32];
    const long long row = blockIdx.x;
    const T* yr = y + row * cols;
    const T* gr = g + row * cols;
    T* orow = out + row * cols;
    T dot = T(0);
    for (int idx = threadIdx.x; idx < cols; idx += blockDim.x) dot += yr[idx] * gr[idx];
    dot = block_reduce<T, false>(dot, scratch);
    for (int idx = threadIdx.x; idx < cols; idx += blockDim.x) {
        const T yi = yr[idx];
        orow[idx] = yi * (gr[idx] - dot);
    }
}
