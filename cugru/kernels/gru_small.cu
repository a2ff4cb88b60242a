// gru_small.cu: the small path (cugru/_plan.py, SmallPlan): a whole pass in one launch of one
// block, for shapes so small that a call's cost is its launches. The forward kernel does the
// input projection, the recurrence and h_n; the backward kernel the reverse recurrence and
// then the whole tail (dx and the weight and bias gradients). No cuBLAS, no copies, no
// atomics: every sum runs in a fixed order, so the same inputs give the same bits.
// Maths and buffers: gru_common.cuh. The units (d, b, j) of a step, D*B*H of them, both
// directions in the same step loop, are taken by groups of L lanes (forward) or by single
// threads (backward) in turn. Shared memory, dynamic: the states of a step (forward, two buffers of D*B*H),
// the carried gradient and the step's d_gate_h (backward, D*B*H + D*B*3H).
#include "gru_common.cuh"

// sum over row < rows of term(row), added up in chunks of 64 rows (each chunk's sum then
// added to the total): a float32 sum's rounding error grows with the terms summed in one
// chain, so this keeps it near that of 64 + rows/64 terms
template <typename T, typename F>
__device__ __forceinline__ T gru_small_rowsum(long long rows, F term) {
    T total = T(0);
    for (long long r0 = 0; r0 < rows; r0 += 64) {
        const long long r1 = r0 + 64 < rows ? r0 + 64 : rows;
        T part = T(0);
        for (long long row = r0; row < r1; ++row) part += term(row);
        total += part;
    }
    return total;
}

// unit i of D*B*H as (d, b, j)
__device__ __forceinline__ void gru_small_unit(int i, int B, int H, int& d, int& b, int& j) {
    const int bh = B * H;
    d = i / bh;
    const int rest = i - d * bh;
    b = rest / H;
    j = rest - b * H;
}

