// gru_common.cuh: what every GRU kernel family shares (torch.nn.GRU's maths, gate order
// r | z | n): the cell's maths forward and backward, the history's layout (reads and writes of
// one unit), the time index of a direction's step, the 16-byte dot product, and the barriers
// (a counter in global memory across blocks; a thread-block cluster's barrier).
//
// Forward, for direction d at step s (time t = s for d = 0, t = T - 1 - s for d = 1):
//   r  = sigmoid((gi_r + b_ir) + (gh_r + b_hr))      gi = x_t W_ih^T, gh = h W_hh^T
//   z  = sigmoid((gi_z + b_iz) + (gh_z + b_hz))
//   hn = gh_n + b_hn
//   n  = tanh((gi_n + b_in) + r * hn)
//   h' = (1 - z) * n + z * h
// Backward of one step (the gate-gradient step), with dh = dy_t + the carried gradient of h:
//   dn = dh (1 - z)(1 - n^2),  dz = dh (h - n) z (1 - z),  dr = dn hn r (1 - r)
//   d_gate_i = [dr, dz, dn],   d_gate_h = [dr, dz, dn r],  carry = dh z + d_gate_h W_hh
//
// Buffers, row-major, sizes T steps, B batch, H hidden, D directions (every family):
//   gi    (T, B, D, 3H)  input projection of every time step, bias not added (one GEMM)
//   hs    (D, S, B, H)   hidden states by step: slot s % S holds h before step s;
//                        S = T + 1 when training (all kept for backward), else S = 2
//   gates (D, T, B, 4H)  per step r | z | n | hn (training only): the saved history
//   y     (T, B, D*H)    outputs; direction d fills columns [d*H, (d+1)*H)
//   dgi   (T, B, D, 3H)  d_gate_i by time (the rows of x)
//   dgh   (D, T, B, 3H)  d_gate_h by step (the rows of hs)
// Offsets are long long where they may pass 2^31 (T*B*D*3H).
// The families: gru_steps.cu (one launch per step), gru_persist.cu (W_hh in shared memory,
// a cooperative grid), gru_tile.cu (W_hh in registers: block, cluster and grid scope),
// gru_tail.cu (the weight gradients' chunk sums), gru_probes.cu (barriers alone, timed by
// the benchmark). Constants shared with Python (GRU_*) are rendered from cugru/_catalog.py.
#include "common.cuh"

// ---- the cell's sigmoid and tanh. double: exp, an IEEE division and tanh. float: from the
// chip's 2^x and 1/x approximations (ex2.approx, rcp.approx) made accurate again around them,
// so that the cell's critical path (r's sigmoid, then n's tanh) is short and has no branch.
// Over every float32 input both stay within a few ulp of the exact value: the sigmoid's largest
// error about 1 ulp above that of expf with a division, the tanh's below tanhf's (measured by
// tools/cell_probe.py, bounded by a GPU test, test_gru_gpu's test_cell_functions_are_accurate);
// NaN stays NaN, and the modules are built with subnormals flushed to zero.
template <typename T> __device__ __forceinline__ T gru_sigmoid(T v) {
    return T(1) / (T(1) + ck_exp(-v));
}
template <typename T> __device__ __forceinline__ T gru_tanh(T v) { return ck_tanh(v); }

