"""How fast a step of a large-H recurrence can run with W_hh resident in the SMs: the floor
of the persistent large-H design, measured on S10's shape against the per-step products.

    python tools/resident_probe.py [--B 256] [--H 512] [--D 2] [--T 50]
                                   [--thread-rows 4|8] [--k-split 1|2]   (GPU needed)

One launch runs T steps of a GRU-shaped recurrence without input (per direction,
a = h W_hh, r = sigmoid(a_r), z = sigmoid(a_z), n = tanh(r a_n), h = (1 - z) n + z h) on
D * (B / 64) * (H / 32) blocks, one an SM: a block keeps its 32 units' three gate columns
of W_hh (H x 96 floats) in shared memory for the whole launch, reads its 64 rows of h from
L2 each step in chunks of 32 (double-buffered), computes a 4-row x 6-column tile a thread
with float32 FMAs (strict: every product and sum in float32, in k order; with --k-split 2
two groups of threads take half of each chunk's k and add their sums), applies the cell
to its own tile, writes its rows of the new h and meets the other blocks of its direction
at a barrier through global memory (an atomic counter). What it leaves out of a GRU pass:
the input projection (one GEMM before the loop), the biases, the outputs y and the saved
gates (one store each a step); so its step is a floor for a forward pass of this design.

Timed in turn (device µs a step, medians over rounds): the resident launch, the same with
no barrier (its results then race: the product and the exchange alone), and the per-step
product the per-step path runs (one batched cuBLAS GEMM over the directions, float32, and
a CuPy elementwise kernel for the cell). The resident launch's result after CHECK_STEPS
steps is checked against the same recurrence in float64 (normwise; the exit status is 1
above CHECK_TOL).
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: rows and units a block holds, rows a thread computes, the k of a chunk of h
ROWS, UNITS, THREAD_ROWS, CHUNK = 64, 32, 4, 32
#: the check's steps (the recurrence is chaotic over many: float32 and float64 part), and
#: the largest normwise error it passes
CHECK_STEPS, CHECK_TOL = 4, 1e-5

_SOURCE = r"""
#define ROWS %(rows)d
#define UNITS %(units)d
#define TR %(thread_rows)d
#define KC %(chunk)d
#define HH %(H)d
#define KS %(k_split)d
#define NT1 ((ROWS / TR) * (UNITS / 2))
#define NT (KS * NT1)
#define NC (3 * UNITS)
#define HP (ROWS + 4)
#define LOADS ((ROWS * KC / 4 + NT - 1) / NT)

__device__ __forceinline__ float sig(float x) { return 1.0f / (1.0f + expf(-x)); }

// one chunk of h (ROWS x KC, row-major in global memory) into registers, then into shared
// memory transposed (KC x ROWS), so a thread's TR rows at one k are one 16-byte load
__device__ __forceinline__ void chunk_load(float4 (&v)[LOADS], const float* h, int kc) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int e = threadIdx.x + i * NT, row = e / (KC / 4), q = e %% (KC / 4);
        if (e < ROWS * KC / 4)
            v[i] = __ldcg(reinterpret_cast<const float4*>(h + (long long)row * HH + kc * KC) + q);
    }
}