// h0 (D, B, H) or zeros (h0 null) -> h, and hs slot 0 (TRAIN) ... the recurrence ... h_n.
// hs, gates: the history when TRAIN (S = steps + 1 slots of hs), else unused (null).
// A unit's six products (x_t and h by each gate's rows of W_ih and W_hh) are split over a
// group of L lanes (a power of two up to 32; lane l takes k = l, l + L, ...), so that a
// warp's loads of weight rows are coalesced, then summed across the group by a butterfly
// of shuffles (the same tree for every lane: the same bits in each).
template <typename T, bool TRAIN, bool QAT>
__global__ void gru_small_forward(const T* __restrict__ x, const T* __restrict__ h0,
                                  const T* __restrict__ w_ih, const T* __restrict__ w_hh,
                                  const T* __restrict__ b_ih, const T* __restrict__ b_hh,
                                  T* __restrict__ hs, T* __restrict__ y, T* __restrict__ gates,
                                  T* __restrict__ h_n, const int* __restrict__ lengths,
                                  int steps, int B, int I, int H, int D, int L, T q_scale,
                                  T q_inv, T q_lo, T q_hi, int q_flags) {
    extern __shared__ __align__(16) unsigned char gru_small_smem[];
    T* h = reinterpret_cast<T*>(gru_small_smem);          // two buffers of D*B*H
    const int units = D * B * H;
    const long long S = steps + 1LL;
    const long long H3 = 3LL * H;
    const int lane = threadIdx.x & (L - 1), groups = blockDim.x / L;
    for (int i = threadIdx.x; i < units; i += blockDim.x) {
        const T v = h0 ? h0[i] : T(0);
        h[i] = v;
        if (TRAIN) {
            int d, b, j;
            gru_small_unit(i, B, H, d, b, j);
            hs[(long long)d * S * B * H + (long long)b * H + j] = v;
        }
    }
    __syncthreads();
    for (int s = 0; s < steps; ++s) {
        const T* cur = h + (s & 1) * units;
        T* nxt = h + ((s + 1) & 1) * units;
        // (the same trip count for every thread: all lanes of a warp reach the shuffles)
        for (int i0 = 0; i0 < units; i0 += groups) {
            const int i = i0 + (int)threadIdx.x / L;
            const bool live = i < units;
            int d = 0, b = 0, j = 0;
            T ir = T(0), iz = T(0), in = T(0), hr = T(0), hz = T(0), hh = T(0);
            if (live) {
                gru_small_unit(i, B, H, d, b, j);
                const T* xt = x + ((long long)gru_time(d, steps, s) * B + b) * I;
                const T* wr = w_ih + (d * H3 + j) * I;
                const T* hv = cur + (d * B + b) * H;
                const T* ur = w_hh + (d * H3 + j) * H;
                const long long wi = (long long)H * I, wh = (long long)H * H;
#pragma unroll 4
                for (long long k = lane; k < I; k += L) {
                    const T v = xt[k];
                    ir += wr[k] * v;
                    iz += wr[wi + k] * v;
                    in += wr[2 * wi + k] * v;
                }
#pragma unroll 4
                for (int k = lane; k < H; k += L) {
                    const T v = hv[k];
                    hr += ur[k] * v;
                    hz += ur[wh + k] * v;
                    hh += ur[2 * wh + k] * v;
                }
            }
            for (int off = L >> 1; off > 0; off >>= 1) {
                ir += __shfl_xor_sync(0xffffffffu, ir, off);
                iz += __shfl_xor_sync(0xffffffffu, iz, off);
                in += __shfl_xor_sync(0xffffffffu, in, off);
                hr += __shfl_xor_sync(0xffffffffu, hr, off);
                hz += __shfl_xor_sync(0xffffffffu, hz, off);
                hh += __shfl_xor_sync(0xffffffffu, hh, off);
            }
            if (live && lane == 0) {
                const int t = gru_time(d, steps, s);
                const T* bi = b_ih + d * H3;
                const T* bh = b_hh + d * H3;
                const T hn = hh + bh[2 * H + j];
                T r, z, n;
                const bool run = t < gru_length(lengths, b, steps);
                const T h_new = gru_cell<QAT>(ir + bi[j], iz + bi[H + j], in + bi[2 * H + j],
                                              hr + bh[j], hz + bh[H + j], hn, cur[i], r, z, n,
                                              GRU_QUANT(T), run);
                nxt[i] = h_new;
                y[((long long)t * B + b) * D * H + (long long)d * H + j] = run ? h_new : T(0);
                if (TRAIN) {
                    hs[((long long)d * S + s + 1) * B * H + (long long)b * H + j] = h_new;
                    T* g = gates + (((long long)d * steps + s) * B + b) * 4 * H;
                    g[j] = r;
                    g[H + j] = z;
                    g[2 * H + j] = n;
                    g[3 * H + j] = hn;
                }
            }
        }
        __syncthreads();
    }
    const T* last = h + (steps & 1) * units;
    for (int i = threadIdx.x; i < units; i += blockDim.x) h_n[i] = last[i];
}

