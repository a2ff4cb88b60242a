// gru.cu: the GRU's kernels (torch.nn.GRU's maths, gate order r | z | n): the pointwise step
// kernels of the per-step path, and the persistent kernels of the fast path (below).
//
// Forward, for direction d at step s (time t = s for d = 0, t = T - 1 - s for d = 1):
//   r  = sigmoid((gi_r + b_ir) + (gh_r + b_hr))      gi = x_t W_ih^T, gh = h W_hh^T
//   z  = sigmoid((gi_z + b_iz) + (gh_z + b_hz))
//   hn = gh_n + b_hn
//   n  = tanh((gi_n + b_in) + r * hn)
//   h' = (1 - z) * n + z * h
// Backward (the patent's S1), with dh = dy_t + the carried gradient of h:
//   dn = dh (1 - z)(1 - n^2),  dz = dh (h - n) z (1 - z),  dr = dn hn r (1 - r)
//   d_gate_i = [dr, dz, dn],   d_gate_h = [dr, dz, dn r],  carry = dh z  (+ d_gate_h W_hh, a GEMM)
//
// Buffers, row-major, sizes T steps, B batch, H hidden, D directions:
//   gi    (T, B, D, 3H)  input projection of every time step, bias not added (one GEMM)
//   gh    (D, B, 3H)     recurrent product of the current step, bias not added (one GEMM)
//   hs    (D, S, B, H)   hidden states by step: slot s % S holds h before step s;
//                        S = T + 1 when training (all kept for backward), else S = 2
//   gates (D, T, B, 4H)  per step r | z | n | hn (training only): the saved history
//   y     (T, B, D*H)    outputs; direction d fills columns [d*H, (d+1)*H)
//   dgi   (T, B, D, 3H)  d_gate_i by time (the rows of x)
//   dgh   (D, T, B, 3H)  d_gate_h by step (the rows of hs)
//   dh    (D, B, H)      carried gradient of h: read, then overwritten with dh * z
// Per-step kernels: grid (ceil(B*H / blockDim.x), D), one thread per (b, j) of one direction;
// both directions run in the same launch. Offsets are long long (T*B*D*3H may pass 2^31).
#include "common.cuh"

template <typename T> __device__ __forceinline__ T gru_sigmoid(T v) {
    return T(1) / (T(1) + ck_exp(-v));
}

// the step's time index in direction d
__device__ __forceinline__ int gru_time(int d, int steps, int s) {
    return d == 0 ? s : steps - 1 - s;
}

// One cell forward: x* = W_i x + b_i and h* = W_h h + b_h per gate (h_n is the candidate
// term hn); returns h' and the gates.
template <typename T>
__device__ __forceinline__ T gru_cell(T x_r, T x_z, T x_n, T h_r, T h_z, T hn, T h, T& r, T& z,
                                      T& n) {
    r = gru_sigmoid(x_r + h_r);
    z = gru_sigmoid(x_z + h_z);
    n = ck_tanh(x_n + r * hn);
    return (T(1) - z) * n + z * h;
}

// One cell backward from dh = dy + carry: the gate gradients, and the direct part dh*z of
// the gradient carried to the previous step.
template <typename T>
__device__ __forceinline__ T gru_cell_backward(T dh, T r, T z, T n, T hn, T h, T& dr, T& dz,
                                               T& dn) {
    dn = dh * (T(1) - z) * (T(1) - n * n);
    dz = dh * (h - n) * z * (T(1) - z);
    dr = dn * hn * r * (T(1) - r);
    return dh * z;
}

// the forward outputs of unit j, row b, direction d at step s (time t): h into its hs slot,
// y, and with TRAIN the history
template <typename T, bool TRAIN>
__device__ __forceinline__ void gru_write_forward(T* hs, T* y, T* gates, T h_new, T r, T z, T n,
                                                  T hn, int d, int D, int s, int t, int b, int j,
                                                  int steps, int B, int H, int S) {
    hs[((long long)d * S + (s + 1) % S) * B * H + (long long)b * H + j] = h_new;
    y[((long long)t * B + b) * D * H + (long long)d * H + j] = h_new;
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

// the gate gradients of unit j, row b: dgi by time t, dgh by step s
template <typename T>
__device__ __forceinline__ void gru_write_backward(T* dgi, T* dgh, T dr, T dz, T dn, T r, int d,
                                                   int D, int s, int t, int b, int j, int steps,
                                                   int B, int H) {
    const long long H3 = 3LL * H;
    T* gi_row = dgi + ((long long)t * B + b) * D * H3 + d * H3;
    gi_row[j] = dr;
    gi_row[H + j] = dz;
    gi_row[2 * H + j] = dn;
    T* gh_row = dgh + (((long long)d * steps + s) * B + b) * H3;
    gh_row[j] = dr;
    gh_row[H + j] = dz;
    gh_row[2 * H + j] = dn * r;
}

// ---- the per-step path: one launch per step and pass -------------------------------------
template <typename T, bool TRAIN>
__global__ void gru_forward_step(const T* __restrict__ gi, const T* __restrict__ gh,
                                 const T* __restrict__ b_ih, const T* __restrict__ b_hh,
                                 T* __restrict__ hs, T* __restrict__ y, T* __restrict__ gates,
                                 int steps, int B, int H, int S, int s) {
    const int D = gridDim.y, d = blockIdx.y;
    const long long BH = (long long)B * H, H3 = 3LL * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    const T* gi_row = gi + ((long long)t * B + b) * D * H3 + d * H3;
    const T* gh_row = gh + ((long long)d * B + b) * H3;
    const T* bi = b_ih + d * H3;
    const T* bh = b_hh + d * H3;
    const T h = hs[((long long)d * S + s % S) * BH + i];
    const T hn = gh_row[2 * H + j] + bh[2 * H + j];
    T r, z, n;
    const T h_new = gru_cell(gi_row[j] + bi[j], gi_row[H + j] + bi[H + j],
                             gi_row[2 * H + j] + bi[2 * H + j], gh_row[j] + bh[j],
                             gh_row[H + j] + bh[H + j], hn, h, r, z, n);
    gru_write_forward<T, TRAIN>(hs, y, gates, h_new, r, z, n, hn, d, D, s, t, b, j, steps, B,
                                H, S);
}

template <typename T>
__global__ void gru_backward_step(const T* __restrict__ dy, const T* __restrict__ gates,
                                  const T* __restrict__ hs, T* dh, T* __restrict__ dgi,
                                  T* __restrict__ dgh, int steps, int B, int H, int s) {
    const int D = gridDim.y, d = blockIdx.y;
    const long long BH = (long long)B * H;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BH) return;
    const int b = (int)(i / H), j = (int)(i - (long long)b * H);
    const int t = gru_time(d, steps, s);
    T r, z, n, hn, h, dr, dz, dn;
    gru_read_history(gates, hs, d, s, b, j, steps, B, H, r, z, n, hn, h);
    const T dhv = dy[((long long)t * B + b) * D * H + (long long)d * H + j] + dh[d * BH + i];
    const T dhz = gru_cell_backward(dhv, r, z, n, hn, h, dr, dz, dn);
    gru_write_backward(dgi, dgh, dr, dz, dn, r, d, D, s, t, b, j, steps, B, H);
    dh[d * BH + i] = dhz;
}