__device__ __forceinline__ void chunk_store(float* hs, const float4 (&v)[LOADS]) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const int e = threadIdx.x + i * NT, row = e / (KC / 4), k = (e %% (KC / 4)) * 4;
        if (e >= ROWS * KC / 4) break;
        hs[(k + 0) * HP + row] = v[i].x;
        hs[(k + 1) * HP + row] = v[i].y;
        hs[(k + 2) * HP + row] = v[i].z;
        hs[(k + 3) * HP + row] = v[i].w;
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
resident_steps(const float* __restrict__ w, float* hbuf, unsigned int* counters,
               unsigned int base, int B, int T, int barrier) {
    extern __shared__ __align__(16) float smem[];
    float* ws = smem;                       // [HH][NC]: column 3 * unit + gate
    float* hs = smem + HH * NC;             // [2][KC][HP]
    const int per_dir = (B / ROWS) * (HH / UNITS), D = gridDim.x / per_dir;
    const int d = blockIdx.x / per_dir, rem = blockIdx.x %% per_dir;
    const int r0 = rem / (HH / UNITS) * ROWS, u0 = rem %% (HH / UNITS) * UNITS;
    // KS groups of threads split each chunk's k; group 0 adds the others' sums
    const int grp = threadIdx.x / NT1, local = threadIdx.x %% NT1;
    const int tx = local %% (UNITS / 2), ty = local / (UNITS / 2);
    for (int i = threadIdx.x; i < HH * NC; i += NT) {
        const int k = i / NC, c = i %% NC;
        ws[i] = w[((long long)d * HH + k) * 3 * HH + (c %% 3) * HH + u0 + c / 3];
    }
    const long long plane = (long long)B * HH;
    for (int s = 0; s < T; ++s) {
        const float* hin = hbuf + ((long long)(s & 1) * D + d) * plane + (long long)r0 * HH;
        float* hout = hbuf + ((long long)((s + 1) & 1) * D + d) * plane + (long long)r0 * HH;
        float acc[TR][6];
#pragma unroll
        for (int i = 0; i < TR; ++i)
#pragma unroll
            for (int j = 0; j < 6; ++j) acc[i][j] = 0.0f;
        float4 v[LOADS];
        chunk_load(v, hin, 0);
        chunk_store(hs, v);
        __syncthreads();
        for (int kc = 0; kc < HH / KC; ++kc) {
            const bool more = kc + 1 < HH / KC;
            if (more) chunk_load(v, hin, kc + 1);
            const float* hb = hs + (kc & 1) * KC * HP + ty * TR;
            const float* wb = ws + kc * KC * NC + tx * 6;
#pragma unroll 8
            for (int kk = 0; kk < KC / KS; ++kk) {
                const int k = grp * (KC / KS) + kk;
                float h4[TR];
#pragma unroll
                for (int i = 0; i < TR; i += 4) {
                    const float4 hv = *reinterpret_cast<const float4*>(hb + k * HP + i);
                    h4[i] = hv.x; h4[i + 1] = hv.y; h4[i + 2] = hv.z; h4[i + 3] = hv.w;
                }
                const float2 w0 = *reinterpret_cast<const float2*>(wb + k * NC);
                const float2 w1 = *reinterpret_cast<const float2*>(wb + k * NC + 2);
                const float2 w2 = *reinterpret_cast<const float2*>(wb + k * NC + 4);
                const float w6[6] = {w0.x, w0.y, w1.x, w1.y, w2.x, w2.y};
#pragma unroll
                for (int i = 0; i < TR; ++i)
#pragma unroll
                    for (int j = 0; j < 6; ++j) acc[i][j] = fmaf(h4[i], w6[j], acc[i][j]);
            }
            if (more) chunk_store(hs + ((kc + 1) & 1) * KC * HP, v);
            __syncthreads();
        }
        if (KS == 2) {   // (through the chunks' buffers, free now: three sums at a time)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                float* red = hs + (ty * TR) * (3 * UNITS / 2) + tx * 3;
                if (grp == 1)
#pragma unroll
                    for (int i = 0; i < TR; ++i)
#pragma unroll
                        for (int j = 0; j < 3; ++j)
                            red[i * (3 * UNITS / 2) + j] = acc[i][3 * half + j];
                __syncthreads();
                if (grp == 0)
#pragma unroll
                    for (int i = 0; i < TR; ++i)
#pragma unroll
                        for (int j = 0; j < 3; ++j)
                            acc[i][3 * half + j] += red[i * (3 * UNITS / 2) + j];
                __syncthreads();
            }
        }
#pragma unroll
        for (int i = 0; i < TR && grp == 0; ++i) {
            const int row = ty * TR + i;
#pragma unroll
            for (int uu = 0; uu < 2; ++uu) {
                const int unit = u0 + tx * 2 + uu;
                const float r = sig(acc[i][3 * uu]), z = sig(acc[i][3 * uu + 1]);
                const float n = tanhf(r * acc[i][3 * uu + 2]);
                const float old = __ldcg(hin + (long long)row * HH + unit);
                __stcg(hout + (long long)row * HH + unit, (1.0f - z) * n + z * old);
            }
        }
        if (barrier) {
            __syncthreads();
            if (threadIdx.x == 0) {
                __threadfence();
                atomicAdd(counters + d, 1u);
                const unsigned int target = base + (unsigned int)(s + 1) * per_dir;
                unsigned int seen;
                do {
                    asm volatile("ld.acquire.gpu.u32 %%0, [%%1];"
                                 : "=r"(seen) : "l"(counters + d) : "memory");
                } while ((int)(seen - target) < 0);
            }
            __syncthreads();
        }
    }
}
"""


#: the kernel's parameters (name, kind), as cukernels.runtime.Kernel packs them
PARAMS = (("w", "ptr"), ("hbuf", "ptr"), ("counters", "ptr"), ("base", "u32"), ("B", "i32"),
          ("T", "i32"), ("barrier", "i32"))


def source(H, thread_rows=THREAD_ROWS, k_split=1):
    """The probe's CUDA source for hidden size H, `thread_rows` rows a thread (4 or 8) and
    `k_split` groups of threads splitting each chunk's k (1 or 2)."""
    return _SOURCE % {"rows": ROWS, "units": UNITS, "thread_rows": thread_rows,
                      "chunk": CHUNK, "H": H, "k_split": k_split}


