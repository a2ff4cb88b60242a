// gru_resident.cu: the resident forward kernel (cugru/_plan.py, ResidentPlan): a forward pass
// of a large hidden size in one cooperative launch over many SMs, every block keeping its
// slice of W_hh in shared memory for all steps. Same maths and buffers as the per-step
// kernels (gru_common.cuh): the input projection gi is one GEMM before the launch, and the
// backward pass runs per step (gru_steps.cu) from the history this kernel writes.
//
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

// one chunk of h (rows r0.. of ROWS, k from k0, KC wide) into registers: zeros beyond B and
// H; 16-byte loads where rows are 16-byte aligned (`vec`: H a multiple of 4), else 4-byte ones
template <int ROWS, int LOADS>
__device__ __forceinline__ void gru_res_load(float4 (&v)[LOADS], const float* hin, int r0,
                                             int B, int H, int k0, bool vec) {
    constexpr int Q = GRU_RESIDENT_CHUNK / 4;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int e = threadIdx.x + i * GRU_RESIDENT_THREADS, row = e / Q;
        const int k = k0 + (e - row * Q) * 4;
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (e >= ROWS * Q || r0 + row >= B || k >= H) continue;
        const float* src = hin + (long long)(r0 + row) * H + k;
        if (vec) {
            v[i] = __ldcg(reinterpret_cast<const float4*>(src));
        } else {
            v[i].x = __ldcg(src);
            if (k + 1 < H) v[i].y = __ldcg(src + 1);
            if (k + 2 < H) v[i].z = __ldcg(src + 2);
            if (k + 3 < H) v[i].w = __ldcg(src + 3);
        }
    }
}

// the chunk into shared memory, transposed (KC x HP): a thread's TR rows at one k are one
// 16-byte load
template <int ROWS, int LOADS>
__device__ __forceinline__ void gru_res_store(float* h_s, const float4 (&v)[LOADS]) {
    constexpr int Q = GRU_RESIDENT_CHUNK / 4, HP = ROWS + GRU_RESIDENT_ROW_PAD;
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

template <int ROWS, int UNITS, int KS, bool TRAIN>
__global__ void __launch_bounds__(GRU_RESIDENT_THREADS, 1)
gru_resident_forward(const float* __restrict__ gi, const float* __restrict__ w_hh,
                     const float* __restrict__ b_ih, const float* __restrict__ b_hh, float* hs,
                     float* __restrict__ y, float* __restrict__ gates, unsigned int* barrier,
                     int steps, int B, int H, int S) {
    constexpr int TR = GRU_RESIDENT_THREAD_ROWS, KC = GRU_RESIDENT_CHUNK;
    constexpr int NT1 = (ROWS / TR) * (UNITS / 2), NC = 3 * UNITS, KK = KC / KS;
    constexpr int HP = ROWS + GRU_RESIDENT_ROW_PAD;
    constexpr int LOADS = (ROWS * KC / 4 + GRU_RESIDENT_THREADS - 1) / GRU_RESIDENT_THREADS;
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
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (unit < H && k < H) {
            if (vec) {
                v = __ldg(reinterpret_cast<const float4*>(src));
            } else {
                v.x = __ldg(src);
                if (k + 1 < H) v.y = __ldg(src + 1);
                if (k + 2 < H) v.z = __ldg(src + 2);
                if (k + 3 < H) v.w = __ldg(src + 3);
            }
        }
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
#pragma unroll
        for (int i = 0; i < TR; ++i)
#pragma unroll
            for (int c = 0; c < 6; ++c) acc[i][c] = 0.f;
        float4 v[LOADS];
        gru_res_load<ROWS>(v, hin, r0, B, H, 0, vec);
        gru_res_store<ROWS>(h_s, v);
        __syncthreads();
        const int chunks = HK / KC;
        for (int kc = 0; kc < chunks; ++kc) {
            const bool more = kc + 1 < chunks;
            if (more) gru_res_load<ROWS>(v, hin, r0, B, H, (kc + 1) * KC, vec);
            const float* hb = h_s + (kc & 1) * KC * HP + grp * KK * HP + ty * TR;
            const float* wb = w_s + (kc * KC + grp * KK) * NC + tx * 6;
#pragma unroll
            for (int k = 0; k < KK; ++k) {
                const float4 hv = *reinterpret_cast<const float4*>(hb + k * HP);
                const float2 w0 = *reinterpret_cast<const float2*>(wb + k * NC);
                const float2 w1 = *reinterpret_cast<const float2*>(wb + k * NC + 2);
                const float2 w2 = *reinterpret_cast<const float2*>(wb + k * NC + 4);
                const float hr[TR] = {hv.x, hv.y, hv.z, hv.w};
                const float wc[6] = {w0.x, w0.y, w1.x, w1.y, w2.x, w2.y};
#pragma unroll
                for (int i = 0; i < TR; ++i)
#pragma unroll
                    for (int c = 0; c < 6; ++c) acc[i][c] = fmaf(hr[i], wc[c], acc[i][c]);
            }
            if (more) gru_res_store<ROWS>(h_s + ((kc + 1) & 1) * KC * HP, v);
            __syncthreads();
        }
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