// ---- the fast path: the whole recurrence in one launch per pass --------------------------
// Same maths and buffers as the per-step kernels, so the input GEMM before and the
// weight-gradient GEMMs after are shared.
//
// Work split. Direction d runs on the gridDim.x blocks of grid row d; block x owns the hidden
// units [j0, j0 + J), j0 = x*J, and keeps its slice of W_hh in shared memory for all steps:
//   forward   w_s[g*J + jj][k] = W_hh[d][g*H + j0 + jj][k]   (3J x H: its units' rows)
//   backward  w_s[jj][r]       = W_hh[d][r][j0 + jj]         (J x 3H: its units' columns)
//   (rows padded to a multiple of the 16-byte pack, plus one pack, against bank conflicts)
// Thread (jj = tid % J, bl = tid / J) computes unit j0 + jj for batch rows b = bl + i*(nt/J),
// i < MAXP. Each step it first loads what the pointwise step needs and does not depend on the
// recurrence (gi, or dy and the saved gates), then stages the vector the product needs (h, or
// the next step's d_gate_h) in shared memory, in chunks of KC elements (the whole vector when
// it fits), with every load of a chunk in flight at once; it accumulates its MAXP dot
// products from 16-byte packs in a fixed order (the same bits every run), applies the
// pointwise step (its own h stays in registers), writes its outputs to global memory, and
// waits at a barrier of its direction's blocks before the next step reads them:
// __syncthreads when the direction has one block, else a counter in global memory
// (release/acquire at GPU scope). The blocks must all be resident: the host launches
// cooperatively and sizes the grid with the occupancy API. Reads of data other blocks wrote
// go through L2 (__ldcg).
//
// Forward step s, t = s (d = 0) or T-1-s (d = 1):
//   r, z, n, hn, h' from gi[t], h W_hh^T (this kernel) and the biases; writes hs, y, gates.
// Backward step s, from T-1 down to 0:
//   carry = dh*z (kept from step s+1) + d_gate_h[s+1] W_hh   (dh_n at s = T-1)
//   dh = dy[t] + carry; dn, dz, dr as in gru.cu; writes dgi[t], dgh[s]; after the loop
//   dh0 = dh*z + d_gate_h[0] W_hh.
#define GRU_NT 256       // threads per block (the host launches exactly this many)

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

// v_s[b][0, kcr) = src[b*ld + k0 + kk] for kk < kc, zeros up to kcr = kc rounded up to the
// pack; rows of v_s are ldv apart. Four loads per thread are in flight per round, through L2.
template <typename T>
__device__ __forceinline__ void gru_stage(T* v_s, int ldv, const T* src, long long ld, int B,
                                          int k0, int kc) {
    const int kcr = gru_round_up(kc, Pack16<T>::N), n = B * kcr;
    __syncthreads();
    for (int base = threadIdx.x; base < n; base += 4 * GRU_NT) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * GRU_NT, b = idx / kcr, kk = idx - b * kcr;
            v[u] = (idx < n && kk < kc) ? __ldcg(src + b * ld + k0 + kk) : T(0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * GRU_NT, b = idx / kcr, kk = idx - b * kcr;
            if (idx < n) v_s[b * ldv + kk] = v[u];
        }
    }
    __syncthreads();
}

// acc += sum over the pack of w[u] * v[u], in order
template <typename T>
__device__ __forceinline__ void gru_dot16(T& acc, const T (&w)[Pack16<T>::N],
                                          const T (&v)[Pack16<T>::N]) {
#pragma unroll
    for (int u = 0; u < Pack16<T>::N; ++u) acc += w[u] * v[u];
}

// one 16-byte pack of k for the three gates of this thread's rows
template <typename T, int MAXP>
__device__ __forceinline__ void gru_fwd_pack(T (&acc)[MAXP][3], const T* wr_s, const T* wz_s,
                                             const T* wn_s, const T* h_s, int KCP, int k0,
                                             int kk, int bl, int rb, int B) {
    constexpr int V = Pack16<T>::N;
    T wr[V], wz[V], wn[V];
    load16(wr_s + k0 + kk, wr);
    load16(wz_s + k0 + kk, wz);
    load16(wn_s + k0 + kk, wn);
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int b = bl + i * rb;
        if (b < B) {
            T hv[V];
            load16(h_s + b * KCP + kk, hv);
            gru_dot16(acc[i][0], wr, hv);
            gru_dot16(acc[i][1], wz, hv);
            gru_dot16(acc[i][2], wn, hv);
        }
    }
}

template <typename T, int MAXP, bool TRAIN>
__global__ void __launch_bounds__(GRU_NT, 1)
gru_persist_forward(const T* __restrict__ gi, const T* __restrict__ w_hh,
                    const T* __restrict__ b_ih, const T* __restrict__ b_hh, T* hs,
                    T* __restrict__ y, T* __restrict__ gates, unsigned int* barrier,
                    int steps, int B, int H, int S, int J, int KC) {
    constexpr int V = Pack16<T>::N;
    extern __shared__ __align__(16) unsigned char gru_smem[];
    const int HP = gru_round_up(H, V) + V, KCP = KC + V;
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* h_s = w_s + 3LL * J * HP;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < 3LL * J * HP; idx += GRU_NT) {
        const int row = (int)(idx / HP), k = (int)(idx - (long long)row * HP);
        const int g = row / J, u = row - g * J;
        w_s[idx] = (u < Jb && k < H) ? w[((long long)g * H + j0 + u) * H + k] : T(0);
    }
    const int rb = GRU_NT / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
    const bool active = bl < rb && jj < Jb;
    const int j = j0 + jj;
    T bi[3] = {T(0), T(0), T(0)}, bh[3] = {T(0), T(0), T(0)}, h_own[MAXP];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int b = bl + i * rb;
        h_own[i] = (active && b < B) ? hs[(long long)d * S * BH + (long long)b * H + j] : T(0);
    }
    if (active) {
#pragma unroll
        for (int g = 0; g < 3; ++g) {
            bi[g] = b_ih[d * H3 + g * H + j];
            bh[g] = b_hh[d * H3 + g * H + j];
        }
    }
    const T* wr_s = w_s + (0LL * J + jj) * HP;
    const T* wz_s = w_s + (1LL * J + jj) * HP;
    const T* wn_s = w_s + (2LL * J + jj) * HP;
    // the input projection of a step does not depend on the recurrence: step s + 1's is loaded
    // before the barrier that ends step s
    T x_r[MAXP], x_z[MAXP], x_n[MAXP];
    auto load_x = [&](int s) {
        const int t = gru_time(d, steps, s);
#pragma unroll
        for (int i = 0; i < MAXP; ++i) {
            const int b = bl + i * rb;
            const bool ok = active && b < B;
            const T* g_row = gi + ((long long)t * B + (ok ? b : 0)) * D * H3 + d * H3;
            x_r[i] = ok ? g_row[j] : T(0);
            x_z[i] = ok ? g_row[H + j] : T(0);
            x_n[i] = ok ? g_row[2 * H + j] : T(0);
        }
    };
    load_x(0);
    unsigned int target = 0;
    for (int s = 0; s < steps; ++s) {
        const int t = gru_time(d, steps, s);
        const T* h_prev = hs + ((long long)d * S + s % S) * BH;
        // two sets of partial sums (even and odd packs) for twice the independent FMAs
        T acc[MAXP][3], acc2[MAXP][3];
#pragma unroll
        for (int i = 0; i < MAXP; ++i)
#pragma unroll
            for (int g = 0; g < 3; ++g) acc[i][g] = acc2[i][g] = T(0);
        for (int k0 = 0; k0 < H; k0 += KC) {
            const int kc = min(KC, H - k0);
            gru_stage(h_s, KCP, h_prev, H, B, k0, kc);
            if (active) {
                const int kcr = gru_round_up(kc, V);
                int kk = 0;
                for (; kk + V < kcr; kk += 2 * V) {
                    gru_fwd_pack<T, MAXP>(acc, wr_s, wz_s, wn_s, h_s, KCP, k0, kk, bl, rb, B);
                    gru_fwd_pack<T, MAXP>(acc2, wr_s, wz_s, wn_s, h_s, KCP, k0, kk + V, bl, rb,
                                          B);
                }
                if (kk < kcr)
                    gru_fwd_pack<T, MAXP>(acc, wr_s, wz_s, wn_s, h_s, KCP, k0, kk, bl, rb, B);
            }
        }
#pragma unroll
        for (int i = 0; i < MAXP; ++i)
#pragma unroll
            for (int g = 0; g < 3; ++g) acc[i][g] += acc2[i][g];
        if (active) {
#pragma unroll
            for (int i = 0; i < MAXP; ++i) {
                const int b = bl + i * rb;
                if (b >= B) continue;
                const T hn = acc[i][2] + bh[2];
                T r, z, n;
                const T h_new = gru_cell(x_r[i] + bi[0], x_z[i] + bi[1], x_n[i] + bi[2],
                                         acc[i][0] + bh[0], acc[i][1] + bh[1], hn, h_own[i],
                                         r, z, n);
                h_own[i] = h_new;
                gru_write_forward<T, TRAIN>(hs, y, gates, h_new, r, z, n, hn, d, D, s, t, b,
                                            j, steps, B, H, S);
            }
        }
        if (s + 1 < steps) load_x(s + 1);
        gru_group_barrier(barrier + d, gridDim.x, target);
    }
}