def threads(thread_rows=THREAD_ROWS, k_split=1):
    return k_split * (ROWS // thread_rows) * (UNITS // 2)


def smem_bytes(H):
    """Shared memory a block takes: its W_hh columns and two chunks of h."""
    return (H * 3 * UNITS + 2 * CHUNK * (ROWS + 4)) * 4


def check_shape(B, H, D, T, sms=None, smem_optin=None):
    """The shape's blocks, or a ValueError naming the argument the probe cannot hold (on a
    GPU of `sms` SMs and `smem_optin` bytes of shared memory a block, where given)."""
    if B <= 0 or B % ROWS:
        raise ValueError(f"--B {B}: a positive multiple of {ROWS}")
    if H <= 0 or H % UNITS or H % CHUNK:
        raise ValueError(f"--H {H}: a positive multiple of {max(UNITS, CHUNK)}")
    if D not in (1, 2):
        raise ValueError(f"--D {D}: 1 or 2")
    if T <= 0:
        raise ValueError(f"--T {T}: a positive number of steps")
    blocks = D * (B // ROWS) * (H // UNITS)
    if sms is not None and blocks > sms:
        raise ValueError(f"--B {B}, --H {H}, --D {D}: {blocks} blocks, one an SM, and this "
                         f"GPU has {sms} SMs")
    if smem_optin is not None and smem_bytes(H) > smem_optin:
        raise ValueError(f"--H {H}: {smem_bytes(H)} bytes of shared memory a block, this GPU "
                         f"has {smem_optin}")
    return blocks


def reference(h0, w, T):
    """The probe's recurrence in float64: h0 (D, B, H), w (D, H, 3H)."""
    h = h0.astype(np.float64)
    w = w.astype(np.float64)
    H = h.shape[2]
    for _ in range(T):
        a = h @ w
        r = 1 / (1 + np.exp(-a[..., :H]))
        z = 1 / (1 + np.exp(-a[..., H:2 * H]))
        n = np.tanh(r * a[..., 2 * H:])
        h = (1 - z) * n + z * h
    return h


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--B", type=int, default=256, help="batch")
    ap.add_argument("--H", type=int, default=512, help="hidden size")
    ap.add_argument("--D", type=int, default=2, help="directions")
    ap.add_argument("--T", type=int, default=50, help="steps")
    ap.add_argument("--repeat", type=int, default=20, help="timed launches per round")
    ap.add_argument("--thread-rows", type=int, choices=(4, 8), default=THREAD_ROWS,
                    help="rows of a thread's tile")
    ap.add_argument("--k-split", type=int, choices=(1, 2), default=1,
                    help="groups of threads splitting each chunk's k (their sums added "
                         "through shared memory)")
    args = ap.parse_args(argv)
    B, H, D, T = args.B, args.H, args.D, args.T
    try:
        check_shape(B, H, D, T)
    except ValueError as e:
        ap.error(str(e))
    from bench import timing
    timing.require_gpu()
    import cupy as cp
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    try:
        blocks = check_shape(B, H, D, T, props["multiProcessorCount"],
                             props["sharedMemPerBlockOptin"])
    except ValueError as e:
        ap.error(str(e))
    from cukernels import runtime
    tr = args.thread_rows
    ks = args.k_split
    raw = cp.RawKernel(source(H, tr, ks), "resident_steps", options=("-std=c++17",))
    # (a cooperative launch: the driver refuses it, rather than the barrier hanging, where
    # the blocks are not all resident at once)
    kern = runtime.Kernel("resident_steps", raw, PARAMS).allow_shared(smem_bytes(H))
    rng = np.random.default_rng(0)
    bound = 3 / np.sqrt(H)        # (gate inputs of about unit size: h stays of order 1)
    w = rng.uniform(-bound, bound, (D, H, 3 * H)).astype(np.float32)
    h0 = rng.uniform(-1, 1, (D, B, H)).astype(np.float32)
    w_d = cp.asarray(w)
    hbuf = cp.zeros((2, D, B, H), cp.float32)
    counters = cp.zeros(D, cp.uint32)
    launches = [0]

    def resident(barrier=1, steps=T):
        def run():
            base = launches[0] % 2**32
            kern.launch((blocks,), (threads(tr, ks),),
                        {"w": w_d, "hbuf": hbuf, "counters": counters, "base": base,
                         "B": B, "T": steps, "barrier": barrier},
                        shared_mem=smem_bytes(H), cooperative=True)
            launches[0] += barrier * steps * (blocks // D)
        return run

    want = reference(h0, w, CHECK_STEPS)

    def check():
        """One launch of CHECK_STEPS steps from h0 against float64 (normwise). Run first
        and again after the timed launches, whose barriers then count on from theirs."""
        hbuf[0] = cp.asarray(h0)
        resident(steps=CHECK_STEPS)()
        got = cp.asnumpy(hbuf[CHECK_STEPS & 1])
        return float(np.abs(got - want).max() / np.abs(want).max())

    first = check()
    h_d = cp.asarray(h0)
    cell = cp.ElementwiseKernel(
        "float32 ar, float32 az, float32 an, float32 old", "float32 h",
        "float r = 1.0f / (1.0f + expf(-ar)); float z = 1.0f / (1.0f + expf(-az));"
        "h = (1.0f - z) * tanhf(r * an) + z * old;", "resident_probe_cell")

    def per_step():
        h = h_d
        for _ in range(T):
            a = cp.matmul(h, w_d)
            h = cell(a[..., :H], a[..., H:2 * H], a[..., 2 * H:], h)
        return h

    def per_step_product():
        for _ in range(T):
            cp.matmul(h_d, w_d)

    us = timing.interleaved_gpu_us({"resident": resident(), "resident, no barrier":
                                    resident(0), "per-step: GEMM + cell": per_step,
                                    "per-step: GEMM alone": per_step_product},
                                   n_repeat=args.repeat * 3)
    second = check()
    err = max(first, second)
    flops = 2.0 * D * B * H * 3 * H
    print(f"B = {B}, H = {H}, D = {D}, T = {T}: {blocks} blocks of {threads(tr, ks)} threads "
          f"({tr} rows x 2 units a thread, k split {ks} ways), {smem_bytes(H)} bytes of "
          f"shared memory each, on {props['multiProcessorCount']} SMs; the resident launch "
          f"against float64 after {CHECK_STEPS} steps, before and after the timed launches: "
          f"normwise error {first:.2e}, {second:.2e} (h of largest "
          f"magnitude {np.abs(want).max():.2f})")
    print("| launch | µs a step | TFLOP/s of the step's product |")
    print("|---|---|---|")
    for name, v in us.items():
        print(f"| {name} | {v / T:.2f} | {flops / (v / T * 1e-6) / 1e12:.1f} |")
    return 0 if err < CHECK_TOL else 1


if __name__ == "__main__":
    sys.exit(main())