__device__ __forceinline__ float gru_ex2(float t) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
    return r;
}
// 1/d to about half an ulp: the approximate reciprocal and one Newton step (d finite, not 0)
__device__ __forceinline__ float gru_rcp(float d) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d));
    return fmaf(y, fmaf(-d, y, 1.0f), y);
}
// 1 / (1 + e^-v), e^-v = 2^(t + c): t = -v log2(e) rounded to float, c its rounding error (a product's
// error is exact in an FMA) plus -v times the error of log2(e) in float; 2^(t + c) =
// 2^t (1 + c ln 2) to within c^2. v is clamped to [-88, 88] first, beyond which sigmoid is 1
// or, flushed to zero, 0 in float32 (as it is from v = -87.34 on; the comparisons keep NaN), so
// that t, c and 1 + e^-v stay finite.
template <> __device__ __forceinline__ float gru_sigmoid<float>(float v) {
    const float u = v < -88.0f ? -88.0f : (v > 88.0f ? 88.0f : v);
    const float t = -u * 1.44269504f;
    const float c = fmaf(-u, 1.92596299e-8f, fmaf(-u, 1.44269504f, -t));
    const float e = gru_ex2(t);
    return gru_rcp(1.0f + fmaf(e, c * 0.693147181f, e));
}
// tanh(v): below |v| = GRU_TANH_SMALL the odd polynomial v + v^3 P(v^2) (a least-squares fit
// of relative error, weighted toward its largest), above it sign(v) (1 - 2 / (e^2|v| + 1)) with
// |v| clamped at 10 (tanh is 1 in float32 from 9.01): both computed, one selected, no branch.
// Each form takes v's sign (so tanh(-0) = -0, where the polynomial's sum of two zeros gives
// +0) before the selection. (Written on |v| with the sign taken once after the selection, or
// with the polynomial on |v|, ptxas spilled in a 512-thread tile kernel, which runs at its
// register limit.) NaN fails |v| < GRU_TANH_SMALL and stays NaN in the second form.
#define GRU_TANH_SMALL 0.9f
template <> __device__ __forceinline__ float gru_tanh<float>(float v) {
    const float a = fabsf(v), s = v * v;
    float p = -4.68006183e-4f;
    p = fmaf(p, s, 2.61745276e-3f);
    p = fmaf(p, s, -8.30238406e-3f);
    p = fmaf(p, s, 2.16838941e-2f);
    p = fmaf(p, s, -5.39348796e-2f);
    p = fmaf(p, s, 1.33330494e-1f);
    p = fmaf(p, s, -3.33333254e-1f);
    const float small = copysignf(fmaf(v * s, p, v), v);   // (only a zero's sign moves)
    const float b = a > 10.0f ? 10.0f : a;
    const float e = gru_ex2(b * 2.88539008f);
    const float big = copysignf(fmaf(-2.0f, gru_rcp(e + 1.0f), 1.0f), v);
    return a < GRU_TANH_SMALL ? small : big;
}

// the step's time index in direction d
__device__ __forceinline__ int gru_time(int d, int steps, int s) {
    return d == 0 ? s : steps - 1 - s;
}

// ---- variable lengths (cugru.gru_forward(..., lengths=)): every kernel takes `lengths`, B
// ints in 1..steps, or null for all equal to steps. Batch row b runs the steps whose time t
// is below its length: direction 0 its first lengths[b] steps, direction 1 from time
// lengths[b] - 1 down. The cells take whether their step runs (`run`): one that does not
// returns the state unchanged (the history's slot gets it too, y gets 0) and, backward,
// zero gate gradients and the carried gradient as it came (the caller leaves dy out of
// it). Folded into the cells, this holds no value beyond what the cell holds anyway: the
// 512-thread tile kernels run at their register limit. A step that runs computes exactly
// what it computes without lengths.
__device__ __forceinline__ int gru_length(const int* __restrict__ lengths, int b, int steps) {
    return lengths ? lengths[b] : steps;
}

// ---- quantization-aware cells (cugru.QuantSpec; the instances with QAT = true)
// fq(v) = (clamp(rint(v * inv) + zp, qmin, qmax) - zp) * scale, inv = 1/scale worked out in
// float32 on the host, is computed as clamp(rint(v * inv), lo, hi) * scale with the bounds
// shifted, lo = qmin - zp and hi = qmax - zp: the same values (cugru.QuantSpec keeps every
// shifted bound within 2^24, exact in float; a zero may come out as -0), and one parameter
// less to hold in registers. The
// straight-through estimator passes a gradient where lo <= rint(v * inv) <= hi. The kernels
// take the state's grid and the flags (1: the state is quantized, 2: the gates are) as the
// parameters q_scale, q_inv, q_lo, q_hi, q_flags. The history keeps the gates before their
// quantizers and the states as quantized; backward quantizes the gates again and recomputes
// the state before its quantizer with explicitly rounded products and sums (no contraction
// into an FMA), so forward and backward see the same bits and the masks cost no memory.
template <typename T> struct GruQuant {
    T scale, inv, lo, hi;
    int flags;
};
#define GRU_QUANT(T) \
    GruQuant<T> { q_scale, q_inv, q_lo, q_hi, q_flags }

__device__ __forceinline__ float gru_mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double gru_mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float gru_add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double gru_add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float gru_rint(float v) { return rintf(v); }
__device__ __forceinline__ double gru_rint(double v) { return rint(v); }