// acc[i] = sum over r < 3H of dgh_step[b][r] * w_row[r], staged in chunks of KC
template <typename T, int MAXP>
__device__ __forceinline__ void gru_back_pack(T (&acc)[MAXP], const T* w_row, const T* g_s,
                                              int KCP, int r0, int rr, int bl, int rb, int B) {
    constexpr int V = Pack16<T>::N;
    T wv[V];
    load16(w_row + r0 + rr, wv);
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int b = bl + i * rb;
        if (b < B) {
            T gv[V];
            load16(g_s + b * KCP + rr, gv);
            gru_dot16(acc[i], wv, gv);
        }
    }
}

// acc[i] = sum over r < 3H of dgh_step[b][r] * w_row[r], staged in chunks of KC; even and
// odd packs in two partial sums, added at the end
template <typename T, int MAXP>
__device__ __forceinline__ void gru_back_product(T (&acc)[MAXP], T* g_s, int KCP,
                                                 const T* w_row, const T* dgh_step, int B,
                                                 int H, int KC, int bl, int rb, bool active) {
    constexpr int V = Pack16<T>::N;
    T acc2[MAXP];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) acc[i] = acc2[i] = T(0);
    for (int r0 = 0; r0 < 3 * H; r0 += KC) {
        const int rc = min(KC, 3 * H - r0);
        gru_stage(g_s, KCP, dgh_step, 3LL * H, B, r0, rc);
        if (active) {
            const int rcr = gru_round_up(rc, V);
            int rr = 0;
            for (; rr + V < rcr; rr += 2 * V) {
                gru_back_pack<T, MAXP>(acc, w_row, g_s, KCP, r0, rr, bl, rb, B);
                gru_back_pack<T, MAXP>(acc2, w_row, g_s, KCP, r0, rr + V, bl, rb, B);
            }
            if (rr < rcr) gru_back_pack<T, MAXP>(acc, w_row, g_s, KCP, r0, rr, bl, rb, B);
        }
    }
#pragma unroll
    for (int i = 0; i < MAXP; ++i) acc[i] += acc2[i];
}

template <typename T, int MAXP>
__global__ void __launch_bounds__(GRU_NT, 1)
gru_persist_backward(const T* __restrict__ dy, const T* __restrict__ gates,
                     const T* __restrict__ hs, const T* __restrict__ w_hh,
                     const T* __restrict__ dh_n, T* __restrict__ dgi, T* dgh,
                     T* __restrict__ dh0, unsigned int* barrier, int steps, int B, int H,
                     int J, int KC) {
    constexpr int V = Pack16<T>::N;
    extern __shared__ __align__(16) unsigned char gru_smem[];
    const int RP = gru_round_up(3 * H, V) + V, KCP = KC + V;
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* g_s = w_s + (long long)J * RP;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < (long long)J * RP; idx += GRU_NT) {
        const int u = (int)(idx / RP), r = (int)(idx - (long long)u * RP);
        w_s[idx] = (u < Jb && r < 3 * H) ? w[(long long)r * H + j0 + u] : T(0);
    }
    const int rb = GRU_NT / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
    const bool active = bl < rb && jj < Jb;
    const int j = j0 + jj;
    const T* w_row = w_s + (long long)jj * RP;
    T carry[MAXP], dhz[MAXP];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int b = bl + i * rb;
        carry[i] = (active && b < B) ? dh_n[d * BH + (long long)b * H + j] : T(0);
        dhz[i] = T(0);
    }
    const T* dgh_d = dgh + (long long)d * steps * B * H3;
    unsigned int target = 0;
    // what S1 reads besides the carry does not depend on the recurrence: step s - 1's is
    // loaded before the barrier that ends step s
    T g_r[MAXP], g_z[MAXP], g_n[MAXP], g_hn[MAXP], h_old[MAXP], dy_v[MAXP];
    auto load_s1 = [&](int s) {
        const int t = gru_time(d, steps, s);
#pragma unroll
        for (int i = 0; i < MAXP; ++i) {
            const int b = bl + i * rb;
            const bool ok = active && b < B;
            gru_read_history(gates, hs, d, s, ok ? b : 0, ok ? j : 0, steps, B, H, g_r[i],
                             g_z[i], g_n[i], g_hn[i], h_old[i]);
            dy_v[i] = ok ? dy[((long long)t * B + b) * D * H + (long long)d * H + j] : T(0);
        }
    };
    load_s1(steps - 1);
    for (int s = steps - 1; s >= 0; --s) {
        const int t = gru_time(d, steps, s);
        if (s < steps - 1) {
            T acc[MAXP];
            gru_back_product<T, MAXP>(acc, g_s, KCP, w_row, dgh_d + (long long)(s + 1) * B * H3,
                                      B, H, KC, bl, rb, active);
#pragma unroll
            for (int i = 0; i < MAXP; ++i) carry[i] = dhz[i] + acc[i];
        }
        if (active) {
#pragma unroll
            for (int i = 0; i < MAXP; ++i) {
                const int b = bl + i * rb;
                if (b >= B) continue;
                T dr, dz, dn;
                dhz[i] = gru_cell_backward(dy_v[i] + carry[i], g_r[i], g_z[i], g_n[i], g_hn[i],
                                           h_old[i], dr, dz, dn);
                gru_write_backward(dgi, dgh, dr, dz, dn, g_r[i], d, D, s, t, b, j, steps, B, H);
            }
        }
        if (s > 0) load_s1(s - 1);
        gru_group_barrier(barrier + d, gridDim.x, target);
    }
    T acc[MAXP];
    gru_back_product<T, MAXP>(acc, g_s, KCP, w_row, dgh_d, B, H, KC, bl, rb, active);
    if (active) {
#pragma unroll
        for (int i = 0; i < MAXP; ++i) {
            const int b = bl + i * rb;
            if (b < B) dh0[d * BH + (long long)b * H + j] = dhz[i] + acc[i];
        }
    }
}

