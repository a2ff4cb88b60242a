// softmax.cu: row-wise SoftMax and its derivative over `rows` rows of `cols` elements
// (row-major, contiguous).
//
//   softmax_activation   y = exp(x - max(x)) / sum(exp(x - max(x)))   (max subtracted: no
//                        overflow for any finite input)
//   softmax_derivative   input_gr = y*(g - sum(y*g))                   (the book's formula
//                        sum_j y_j*g_j*(delta_ij - y_i), in O(cols) per row)
//
// Two launch shapes:
//  * <T, G, PT> "cached" kernels: a group of G threads per row (G = 32: one warp, several
//    rows per block; G > 32: one block of G threads per row) keeps the row in registers,
//    PT elements per thread, for rows with cols <= G*PT. One read and one write per element.
//  * "_long" kernels: one block per row, any cols; the row is read twice (online max/sum,
//    then the write pass).
// Reductions use a fixed tree (warp shuffles, then one warp over the block's warps), so the
// result is bitwise repeatable. Each thread writes only elements it read, after the row's
// reductions: `y` may alias `x`, and input_gr may alias output_gr.
#include "common.cuh"

template <typename T> __device__ __forceinline__ T ck_neg_inf();
template <> __device__ __forceinline__ float ck_neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double ck_neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ULL);
}

// The row this thread works on, and its lane inside the row's group; -1 if none.
template <int G>
__device__ __forceinline__ long long group_row(long long rows, int& lane) {
    lane = G == 32 ? (threadIdx.x & 31) : threadIdx.x;
    const long long row = G == 32 ? (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)
                                  : (long long)blockIdx.x;
    return row < rows ? row : -1;
}

template <typename T, int G, int PT>
__global__ void softmax_activation(const T* x, T* y, long long rows, int cols) {
    __shared__ T scratch[32];
    int lane;
    const long long row = group_row<G>(rows, lane);
    if (row < 0) return;  // whole warps (G = 32) or whole blocks (G > 32) leave together
    const T* xr = x + row * cols;
    T* yr = y + row * cols;
    T v[PT];
    T m = ck_neg_inf<T>();
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        const int idx = k * G + lane;
        v[k] = idx < cols ? xr[idx] : ck_neg_inf<T>();
        m = ck_max(m, v[k]);
    }
    m = group_reduce<T, G, true>(m, scratch);
    T s = T(0);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        if (k * G + lane < cols) { v[k] = ck_exp(v[k] - m); s += v[k]; }
    }
    s = group_reduce<T, G, false>(s, scratch);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        const int idx = k * G + lane;
        if (idx < cols) yr[idx] = v[k] / s;
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
    const T S = block_reduce<T, false>(s, scratch);
    for (int idx = threadIdx.x; idx < cols; idx += blockDim.x) yr[idx] = ck_exp(xr[idx] - M) / S;
}

template <typename T, int G, int PT>
__global__ void softmax_derivative(const T* y, const T* g, T* out, long long rows, int cols) {
    __shared__ T scratch[32];
    int lane;
    const long long row = group_row<G>(rows, lane);
    if (row < 0) return;
    const T* yr = y + row * cols;
    const T* gr = g + row * cols;
    T* orow = out + row * cols;
    T yv[PT], gv[PT];
    T dot = T(0);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        const int idx = k * G + lane;
        yv[k] = idx < cols ? yr[idx] : T(0);
        gv[k] = idx < cols ? gr[idx] : T(0);
        dot += yv[k] * gv[k];
    }
    dot = group_reduce<T, G, false>(dot, scratch);
#pragma unroll
    for (int k = 0; k < PT; ++k) {
        const int idx = k * G + lane;
        if (idx < cols) orow[idx] = yv[k] * (gv[k] - dot);
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
