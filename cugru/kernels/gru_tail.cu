// gru_tail.cu: the backward pass's tail after the recurrence, shared by every path. The
// weight and bias gradients are GEMMs over all T*B rows in chunks (cugru/_passes.py); this
// kernel adds the chunks' partial sums in chunk order (no atomics: the same bits every run).
#include "gru_common.cuh"

// out[k] = part[0][k] + part[1][k] + ... + part[chunks-1][k] for k < n (part rows ld apart):
// the per-chunk weight-gradient GEMMs' results folded in. Grid-stride over k.
template <typename T>
__global__ void gru_sum_chunks(const T* __restrict__ part, T* __restrict__ out, long long n,
                               long long ld, int chunks) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        T a = part[k];
        for (int c = 1; c < chunks; ++c) a += part[c * ld + k];
        out[k] = a;
    }
}