// ---- the fast path with weights in registers: block, cluster and grid scope ----------------
// A group of C blocks (C = 1: one block; C > 1: a thread-block cluster; C = 0: G blocks that
// meet at a counter in global memory, "grid scope") of NT threads runs one direction d for
// one group of R <= MR batch rows, b0 = g*R: gridDim.y = D. Groups are independent (the
// recurrence never mixes batch rows). At block and cluster scope gridDim.x = groups * C, one
// group per cluster, and groups need not be resident at once. At grid scope gridDim.x =
// slots * G: the G blocks of a slot take groups g = slot, slot + slots, ... one after the
// other, and the host launches cooperatively (every block resident). Block c of a group
// owns units [j0, j0 + J), j0 = c*J. A step has two phases.
// 1. The product. Thread tid = n*KS + ks (lane ks), n*U < J, holds for its U units
//    u = n*U + v (v < U) the weights of the Q 16-byte packs p = ks + q*KS (q < Q) of each
//    gate, in registers, zero past H (unit j = j0 + u):
//      forward   w[v][g][q] = W_hh[d][g*H + j][p*V ...]   (row j of each gate: k = p*V + e)
//      backward  w[v][g][q] = W_hh[d][g*H + p*V ...][j]   (column j: rows g*H + p*V + e)
//    It multiplies them with the vector each block keeps whole in shared memory: h (MR rows
//    of HS) forward, d_gate_h (MR rows of 3 segments of HS) backward. HS = KS*Q*V >= H, and
//    the vector is zero past H and in the rows past R, so every lane runs exactly Q packs of
//    MR rows, with no branch; each pack it loads serves its U units (U > 1: fewer shared-
//    memory loads per multiply-add). Its sum for unit u (with U = 1: even and odd q apart,
//    then added) goes to part[row][gate][u][ks].
// 2. The pointwise step, after __syncthreads. Thread p < J*R serves unit u = p % J of row
//    i = p / J: it adds the KS lane sums of its unit in lane order (the same bits every run),
//    applies the step and passes its new values on, then writes its outputs to global
//    memory. What it reads from global memory arrives GRU_TILE_AHEAD steps ahead.
// How the new values reach every block of the group:
//    block    into the other buffer of the vector (double-buffered by step parity); the warps
//             without pointwise steps wait only for the new values (barriers 1 and 2 below);
//    cluster  through the exchange below (st.async into the other blocks' shared memory,
//             counted on mbarriers; no cluster-wide barrier per step), also double-buffered;
//    grid     into hs (forward) or dgh (backward) in global memory, which are the outputs
//             anyway; each block then arrives at the group's counter, and at the next step
//             waits for the others and copies the group's rows from L2 into its vector (one
//             buffer: the copy comes after every thread of the block is done with it).

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

// one 16-byte pack from shared memory
template <typename T>
__device__ __forceinline__ void gru_smem_pack(const T* p, T (&v)[Pack16<T>::N]) {
    typedef typename Pack16<T>::type P;
    const P q = *reinterpret_cast<const P*>(p);
    const T* s = reinterpret_cast<const T*>(&q);
#pragma unroll
    for (int e = 0; e < Pack16<T>::N; ++e) v[e] = s[e];
}

// Cluster scope without a cluster-wide barrier per step. Every block holds two exchange
// buffers (the vector of even and of odd steps) and one mbarrier per buffer. The pointwise
// threads store their new values into their own block's buffer; after a barrier of the
// warps with pointwise steps, each of these warps sends its 16-byte packs into the same
// buffer of every other block with st.async, whose bytes count off the receiving block's
// mbarrier as they land (complete_tx), and every thread of it arrives on its own block's
// mbarrier (release: its stores, and its reads of the lane sums the next product
// overwrites, come first). A phase of a block's mbarrier completes once those threads have
// arrived, its thread 0 has armed it (one arrival declaring the bytes the other blocks send:
// gru_exchange_arm) and those bytes have landed; every thread waits for it (acquire) before
// reading the buffer. So no fence and no block-wide barrier lies between a value's store
// and its use in another block.
// Buffer b is written again two steps later. The values of that step need those of the step
// in between from every block, which a block makes only after its product has read buffer
// b: the two buffers (and mbarriers) alternate by step without further waits.
__device__ __forceinline__ unsigned int gru_smem_addr(const void* p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// thread 0 arms the next phase of mbarrier b: its arrival, and `bytes` to come from the others
template <int C>
__device__ __forceinline__ void gru_exchange_arm(unsigned long long* bars, int b,
                                                 unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    if (C > 1 && threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     ::"r"(gru_smem_addr(bars + b)), "r"(bytes) : "memory");
#endif
}

// The exchange's start: thread 0 sets up both mbarriers, each phase waiting for the threads
// of the pointwise warps (pw) and thread 0; the cluster barrier (every block has filled its
// vector and set up its mbarriers before any block sends); then thread 0 arms the first
// phase of each. Bytes may land before their phase is armed: its count of bytes to come
// runs below zero meanwhile, and the phase cannot complete without thread 0's arrival.
// (Armed after the barrier, the arming is ordered after the set-up for every thread of the
// warp, as compute-sanitizer's racecheck sees it.)
template <int C>
__device__ __forceinline__ void gru_exchange_start(unsigned long long* bars, int pw,
                                                   unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    if (C > 1 && threadIdx.x == 0) {
        for (int b = 0; b < 2; ++b)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                         ::"r"(gru_smem_addr(bars + b)), "r"(1 + pw) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#endif
    gru_cluster_barrier<C>();
    for (int b = 0; b < 2; ++b) gru_exchange_arm<C>(bars, b, bytes);
}

// the bytes a block of the cluster receives per step from the others: `rows` rows of `segs`
// segments of the HP packed values, less its own J (or fewer, past HP) from column j0
template <typename T>
__device__ __forceinline__ unsigned int gru_exchange_bytes(int rows, int segs, int J, int j0,
                                                           int HP) {
    return (unsigned int)(rows * segs * (HP - max(0, min(J, HP - j0))) * (int)sizeof(T));
}

// a 16-byte pack into the shared memory of block `rank` of the cluster, at the address
// `local` has in this block, counted off that block's mbarrier at the address of `bar`
template <typename T>
__device__ __forceinline__ void gru_send16(T* local, int rank, const T* v,
                                           unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
    unsigned int ra, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(ra) : "r"(gru_smem_addr(local)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(rb) : "r"(gru_smem_addr(bar)), "r"(rank));
    if (sizeof(T) == 4) {
        const float* f = reinterpret_cast<const float*>(v);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32"
                     " [%0], {%1, %2, %3, %4}, [%5];"
                     ::"r"(ra), "f"(f[0]), "f"(f[1]), "f"(f[2]), "f"(f[3]), "r"(rb)
                     : "memory");
    } else {
        const double* f = reinterpret_cast<const double*>(v);
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f64"
                     " [%0], {%1, %2}, [%3];"
                     ::"r"(ra), "d"(f[0]), "d"(f[1]), "r"(rb) : "memory");
    }
#endif
}

// One block (C = 1): a step's new values are in place once the warps with pointwise steps
// (the first pw threads, whole warps) have written them into the vector. Those warps arrive
// at barrier 1 right after writing (gru_values_written) and go on to their global stores and
// loads; the other warps wait at barrier 1 and start the next product. The pointwise warps
// then wait for each other at barrier 2 (gru_step_end). (Barrier 0 is __syncthreads.)
// A cluster (C > 1): every thread of the pointwise warps (threads p0 .. p0 + pw-1) calls
// gru_values_written once its values are in exchange buffer `buf` of its block (segments
// gstride apart): its warp sends the packs its threads wrote to every other block, and each
// thread arrives on mbarrier b. A lane sends one pack, at xoff + g*gstride (GruTile; no pack
// at or past HP), of the segments g its lane number picks, to the blocks it picks.
template <typename T, int C, int NT>
__device__ __forceinline__ void gru_values_written(int pw, int p0, unsigned long long* bars,
                                                   int b, T* buf, int gstride, int segs,
                                                   int xoff, bool xok) {
    if (C == 1 && (int)threadIdx.x < pw) asm volatile("bar.arrive 1, %0;" ::"n"(NT) : "memory");
#if __CUDA_ARCH__ >= 900
    if constexpr (C > 1) {
        if ((unsigned)((int)threadIdx.x - p0) >= (unsigned)pw) return;
        constexpr int V = Pack16<T>::N, NP = 32 / V;   // a warp's packs per segment
        // (the pointwise warps' own barrier, 1, unused at cluster scope: the lanes read values
        // other lanes, of any pointwise warp, stored)
        asm volatile("bar.sync 1, %0;" ::"r"(pw) : "memory");
        const int rank = gru_cluster_rank<C>();
        // (segment, other block) pairs of the lane's pack, the warp's lanes in turn
        if (xok) {
            for (int idx = (int)(threadIdx.x & 31); idx < NP * segs * (C - 1); idx += 32) {
                const int rest = idx / NP, g = rest % segs;
                T* at = buf + xoff + g * gstride;
                T v[V];
                gru_smem_pack(at, v);
                gru_send16(at, (rank + 1 + rest / segs) % C, v, bars + b);
            }
        }
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];"
                     ::"r"(gru_smem_addr(bars + b)) : "memory");
    }