// fq(v) on the shifted bounds; `inside`: nothing was clipped. A NaN stays NaN (as in the
// numpy quantizer; fmin and fmax alone would turn it into a bound) and has no gradient.
template <typename T>
__device__ __forceinline__ T gru_fq(T v, T scale, T inv, T lo, T hi, bool& inside) {
    const T q = gru_rint(gru_mul_rn(v, inv));
    inside = q >= lo && q <= hi;
    return gru_mul_rn(q < lo ? lo : (q > hi ? hi : q), scale);   // (a NaN passes both tests)
}
// the gates' fixed grids: r and z on (1/256, 0, 0, 255), n on (2/256, 128, 0, 255)
template <typename T> __device__ __forceinline__ T gru_fq_rz(T v, bool& inside) {
    return gru_fq(v, T(1.0 / 256), T(256), T(0), T(255), inside);
}
template <typename T> __device__ __forceinline__ T gru_fq_n(T v, bool& inside) {
    return gru_fq(v, T(1.0 / 128), T(128), T(-128), T(127), inside);
}
// the new state before its quantizer, (1 - z) n + z h, rounded as written
template <typename T> __device__ __forceinline__ T gru_state_rn(T z, T n, T h) {
    return gru_add_rn(gru_mul_rn(T(1) - z, n), gru_mul_rn(z, h));
}

// One cell forward: x* = W_i x + b_i and h* = W_h h + b_h per gate (h_n is the candidate
// term hn); returns h' and the gates (with QAT: h' quantized where q says, the gates before
// their quantizers).
template <bool QAT, typename T>
__device__ __forceinline__ T gru_cell(T x_r, T x_z, T x_n, T h_r, T h_z, T hn, T h, T& r, T& z,
                                      T& n, const GruQuant<T>& q, bool run = true) {
    r = gru_sigmoid(x_r + h_r);
    z = gru_sigmoid(x_z + h_z);
    if constexpr (!QAT) {
        n = gru_tanh(x_n + r * hn);
        return run ? (T(1) - z) * n + z * h : h;
    } else {
        bool in;
        const bool g = q.flags & 2;
        T rq = r;
        if (g) rq = gru_fq_rz(r, in);
        n = gru_tanh(x_n + rq * hn);
        T zq = z, nq = n;
        if (g) {
            zq = gru_fq_rz(z, in);
            nq = gru_fq_n(n, in);
        }
        const T pre = gru_state_rn(zq, nq, h);
        if (!run) return h;
        if (q.flags & 1) return gru_fq(pre, q.scale, q.inv, q.lo, q.hi, in);
        return pre;
    }
}

// One cell backward from dh = dy + carry: the gate gradients, and the direct part dh*z of
// the gradient carried to the previous step; r_used is the r that multiplied hn (the
// quantized r with QAT), which d_gate_h's n block takes. With QAT, the straight-through
// estimator: each quantizer passes the gradient where it did not clip, else 0.
template <bool QAT, typename T>
__device__ __forceinline__ T gru_cell_backward(T dh, T r, T z, T n, T hn, T h, T& dr, T& dz,
                                               T& dn, T& r_used, const GruQuant<T>& q,
                                               bool run = true) {
    if (!run) {
        dr = dz = dn = r_used = T(0);
        return dh;
    }
    if constexpr (!QAT) {
        dn = dh * (T(1) - z) * (T(1) - n * n);
        dz = dh * (h - n) * z * (T(1) - z);
        dr = dn * hn * r * (T(1) - r);
        r_used = r;
        return dh * z;
    } else {
        const bool g = q.flags & 2;
        T zq = z, nq = n;
        bool mz = true, mn = true, mr = true;
        if (g) {
            zq = gru_fq_rz(z, mz);
            nq = gru_fq_n(n, mn);
        }
        if (q.flags & 1) {
            bool mh;
            gru_fq(gru_state_rn(zq, nq, h), q.scale, q.inv, q.lo, q.hi, mh);
            if (!mh) dh = T(0);
        }
        dz = mz ? dh * (h - nq) * z * (T(1) - z) : T(0);
        dn = mn ? dh * (T(1) - zq) * (T(1) - n * n) : T(0);
        r_used = r;
        if (g) r_used = gru_fq_rz(r, mr);
        dr = mr ? dn * hn * r * (T(1) - r) : T(0);
        return dh * zq;
    }
}

