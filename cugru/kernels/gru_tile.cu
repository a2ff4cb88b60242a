// gru_tile.cu: the persistent kernels with W_hh in registers (cugru/_plan.py, TilePlan).
// A group of C blocks (C = 1: one block; C > 1: a thread-block cluster; C = 0: G blocks that
// meet at a counter in global memory, "grid scope") of NT threads runs one direction d for
// one group of R <= MR batch rows, b0 = g*R: gridDim.y = D. Groups are independent (the
// recurrence never mixes batch rows). At block and cluster scope gridDim.x = groups * C, one
// group per cluster, and groups need not be resident at once. At grid scope gridDim.x =
// slots * G: the G blocks of a slot take groups g = slot, slot + slots, ... one after the
// other, and the host launches cooperatively (every block resident). Block c of a group
// owns units [j0, min(j0 + J, H)), j0 = c*J (none where j0 >= H: a cluster's last blocks,
// where 16-byte packs of units leave them none, take part in the exchange only). A step
// has two phases.
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
//    i = p / J: it adds the KS lane sums of its unit pairwise (the same bits every run),
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
// LEN: the instance for variable lengths (gru_common.cuh); without it `lengths` is not read
// and the code is the plain GRU's (the 512-thread tiles have no register left for lengths).
#include "gru_common.cuh"

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
// does not depend on the recurrence, GRU_TILE_AHEAD steps ahead (rendered from
// cugru/_catalog.py), into a ring in shared memory: each lane copies exactly the elements it
// later reads, so waiting for its own copy groups makes them visible to it (no barrier needed).

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

// the most lanes per unit, GRU_TILE_MAX_LANES at block and cluster scope and
// GRU_GRID_MAX_LANES at grid scope, are rendered from cugru/_catalog.py (its splits keep to
// them)

// The sum of K values (K a power of two), pairwise: the sums of the two halves added, down
// to single values, so a sum's rounding error grows with log2(K), not with K (and the bits
// are the same every run). x: K values in registers; p: K values in shared memory, `stride`
// apart (1: read as 16-byte packs where K fills them; p then starts on a pack).
template <int K, typename T>
__device__ __forceinline__ T gru_pairwise(const T* x) {
    if constexpr (K == 1) return x[0];
    else return gru_pairwise<K / 2>(x) + gru_pairwise<K / 2>(x + K / 2);
}

template <int K, typename T>
__device__ __forceinline__ T gru_pairwise_smem(const T* p, int stride) {
    constexpr int V = Pack16<T>::N;
    if constexpr (K == 1) {
        return p[0];
    } else if constexpr (K == V) {
        T x[V];
        if (stride == 1) {
            gru_smem_pack(p, x);
        } else {
#pragma unroll
            for (int e = 0; e < V; ++e) x[e] = p[e * stride];
        }
        return gru_pairwise<V>(x);
    } else if constexpr (K <= 8) {
        return gru_pairwise_smem<K / 2>(p, stride) +
               gru_pairwise_smem<K / 2>(p + (K / 2) * stride, stride);
    } else {
        // (grid scope, up to 64 lanes) the same tree, its blocks of 8 values read in turn
        // in a loop (unrolled, 64 doubles read together spill the forward kernels'
        // registers): each block's sum is added to the partial sums before it like a binary
        // counter, level l holding the sum of 2^l blocks
        constexpr int NB = K / 8;
        constexpr int LEVELS = NB == 2 ? 2 : NB == 4 ? 3 : 4;   // log2(NB) + 1
        static_assert(NB == 2 || NB == 4 || NB == 8, "8 to 64 values");
        T level[LEVELS];
#pragma unroll 1
        for (int b = 0; b < NB; ++b) {
            T v = gru_pairwise_smem<8>(p + b * 8 * stride, stride);
            bool carry = true;   // (v still to be placed; the levels below b's lowest 0 bit)
#pragma unroll
            for (int l = 0; l < LEVELS - 1; ++l) {
                if (carry && (b >> l & 1)) {
                    v = level[l] + v;
                } else if (carry) {
                    level[l] = v;
                    carry = false;
                }
            }
            if (carry) level[LEVELS - 1] = v;
        }
        return level[LEVELS - 1];
    }
}