#endif
}

// the end of a step at block scope: the pointwise warps wait for each other (see above)
template <int C, int NT> __device__ __forceinline__ void gru_step_end(int pw) {
    if (C != 1) return;
    if ((int)threadIdx.x < pw) asm volatile("bar.sync 2, %0;" ::"r"(pw) : "memory");
    else asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
}

// before reading exchange buffer b as written in the pass's step number `it` - 1 (it >= 1);
// thread 0 then arms its next phase
template <int C>
__device__ __forceinline__ void gru_exchange_wait(unsigned long long* bars, int b, int it,
                                                  unsigned int bytes) {
#if __CUDA_ARCH__ >= 900
    if (C > 1) {
        const unsigned int a = gru_smem_addr(bars + b), parity = ((it - 1) >> 1) & 1;
        unsigned int done;
        do {
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;"
                         "\n\tselp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done) : "r"(a), "r"(parity) : "memory");
        } while (!done);
        gru_exchange_arm<C>(bars, b, bytes);
    }
#endif
}

// Asynchronous copies (cp.async, sm_80 on) of what a step reads from global memory and what
// does not depend on the recurrence, GRU_TILE_AHEAD steps ahead, into a ring in shared
// memory: each lane copies exactly the elements it later reads, so waiting for its own copy
// groups makes them visible to it (no barrier needed).
#define GRU_TILE_AHEAD 8

template <typename T> __device__ __forceinline__ void gru_copy_async(T* dst, const T* src) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(a), "l"(src), "n"(sizeof(T))
                 : "memory");
}
__device__ __forceinline__ void gru_copy_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
// all but the latest GRU_TILE_AHEAD - 1 copy groups of this thread have landed
__device__ __forceinline__ void gru_copy_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(GRU_TILE_AHEAD - 1) : "memory");
}

// the most lanes per unit (the host's splits keep to it): block and cluster scope, grid scope
#define GRU_TILE_MAX_LANES 8
#define GRU_GRID_MAX_LANES 64

// out[g] = p[g*ld] + p[g*ld + 1] + ... + p[g*ld + K-1], added in that order (shared memory)
template <typename T, int K>
__device__ __forceinline__ void gru_sum_lanes(T (&out)[3], const T* p, int ld) {
    constexpr int V = Pack16<T>::N;
#pragma unroll
    for (int g = 0; g < 3; ++g) {
        T v = T(0);
        if constexpr (K % V == 0) {   // 16-byte packs (K*sizeof(T) divides the offsets)
#pragma unroll
            for (int c = 0; c < K / V; ++c) {
                T x[V];
                gru_smem_pack(p + g * ld + c * V, x);
#pragma unroll
                for (int e = 0; e < V; ++e) v = (c == 0 && e == 0) ? x[0] : v + x[e];
            }
        } else {
#pragma unroll
            for (int k = 0; k < K; ++k) v = k == 0 ? p[g * ld] : v + p[g * ld + k];
        }
        out[g] = v;
    }
}

// The block's roles and its shared memory: [16 B: two mbarriers][vec: NV][MR][segs*HS]
// [part: MR][3][J*KS][gap: NG][R][segs][J][ring: GRU_TILE_AHEAD][R][ring][J], where segs is 1
// forward (h) and 3 backward (d_gate_h), ring the values a pointwise step reads ahead (3
// forward, 6 backward), NV = 2 at block and cluster scope (the exchange buffers of even and
// odd steps), NV = 1 at grid scope; forward, the biases of the block's units follow ([6][J]).
// The gap is unused: NG = 2 at block and cluster scope, 0 at grid scope. Without it (the ring
// right after part) ptxas spills in the 8-row backward kernels (block scope on sm_80, a
// cluster of 2 on sm_90), whose registers are full.
// The warps with pointwise steps are the last pw threads of the block where the product
// leaves them free (cluster scope), so that their outputs and loads ahead overlap the next
// product; else the first pw threads.
template <typename T, int C, int Q, int MR, int NT, int U> struct GruTile {
    static constexpr int V = Pack16<T>::N;
    int d, b0, rows, j0, HS, JK;
    int G;              // blocks per group (C, or the grid scope's G)
    int wu, ks;         // the product: units wu .. wu + U-1 (of this block) and lane ks
    int wn;             //   how many of them are units of H
    bool product;       //   this thread has a part in the product
    int pu, pi, j, bm;  // the pointwise step: unit pu, row pi; j = j0 + pu, row bm of the batch
    bool mine;          //   this thread has a pointwise step
    int pw, p0;         // the warps with pointwise steps: threads p0 .. p0 + pw-1
    int xoff;           // cluster scope, one row: pack_slot's results, kept
    bool xok;
    T *vec, *part, *ring;
    // block c = blockIdx.x % G of group blockIdx.x / G
    __device__ __forceinline__ GruTile(unsigned char* smem, int B, int H, int J, int KS, int R,
                                       int segs, int G_) {
        d = blockIdx.y;
        G = C > 0 ? C : G_;
        b0 = (blockIdx.x / G) * R;
        rows = min(R, B - b0);
        j0 = (C > 0 ? gru_cluster_rank<C>() : (int)blockIdx.x % G) * J;
        HS = KS * Q * V;
        JK = J * KS;
        const int tid = threadIdx.x;
        wu = tid / KS;
        ks = tid - wu * KS;
        product = wu * U < J;
        wu *= U;
        wn = max(0, min(U, min(J, H - j0) - wu));
        pw = (J * rows + 31) / 32 * 32;
        p0 = 0;
        int pt = tid;   // the thread's place among the pointwise threads
        if constexpr (C > 1) {
            if ((J + U - 1) / U * KS + pw <= NT) p0 = NT - pw;
            pt = max(tid - p0, 0);
            pi = tid < p0 ? R : pt / J;   // (threads before p0: a row past the last)
            pu = pt - (pt / J) * J;
        } else {
            pi = tid / J;
            pu = tid - pi * J;
        }
        mine = pi < rows && pu < H - j0;
        j = mine ? j0 + pu : 0;
        bm = mine ? b0 + pi : 0;
        xoff = 0;
        xok = false;
        if constexpr (MR == 1) xok = work_pack_slot(H, J, segs, xoff);
        vec = reinterpret_cast<T*>(smem + 16);
        part = vec + (C > 0 ? 2 : 1) * MR * segs * HS;
        ring = part + MR * 3 * JK + (C > 0 ? 2 * R * segs * J : 0);   // (the gap above)
    }
    // Cluster scope: the pack this lane of a pointwise warp sends, at xoff + g*(segment
    // stride) in an exchange buffer for segment g, and whether it has one. Pack p = lane %
    // (32 / V) of a warp holds the values of its threads p*V .. p*V + V-1. Worked out once
    // with one row (MR = 1); at each step with more (their registers are short).
    __device__ __forceinline__ bool work_pack_slot(int H, int J, int segs, int& off) const {
        const int tid = threadIdx.x, lane = tid & 31;
        const int first = tid - p0 - lane + (lane % (32 / V)) * V;
        const int xi = first / J, xu = first - xi * J, HP = (H + V - 1) / V * V;
        off = xi * segs * HS + j0 + xu;
        return C > 1 && tid >= p0 && xi < rows && j0 + xu < HP;
    }
    __device__ __forceinline__ bool pack_slot(int H, int J, int segs, int& off) const {
        if constexpr (MR == 1) {
            off = xoff;
            return xok;
        }
        return work_pack_slot(H, J, segs, off);
    }
    // run() for this block's group (block and cluster scope), or at grid scope for each
    // group of its slot in turn: groups slot, slot + slots, ... (slots = gridDim.x / G)
    template <typename F>
    __device__ __forceinline__ void each_group(int B, int H, int J, int R, int groups, F& run) {
        if constexpr (C > 0) {
            run();
        } else {
            for (int g = blockIdx.x / G;;) {
                run();
                g += gridDim.x / G;
                if (g >= groups) break;
                b0 = g * R;
                rows = min(R, B - b0);
                mine = pi < rows && pu < H - j0;
                j = mine ? j0 + pu : 0;
                bm = mine ? b0 + pi : 0;
            }
        }
    }
    // the vector of step parity b (0 at grid scope), row i
    __device__ __forceinline__ T* row(int b, int i, int segs) const {
        return vec + ((C > 0 ? b : 0) * MR + i) * segs * HS;
    }
    // this thread's sums of the three gates: the lane sums of its unit, in lane order
    // (KS a power of two up to GRU_TILE_MAX_LANES, or GRU_GRID_MAX_LANES at grid scope)
    __device__ __forceinline__ void unit_sums(T (&out)[3], int KS) const {
        static_assert(GRU_TILE_MAX_LANES == 8 && GRU_GRID_MAX_LANES == 64,
                      "unit_sums takes 1 to 8 lanes, or up to 64 at grid scope");
        const T* p = part + pi * 3 * JK + pu * KS;
        if (KS == 1) gru_sum_lanes<T, 1>(out, p, JK);
        else if (KS == 2) gru_sum_lanes<T, 2>(out, p, JK);
        else if (KS == 4) gru_sum_lanes<T, 4>(out, p, JK);
        else if (C > 0 || KS == 8) gru_sum_lanes<T, 8>(out, p, JK);
        else if (KS == 16) gru_sum_lanes<T, 16>(out, p, JK);
        else if (KS == 32) gru_sum_lanes<T, 32>(out, p, JK);
        else gru_sum_lanes<T, 64>(out, p, JK);
    }
};