// the forward outputs of unit j, row b, direction d at step s (time t): h into its hs slot,
// y (h, or 0 where the step did not `run`), and with TRAIN the history
template <typename T, bool TRAIN>
__device__ __forceinline__ void gru_write_forward(T* hs, T* y, T* gates, T h_new, bool run, T r,
                                                  T z, T n, T hn, int d, int D, int s, int t,
                                                  int b, int j, int steps, int B, int H,
                                                  int S) {
    hs[((long long)d * S + (s + 1) % S) * B * H + (long long)b * H + j] = h_new;
    y[((long long)t * B + b) * D * H + (long long)d * H + j] = run ? h_new : T(0);
    if (TRAIN) {
        T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
        g[j] = r;
        g[H + j] = z;
        g[2 * H + j] = n;
        g[3 * H + j] = hn;
    }
}

// the history of unit j, row b, direction d at step s: gates r, z, n, hn and the state h
template <typename T>
__device__ __forceinline__ void gru_read_history(const T* gates, const T* hs, int d, int s,
                                                 int b, int j, int steps, int B, int H, T& r,
                                                 T& z, T& n, T& hn, T& h) {
    const T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
    r = g[j];
    z = g[H + j];
    n = g[2 * H + j];
    hn = g[3 * H + j];
    h = hs[(((long long)d * (steps + 1) + s) * B + b) * H + j];
}

// the gate gradients of unit j, row b: dgi by time t, dgh by step s (stored as O: T, or
// double where the per-step path's tail runs in float64)
template <typename O, typename T>
__device__ __forceinline__ void gru_write_backward(O* dgi, O* dgh, T dr, T dz, T dn, T r, int d,
                                                   int D, int s, int t, int b, int j, int steps,
                                                   int B, int H) {
    const long long H3 = 3LL * H;
    O* gi_row = dgi + ((long long)t * B + b) * D * H3 + d * H3;
    gi_row[j] = O(dr);
    gi_row[H + j] = O(dz);
    gi_row[2 * H + j] = O(dn);
    O* gh_row = dgh + (((long long)d * steps + s) * B + b) * H3;
    gh_row[j] = O(dr);
    gh_row[H + j] = O(dz);
    gh_row[2 * H + j] = O(dn * r);
}

// A barrier across `count` blocks through a counter in global memory, in two halves. After a
// __syncthreads that follows the block's writes, thread 0 arrives (release, GPU scope) and
// raises its running goal `target` by count; a wait (thread 0 spins, acquire, then
// __syncthreads) returns once every block has arrived as often as this one.
__device__ __forceinline__ void gru_group_arrive(unsigned int* counter, unsigned int count,
                                                 unsigned int& target) {
    if (threadIdx.x == 0) {
        target += count;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    }
}
__device__ __forceinline__ void gru_group_wait(const unsigned int* counter,
                                               unsigned int target) {
    if (threadIdx.x == 0) {
        unsigned int seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                         : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// All `count` blocks of one direction wait here; `target` is thread 0's running goal.
__device__ __forceinline__ void gru_group_barrier(unsigned int* counter, unsigned int count,
                                                  unsigned int& target) {
    __syncthreads();
    if (count > 1) {
        gru_group_arrive(counter, count, target);
        gru_group_wait(counter, target);
    }
}

__device__ __forceinline__ int gru_round_up(int v, int m) { return (v + m - 1) / m * m; }

// acc += sum over the pack of w[u] * v[u], in order
template <typename T>
__device__ __forceinline__ void gru_dot16(T& acc, const T (&w)[Pack16<T>::N],
                                          const T (&v)[Pack16<T>::N]) {
#pragma unroll
    for (int u = 0; u < Pack16<T>::N; ++u) acc += w[u] * v[u];
}

// ---- thread-block clusters (sm_90 on): the cluster's shape, a block's rank, its barrier
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define GRU_CLUSTER_DIMS(c) __cluster_dims__(c, 1, 1)
#else
#define GRU_CLUSTER_DIMS(c)
#endif

template <int C> __device__ __forceinline__ int gru_cluster_rank() {
    unsigned int r = 0;
#if __CUDA_ARCH__ >= 900
    if (C > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return (int)r;
}

// every thread of the cluster (C > 1, release/acquire) or of the block waits here
template <int C> __device__ __forceinline__ void gru_cluster_barrier() {
#if __CUDA_ARCH__ >= 900
    if (C > 1) {
        asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                     "barrier.cluster.wait.acquire.aligned;" ::: "memory");
        return;
    }
#endif
    __syncthreads();
}
