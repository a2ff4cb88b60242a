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

// Up to GRU_CAST_ARRAYS arrays per launch, each converted on its own: out_s[k] = the
// conversion of in_s[k] for k < n_s (n_s = 0: array s unused). Grid-stride over each array
// in turn; the loop over arrays unrolls, so each array's pointers stay in registers.
#define GRU_CAST_KERNEL(NAME, IN, OUT, CONVERT)                                               \
    template <int FMT>                                                                        \
    __global__ void NAME(const IN* in0, const IN* in1, const IN* in2, const IN* in3,          \
                         const IN* in4, const IN* in5, OUT* out0, OUT* out1, OUT* out2,       \
                         OUT* out3, OUT* out4, OUT* out5, long long n0, long long n1,         \
                         long long n2, long long n3, long long n4, long long n5) {            \
        const IN* in[GRU_CAST_ARRAYS] = {in0, in1, in2, in3, in4, in5};                       \
        OUT* out[GRU_CAST_ARRAYS] = {out0, out1, out2, out3, out4, out5};                     \
        const long long n[GRU_CAST_ARRAYS] = {n0, n1, n2, n3, n4, n5};                        \
        const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;             \
        const long long stride = (long long)gridDim.x * blockDim.x;                           \
        _Pragma("unroll") for (int s = 0; s < GRU_CAST_ARRAYS; ++s)                           \
            for (long long k = first; k < n[s]; k += stride)                                  \
                out[s][k] = CONVERT<FMT>(in[s][k]);                                           \
    }

GRU_CAST_KERNEL(gru_widen, unsigned short, float, gru_half_to_float)
GRU_CAST_KERNEL(gru_narrow, float, unsigned short, gru_float_to_half)
