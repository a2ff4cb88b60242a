// gru_resident.cu: the resident kernels (cugru/_plan.py, ResidentPlan): each pass of a large
// hidden size in one cooperative launch over many SMs, every block keeping its slice of W_hh
// in shared memory for all steps. Same maths and buffers as the per-step kernels
// (gru_common.cuh): the input projection gi is one GEMM before the forward launch, and the
// shared tail (dx and the weight gradients) runs after the backward one.
//
// The forward kernel.
// Work split. Direction d runs on the gridDim.x blocks of grid row d. Block x owns the batch
// rows [r0, r0 + ROWS) and the units [u0, u0 + UNITS), r0 = (x / UB) * ROWS and
// u0 = (x % UB) * UNITS with UB = ceil(H / UNITS) blocks across the units. It keeps its units'
// three gate columns of W_hh, k-major, in shared memory:
//   w_s[k][3 uu + g] = W_hh[d][g H + u0 + uu][k]     (zero where k or the unit is beyond H)
// Its threads form KS groups of NT1 = (ROWS / TR) x (UNITS / 2) threads; thread (tx, ty) of a
// group computes the TR rows r0 + TR ty .. and the two units u0 + 2 tx, + 1 (six gate
// columns) of the step's product h W_hh^T. The product runs over k in chunks of KC: each
// chunk of h (ROWS x KC) is copied from L2 into shared memory, transposed, with the next
// chunk's loads in flight while the current one is summed; group g sums the g-th of the KS
// slices of every chunk, in k order, with float32 FMAs. Groups 1.. then hand their sums to
// group 0 through shared memory, which adds them in group order: the same bits every run.
// Group 0 applies the cell to its tile (its inputs gi and h loaded before the product, so
// their latency hides behind it) and writes hs, y and, training, the history. The blocks of
// a direction then meet at a counter in global memory (not after the last step); the next
// step reads the new h through L2 (__ldcg).
//
// Any B and H: rows and units beyond them are computed on zeros and not written. The host
// checks the split (cugru/_plan.py, resident_split): every block of both directions
// resident at once (a cooperative launch), GRU_RESIDENT_THREADS threads a block.
#include "gru_common.cuh"

// four consecutive floats of a row, from element k (< n, the row's length) at src: one
// 16-byte load where `vec` (the row 16-byte aligned, n a multiple of 4), else one element at
// a time with zeros from n on; CG: through L2 alone (__ldcg: values other blocks wrote in
// this launch), else through the read-only path (__ldg)
template <bool CG>
__device__ __forceinline__ float4 gru_res_row4(const float* src, int k, int n, bool vec) {
    if (vec) {
        const float4* p = reinterpret_cast<const float4*>(src);
        return CG ? __ldcg(p) : __ldg(p);
    }
    float4 v = make_float4(CG ? __ldcg(src) : __ldg(src), 0.f, 0.f, 0.f);
    if (k + 1 < n) v.y = CG ? __ldcg(src + 1) : __ldg(src + 1);
    if (k + 2 < n) v.z = CG ? __ldcg(src + 2) : __ldg(src + 2);
    if (k + 3 < n) v.w = CG ? __ldcg(src + 3) : __ldg(src + 3);
    return v;
}

// one chunk (rows r0.. of ROWS, elements k0.. of KC) of a matrix of rows of n elements
// (h: n = H; d_gate_h: n = 3H) into registers: zeros beyond B and n
template <int ROWS, int KC, int LOADS>
__device__ __forceinline__ void gru_res_load(float4 (&v)[LOADS], const float* base, int r0,
                                             int B, int n, int k0, bool vec) {
    constexpr int Q = KC / 4;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int e = threadIdx.x + i * GRU_RESIDENT_THREADS, row = e / Q;
        const int k = k0 + (e - row * Q) * 4;
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (e >= ROWS * Q || r0 + row >= B || k >= n) continue;
        v[i] = gru_res_row4<true>(base + (long long)(r0 + row) * n + k, k, n, vec);
    }
}

// the chunk into shared memory, transposed (KC x HP): a thread's TR rows at one k are one
// 16-byte load
template <int ROWS, int KC, int LOADS>
__device__ __forceinline__ void gru_res_store(float* h_s, const float4 (&v)[LOADS]) {
    constexpr int Q = KC / 4, HP = ROWS + GRU_RESIDENT_ROW_PAD;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int e = threadIdx.x + i * GRU_RESIDENT_THREADS, row = e / Q;
        const int k = (e - row * Q) * 4;
        if (e >= ROWS * Q) break;
        h_s[(k + 0) * HP + row] = v[i].x;
        h_s[(k + 1) * HP + row] = v[i].y;
        h_s[(k + 2) * HP + row] = v[i].z;
        h_s[(k + 3) * HP + row] = v[i].w;
    }
}

