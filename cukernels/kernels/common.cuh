// common.cuh: helpers shared by every cukernels source.
//
// The runtime (cukernels/runtime.py) pastes this text in place of the line that includes it,
// so CuPy's compile cache (keyed on the source text) sees every edit of this header.
// Sources are compiled by NVRTC: no host headers, no standard library.
//
// Element type T is float or double. Element counts are `long long` (arrays may hold
// more than 2^31 elements). Grids are padded: every thread bounds-checks its index.

// ---- math overloads, spelled out so that float stays float --------------------------
__device__ __forceinline__ float  ck_exp(float x)  { return expf(x); }
__device__ __forceinline__ double ck_exp(double x) { return exp(x); }
__device__ __forceinline__ float  ck_log(float x)  { return logf(x); }
__device__ __forceinline__ double ck_log(double x) { return log(x); }
__device__ __forceinline__ float  ck_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double ck_tanh(double x){ return tanh(x); }
__device__ __forceinline__ float  ck_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double ck_sqrt(double x){ return sqrt(x); }
__device__ __forceinline__ float  ck_max(float a, float b)   { return fmaxf(a, b); }
__device__ __forceinline__ double ck_max(double a, double b) { return fmax(a, b); }
template <typename T> __device__ __forceinline__ T ck_clamp(T x, T lo, T hi) {
    return x < lo ? lo : (x > hi ? hi : x);
}
template <typename T> __device__ __forceinline__ T ck_sign(T x) {
    return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
}

// ---- tuning knobs, rendered as #defines from Python (cukernels/_launch.py: UNROLL, STREAM) --
// CK_UNROLL: 16-byte packs per thread per iteration in the elementwise drivers
// CK_STREAM: 1 for streaming (evict-first) loads and stores of one-pass data

// ---- 16-byte packs: float4 for float, double2 for double ---------------------------
template <typename T> struct Pack16;
template <> struct Pack16<float>  { typedef float4  type; static const int N = 4; };
template <> struct Pack16<double> { typedef double2 type; static const int N = 2; };

template <typename T>
__device__ __forceinline__ void load16(const T* p, T (&v)[Pack16<T>::N]) {
    typedef typename Pack16<T>::type P;
#if CK_STREAM
    P q = __ldcs(reinterpret_cast<const P*>(p));
#else
    P q = *reinterpret_cast<const P*>(p);
#endif
    const T* s = reinterpret_cast<const T*>(&q);
#pragma unroll
    for (int j = 0; j < Pack16<T>::N; ++j) v[j] = s[j];
}
template <typename T>
__device__ __forceinline__ void store16(T* p, const T (&v)[Pack16<T>::N]) {
    typedef typename Pack16<T>::type P;
    P q;
    T* d = reinterpret_cast<T*>(&q);
#pragma unroll
    for (int j = 0; j < Pack16<T>::N; ++j) d[j] = v[j];
#if CK_STREAM
    __stcs(reinterpret_cast<P*>(p), q);
#else
    *reinterpret_cast<P*>(p) = q;
#endif
}

__device__ __forceinline__ long long ck_tid() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long ck_stride() {
    return (long long)gridDim.x * blockDim.x;
}

// ---- elementwise driver -------------------------------------------------------------
// out[i] = Op::apply(in0[i], in1[i], in2[i], p) for i < n. NIN (1..3) inputs are read.
// With vec != 0 (the host checked that every pointer is 16-byte aligned) the bulk moves in
// 16-byte packs, CK_UNROLL packs per thread per iteration, every load issued before the first
// use; the tail, and every element when vec == 0, moves one element at a time.
// `out` may alias any input: each element is read before it is written, by one thread.
template <typename T> struct EwParams { T a; T b; int code; };

template <typename T, int NIN, class Op>
__device__ __forceinline__ void ew_map(const T* in0, const T* in1, const T* in2, T* out,
                                       long long n, const EwParams<T>& p, int vec) {
    const int V = Pack16<T>::N, U = CK_UNROLL;
    const long long S = ck_stride();
    long long head = 0;
    if (vec) {
        const long long packs = n / V;
        for (long long c0 = ck_tid(); c0 < packs; c0 += S * U) {
            T a[U][V], b[U][V], d[U][V];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long c = c0 + u * S;
                if (c < packs) {
                    load16(in0 + c * V, a[u]);
                    if (NIN > 1) load16(in1 + c * V, b[u]);
                    if (NIN > 2) load16(in2 + c * V, d[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const long long c = c0 + u * S;
                if (c < packs) {
                    T r[V];
#pragma unroll
                    for (int j = 0; j < V; ++j)
                        r[j] = Op::apply(a[u][j], NIN > 1 ? b[u][j] : T(0), NIN > 2 ? d[u][j] : T(0), p);
                    store16(out + c * V, r);
                }
            }
        }
        head = packs * V;
    }
    for (long long i = head + ck_tid(); i < n; i += S)
        out[i] = Op::apply(in0[i], NIN > 1 ? in1[i] : T(0), NIN > 2 ? in2[i] : T(0), p);
}

// ---- reductions inside a group of G threads (G = 32: a warp; G > 32: the whole block) --
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = ck_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// Block-wide sum/max for blockDim.x == G (a multiple of 32, at most 1024). `scratch` holds
// 32 values. Every thread gets the result; the fixed tree makes it bitwise repeatable.
template <typename T, bool IS_MAX>
__device__ __forceinline__ T block_reduce(T v, T* scratch) {
    v = IS_MAX ? warp_max(v) : warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    __syncthreads();                       // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    T w = lane < nwarps ? scratch[lane] : (IS_MAX ? scratch[0] : T(0));
    return IS_MAX ? warp_max(w) : warp_sum(w);
}
