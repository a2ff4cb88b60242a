// gru_persist.cu: the whole GRU recurrence in one launch per pass (the fast path).
//
// Maths and buffers as in gru.cu (gate order r | z | n; gi, hs, gates, y, dgi, dgh laid out
// the same, so the input GEMM before and the weight-gradient GEMMs after are shared).
//
// Work split. Direction d runs on the gridDim.x blocks of grid row d; block x owns the hidden
// units [j0, j0 + J), j0 = x*J, and keeps its slice of W_hh in shared memory for all steps:
//   forward   w_s[k][g][jj] = W_hh[d][g*H + j0 + jj][k]   (3J x H: its units' rows)
//   backward  w_s[r][jj]    = W_hh[d][r][j0 + jj]         (3H x J: its units' columns)
// Thread (jj = tid % J, bl = tid / J) computes unit j0 + jj for batch rows b = bl + i*(nt/J),
// i < MAXP. Each step it stages the vector the product needs (h, or the next step's d_gate_h)
// through shared memory in chunks of GRU_KC, accumulates its MAXP dot products in a fixed
// order (the same bits every run), applies the pointwise step, writes its outputs to global
// memory, and waits at a barrier of its direction's blocks before the next step reads them:
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
#include "common.cuh"

#ifndef GRU_KC
#define GRU_KC 32        // vector elements staged per chunk (rows padded to GRU_KC + 1)
#endif

// All `count` blocks of one direction wait here; `target` is thread 0's running goal.
__device__ __forceinline__ void gru_group_barrier(unsigned int* counter, unsigned int count,
                                                  unsigned int& target) {
    __syncthreads();
    if (count > 1) {
        if (threadIdx.x == 0) {
            target += count;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
            unsigned int seen;
            do {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(seen) : "l"(counter) : "memory");
            } while (seen < target);
        }
        __syncthreads();
    }
}

template <typename T> __device__ __forceinline__ T gru_sig(T v) {
    return T(1) / (T(1) + ck_exp(-v));
}

// stage rows [b][k0, k0 + kc) of a (B, ld) matrix into v_s[b][GRU_KC + 1], through L2
template <typename T>
__device__ __forceinline__ void gru_stage(T* v_s, const T* src, long long ld, int B, int k0,
                                          int kc) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < B * kc; idx += blockDim.x) {
        const int b = idx / kc, kk = idx - b * kc;
        v_s[b * (GRU_KC + 1) + kk] = __ldcg(src + b * ld + k0 + kk);
    }
    __syncthreads();
}

template <typename T, int MAXP, bool TRAIN>
__global__ void __launch_bounds__(256, 1)
gru_persist_forward(const T* __restrict__ gi, const T* __restrict__ w_hh,
                    const T* __restrict__ b_ih, const T* __restrict__ b_hh, T* hs,
                    T* __restrict__ y, T* __restrict__ gates, unsigned int* barrier,
                    int steps, int B, int H, int S, int J) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* h_s = w_s + 3LL * J * H;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < 3LL * J * H; idx += blockDim.x) {
        const int k = (int)(idx / (3 * J)), rem = (int)(idx - (long long)k * 3 * J);
        const int g = rem / J, u = rem - g * J;
        w_s[idx] = u < Jb ? w[((long long)g * H + j0 + u) * H + k] : T(0);
    }
    const int rb = blockDim.x / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
    const bool active = bl < rb && jj < Jb;
    const int j = j0 + jj;
    T bi[3] = {T(0), T(0), T(0)}, bh[3] = {T(0), T(0), T(0)};
    if (active) {
#pragma unroll
        for (int g = 0; g < 3; ++g) {
            bi[g] = b_ih[d * H3 + g * H + j];
            bh[g] = b_hh[d * H3 + g * H + j];
        }
    }
    unsigned int target = 0;
    for (int s = 0; s < steps; ++s) {
        const int t = d == 0 ? s : steps - 1 - s;
        const T* h_prev = hs + ((long long)d * S + s % S) * BH;
        T acc[MAXP][3];
#pragma unroll
        for (int i = 0; i < MAXP; ++i) acc[i][0] = acc[i][1] = acc[i][2] = T(0);
        for (int k0 = 0; k0 < H; k0 += GRU_KC) {
            const int kc = min(GRU_KC, H - k0);
            gru_stage(h_s, h_prev, H, B, k0, kc);
            if (active) {
                for (int kk = 0; kk < kc; ++kk) {
                    const T* wk = w_s + (long long)(k0 + kk) * 3 * J + jj;
                    const T wr = wk[0], wz = wk[J], wn = wk[2 * J];
#pragma unroll
                    for (int i = 0; i < MAXP; ++i) {
                        const int b = bl + i * rb;
                        if (b < B) {
                            const T hv = h_s[b * (GRU_KC + 1) + kk];
                            acc[i][0] += wr * hv;
                            acc[i][1] += wz * hv;
                            acc[i][2] += wn * hv;
                        }
                    }
                }
            }
        }
        if (active) {
            T* h_next = hs + ((long long)d * S + (s + 1) % S) * BH;
#pragma unroll
            for (int i = 0; i < MAXP; ++i) {
                const int b = bl + i * rb;
                if (b >= B) continue;
                const T* g_row = gi + ((long long)t * B + b) * D * H3 + d * H3;
                const T r = gru_sig((g_row[j] + bi[0]) + (acc[i][0] + bh[0]));
                const T z = gru_sig((g_row[H + j] + bi[1]) + (acc[i][1] + bh[1]));
                const T hn = acc[i][2] + bh[2];
                const T n = ck_tanh((g_row[2 * H + j] + bi[2]) + r * hn);
                const T h = __ldcg(h_prev + (long long)b * H + j);
                const T h_new = (T(1) - z) * n + z * h;
                h_next[(long long)b * H + j] = h_new;
                y[((long long)t * B + b) * D * H + (long long)d * H + j] = h_new;
                if (TRAIN) {
                    T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
                    g[j] = r;
                    g[H + j] = z;
                    g[2 * H + j] = n;
                    g[3 * H + j] = hn;
                }
            }
        }
        gru_group_barrier(barrier + d, gridDim.x, target);
    }
}