// a row's COLS weights of w_s at p: 16-byte loads where they are 16-byte aligned (4
// columns: the backward's units), else 8-byte ones (6 columns: the forward's gates)
__device__ __forceinline__ void gru_res_w(const float* p, float (&wc)[4]) {
    const float4 w = *reinterpret_cast<const float4*>(p);
    wc[0] = w.x, wc[1] = w.y, wc[2] = w.z, wc[3] = w.w;
}
__device__ __forceinline__ void gru_res_w(const float* p, float (&wc)[6]) {
    const float2 w0 = *reinterpret_cast<const float2*>(p);
    const float2 w1 = *reinterpret_cast<const float2*>(p + 2);
    const float2 w2 = *reinterpret_cast<const float2*>(p + 4);
    wc[0] = w0.x, wc[1] = w0.y, wc[2] = w1.x, wc[3] = w1.y, wc[4] = w2.x, wc[5] = w2.y;
}

// a thread's tile of the block's product, both kernels: acc[i][c] = the sum over k < kn of
// row (r0 + TR ty + i) of src (rows of n elements, zeros beyond B and n) times
// w_s[k][COLS tx + c] (NW floats a k). The rows come through L2 in chunks of KC, each copied
// into shared memory h_s (two buffers), transposed, while the next chunk's loads are in
// flight; group grp sums the KK values of k of its slice of every chunk, in k order.
template <int ROWS, int KC, int KK, int NW, int COLS>
__device__ __forceinline__ void gru_res_product(float (&acc)[GRU_RESIDENT_THREAD_ROWS][COLS],
                                                const float* src, int r0, int B, int n,
                                                int kn, bool vec, float* h_s,
                                                const float* w_s, int grp, int tx, int ty) {
    constexpr int TR = GRU_RESIDENT_THREAD_ROWS, HP = ROWS + GRU_RESIDENT_ROW_PAD;
    constexpr int LOADS = (ROWS * KC / 4 + GRU_RESIDENT_THREADS - 1) / GRU_RESIDENT_THREADS;
#pragma unroll
    for (int i = 0; i < TR; ++i)
#pragma unroll
        for (int c = 0; c < COLS; ++c) acc[i][c] = 0.f;
    float4 v[LOADS];
    gru_res_load<ROWS, KC>(v, src, r0, B, n, 0, vec);
    gru_res_store<ROWS, KC>(h_s, v);
    __syncthreads();
    const int chunks = kn / KC;
    for (int kc = 0; kc < chunks; ++kc) {
        const bool more = kc + 1 < chunks;
        if (more) gru_res_load<ROWS, KC>(v, src, r0, B, n, (kc + 1) * KC, vec);
        const float* hb = h_s + (kc & 1) * KC * HP + grp * KK * HP + ty * TR;
        const float* wb = w_s + (kc * KC + grp * KK) * NW + tx * COLS;
#pragma unroll
        for (int k = 0; k < KK; ++k) {
            const float4 hv = *reinterpret_cast<const float4*>(hb + k * HP);
            const float hr[TR] = {hv.x, hv.y, hv.z, hv.w};
            float wc[COLS];
            gru_res_w(wb + k * NW, wc);
#pragma unroll
            for (int i = 0; i < TR; ++i)
#pragma unroll
                for (int c = 0; c < COLS; ++c) acc[i][c] = fmaf(hr[i], wc[c], acc[i][c]);
        }
        if (more) gru_res_store<ROWS, KC>(h_s + ((kc + 1) & 1) * KC * HP, v);
        __syncthreads();
    }
}