// The reverse recurrence (dgi, dgh and dh0 from dy, dh_n or zeros, and the history), then
// the tail from them: dx (T, B, I); dw_ih (D, 3H, I), dw_hh (D, 3H, H), db_ih and db_hh
// (D, 3H), each a sum over the T*B rows in row order (gru_small_rowsum).
template <typename T, bool QAT>
__global__ void gru_small_backward(const T* __restrict__ dy, const T* __restrict__ dh_n,
                                   const T* __restrict__ x, const T* __restrict__ w_ih,
                                   const T* __restrict__ w_hh, const T* __restrict__ gates,
                                   const T* __restrict__ hs, T* __restrict__ dgi,
                                   T* __restrict__ dgh, T* __restrict__ dx,
                                   T* __restrict__ dh0, T* __restrict__ dw_ih,
                                   T* __restrict__ dw_hh, T* __restrict__ db_ih,
                                   T* __restrict__ db_hh, const int* __restrict__ lengths,
                                   int steps, int B, int I, int H, int D, T q_scale, T q_inv,
                                   T q_lo, T q_hi, int q_flags) {
    extern __shared__ __align__(16) unsigned char gru_small_smem[];
    const int units = D * B * H;
    const long long H3 = 3LL * H;
    T* carry = reinterpret_cast<T*>(gru_small_smem);       // D*B*H: the carried gradient of h
    T* dgs = carry + units;                                 // D*B*3H: this step's d_gate_h
    for (int i = threadIdx.x; i < units; i += blockDim.x) carry[i] = dh_n ? dh_n[i] : T(0);
    __syncthreads();
    for (int s = steps - 1; s >= 0; --s) {
        for (int i = threadIdx.x; i < units; i += blockDim.x) {
            int d, b, j;
            gru_small_unit(i, B, H, d, b, j);
            const int t = gru_time(d, steps, s);
            T r, z, n, hn, h, dr, dz, dn, r_used;
            gru_read_history(gates, hs, d, s, b, j, steps, B, H, r, z, n, hn, h);
            const bool run = t < gru_length(lengths, b, steps);
            const T dh = run ? dy[((long long)t * B + b) * D * H + (long long)d * H + j]
                                   + carry[i]
                             : carry[i];
            carry[i] = gru_cell_backward<QAT>(dh, r, z, n, hn, h, dr, dz, dn, r_used,
                                              GRU_QUANT(T), run);
            gru_write_backward(dgi, dgh, dr, dz, dn, r_used, d, D, s, t, b, j, steps, B, H);
            T* g = dgs + (d * B + b) * H3;
            g[j] = dr;
            g[H + j] = dz;
            g[2 * H + j] = dn * r_used;
        }
        __syncthreads();
        // carry = dh z + d_gate_h W_hh, unit by unit (each thread its own units)
        for (int i = threadIdx.x; i < units; i += blockDim.x) {
            int d, b, j;
            gru_small_unit(i, B, H, d, b, j);
            const T* g = dgs + (d * B + b) * H3;
            const T* wh = w_hh + d * H3 * H + j;
            T acc = carry[i];
#pragma unroll 4
            for (int k = 0; k < 3 * H; ++k) acc += g[k] * wh[(long long)k * H];
            carry[i] = acc;
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < units; i += blockDim.x) dh0[i] = carry[i];
    // the tail: dgi and dgh were written by this block, and the barrier above makes them
    // visible to all its threads
    const long long rows = (long long)steps * B, DG = D * H3;
    const long long n_dx = rows * I, n_ih = DG * I, n_hh = DG * H;
    const long long total = n_dx + n_ih + n_hh + 2 * DG;
    for (long long e = threadIdx.x; e < total; e += blockDim.x) {
        if (e < n_dx) {                       // dx[row, i] = sum over d, g of W_ih[d, g, i] dgi
            const long long row = e / I;
            const int i = (int)(e - row * I);
            const T* g = dgi + row * DG;
            T acc = T(0);
#pragma unroll 4
            for (long long k = 0; k < DG; ++k) acc += w_ih[k * I + i] * g[k];
            dx[e] = acc;
            continue;
        }
        long long f = e - n_dx;
        if (f < n_ih) {                       // dw_ih[dg, i] = sum over rows of dgi x
            const long long dg = f / I;
            const int i = (int)(f - dg * I);
            dw_ih[f] = gru_small_rowsum<T>(
                rows, [&](long long row) { return dgi[row * DG + dg] * x[row * I + i]; });
            continue;
        }
        f -= n_ih;
        if (f < n_hh) {                       // dw_hh[d, g, k] = sum over (s, b) of dgh hs
            const long long dg = f / H;
            const int k = (int)(f - dg * H);
            const int d = (int)(dg / H3);
            const T* gh = dgh + (long long)d * rows * H3 + (dg - d * H3);
            const T* hv = hs + (long long)d * (steps + 1LL) * B * H + k;
            dw_hh[f] = gru_small_rowsum<T>(
                rows, [&](long long row) { return gh[row * H3] * hv[row * H]; });
            continue;
        }
        f -= n_hh;
        if (f < DG) {                         // db_ih[dg] = sum over rows of dgi
            db_ih[f] = gru_small_rowsum<T>(rows, [&](long long row) { return dgi[row * DG + f]; });
            continue;
        }
        f -= DG;                              // db_hh[d, g] = sum over (s, b) of dgh
        const int d = (int)(f / H3);
        const T* gh = dgh + (long long)d * rows * H3 + (f - d * H3);
        db_hh[f] = gru_small_rowsum<T>(rows, [&](long long row) { return gh[row * H3]; });
    }
}
