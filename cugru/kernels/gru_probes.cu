// gru_probes.cu: barriers alone, for the benchmark (bench/gru.py): the floor of a
// persistent pass's step is one barrier of its scope, timed here with nothing else. And the
// cell's float sigmoid and tanh against double (tools/cell_probe.py and a GPU test).
#include "gru_common.cuh"

// n barriers of a block (C = 1) or of a thread-block cluster of C blocks: the tile kernels'
// scope at block and cluster scope (GRU_TILE_MAX_THREADS: the most threads a tile kernel's
// block has)
template <int C>
__global__ void __launch_bounds__(GRU_TILE_MAX_THREADS, 1) GRU_CLUSTER_DIMS(C)
gru_cluster_barrier_probe(int n) {
    for (int i = 0; i < n; ++i) gru_cluster_barrier<C>();
}

// n barriers through a counter in global memory across the gridDim.x blocks of each grid row
// (a cooperative launch): the persist kernels' barrier, and the tile kernels' at grid scope
__global__ void __launch_bounds__(GRU_PERSIST_THREADS, 1)
gru_counter_barrier_probe(unsigned int* barrier, int n) {
    unsigned int target = 0;
    for (int i = 0; i < n; ++i) gru_group_barrier(barrier + blockIdx.y, gridDim.x, target);
}

// The cell's float sigmoid and tanh (gru_common.cuh) and their IEEE forms (expf and a
// division; tanhf), against the exact values in double, over the float32 inputs whose bit
// patterns are first + i * stride (i < count, wrapping at 2^32). out[f], f = 0..3 (sigmoid,
// tanh, IEEE sigmoid, IEEE tanh), as ordered bits of non-negative doubles (atomicMax): the
// largest error in units of the last place of the exact value in float32, where it is a
// normal float32 (at least FLT_MIN in magnitude); out[4 + f] the largest absolute error
// where it is smaller (the results the flush to zero touches); out[8] counts the inputs
// where a result is NaN and the exact value is not, or the other way round.
__device__ __forceinline__ void gru_cell_error(double got, double exact, double& ulps,
                                               double& tiny, unsigned long long& nan) {
    if (isnan(got) || isnan(exact)) {
        nan += isnan(got) != isnan(exact);
        return;
    }
    const double a = fabs(exact), err = fabs(got - exact);
    if (a >= 1.1754943508222875e-38) ulps = fmax(ulps, err / ldexp(1.0, ilogb(a) - 23));
    else tiny = fmax(tiny, err);
}

__global__ void __launch_bounds__(256)
gru_cell_error_probe(unsigned int first, unsigned int stride, long long count,
                     unsigned long long* out) {
    double ulps[4] = {0, 0, 0, 0}, tiny[4] = {0, 0, 0, 0};
    unsigned long long nan = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = __uint_as_float(first + (unsigned int)i * stride);
        const double s = 1.0 / (1.0 + exp(-(double)v)), t = tanh((double)v);
        gru_cell_error(gru_sigmoid(v), s, ulps[0], tiny[0], nan);
        gru_cell_error(gru_tanh(v), t, ulps[1], tiny[1], nan);
        gru_cell_error(1.0f / (1.0f + expf(-v)), s, ulps[2], tiny[2], nan);
        gru_cell_error(tanhf(v), t, ulps[3], tiny[3], nan);
    }
    for (int f = 0; f < 4; ++f) {
        for (int o = 16; o > 0; o >>= 1) {
            ulps[f] = fmax(ulps[f], __shfl_xor_sync(0xffffffffu, ulps[f], o));
            tiny[f] = fmax(tiny[f], __shfl_xor_sync(0xffffffffu, tiny[f], o));
        }
    }
    for (int o = 16; o > 0; o >>= 1) nan += __shfl_xor_sync(0xffffffffu, nan, o);
    if ((threadIdx.x & 31) == 0) {
        for (int f = 0; f < 4; ++f) {
            atomicMax(out + f, (unsigned long long)__double_as_longlong(ulps[f]));
            atomicMax(out + 4 + f, (unsigned long long)__double_as_longlong(tiny[f]));
        }
        atomicAdd(out + 8, nan);
    }
}