template <int ROWS, int UNITS, int KS, bool TRAIN>
__global__ void __launch_bounds__(GRU_RESIDENT_THREADS, 1)
gru_resident_forward(const float* __restrict__ gi, const float* __restrict__ w_hh,
                     const float* __restrict__ b_ih, const float* __restrict__ b_hh, float* hs,
                     float* __restrict__ y, float* __restrict__ gates, unsigned int* barrier,
                     int steps, int B, int H, int S) {
    constexpr int TR = GRU_RESIDENT_THREAD_ROWS, KC = GRU_RESIDENT_CHUNK;
    constexpr int NT1 = (ROWS / TR) * (UNITS / 2), NC = 3 * UNITS, KK = KC / KS;
    constexpr int HP = ROWS + GRU_RESIDENT_ROW_PAD;
    static_assert(TR == 4, "a thread's rows are one 16-byte load of the transposed chunk");
    static_assert(KS * NT1 == GRU_RESIDENT_THREADS, "the groups fill the block");
    static_assert(KC % (4 * KS) == 0 && HP % 4 == 0, "16-byte chunks and slices");
    extern __shared__ __align__(16) float smem[];
    const int D = gridDim.y, d = blockIdx.y;
    const int UB = (H + UNITS - 1) / UNITS;
    const int r0 = blockIdx.x / UB * ROWS, u0 = blockIdx.x % UB * UNITS;
    const int HK = gru_round_up(H, KC);
    float* w_s = smem;                    // [HK][NC]
    float* h_s = w_s + HK * NC;           // [2][KC][HP]: the chunks, double-buffered
    float* red = h_s + 2 * KC * HP;       // [KS - 1][TR * 6][NT1]: groups 1..'s sums
    const int grp = threadIdx.x / NT1, local = threadIdx.x - grp * NT1;
    const int tx = local % (UNITS / 2), ty = local / (UNITS / 2);
    const long long H3 = 3LL * H, BH = (long long)B * H;

    // the slice of W_hh, once: lanes take consecutive columns (the stores meet distinct
    // banks), a thread 4 k of one column, in one 16-byte load where rows are 16-byte aligned
    const bool vec = (H & 3) == 0;
    const float* wd = w_hh + (long long)d * H3 * H;
    for (int e = threadIdx.x; e < NC * (HK / 4); e += GRU_RESIDENT_THREADS) {
        const int c = e % NC, k = e / NC * 4, unit = u0 + c / 3;
        const float* src = wd + ((long long)(c % 3) * H + unit) * H + k;
        const float4 v = unit < H && k < H ? gru_res_row4<false>(src, k, H, vec)
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
        w_s[(k + 0) * NC + c] = v.x;
        w_s[(k + 1) * NC + c] = v.y;
        w_s[(k + 2) * NC + c] = v.z;
        w_s[(k + 3) * NC + c] = v.w;
    }
    // group 0's units (j0 and j0 + 1, where below H) and their biases
    const int j0 = u0 + 2 * tx;
    const bool mine = grp == 0 && j0 < H;
    float bi[3][2], bh[3][2];
#pragma unroll
    for (int g = 0; g < 3; ++g)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const bool in = grp == 0 && j0 + u < H;
            bi[g][u] = in ? b_ih[d * H3 + g * H + j0 + u] : 0.f;
            bh[g][u] = in ? b_hh[d * H3 + g * H + j0 + u] : 0.f;
        }
    const GruQuant<float> none{0.f, 0.f, 0.f, 0.f, 0};
    unsigned int target = 0;
    __syncthreads();

    for (int s = 0; s < steps; ++s) {
        const int t = gru_time(d, steps, s);
        const float* hin = hs + ((long long)d * S + s % S) * BH;
        // the cell's inputs (group 0): gi of time t and the state, before the product
        float xg[TR][3][2], old[TR][2];
#pragma unroll
        for (int i = 0; i < TR; ++i) {
            const int b = r0 + ty * TR + i;
            const float* row = gi + ((long long)t * B + b) * D * H3 + d * H3 + j0;
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const bool in = mine && b < B && j0 + u < H;
#pragma unroll
                for (int g = 0; g < 3; ++g) xg[i][g][u] = in ? __ldg(row + g * H + u) : 0.f;
                old[i][u] = in ? __ldcg(hin + (long long)b * H + j0 + u) : 0.f;
            }
        }
        float acc[TR][6];
        gru_res_product<ROWS, KC, KK, NC>(acc, hin, r0, B, H, HK, vec, h_s, w_s, grp, tx, ty);
        if (KS > 1) {
            if (grp > 0)
#pragma unroll
                for (int e = 0; e < TR * 6; ++e)
                    red[((grp - 1) * TR * 6 + e) * NT1 + local] = acc[e / 6][e % 6];
            __syncthreads();
            if (grp == 0)
#pragma unroll
                for (int g = 1; g < KS; ++g)
#pragma unroll
                    for (int e = 0; e < TR * 6; ++e)
                        acc[e / 6][e % 6] += red[((g - 1) * TR * 6 + e) * NT1 + local];
        }
        if (mine) {
#pragma unroll
            for (int i = 0; i < TR; ++i) {
                const int b = r0 + ty * TR + i;
                if (b >= B) break;
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    if (j0 + u >= H) break;
                    const float hn = acc[i][3 * u + 2] + bh[2][u];
                    float r, z, n;
                    const float h_new = gru_cell<false>(
                        xg[i][0][u] + bi[0][u], xg[i][1][u] + bi[1][u], xg[i][2][u] + bi[2][u],
                        acc[i][3 * u] + bh[0][u], acc[i][3 * u + 1] + bh[1][u], hn, old[i][u],
                        r, z, n, none);
                    gru_write_forward<float, TRAIN>(hs, y, gates, h_new, true, r, z, n, hn, d,
                                                    D, s, t, b, j0 + u, steps, B, H, S);
                }
            }
        }
        if (s + 1 < steps) gru_group_barrier(barrier + d, gridDim.x, target);
    }
}