// Grid scope: the vector of a step from global memory into shared memory, zero past H and
// in the rows past `rows` (H a multiple of the pack):
//   vec[(i*segs + g)*HS + k] = src[i*ld + g*H + k]   for i < MR, g < segs, k < HS.
// Asynchronous 16-byte copies through L2 (other blocks wrote the vector: L1 may hold stale
// lines), zero-filled where there is no source; it returns once all of this thread's copies
// (the ring's too) have landed.
template <typename T, int MR, int NT>
__device__ __forceinline__ void gru_tile_stage(T* vec, int HS, int segs, const T* src,
                                               int ld, int H, int rows) {
    constexpr int V = Pack16<T>::N;
    const int nr = HS / V, n = MR * segs * nr;
    for (int idx = threadIdx.x; idx < n; idx += NT) {
        const int rg = idx / nr, k = (idx - rg * nr) * V;   // rg = i*segs + g
        const int i = rg / segs, g = rg - i * segs;
        const bool in = i < rows && k < H;
        const T* at = in ? src + i * ld + g * H + k : src;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                     ::"r"(gru_smem_addr(vec + rg * HS + k)), "l"(at), "r"(in ? 16 : 0)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

// the product thread's weights: forward rows (FWD) or backward columns of units j .. j + U-1
// (the first n of them units of H), zero outside H
template <typename T, int Q, int U, bool FWD>
__device__ __forceinline__ void gru_tile_weights(T (&w)[U][3][Q][Pack16<T>::N], const T* wd,
                                                 int H, int j, int n, int ks, int KS) {
    constexpr int V = Pack16<T>::N;
#pragma unroll
    for (int v = 0; v < U; ++v)
#pragma unroll
        for (int g = 0; g < 3; ++g)
#pragma unroll
            for (int q = 0; q < Q; ++q)
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    const int k = (ks + q * KS) * V + e;
                    const long long at = FWD ? ((long long)g * H + j + v) * H + k
                                             : ((long long)g * H + k) * H + j + v;
                    w[v][g][q][e] = (v < n && k < H) ? wd[at] : T(0);
                }
}

// Phase 1 for every row i < MR: this lane's part of sum over k of w[u][g][k] * v[i][g][k]
// for its U units u (rows ld apart, gate segments gstride apart; ONE: one segment for the
// three gates) into part[i][g][slot + u*KS], slot = (first unit)*KS + ks (rows JK*3 apart).
// One unit per thread sums even and odd packs apart (two chains), then adds the two.
template <bool ONE, int Q, int MR, int U, typename T>
__device__ __forceinline__ void gru_tile_product(T* part,
                                                 const T (&w)[U][3][Q][Pack16<T>::N],
                                                 const T* v, int ld, int gstride, int ks,
                                                 int KS, int slot, int JK) {
    constexpr int V = Pack16<T>::N;
    T a[MR][U][3], b[MR][U][3];
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int g = 0; g < 3; ++g) a[i][u][g] = b[i][u][g] = T(0);
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int q = 0; q < Q; ++q) {
            T x[3][V];
#pragma unroll
            for (int g = 0; g < (ONE ? 1 : 3); ++g)
                gru_smem_pack(v + i * ld + g * gstride + (ks + q * KS) * V, x[g]);
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int g = 0; g < 3; ++g)
                    gru_dot16((U == 1 && (q & 1)) ? b[i][u][g] : a[i][u][g], w[u][g][q],
                              x[ONE ? 0 : g]);
            if (!ONE) asm volatile("" ::: "memory");   // (three packs at a time in registers)
        }
#pragma unroll
    for (int i = 0; i < MR; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int g = 0; g < 3; ++g)
                part[(i * 3 + g) * JK + slot + u * KS] = U == 1 ? a[i][u][g] + b[i][u][g]
                                                                : a[i][u][g];
}

