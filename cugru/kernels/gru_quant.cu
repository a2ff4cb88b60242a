// gru_quant.cu: the fake quantizers a quantization-aware call (cugru.QuantSpec) runs around
// the recurrence, one launch on each side of it: before the forward pass the weights per
// output row and x and h0 (gru_quant_operands); after the backward pass the
// straight-through estimator's masks of dx and dh0 (gru_quant_masks). fq and its rounding:
// gru_common.cuh (gru_fq), the same bits as cugru/quant.py's numpy quantizer. Grids of x
// and h are (scale, inv, lo, hi) with the bounds shifted by the zero point.
#include "gru_common.cuh"

// max(a, b) that keeps a NaN (fmax drops it), as numpy's max does
template <typename T> __device__ __forceinline__ T gru_max_nan(T a, T b) {
    return (a != a || b != b) ? a + b : fmax(a, b);
}

// The weights of one row (a block of GRU_QUANT_THREADS threads): s = float(max(max|w_row| /
// qmax, 2^-23)), wq_row = clamp(rint(w_row * float(1/s)), -qmax, qmax) * s. A maximum is
// exact in any order, so the scale has the same bits on every run. A NaN weight makes its
// row NaN, as in the numpy quantizer.
template <typename T>
__device__ __forceinline__ void gru_fq_row(const T* __restrict__ src, T* __restrict__ dst,
                                           int cols, T qmax, T* part) {
    T m = T(0);
    for (int c = threadIdx.x; c < cols; c += GRU_QUANT_THREADS)
        m = gru_max_nan(m, fabs(src[c]));
    part[threadIdx.x] = m;
    __syncthreads();
    for (int k = GRU_QUANT_THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            part[threadIdx.x] = gru_max_nan(part[threadIdx.x], part[threadIdx.x + k]);
        __syncthreads();
    }
    const float s = (float)gru_max_nan(part[0] / qmax, T(1.1920928955078125e-07));   // 2^-23
    const float inv = 1.0f / s;
    for (int c = threadIdx.x; c < cols; c += GRU_QUANT_THREADS) {
        const T u = gru_rint(gru_mul_rn(src[c], T(inv)));
        dst[c] = u != u ? u : gru_mul_rn(fmin(fmax(u, -qmax), qmax), T(s));
    }
}

// Blocks [0, rows_ih): the rows of w_ih (rows_ih x I) into wq_ih; the next rows_hh blocks:
// those of w_hh (rows_hh x H) into wq_hh; the last `fq_blocks` blocks: xq = fq(x) (nx
// values, nx = 0 to skip) then h0q = fq(h0) (nh values), grid-stride.
template <typename T>
__global__ void __launch_bounds__(GRU_QUANT_THREADS)
gru_quant_operands(const T* __restrict__ w_ih, T* __restrict__ wq_ih, int rows_ih, int I,
                   const T* __restrict__ w_hh, T* __restrict__ wq_hh, int rows_hh, int H,
                   T qmax, const T* __restrict__ x, T* __restrict__ xq, long long nx,
                   T x_scale, T x_inv, T x_lo, T x_hi, const T* __restrict__ h0,
                   T* __restrict__ h0q, long long nh, T h_scale, T h_inv, T h_lo, T h_hi) {
    __shared__ T part[GRU_QUANT_THREADS];
    const int blk = blockIdx.x;
    if (blk < rows_ih) {
        gru_fq_row(w_ih + (long long)blk * I, wq_ih + (long long)blk * I, I, qmax, part);
        return;
    }
    if (blk < rows_ih + rows_hh) {
        const long long row = blk - rows_ih;
        gru_fq_row(w_hh + row * H, wq_hh + row * H, H, qmax, part);
        return;
    }
    const long long first = (long long)(blk - rows_ih - rows_hh) * GRU_QUANT_THREADS +
                            threadIdx.x;
    const long long stride = (long long)(gridDim.x - rows_ih - rows_hh) * GRU_QUANT_THREADS;
    bool inside;
    for (long long k = first; k < nx + nh; k += stride) {
        if (k < nx) xq[k] = gru_fq(x[k], x_scale, x_inv, x_lo, x_hi, inside);
        else h0q[k - nx] = gru_fq(h0[k - nx], h_scale, h_inv, h_lo, h_hi, inside);
    }
}

// The straight-through estimator at x and h0: dx = 0 where fq(x) clipped (nx values, nx = 0
// to skip), dh0 = 0 where fq(h0) clipped (nh values), in place, grid-stride.
template <typename T>
__global__ void gru_quant_masks(const T* __restrict__ x, T* __restrict__ dx, long long nx,
                                T x_inv, T x_lo, T x_hi, const T* __restrict__ h0,
                                T* __restrict__ dh0, long long nh, T h_inv, T h_lo, T h_hi) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    bool inside;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < nx + nh;
         k += stride) {
        if (k < nx) {
            gru_fq(x[k], T(1), x_inv, x_lo, x_hi, inside);
            if (!inside) dx[k] = T(0);
        } else {
            gru_fq(h0[k - nx], T(1), h_inv, h_lo, h_hi, inside);
            if (!inside) dh0[k - nx] = T(0);
        }
    }
}