// The resident backward kernel: the backward recurrence of the same shapes in one
// cooperative launch, from the history the forward pass kept; it fills dgi, dgh and dh
// (dh_n or zeros in, dh0 out) as the per-step backward pass does, and the shared tail
// (cugru/_passes.py) takes the weight gradients and dx from them.
//
// Work split. Block x of grid row d owns the rows [r0, r0 + ROWS) and units [u0, u0 + UNITS)
// of the carried gradient dh, as in the forward kernel, and keeps the matching columns of
// W_hh, j-major over its 3H rows:
//   w_s[j][uu] = W_hh[d][j][u0 + uu]     (zero where j >= 3H or the unit is beyond H)
// Step s (from the last): the block's 256 threads each take OPT of its ROWS x UNITS units,
// thread e the units o = e + 256 i (row o / UNITS, unit o % UNITS), and apply the cell
// backward to them (gru_cell_backward, from dy + the carried gradient), writing dgi, dgh of
// step s and keeping dh*z. The blocks of the direction meet at the counter; then each block
// sums its tile of dgh_s W_hh (the rows of dgh_s through L2, in chunks of KC of j as the
// forward kernel reads h; KC per split: cugru/_catalog.py's RESIDENT_BACKWARD_CHUNK):
// groups of NT1 = (ROWS / 4) x (UNITS / 4) threads, a thread 4 rows x 4 units, group g
// summing the g-th of the KSB slices of every chunk in j order. The
// groups' sums meet in shared memory, where each unit's thread adds them in group order to
// its dh*z: the carried gradient of step s - 1 (after step 0: dh0, stored to dh).
template <int ROWS, int UNITS, int KC>
__global__ void __launch_bounds__(GRU_RESIDENT_THREADS, 1)
gru_resident_backward(const float* __restrict__ dy, const float* __restrict__ gates,
                      const float* __restrict__ hs, float* __restrict__ dh,
                      float* __restrict__ dgi, float* dgh, const float* __restrict__ w_hh,
                      unsigned int* barrier, int steps, int B, int H) {
    constexpr int TR = GRU_RESIDENT_THREAD_ROWS;
    constexpr int HP = ROWS + GRU_RESIDENT_ROW_PAD;
    constexpr int NT1 = (ROWS / TR) * (UNITS / 4), KSB = GRU_RESIDENT_THREADS / NT1;
    constexpr int KK = KC / KSB, OPT = ROWS * UNITS / GRU_RESIDENT_THREADS;
    static_assert(TR == 4, "a thread's rows are one 16-byte load of the transposed chunk");
    static_assert(UNITS % 4 == 0 && ROWS % TR == 0 && HP % 4 == 0,
                  "16-byte loads and stores of w_s, the chunks and the groups' sums");
    static_assert(KSB * NT1 == GRU_RESIDENT_THREADS && KK * KSB == KC && KK >= 1,
                  "the groups fill the block and split a chunk evenly");
    static_assert(OPT * GRU_RESIDENT_THREADS == ROWS * UNITS, "every thread takes OPT units");
    extern __shared__ __align__(16) float smem[];
    const int D = gridDim.y, d = blockIdx.y;
    const int UB = (H + UNITS - 1) / UNITS;
    const int r0 = blockIdx.x / UB * ROWS, u0 = blockIdx.x % UB * UNITS;
    const int H3 = 3 * H, JK = gru_round_up(H3, KC);
    float* w_s = smem;                    // [JK][UNITS]
    float* h_s = w_s + JK * UNITS;        // [2][KC][HP]: chunks of dgh_s, double-buffered
    float* red = h_s;                     // [KSB][ROWS][UNITS]: the groups' sums (after)
    const int grp = threadIdx.x / NT1, local = threadIdx.x - grp * NT1;
    const int tx = local % (UNITS / 4), ty = local / (UNITS / 4);
    const long long BH = (long long)B * H;
    const bool vec = (H & 3) == 0;

    // the columns of W_hh, once: a thread 4 units of one row j
    const float* wd = w_hh + (long long)d * H3 * H;
    for (int e = threadIdx.x; e < JK * (UNITS / 4); e += GRU_RESIDENT_THREADS) {
        const int j = e / (UNITS / 4), uu = (e - j * (UNITS / 4)) * 4, unit = u0 + uu;
        const float4 v = j < H3 && unit < H
                             ? gru_res_row4<false>(wd + (long long)j * H + unit, unit, H, vec)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(w_s + j * UNITS + uu) = v;
    }
    // this thread's units of the cell, and their carried gradient (dh_n or zeros)
    int ob[OPT], oj[OPT];
    float carry[OPT], dhz[OPT];
#pragma unroll
    for (int i = 0; i < OPT; ++i) {
        const int o = threadIdx.x + i * GRU_RESIDENT_THREADS;
        ob[i] = r0 + o / UNITS;
        oj[i] = u0 + o % UNITS;
        const bool in = ob[i] < B && oj[i] < H;
        carry[i] = in ? dh[d * BH + (long long)ob[i] * H + oj[i]] : 0.f;
        dhz[i] = 0.f;
    }
    const GruQuant<float> none{0.f, 0.f, 0.f, 0.f, 0};
    unsigned int target = 0;
    __syncthreads();

    // step s's cell for s >= 0, after the product of dgh_{s+1} (s < steps - 1); s = -1:
    // the last product alone, into dh0
    for (int s = steps - 1; s >= -1; --s) {
        const int t = s >= 0 ? gru_time(d, steps, s) : 0;
        // the cell's inputs, before the product: its history and dy
        float hr[OPT], hz[OPT], hn_[OPT], hnn[OPT], hh[OPT], dyv[OPT];
#pragma unroll
        for (int i = 0; i < OPT; ++i) {
            hr[i] = hz[i] = hn_[i] = hnn[i] = hh[i] = dyv[i] = 0.f;
            if (s >= 0 && ob[i] < B && oj[i] < H) {
                gru_read_history(gates, hs, d, s, ob[i], oj[i], steps, B, H, hr[i], hz[i],
                                 hn_[i], hnn[i], hh[i]);
                dyv[i] = __ldg(dy + ((long long)t * B + ob[i]) * D * H + (long long)d * H +
                               oj[i]);
            }
        }
        if (s < steps - 1) {
            // dgh_{s+1} W_hh over this block's tile
            const float* src = dgh + ((long long)d * steps + s + 1) * B * H3;
            float acc[TR][4];
            gru_res_product<ROWS, KC, KK, UNITS>(acc, src, r0, B, H3, JK, vec, h_s, w_s, grp, tx,
                                                 ty);
#pragma unroll
            for (int i = 0; i < TR; ++i)
                *reinterpret_cast<float4*>(red + (grp * ROWS + ty * TR + i) * UNITS + tx * 4) =
                    make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
            __syncthreads();
#pragma unroll
            for (int i = 0; i < OPT; ++i) {
                const int o = threadIdx.x + i * GRU_RESIDENT_THREADS;
                float sum = red[o];
#pragma unroll
                for (int g = 1; g < KSB; ++g) sum += red[g * ROWS * UNITS + o];
                carry[i] = dhz[i] + sum;
            }
        }
        if (s < 0) break;
#pragma unroll
        for (int i = 0; i < OPT; ++i) {
            if (ob[i] >= B || oj[i] >= H) continue;
            float dr, dz, dn, r_used;
            dhz[i] = gru_cell_backward<false>(dyv[i] + carry[i], hr[i], hz[i], hn_[i], hnn[i],
                                              hh[i], dr, dz, dn, r_used, none);
            gru_write_backward(dgi, dgh, dr, dz, dn, r_used, d, D, s, t, ob[i], oj[i], steps,
                               B, H);
        }
        // (every step: the product after it reads dgh_s of the direction's other blocks)
        gru_group_barrier(barrier + d, gridDim.x, target);
    }
#pragma unroll
    for (int i = 0; i < OPT; ++i)
        if (ob[i] < B && oj[i] < H) dh[d * BH + (long long)ob[i] * H + oj[i]] = carry[i];
}