// acc[i] = sum over r < 3H of dgh_row(b)[r] * w_s[r][jj], staged in chunks
template <typename T, int MAXP>
__device__ __forceinline__ void gru_back_product(T (&acc)[MAXP], T* g_s, const T* w_s,
                                                 const T* dgh_step, int B, int H, int J,
                                                 int jj, int bl, int rb, bool active) {
#pragma unroll
    for (int i = 0; i < MAXP; ++i) acc[i] = T(0);
    for (int r0 = 0; r0 < 3 * H; r0 += GRU_KC) {
        const int rc = min(GRU_KC, 3 * H - r0);
        gru_stage(g_s, dgh_step, 3LL * H, B, r0, rc);
        if (active) {
            for (int rr = 0; rr < rc; ++rr) {
                const T wv = w_s[(long long)(r0 + rr) * J + jj];
#pragma unroll
                for (int i = 0; i < MAXP; ++i) {
                    const int b = bl + i * rb;
                    if (b < B) acc[i] += g_s[b * (GRU_KC + 1) + rr] * wv;
                }
            }
        }
    }
}

template <typename T, int MAXP>
__global__ void __launch_bounds__(256, 1)
gru_persist_backward(const T* __restrict__ dy, const T* __restrict__ gates,
                     const T* __restrict__ hs, const T* __restrict__ w_hh,
                     const T* __restrict__ dh_n, T* __restrict__ dgi, T* dgh,
                     T* __restrict__ dh0, unsigned int* barrier, int steps, int B, int H,
                     int J) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    T* w_s = reinterpret_cast<T*>(gru_smem);
    T* g_s = w_s + 3LL * H * J;
    const int D = gridDim.y, d = blockIdx.y;
    const int j0 = blockIdx.x * J, Jb = min(J, H - j0);
    const long long H3 = 3LL * H, BH = (long long)B * H;
    const T* w = w_hh + d * H3 * H;
    for (long long idx = threadIdx.x; idx < 3LL * H * J; idx += blockDim.x) {
        const long long r = idx / J;
        const int u = (int)(idx - r * J);
        w_s[idx] = u < Jb ? w[r * H + j0 + u] : T(0);
    }
    const int rb = blockDim.x / J, jj = threadIdx.x % J, bl = threadIdx.x / J;
    const bool active = bl < rb && jj < Jb;
    const int j = j0 + jj;
    T carry[MAXP], dhz[MAXP];
#pragma unroll
    for (int i = 0; i < MAXP; ++i) {
        const int b = bl + i * rb;
        carry[i] = (active && b < B) ? dh_n[d * BH + (long long)b * H + j] : T(0);
        dhz[i] = T(0);
    }
    const T* dgh_d = dgh + (long long)d * steps * B * H3;
    unsigned int target = 0;
    for (int s = steps - 1; s >= 0; --s) {
        const int t = d == 0 ? s : steps - 1 - s;
        if (s < steps - 1) {
            T acc[MAXP];
            gru_back_product<T, MAXP>(acc, g_s, w_s, dgh_d + (long long)(s + 1) * B * H3, B, H,
                                      J, jj, bl, rb, active);
#pragma unroll
            for (int i = 0; i < MAXP; ++i) carry[i] = dhz[i] + acc[i];
        }
        if (active) {
#pragma unroll
            for (int i = 0; i < MAXP; ++i) {
                const int b = bl + i * rb;
                if (b >= B) continue;
                const T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
                const T r = g[j], z = g[H + j], n = g[2 * H + j], hn = g[3 * H + j];
                const T h = hs[((long long)d * (steps + 1) + s) * BH + (long long)b * H + j];
                const T dhv = dy[((long long)t * B + b) * D * H + (long long)d * H + j] + carry[i];
                const T dn = dhv * (T(1) - z) * (T(1) - n * n);
                const T dz = dhv * (h - n) * z * (T(1) - z);
                const T dr = dn * hn * r * (T(1) - r);
                T* gi_row = dgi + ((long long)t * B + b) * D * H3 + d * H3;
                gi_row[j] = dr;
                gi_row[H + j] = dz;
                gi_row[2 * H + j] = dn;
                T* gh_row = dgh + (((long long)d * steps + s) * B + b) * H3;
                gh_row[j] = dr;
                gh_row[H + j] = dz;
                gh_row[2 * H + j] = dn * r;
                dhz[i] = dhv * z;
            }
        }
        gru_group_barrier(barrier + d, gridDim.x, target);
    }
    T acc[MAXP];
    gru_back_product<T, MAXP>(acc, g_s, w_s, dgh_d, B, H, J, jj, bl, rb, active);
    if (active) {
#pragma unroll
        for (int i = 0; i < MAXP; ++i) {
            const int b = bl + i * rb;
            if (b < B) dh0[d * BH + (long long)b * H + j] = dhz[i] + acc[i];
        }
    }
}
