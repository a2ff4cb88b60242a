// gru_cast.cu: float16 and bfloat16 data (cugru/_half.py). A call on half-precision data
// computes in float32: its inputs are widened to float32 once (exact for both formats), the
// float32 pass runs, and each result is rounded once to the data's format: to nearest, ties
// to even, beyond the format's range to infinity, a NaN stays a NaN (the rounding of numpy's
// float16 and of ml_dtypes' bfloat16). Both formats travel as their 16 bits.
//   FMT 0: float16 (IEEE binary16)    FMT 1: bfloat16 (the upper 16 bits of a float32)
#include "gru_common.cuh"

template <int FMT> __device__ __forceinline__ float gru_half_to_float(unsigned short v) {
    if (FMT == 1) return __uint_as_float((unsigned)v << 16);
    float out;
    asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(v));
    return out;
}

template <int FMT> __device__ __forceinline__ unsigned short gru_float_to_half(float v) {
    if (FMT == 0) {
        unsigned short out;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(v));
        return out;
    }
    const unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u)                 // NaN: keep the sign, make it quiet
        return (unsigned short)((u >> 16) | 0x0040u);
    // add just under half a unit of the kept bits, plus the kept bits' lowest bit: a tie
    // rounds to the even neighbour; a carry into the exponent is the right result, up to
    // infinity
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// out[k] = in[k] widened to float, k < n (grid-stride)
template <int FMT>
__global__ void gru_widen(const unsigned short* __restrict__ in, float* __restrict__ out,
                          long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride)
        out[k] = gru_half_to_float<FMT>(in[k]);
}

// out[k] = in[k] rounded to the format, k < n (grid-stride)
template <int FMT>
__global__ void gru_narrow(const float* __restrict__ in, unsigned short* __restrict__ out,
                           long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride)
        out[k] = gru_float_to_half<FMT>(in[k]);
}
