// gru_tail.cu: the backward pass's tail after the recurrence, shared by every path. The
// weight and bias gradients are GEMMs over all T*B rows in chunks (cugru/_passes.py):
// gru_sum_chunks adds the chunks' partial sums in chunk order; a pass of few rows sums its
// bias gradients in gru_bias_sums instead. gru_add_chunks serves the per-step backward
// recurrence (its split product). No atomics: the same bits every run.
#include "gru_common.cuh"

// The chunks' partial sums folded in, in chunk order (part rows ld apart), for k < n:
// out[k] = part[0][k] + ... + part[chunks-1][k], or with ADD out[k] + part[0][k] + ... .
// Grid-stride over k.
template <typename T, bool ADD>
__device__ __forceinline__ void gru_fold_chunks(const T* __restrict__ part,
                                                T* __restrict__ out, long long n,
                                                long long ld, int chunks) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        T a = ADD ? out[k] : part[k];
        for (int c = ADD ? 0 : 1; c < chunks; ++c) a += part[c * ld + k];
        out[k] = a;
    }
}

// The per-chunk weight-gradient GEMMs' results folded into out.
template <typename T>
__global__ void gru_sum_chunks(const T* __restrict__ part, T* __restrict__ out, long long n,
                               long long ld, int chunks) {
    gru_fold_chunks<T, false>(part, out, n, ld, chunks);
}

// The per-step backward product split along its sum (the slices' products written apart,
// cugru/_plan.py's StepsPlan) added into the carried gradient out.
template <typename T>
__global__ void gru_add_chunks(const T* __restrict__ part, T* __restrict__ out, long long n,
                               long long ld, int chunks) {
    gru_fold_chunks<T, true>(part, out, n, ld, chunks);
}

// The bias gradients of a pass of few rows, summed in double (float data too: within a
// float unit of the exact sum): db[c] for c < 2*D*G is the sum over the rows r < rows of
// column c of d_gate_i (c < DG = D*G: dgi[r*DG + c]) or of d_gate_h (c = DG + d*G + g:
// dgh[(d*rows + r)*G + g]), db_ih then db_hh. A block takes GRU_BIAS_COLS columns, a warp's
// lanes on adjacent addresses; the GRU_BIAS_LANES threads of a column take every
// GRU_BIAS_LANES-th row, and their sums are added in lane order (no atomics: the same bits
// every run).
template <typename T>
__global__ void __launch_bounds__(GRU_BIAS_COLS * GRU_BIAS_LANES)
gru_bias_sums(const T* __restrict__ dgi, const T* __restrict__ dgh, T* __restrict__ db,
              int rows, int DG, int G) {
    __shared__ double lane_sums[GRU_BIAS_LANES][GRU_BIAS_COLS];
    const int c = blockIdx.x * GRU_BIAS_COLS + threadIdx.x;
    double a = 0.0;
    if (c < 2 * DG) {
        const T* col;
        long long ld;
        if (c < DG) {
            col = dgi + c;
            ld = DG;
        } else {
            const int d = (c - DG) / G;
            col = dgh + (long long)d * rows * G + (c - DG - d * G);
            ld = G;
        }
        for (int r = threadIdx.y; r < rows; r += GRU_BIAS_LANES) a += (double)col[r * ld];
    }
    lane_sums[threadIdx.y][threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.y == 0 && c < 2 * DG) {
        for (int l = 1; l < GRU_BIAS_LANES; ++l) a += lane_sums[l][threadIdx.x];
        db[c] = (T)a;
    }
}