// out[g] = the pairwise sum of the K lane sums p[g*ld + k*stride], k < K, of each gate
template <typename T, int K>
__device__ __forceinline__ void gru_sum_lanes(T (&out)[3], const T* p, int ld, int stride) {
    if constexpr (K > 8) {   // (the gates one after another: a loop, registers kept)
#pragma unroll 1
        for (int g = 0; g < 3; ++g) {
            const T v = gru_pairwise_smem<K>(p + g * ld, stride);
            out[0] = g == 0 ? v : out[0];
            out[1] = g == 1 ? v : out[1];
            out[2] = g == 2 ? v : out[2];
        }
    } else {
#pragma unroll
        for (int g = 0; g < 3; ++g) out[g] = gru_pairwise_smem<K>(p + g * ld, stride);
    }
}

// The lane sums' row stride of the MMA kernels (cugru/_catalog.py, mma_part_row): 3*J*KS
// rounded up to GRU_MMA_ROW_ALIGN (16), plus GRU_MMA_ROW_PAD (4), so that the 8 rows a
// warp's mma results go to start 8 banks apart (the MMA product below)
__device__ __forceinline__ int gru_mma_part_row(int JK) {
    return (3 * JK + GRU_MMA_ROW_ALIGN - 1) / GRU_MMA_ROW_ALIGN * GRU_MMA_ROW_ALIGN
           + GRU_MMA_ROW_PAD;
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
template <typename T, int C, int Q, int MR, int NT, int U, bool MMA = false> struct GruTile {
    static constexpr int V = Pack16<T>::N;
    int d, b0, rows, j0, HS, JK;
    int J, RS;          // MMA: units, and the lane sums' row stride (gru_mma_part_row)
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
        if constexpr (MMA) {
            this->J = J;
            RS = gru_mma_part_row(JK);
        }
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
        ring = part + MR * (MMA ? RS : 3 * JK) + (C > 0 ? 2 * R * segs * J : 0);   // (the gap)
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
    // this thread's sums of the three gates: the lane sums of its unit, added pairwise
    // (gru_pairwise; KS a power of two up to GRU_TILE_MAX_LANES, or GRU_GRID_MAX_LANES at
    // grid scope). The FMA layout keeps a unit's lanes side by side (pu*KS + ks); the MMA
    // layout puts row pi at pi*RS, then gate, lane ks, unit pu (lanes J apart).
    __device__ __forceinline__ void unit_sums(T (&out)[3], int KS) const {
        static_assert(GRU_TILE_MAX_LANES == 8 && GRU_GRID_MAX_LANES == 64,
                      "unit_sums takes 1 to 8 lanes, or up to 64 at grid scope");
        const T* p = MMA ? part + pi * RS + pu : part + pi * 3 * JK + pu * KS;
        const int stride = MMA ? J : 1;
        if (KS == 1) gru_sum_lanes<T, 1>(out, p, JK, stride);
        else if (KS == 2) gru_sum_lanes<T, 2>(out, p, JK, stride);
        else if (KS == 4) gru_sum_lanes<T, 4>(out, p, JK, stride);
        else if (C > 0 || KS == 8) gru_sum_lanes<T, 8>(out, p, JK, stride);
        else if (KS == 16) gru_sum_lanes<T, 16>(out, p, JK, stride);
        else if (KS == 32) gru_sum_lanes<T, 32>(out, p, JK, stride);
        else gru_sum_lanes<T, 64>(out, p, JK, stride);
    }
};

// Grid scope: the vector of a step from global memory into shared memory, zero past H and
// in the rows past `rows`:
//   vec[(i*segs + g)*HS + k] = src[i*ld + g*H + k]   for i < MR, g < segs, k < HS.
// Through L2 (other blocks wrote the vector: L1 may hold stale lines). It returns once all of
// this thread's copies (the ring's too) have landed. Two ways (the same for the whole block):
// - H a multiple of the pack: every row starts on a 16-byte boundary; asynchronous 16-byte
//   copies, zero-filled where there is no source.
// - else: the group's rows of a step are one span of rows*segs*H elements from src (ld is
//   segs*H), which starts anywhere in a 16-byte pack. Its packs are loaded (the first and
//   last element by element, where they reach past the span), 64 bytes in flight per
//   thread (32 in double), and each element is stored at its row and column. The vector
//   stays zero elsewhere from gru_tile_zero at the start of the group.
template <typename T, int MR, int NT>
__device__ __forceinline__ void gru_tile_stage(T* vec, int HS, int segs, const T* src,
                                               int ld, int H, int rows) {
    constexpr int V = Pack16<T>::N;
    if (H % V == 0) {
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
    } else {
        typedef typename Pack16<T>::type P;
        // packs in flight per thread (two in double: more spill in the grid backward kernels)
        constexpr int L = V == 4 ? 4 : 2;
        // the span's elements before src in its first pack
        const int lead = (int)((reinterpret_cast<unsigned long long>(src) & 15) / sizeof(T));
        const T* base = src - lead;
        const int n = rows * segs * H, np = (lead + n + V - 1) / V;
        for (int p0 = threadIdx.x; p0 < np; p0 += L * NT) {
            T v[L][V];
#pragma unroll
            for (int u = 0; u < L; ++u) {
                const int p = p0 + u * NT, f0 = p * V - lead;   // the pack's first element
                if (p < np && f0 >= 0 && f0 + V <= n) {
                    const P q = __ldcg(reinterpret_cast<const P*>(base) + p);
                    const T* e = reinterpret_cast<const T*>(&q);
#pragma unroll
                    for (int k = 0; k < V; ++k) v[u][k] = e[k];
                } else {
#pragma unroll
                    for (int k = 0; k < V; ++k)
                        v[u][k] = (p < np && f0 + k >= 0 && f0 + k < n) ? __ldcg(src + f0 + k)
                                                                         : T(0);
                }
            }
#pragma unroll
            for (int u = 0; u < L; ++u) {
                // element f = f0 + e of the span is row rg = f / H, column f % H: one
                // division a pack, then the column counts on (negative before the span)
                const int f0 = (p0 + u * NT) * V - lead;
                int rg = f0 > 0 ? f0 / H : 0, col = f0 - rg * H;
#pragma unroll
                for (int e = 0; e < V; ++e) {
                    if (f0 + e >= 0 && f0 + e < n) vec[rg * HS + col] = v[u][e];
                    if (++col == H) {
                        col = 0;
                        ++rg;
                    }
                }
            }
        }
    }
    asm volatile("cp.async.commit_group;\n\tcp.async.wait_group 0;" ::: "memory");
}

// Grid scope, H not a multiple of the pack: the vector's MR rows of segs*HS zeroed at the
// start of a group (gru_tile_stage then writes only the group's rows below H), and the
// block's threads meet (their last reads of the vector came before, at the previous
// group's last barrier)
template <typename T, int MR, int NT>
__device__ __forceinline__ void gru_tile_zero(T* vec, int HS, int segs, int H) {
    if (H % Pack16<T>::N == 0) return;
    for (int idx = threadIdx.x; idx < MR * segs * HS; idx += NT) vec[idx] = T(0);
    __syncthreads();
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

// ---- The product on tensor cores (MMA: float32 data under math="tf32"; cugru/_catalog.py's
// MMA_TILES, kernels with MR = 8 rows). The FMA product above computes the same sums, each
// lane's k in 16-byte packs; here the block's product is cut into jobs, each the sums of 16
// units of one gate over one lane's slice of k (L = Q*V consecutive k from ks*L), which
// mma.m16n8k8 computes for all 8 rows of the vector at once: TF32 operands (each rounded to
// nearest by cvt.rna), float32 accumulation. A job's sums are lane ks's sums of those units,
// stored in a layout of the lane sums of its own (row i of the batch at i*RS, then gate,
// lane, unit: a warp's stores meet no bank twice), which GruTile::unit_sums adds pairwise
// as it adds the FMA lanes'.
// The fragments of m16n8k8 (lane l = 4*g + t): A (16 units x 8 k) at rows g, g + 8 and
// columns t, t + 4; B (8 k x 8 rows) at rows t, t + 4 and column g; D (16 x 8) at rows g,
// g + 8 and columns 2t, 2t + 1. The 8 k of an mma are not consecutive: over 16 k from kb,
// lane t loads the 16-byte pack at kb + 4t of row g of the vector, whose elements 0 and 1
// serve the first mma (its columns t and t + 4) and 2 and 3 the second; each lane's weights
// are loaded in the same order, so the pairs meet and the two mmas together cover the 16 k.
// Jobs: the block's units in chunks of 16 (NC = ceil(J / 16)), a warp's 2U jobs taking CW
// chunks (the least power of two >= NC, at most 2U) of SW = 2U / CW consecutive slices;
// warp w takes chunk group w % NGC and slice group w / NGC. mma_warps() in cugru/_catalog.py
// counts the warps this takes (NGC * ceil(KS / SW)); the planner runs the MMA kernels only
// where the block has that many.
__device__ __forceinline__ unsigned int gru_tf32(float x) {
    unsigned int r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void gru_mma_tf32(float (&d)[4], const unsigned int (&a)[4],
                                             unsigned int b0, unsigned int b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The MMA product's weights in registers and its product; the primary template, empty, is
// the FMA kernels' (their weights and product are gru_tile_weights and gru_tile_product).
template <typename T, int Q, int MR, int U, bool MMA> struct GruTileMma {
    template <bool FWD, class Tile>
    __device__ __forceinline__ void load(const T*, int, int, int, const Tile&) {}
    template <bool ONE, class Tile>
    __device__ __forceinline__ void product(const Tile&, const T*, int, int, int) const {}
};

template <int Q, int MR, int U> struct GruTileMma<float, Q, MR, U, true> {
    static_assert(MR == 8 && Q % 4 == 0, "the MMA product takes 8 rows and 16 k per block");
    static constexpr int NJ = 2 * U, NB = Q / 4;   // jobs per warp; blocks of 16 k per slice
    unsigned int a[NJ][3][NB][2][4];
    int koff[NJ];     // the job's first k (ks*L), + 4t
    int poff[NJ];     // its place in a row of part: ks*J + 16c + g (+ gate*J*KS)
    // 4: the job runs (the same for the warp's lanes: mma.sync needs all 32); 1: unit 16c + g
    // is one of the block's, 2: unit 16c + g + 8 is (this lane's stores)
    int use[NJ];
    template <bool FWD, class Tile>
    __device__ __forceinline__ void load(const float* wd, int H, int J, int KS, const Tile& tl) {
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        const int NC = (J + 15) / 16;
        int CW = 1;
        while (CW < NJ && CW < NC) CW *= 2;
        const int SW = NJ / CW, NGC = (NC + CW - 1) / CW, NGS = (KS + SW - 1) / SW;
        const int L = Q * 4, j0 = tl.j0;
#pragma unroll
        for (int jb = 0; jb < NJ; ++jb) {
            const int c = (warp % NGC) * CW + jb % CW, ks = (warp / NGC) * SW + jb / CW;
            const bool ok = warp < NGC * NGS && c < NC && ks < KS;
            const int u0 = 16 * c + g;
            koff[jb] = ks * L + 4 * t;
            poff[jb] = ks * J + u0;
            use[jb] = !ok ? 0 : 4 + (u0 < J) + 2 * (u0 + 8 < J);
#pragma unroll
            for (int gg = 0; gg < 3; ++gg)
#pragma unroll
                for (int b = 0; b < NB; ++b)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            // e: 0 (unit u0, k), 1 (u0 + 8, k), 2 (u0, k + 1), 3 (u0 + 8, k + 1)
                            const int u = u0 + 8 * (e & 1);
                            const int k = ks * L + 16 * b + 4 * t + 2 * h + (e >> 1);
                            const long long at = FWD ? ((long long)gg * H + j0 + u) * H + k
                                                     : ((long long)gg * H + k) * H + j0 + u;
                            a[jb][gg][b][h][e] =
                                gru_tf32(ok && u < J && j0 + u < H && k < H ? wd[at] : 0.f);
                        }
        }
    }
    // ONE: one vector for the three gates (forward), else gate gg's at v + gg*gstride
    template <bool ONE, class Tile>
    __device__ __forceinline__ void product(const Tile& tl, const float* v, int ld,
                                            int gstride, int KS) const {
        const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
        const int JK = tl.JK;
        float* part = tl.part;
        __syncwarp();   // (the lanes may leave the wait for the vector apart)
#pragma unroll
        for (int jb = 0; jb < NJ; ++jb) {
            if (!(use[jb] & 4)) continue;
            float acc[3][4];
#pragma unroll
            for (int gg = 0; gg < 3; ++gg)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[gg][e] = 0.f;
            const float* row = v + g * ld + koff[jb];
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                unsigned int x[ONE ? 1 : 3][4];   // (forward: one pack serves the three gates)
#pragma unroll
                for (int gg = 0; gg < (ONE ? 1 : 3); ++gg) {
                    const float4 f = *reinterpret_cast<const float4*>(row + gg * gstride + 16 * b);
                    x[gg][0] = gru_tf32(f.x);
                    x[gg][1] = gru_tf32(f.y);
                    x[gg][2] = gru_tf32(f.z);
                    x[gg][3] = gru_tf32(f.w);
                }
#pragma unroll
                for (int gg = 0; gg < 3; ++gg) {
                    const unsigned int(&y)[4] = x[ONE ? 0 : gg];
                    gru_mma_tf32(acc[gg], a[jb][gg][b][0], y[0], y[1]);
                    gru_mma_tf32(acc[gg], a[jb][gg][b][1], y[2], y[3]);
                }
            }
            // D: rows (units) g and g + 8, columns (batch rows) 2t and 2t + 1, into the MMA
            // layout of the lane sums: row i at i*RS (RS = 4 mod 16: the rows 2t of a
            // warp's lanes start 8 banks apart, their units g follow), gate, lane, unit
            float* p = part + 2 * t * tl.RS + poff[jb];
#pragma unroll
            for (int gg = 0; gg < 3; ++gg) {
                if (use[jb] & 1) {
                    p[gg * JK] = acc[gg][0];
                    p[tl.RS + gg * JK] = acc[gg][1];
                }
                if (use[jb] & 2) {
                    p[gg * JK + 8] = acc[gg][2];
                    p[tl.RS + gg * JK + 8] = acc[gg][3];
                }
            }
        }
    }
};

// The tile kernels' bodies; the kernels themselves follow (grid scope has no cluster shape).
template <typename T, int C, int Q, int MR, int NT, int U, bool TRAIN, bool QAT, bool LEN,
          bool MMA = false>
__device__ __forceinline__ void
gru_tile_forward_run(const T* __restrict__ gi, const T* __restrict__ w_hh,
                     const T* __restrict__ b_ih, const T* __restrict__ b_hh, T* hs,
                     T* __restrict__ y, T* __restrict__ gates, T* __restrict__ h_n,
                     const int* __restrict__ lengths, int steps, int B, int H, int S, int J,
                     int KS, int R, unsigned int* counters, int G, int groups,
                     const GruQuant<T> q) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    GruTile<T, C, Q, MR, NT, U, MMA> tl(gru_smem, B, H, J, KS, R, 1, G);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(gru_smem);
    const int D = gridDim.y, d = tl.d, HS = tl.HS, HP = (H + tl.V - 1) / tl.V * tl.V;
    const long long H3 = 3LL * H, BH = (long long)B * H;
    T w[U][3][Q][Pack16<T>::N];
    GruTileMma<T, Q, MR, U, MMA> mma;   // (MMA: the product on tensor cores, w unused)
    if constexpr (MMA)
        mma.template load<true>(w_hh + d * H3 * H, H, J, KS, tl);
    else
        gru_tile_weights<T, Q, U, true>(w, w_hh + d * H3 * H, H, tl.j0 + tl.wu, tl.wn, tl.ks,
                                        KS);
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
        if (C == 0) gru_tile_zero<T, MR, NT>(tl.vec, HS, 1, H);
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
            if constexpr (MMA)
                mma.template product<true>(tl, tl.row(s & 1, 0, 1), HS, 0, KS);
            else if (tl.product)
                gru_tile_product<true, Q, MR, U>(tl.part, w, tl.row(s & 1, 0, 1), HS, 0, tl.ks,
                                                 KS, tl.wu * KS + tl.ks, tl.JK);
            gru_copy_wait();
            __syncthreads();
            T h_new, r, z, n, hn;
            bool run = true;
            if (tl.mine) {
                const T* x = ring_m + (s % GRU_TILE_AHEAD) * R * 3 * J;
                T gh[3];
                tl.unit_sums(gh, KS);
                hn = gh[2] + bias[5 * J];
                run = !LEN || gru_time(d, steps, s) < gru_length(lengths, bm, steps);
                h_new = gru_cell<QAT>(x[0] + bias[0], x[J] + bias[J], x[2 * J] + bias[2 * J],
                                      gh[0] + bias[3 * J], gh[1] + bias[4 * J], hn,
                                      tl.row(s & 1, tl.pi, 1)[j], r, z, n, q, run);
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
                (y + (long long)gru_time(d, steps, s) * (B * D * H))[o_t] = run ? h_new : T(0);
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

template <typename T, int C, int Q, int MR, int NT, int U, bool QAT, bool LEN, bool MMA = false>
__device__ __forceinline__ void
gru_tile_backward_run(const T* __restrict__ dy, const T* __restrict__ gates,
                      const T* __restrict__ hs, const T* __restrict__ w_hh,
                      const T* __restrict__ dh_n /* null: zeros */, T* __restrict__ dgi,
                      T* __restrict__ dgh, T* __restrict__ dh0,
                      const int* __restrict__ lengths, int steps, int B, int H, int J, int KS,
                      int R, unsigned int* counters, int G, int groups, const GruQuant<T> q) {
    extern __shared__ __align__(16) unsigned char gru_smem[];
    GruTile<T, C, Q, MR, NT, U, MMA> tl(gru_smem, B, H, J, KS, R, 3, G);
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(gru_smem);
    const int D = gridDim.y, d = tl.d, HS = tl.HS, HP = (H + tl.V - 1) / tl.V * tl.V;
    const long long H3 = 3LL * H, BH = (long long)B * H;
    T w[U][3][Q][Pack16<T>::N];
    GruTileMma<T, Q, MR, U, MMA> mma;
    if constexpr (MMA)
        mma.template load<false>(w_hh + d * H3 * H, H, J, KS, tl);
    else
        gru_tile_weights<T, Q, U, false>(w, w_hh + d * H3 * H, H, tl.j0 + tl.wu, tl.wn, tl.ks,
                                         KS);
    unsigned int* counter =
        C == 0 ? counters + d * (gridDim.x / tl.G) + blockIdx.x / tl.G : nullptr;
    unsigned int target = 0;
    // the step loop for one group of rows (tl.each_group below runs it)
    auto run = [&]() {
        const int j = tl.j;
        if (C > 0) {
            for (int idx = threadIdx.x; idx < 2 * MR * 3 * HS; idx += NT) tl.vec[idx] = T(0);
        } else {
            gru_tile_zero<T, MR, NT>(tl.vec, HS, 3, H);
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
            if constexpr (MMA)
                mma.template product<false>(tl, tl.row((s + 1) & 1, 0, 3), 3 * HS, HS, KS);
            else if (tl.product)
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
                T dr, dz, dn, r;
                const bool run = !LEN || gru_time(d, steps, s) < gru_length(lengths, bm, steps);
                dhz = gru_cell_backward<QAT>(run ? v[5 * J] + carry : carry, v[0], v[J],
                                             v[2 * J], v[3 * J], v[4 * J], dr, dz, dn, r, q,
                                             run);
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
        T *__restrict__ h_n, const int *__restrict__ lengths, int steps, int B, int H,     \
        int S, int J, int KS, int R, unsigned int *counters, int G, int groups, T q_scale,  \
        T q_inv, T q_lo, T q_hi, int q_flags
#define GRU_TILE_FORWARD_ARGS                                                                \
    gi, w_hh, b_ih, b_hh, hs, y, gates, h_n, lengths, steps, B, H, S, J, KS, R, counters, G, \
        groups, GRU_QUANT(T)
#define GRU_TILE_BACKWARD_PARAMS                                                             \
    const T *__restrict__ dy, const T *__restrict__ gates, const T *__restrict__ hs,         \
        const T *__restrict__ w_hh, const T *__restrict__ dh_n, T *__restrict__ dgi,             \
        T *__restrict__ dgh,                                                               \
        T *__restrict__ dh0, const int *__restrict__ lengths, int steps, int B, int H,     \
        int J, int KS, int R, unsigned int *counters, int G, int groups, T q_scale,         \
        T q_inv, T q_lo, T q_hi, int q_flags
#define GRU_TILE_BACKWARD_ARGS                                                               \
    dy, gates, hs, w_hh, dh_n, dgi, dgh, dh0, lengths, steps, B, H, J, KS, R, counters, G,   \
        groups, GRU_QUANT(T)

template <typename T, int C, int Q, int MR, int NT, int U, bool TRAIN, bool QAT, bool LEN>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, C, Q, MR, NT, U, TRAIN, QAT, LEN>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int C, int Q, int MR, int NT, int U, bool QAT, bool LEN>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, C, Q, MR, NT, U, QAT, LEN>(GRU_TILE_BACKWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U, bool TRAIN, bool QAT, bool LEN>
__global__ void __launch_bounds__(NT, 1) gru_tile_grid_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, 0, Q, MR, NT, U, TRAIN, QAT, LEN>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U, bool QAT, bool LEN>
__global__ void __launch_bounds__(NT, 1) gru_tile_grid_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, 0, Q, MR, NT, U, QAT, LEN>(GRU_TILE_BACKWARD_ARGS);
}
// The MMA kernels (float32 data under math="tf32"; plain instances only: no QAT, no LEN).
template <typename T, int C, int Q, int MR, int NT, int U, bool TRAIN>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_mma_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, C, Q, MR, NT, U, TRAIN, false, false, true>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int C, int Q, int MR, int NT, int U>
__global__ void __launch_bounds__(NT, 1) GRU_CLUSTER_DIMS(C)
gru_tile_mma_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, C, Q, MR, NT, U, false, false, true>(GRU_TILE_BACKWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U, bool TRAIN>
__global__ void __launch_bounds__(NT, 1) gru_tile_grid_mma_forward(GRU_TILE_FORWARD_PARAMS) {
    gru_tile_forward_run<T, 0, Q, MR, NT, U, TRAIN, false, false, true>(GRU_TILE_FORWARD_ARGS);
}
template <typename T, int Q, int MR, int NT, int U>
__global__ void __launch_bounds__(NT, 1) gru_tile_grid_mma_backward(GRU_TILE_BACKWARD_PARAMS) {
    gru_tile_backward_run<T, 0, Q, MR, NT, U, false, false, true>(GRU_TILE_BACKWARD_ARGS);
}
