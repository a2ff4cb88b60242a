// gru_persist.cu: the persistent kernels with W_hh in shared memory (cugru/_plan.py,
// PersistPlan): the whole recurrence in one launch per pass, the blocks of a direction
// meeting at a barrier every step.
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
//   dh = dy[t] + carry; dn, dz, dr as in gru_common.cuh; writes dgi[t], dgh[s]; after the loop
//   dh0 = dh*z + d_gate_h[0] W_hh.
// GRU_PERSIST_THREADS: threads per block (rendered from cugru/_catalog.py; the host launches
// exactly this many).
#include "gru_common.cuh"

// v_s[b][0, kcr) = src[b*ld + k0 + kk] for kk < kc, zeros up to kcr = kc rounded up to the
// pack; rows of v_s are ldv apart. Four loads per thread are in flight per round, through L2.
template <typename T>
__device__ __forceinline__ void gru_stage(T* v_s, int ldv, const T* src, long long ld, int B,
                                          int k0, int kc) {
    const int kcr = gru_round_up(kc, Pack16<T>::N), n = B * kcr;
    __syncthreads();
    for (int base = threadIdx.x; base < n; base += 4 * GRU_PERSIST_THREADS) {
        T v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * GRU_PERSIST_THREADS, b = idx / kcr, kk = idx - b * kcr;
            v[u] = (idx < n && kk < kc) ? __ldcg(src + b * ld + k0 + kk) : T(0);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = base + u * GRU_PERSIST_THREADS, b = idx / kcr, kk = idx - b * kcr;
            if (idx < n) v_s[b * ldv + kk] = v[u];
        }
    }
    __syncthreads();
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

template <typename T, int MAXP, bool TRAIN, bool QAT>
__global__ void __launch_bounds__(GRU_PERSIST_THREADS, 1)
gru_persist_forward(const T* __restrict__ gi, const T* __restrict__ w_hh,
                    const T* __restrict__ b_ih, const T* __restrict__ b_hh, T* hs,
                    T* __restrict__ y, T* __restrict__ gates, unsigned int* barrier,
                    const int* __restrict__ lengths, int steps, int B, int H, int S, int J,
                    int KC, T q_scale, T q_inv, T q_lo, T q_hi, int q_flags) {
    constexpr int V = Pack16<T>::N;
    extern __shared__ __align__(16) unsigned char gru_smem[];
    const int HP = gru_round_up(H, V) + V, KCP = KC + V;
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* h_s = w_s + 3LL * J * HP;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < 3LL * J * HP; idx += GRU_PERSIST_THREADS) {
        const int row = (int)(idx / HP), k = (int)(idx - (long long)row * HP);
        const int g = row / J, u = row - g * J;
        w_s[idx] = (u < Jb && k < H) ? w[((long long)g * H + j0 + u) * H + k] : T(0);
    }
    const int rb = GRU_PERSIST_THREADS / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
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
                const bool run = t < gru_length(lengths, b, steps);
                const T h_new = gru_cell<QAT>(x_r[i] + bi[0], x_z[i] + bi[1], x_n[i] + bi[2],
                                              acc[i][0] + bh[0], acc[i][1] + bh[1], hn,
                                              h_own[i], r, z, n, GRU_QUANT(T), run);
                h_own[i] = h_new;
                gru_write_forward<T, TRAIN>(hs, y, gates, h_new, run, r, z, n, hn, d, D, s, t,
                                            b, j, steps, B, H, S);
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

template <typename T, int MAXP, bool QAT>
__global__ void __launch_bounds__(GRU_PERSIST_THREADS, 1)
gru_persist_backward(const T* __restrict__ dy, const T* __restrict__ gates,
                     const T* __restrict__ hs, const T* __restrict__ w_hh,
                     const T* __restrict__ dh_n, T* __restrict__ dgi, T* dgh,
                     T* __restrict__ dh0, unsigned int* barrier,
                     const int* __restrict__ lengths, int steps, int B, int H, int J, int KC,
                     T q_scale, T q_inv, T q_lo, T q_hi, int q_flags) {
    constexpr int V = Pack16<T>::N;
    extern __shared__ __align__(16) unsigned char gru_smem[];
    const int RP = gru_round_up(3 * H, V) + V, KCP = KC + V;
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* g_s = w_s + (long long)J * RP;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < (long long)J * RP; idx += GRU_PERSIST_THREADS) {
        const int u = (int)(idx / RP), r = (int)(idx - (long long)u * RP);
        w_s[idx] = (u < Jb && r < 3 * H) ? w[(long long)r * H + j0 + u] : T(0);
    }
    const int rb = GRU_PERSIST_THREADS / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
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
                T dr, dz, dn, r_used;
                const bool run = t < gru_length(lengths, b, steps);
                dhz[i] = gru_cell_backward<QAT>(run ? dy_v[i] + carry[i] : carry[i], g_r[i],
                                                g_z[i], g_n[i], g_hn[i], h_old[i], dr, dz, dn,
                                                r_used, GRU_QUANT(T), run);
                gru_write_backward(dgi, dgh, dr, dz, dn, r_used, d, D, s, t, b, j, steps, B,
                                   H);
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