// The tile kernels' bodies; the kernels themselves follow (grid scope has no cluster shape).
template <typename T, int C, int Q, int MR, int NT, int U, bool TRAIN>
__device__ __forceinline__ void
gru_tile_forward_run(const T* __restrict__ gi, const T* __restrict__ w_hh,
                     const T* __restrict__ b_ih, const T* __restrict__ b_hh, T* hs,
                     T* __restrict__ y, T* __restrict__ gates, T* __restrict__ h_n, int steps,
                     int B, int H, int S, int J, int KS, int R, unsigned int* counters, int G,
                     int groups) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    GruTile<T, C, Q, MR, NT, U> tl(gru_smem, B, H, J, KS, R, 1, G);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(gru_smem);
    const int D = gridDim.y, d = tl.d, HS = tl.HS, HP = (H + tl.V - 1) / tl.V * tl.V;
    const long long H3 = 3LL * H, BH = (long long)B * H;
    T w[U][3][Q][Pack16<T>::N];
    gru_tile_weights<T, Q, U, true>(w, w_hh + d * H3 * H, H, tl.j0 + tl.wu, tl.wn, tl.ks, KS);
    // the biases of the block's units wait in shared memory, after the ring (registers are
    // short with NT = 512)
    T* bias = tl.ring + GRU_TILE_AHEAD * R * 3 * J + tl.pu;   // [b_ih | b_hh][3][J]
    for (int idx = threadIdx.x; idx < 6 * J; idx += NT) {
        const int g = idx / J, u = idx - g * J;
        tl.ring[GRU_TILE_AHEAD * R * 3 * J + idx] =
            tl.j0 + u < H ? (g < 3 ? b_ih : b_hh - 3 * H)[d * H3 + g * H + tl.j0 + u] : T(0);
    }
    // grid scope: the counter of this block's slot
    unsigned int* counter =
        C == 0 ? counters + d * (gridDim.x / tl.G) + blockIdx.x / tl.G : nullptr;
    unsigned int target = 0;
    // the step loop for one group of rows (tl.each_group below runs it)
    auto run = [&]() {
        const int j = tl.j;
        const unsigned int xbytes = C > 1 ? gru_exchange_bytes<T>(tl.rows, 1, J, tl.j0, HP) : 0;
        if (C > 0) {
            for (int idx = threadIdx.x; idx < 2 * MR * HS; idx += NT) {   // h0, zeros elsewhere
                const int i = idx / HS, k = idx - i * HS;
                tl.vec[idx] = (i < tl.rows && k < H)
                                  ? hs[(long long)d * S * BH + (long long)(tl.b0 + i) * H + k]
                                  : T(0);
            }
        }
        // The pointwise thread's addresses: a step's rows start at an address the same for
        // the whole block (time t: y + t*B*D*H, gi + t*B*D*3H; step s: gates +
        // (d*steps + s)*B*4H, hs + (d*S + s)*B*H), and its row and unit are a 32-bit offset
        // within them (the host keeps B*D*4H < 2^31).
        const int bm = tl.bm, o_t = (bm * D + d) * H + j, o_s = bm * H + j;
        T* ring_m = tl.ring + tl.pi * 3 * J + tl.pu;                      // + slot * R*3*J
        // the input projection of step s into the ring, GRU_TILE_AHEAD steps ahead
        auto fetch = [&](int s) {
            if (tl.mine && s < steps) {
                const T* src = gi + (long long)gru_time(d, steps, s) * (B * D * H3) + 3 * o_t
                               - 2 * j;
                T* dst = ring_m + (s % GRU_TILE_AHEAD) * R * 3 * J;
#pragma unroll
                for (int g = 0; g < 3; ++g) gru_copy_async(dst + g * J, src + g * H);
            }
            gru_copy_commit();
        };
        // (grid scope: one step less ahead, fetched right after the vector lands, which
        // waits for all of the thread's copies: each has a whole step to arrive)
#pragma unroll 1
        for (int s = 0; s < (C > 0 ? GRU_TILE_AHEAD : GRU_TILE_AHEAD - 1); ++s) fetch(s);
        if (C > 0) {
            gru_exchange_start<C>(bars, tl.pw, xbytes);
        }
        for (int s = 0; s < steps; ++s) {
            if (C == 0) {   // h of step s: slot s % S of hs, the group's rows
                if (s > 0) gru_group_wait(counter, target);
                gru_tile_stage<T, MR, NT>(tl.vec, HS, 1,
                                          hs + ((long long)d * S + s % S) * BH
                                             + (long long)tl.b0 * H, H, H, tl.rows);
                fetch(s + GRU_TILE_AHEAD - 1);   // into the slot step s - 1 read
                __syncthreads();
            } else if (s > 0) {
                gru_exchange_wait<C>(bars, s & 1, s, xbytes);
            }
            if (tl.product)
                gru_tile_product<true, Q, MR, U>(tl.part, w, tl.row(s & 1, 0, 1), HS, 0, tl.ks,
                                                 KS, tl.wu * KS + tl.ks, tl.JK);
            gru_copy_wait();
            __syncthreads();
            T h_new, r, z, n, hn;
            if (tl.mine) {
                const T* x = ring_m + (s % GRU_TILE_AHEAD) * R * 3 * J;
                T gh[3];
                tl.unit_sums(gh, KS);
                hn = gh[2] + bias[5 * J];
                h_new = gru_cell(x[0] + bias[0], x[J] + bias[J], x[2 * J] + bias[2 * J],
                                 gh[0] + bias[3 * J], gh[1] + bias[4 * J], hn,
                                 tl.row(s & 1, tl.pi, 1)[j], r, z, n);
                if (C == 0) (hs + ((long long)d * S + (s + 1) % S) * BH)[o_s] = h_new;
                else tl.row((s + 1) & 1, tl.pi, 1)[j] = h_new;
            }
            if (C == 0) {
                __syncthreads();
                gru_group_arrive(counter, tl.G, target);
            } else if (C == 1 || s < steps - 1) {   // (no block reads the last values)
                int xoff;
                const bool xok = tl.pack_slot(H, J, 1, xoff);
                gru_values_written<T, C, NT>(tl.pw, tl.p0, bars, (s + 1) & 1,
                                             tl.row((s + 1) & 1, 0, 1), 0, 1, xoff, xok);
            }
            if (tl.mine) {   // the outputs
                (y + (long long)gru_time(d, steps, s) * (B * D * H))[o_t] = h_new;
                if (s == steps - 1) h_n[d * BH + o_s] = h_new;
                if (TRAIN) {
                    if (C > 0) (hs + ((long long)d * S + s + 1) * BH)[o_s] = h_new;
                    T* g = gates + ((long long)d * steps + s) * (4 * BH) + 4 * o_s - 3 * j;
                    g[0] = r;
                    g[H] = z;
                    g[2 * H] = n;
                    g[3 * H] = hn;
                }
            }
            if (C > 0) fetch(s + GRU_TILE_AHEAD);   // into the slot just read (by this thread)
            gru_step_end<C, NT>(tl.pw);
        }
        if (C > 1) gru_cluster_barrier<C>();   // no block leaves while others write into it
    };
    tl.each_group(B, H, J, R, groups, run);
}

