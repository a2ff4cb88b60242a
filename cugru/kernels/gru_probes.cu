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

// The cell's float sigmoid and tanh (gru_common.cuh) beside their IEEE forms (expf and a
// division; tanhf) and the fast intrinsics (__expf and __fdividef; tanh.approx), against the
// exact values in double, over the float32 inputs whose bit patterns are first + i * stride
// (i < count, wrapping at 2^32). The exact value is that of the input's bits (a subnormal
// input is not flushed there, though every float form sees it as zero). One launch measures
// function fn (0..5: sigmoid, tanh, their IEEE forms, their fast forms): out[0], as ordered
// bits of a non-negative double (atomicMax), the largest error in units of the last place of
// the exact value in float32 where that is a normal float32 (at least FLT_MIN in magnitude);
// out[1] the largest absolute error where it is smaller (what the flush to zero touches);
// out[2] counts the results that are NaN where the exact value is not, or the other way
// round, or a zero of the other sign than the exact value's.
__device__ __forceinline__ float gru_tanh_approx(float v) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(v));
    return t;
}

__global__ void __launch_bounds__(256)
gru_cell_error_probe(int fn, unsigned int first, unsigned int stride, long long count,
                     unsigned long long* out) {
    double ulps = 0.0, tiny = 0.0;
    unsigned long long bad = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        const unsigned int bits = first + (unsigned int)i * stride;
        const float v = __uint_as_float(bits);
        // (the input's own value: a conversion to double would flush a subnormal)
        const double x = (bits & 0x7f800000u)
            ? (double)v
            : copysign(ldexp((double)(bits & 0x7fffffu), -149), (bits >> 31) ? -1.0 : 1.0);
        const bool sig = (fn & 1) == 0;
        const double exact = sig ? 1.0 / (1.0 + exp(-x)) : tanh(x);
        float got;
        switch (fn) {
            case 0: got = gru_sigmoid(v); break;
            case 1: got = gru_tanh(v); break;
            case 2: got = 1.0f / (1.0f + expf(-v)); break;
            case 3: got = tanhf(v); break;
            case 4: got = __fdividef(1.0f, 1.0f + __expf(-v)); break;
            default: got = gru_tanh_approx(v); break;
        }
        if (isnan(got) || isnan(exact)) {
            bad += isnan(got) != isnan(exact);
            continue;
        }
        const double a = fabs(exact), err = fabs((double)got - exact);
        if (got == 0.0f && signbit(got) != signbit(exact)) ++bad;
        if (a >= 1.1754943508222875e-38) ulps = fmax(ulps, err / ldexp(1.0, ilogb(a) - 23));
        else tiny = fmax(tiny, err);
    }
    for (int o = 16; o > 0; o >>= 1) {
        ulps = fmax(ulps, __shfl_xor_sync(0xffffffffu, ulps, o));
        tiny = fmax(tiny, __shfl_xor_sync(0xffffffffu, tiny, o));
        bad += __shfl_xor_sync(0xffffffffu, bad, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(out, (unsigned long long)__double_as_longlong(ulps));
        atomicMax(out + 1, (unsigned long long)__double_as_longlong(tiny));
        atomicAdd(out + 2, bad);
    }
}