template <typename T, int C, int Q, int MR, int NT, int U>
__device__ __forceinline__ void
gru_tile_backward_run(const T* __restrict__ dy, const T* __restrict__ gates,
                      const T* __restrict__ hs, const T* __restrict__ w_hh,
                      const T* __restrict__ dh_n /* null: zeros */, T* __restrict__ dgi,
                      T* __restrict__ dgh, T* __restrict__ dh0, int steps, int B, int H,
                      int J, int KS, int R, unsigned int* counters, int G, int groups) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    GruTile<T, C, Q, MR, NT, U> tl(gru_smem, B, H, J, KS, R, 3, G);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(gru_smem);
    const int D = gridDim.y, d = tl.d, HS = tl.HS, HP = (H + tl.V - 1) / tl.V * tl.V;
    const long long H3 = 3LL * H, BH = (long long)B * H;
    T w[U][3][Q][Pack16<T>::N];
    gru_tile_weights<T, Q, U, false>(w, w_hh + d * H3 * H, H, tl.j0 + tl.wu, tl.wn, tl.ks, KS);
    unsigned int* counter =
        C == 0 ? counters + d * (gridDim.x / tl.G) + blockIdx.x / tl.G : nullptr;
    unsigned int target = 0;
    // the step loop for one group of rows (tl.each_group below runs it)
    auto run = [&]() {
        const int j = tl.j;
        if (C > 0) {
            for (int idx = threadIdx.x; idx < 2 * MR * 3 * HS; idx += NT) tl.vec[idx] = T(0);
        }
        // the pointwise thread's carried gradient, dh*z, and the addresses of its row at step
        // or time 0 with the stride per step (or time)
        const int bm = tl.bm;
        T carry = (tl.mine && dh_n) ? dh_n[d * BH + (long long)bm * H + j] : T(0), dhz = T(0);
        // its rows: of dy and dgi by time t, (t*B + bm)*D + d; of gates and dgh by step s,
        // (d*steps + s)*B + bm (of hs, d*B more)
        const long long time_row = (long long)bm * D + d;
        const long long step_row = (long long)d * steps * B + bm;
        T* ring_m = tl.ring + tl.pi * 6 * J + tl.pu;                          // + slot*R*6*J
        // what a step reads besides the carry, step s (counting down) into ring slot
        // s % GRU_TILE_AHEAD: r, z, n, hn, h, dy
        auto fetch = [&](int s) {
            if (tl.mine && s >= 0) {
                const long long e = step_row + (long long)s * B;
                const long long f = time_row + (long long)gru_time(d, steps, s) * B * D;
                const T* g = gates + e * 4 * H + j;
                T* v = ring_m + (s % GRU_TILE_AHEAD) * R * 6 * J;
#pragma unroll
                for (int k = 0; k < 4; ++k) gru_copy_async(v + k * J, g + k * H);
                gru_copy_async(v + 4 * J, hs + (e + (long long)d * B) * H + j);
                gru_copy_async(v + 5 * J, dy + f * H + j);
            }
            gru_copy_commit();
        };
#pragma unroll 1
        for (int k = 0; k < GRU_TILE_AHEAD; ++k) fetch(steps - 1 - k);
        if (C > 0) {
            gru_exchange_start<C>(bars, tl.pw, gru_exchange_bytes<T>(tl.rows, 3, J, tl.j0, HP));
        }
        // the carry into step s from d_gate_h of step s + 1 (buffer (s + 1) & 1; at grid
        // scope the group's rows of dgh at step s + 1)
        auto carried = [&](int s) {
            if (C == 0) {
                gru_group_wait(counter, target);
                gru_tile_stage<T, MR, NT>(tl.vec, HS, 3,
                                          dgh + (((long long)d * steps + s + 1) * B + tl.b0)
                                                    * H3, 3 * H, H, tl.rows);
                fetch(s - GRU_TILE_AHEAD + 1);   // into the slot step s + 1 read (as above)
                __syncthreads();
            } else {
                gru_exchange_wait<C>(bars, (s + 1) & 1, steps - 1 - s,
                                     gru_exchange_bytes<T>(tl.rows, 3, J, tl.j0, HP));
            }
            if (tl.product)
                gru_tile_product<false, Q, MR, U>(tl.part, w, tl.row((s + 1) & 1, 0, 3), 3 * HS,
                                                  HS, tl.ks, KS, tl.wu * KS + tl.ks, tl.JK);
            gru_copy_wait();
            __syncthreads();
            if (!tl.mine) return T(0);
            T gs[3];
            tl.unit_sums(gs, KS);
            return dhz + ((gs[0] + gs[1]) + gs[2]);
        };
        for (int s = steps - 1; s >= 0; --s) {
            if (s < steps - 1) carry = carried(s);
            else gru_copy_wait();
            if (tl.mine) {
                const T* v = ring_m + (s % GRU_TILE_AHEAD) * R * 6 * J;
                const T r = v[0];
                T dr, dz, dn;
                dhz = gru_cell_backward(v[5 * J] + carry, r, v[J], v[2 * J], v[3 * J], v[4 * J],
                                        dr, dz, dn);
                if (C > 0) {
                    T* out = tl.row(s & 1, tl.pi, 3) + j;
                    out[0] = dr;
                    out[HS] = dz;
                    out[2 * HS] = dn * r;
                }
                // the outputs (before the arrival: registers are short with NT = 512); at grid
                // scope dgh is also what the other blocks read
                const long long f = time_row + (long long)gru_time(d, steps, s) * B * D;
                T* gi_row = dgi + f * H3 + j;
                gi_row[0] = dr;
                gi_row[H] = dz;
                gi_row[2 * H] = dn;
                T* gh_row = dgh + (step_row + (long long)s * B) * H3 + j;
                gh_row[0] = dr;
                gh_row[H] = dz;
                gh_row[2 * H] = dn * r;
            }
            if (C == 0) {
                __syncthreads();
                gru_group_arrive(counter, tl.G, target);
            } else {
                int xoff;
                const bool xok = tl.pack_slot(H, J, 3, xoff);
                gru_values_written<T, C, NT>(tl.pw, tl.p0, bars, s & 1, tl.row(s & 1, 0, 3), HS,
                                             3, xoff, xok);
            }
            if (C > 0) fetch(s - GRU_TILE_AHEAD);   // into the slot just read (by this thread)
            gru_step_end<C, NT>(tl.pw);
        }
        const T dh = carried(-1);   // d_gate_h of step 0, in buffer 0
        if (tl.mine) dh0[d * BH + (long long)bm * H + j] = dh;
        if (C > 1) gru_cluster_barrier<C>();   // no block leaves while others write into it
    };
    tl.each_group(B, H, J, R, groups, run);
}

// The kernels: block and cluster scope (C >= 1; `counters` unused, G = C, groups = gridDim.x
// / C), grid scope (C = 0: G blocks per group, `counters` D x slots zeros).
#define GRU_TILE_FORWARD_PARAMS                                                              \
    const T *__restrict__ gi, const T *__restrict__ w_hh, const T *__restrict__ b_ih,        \
        const T *__restrict__ b_hh, T *hs, T *__restrict__ y, T *__restrict__ gates,        \
        T *__restrict__ h_n, int steps, int B, int H, int S, int J, int KS, int R,          \
        unsigned int *counters, int G, int groups
#define GRU_TILE_FORWARD_ARGS \
    gi, w_hh, b_ih, b_hh, hs, y, gates, h_n, steps, B, H, S, J, KS, R, counters, G, groups
#define GRU_TILE_BACKWARD_PARAMS                                                             \
    const T *__restrict__ dy, const T *__restrict__ gates, const T *__restrict__ hs,         \
        const T *__restrict__ w_hh, const T *__restrict__ dh_n, T *__restrict__ dgi,             \
        T *__restrict__ dgh,                                                               \
        T *__restrict__ dh0, int steps, int B, int H, int J, int KS, int R,                 \
        unsigned int *counters, int G, int groups
#define GRU_TILE_BACKWARD_ARGS \
    dy, gates, hs, w_hh, dh_n, dgi, dgh, dh0, steps, B, H, J, KS, R, counters, G, groups

template <typename T, int C, int Q, int MR, int NT, int U, bool TRAIN>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, C, Q, MR, NT, U, TRAIN>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int C, int Q, int MR, int NT, int U>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, C, Q, MR, NT, U>(GRU_TILE_BACKWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U, bool TRAIN>
__global__ void __launch_bounds__(NT, 1) gru_grid_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, 0, Q, MR, NT, U, TRAIN>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U>
__global__ void __launch_bounds__(NT, 1) gru_grid_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, 0, Q, MR, NT, U>(GRU_TILE_BACKWARD_ARGS);
}


// ---- the weight-gradient tail ------------------------------------------------------------
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

// ---- barrier probes for the benchmark: n barriers of one scope and nothing else -----------
// The floor of the fast path's step: its barrier (block or cluster; grid below), timed alone.
template <int C>   // (512: the most threads a tile kernel's block has)
__global__ void __launch_bounds__(512, 1) GRU_CLUSTER_DIMS(C) gru_barrier_probe(int n) {
    for (int i = 0; i < n; ++i) gru_cluster_barrier<C>();
}

// the grid-scope kernels' barrier across the gridDim.x blocks of each grid row (cooperative)
__global__ void __launch_bounds__(GRU_NT, 1) gru_grid_barrier_probe(unsigned int* barrier,
                                                                    int n) {
    unsigned int target = 0;
    for (int i = 0; i < n; ++i) gru_group_barrier(barrier + blockIdx.y, gridDim.x, target);
}
