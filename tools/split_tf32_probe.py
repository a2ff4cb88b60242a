"""Float32 products from three TF32 products of split operands ("3xTF32"), against
cuBLAS' float32 product, on the four large GEMMs of a train step: time and error.

    python tools/split_tf32_probe.py [ids] [--chunks full,1600,512,256] [--reps N]

Each operand a is split into hi = a rounded to TF32 (10 bits of significand) and lo = a - hi
rounded to TF32; a product is then lo_a hi_b + hi_a lo_b + hi_a hi_b, each on tensor cores
with TF32 inputs and float32 sums (torch.matmul with TF32 allowed: cuBLAS' kernels). With
--chunks c the sum over k runs in chunks of c terms (a batched product per term), the
chunks' results added in float32. For each train-step GEMM of a shape of bench.paths' table
(the input projection, dx, dW_ih, dW_hh: their m, n, k): device µs of the float32 product
over the same chunks (in one call where the chunk is k) and of the three products (the
split left out: it is a pass over the operands' memory, timed apart: the two launches of
a split kernel issued from Python, so on small operands the host's pace), and each one's
error against float64: the largest |error| over the largest |result|, and the root mean
square error over the result's.
GPU and torch needed.
"""
import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_SPLIT = r"""
extern "C" __global__ void split_tf32(const float* a, float* hi, float* lo, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned u = __float_as_uint(a[i]);
        // round to nearest (ties away) at bit 13; truncate where that would overflow
        unsigned h = (u & 0x7fffffffu) < 0x7f7fe000u ? (u + 0x1000u) & 0xffffe000u
                                                      : u & 0xffffe000u;
        float r = a[i] - __uint_as_float(h);
        hi[i] = __uint_as_float(h);
        lo[i] = __uint_as_float((__float_as_uint(r) + 0x1000u) & 0xffffe000u);
    }
}
"""


def gemms(T, B, I, H, bi):
    """(name, m, n, k) of the train step's four large products (row-major m x k by k x n)."""
    D, G = (2 if bi else 1), 3 * H
    return [("input projection", T * B, D * G, I), ("dx", T * B, I, D * G),
            ("dW_ih", D * G, I, T * B), ("dW_hh", G, H, T * B)]


def device_us(torch, fn, reps):
    """The median over 5 rounds of `reps` back-to-back calls, device µs a call."""
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        rounds.append(start.elapsed_time(stop) * 1000 / reps)
    return sorted(rounds)[2]


def errors(got, ref):
    err = (got.double() - ref).abs()
    return (err.max() / ref.abs().max()).item(), \
        (err.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S8", "S9", "S10", "O6", "O14", "O16"])
    ap.add_argument("--chunks", default="full,1600,512,256",
                    help="chunk lengths of the sum over k ('full': one chunk)")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from bench.paths import ALL
    kernel = cp.RawKernel(_SPLIT, "split_tf32")

    def split(a):
        hi, lo = torch.empty_like(a), torch.empty_like(a)
        n = a.numel()
        kernel((min(-(-n // 256), 4096),), (256,),
               (cp.from_dlpack(a), cp.from_dlpack(hi), cp.from_dlpack(lo), cp.int64(n)))
        return hi, lo

    gen = torch.Generator(device="cuda").manual_seed(0)
    allowed = torch.backends.cuda.matmul.allow_tf32     # (restored after each row)
    print("| id | product | m, n, k | chunk | float32, the same chunks (µs) | 3xTF32 (µs) | "
          "split (µs) | "
          "float32 error: max, rms | 3xTF32 error: max, rms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sid in args.ids:
        T, B, I, H, bi = ALL[sid][0]
        for name, m, n, k in gemms(T, B, I, H, bi):
            a = torch.randn(m, k, device="cuda", generator=gen)
            b = torch.randn(k, n, device="cuda", generator=gen) / math.sqrt(H)
            ref = a.double() @ b.double()
            (a_hi, a_lo), (b_hi, b_lo) = split(a), split(b)
            done = set()
            for chunk in args.chunks.split(","):
                c = k if chunk == "full" else int(chunk)
                if c > k or k % c or c in done:
                    continue
                done.add(c)
                s = k // c

                def per_chunk(t, rows):        # (s, rows, c) views of an operand (rows, k)
                    return t.view(rows, s, c).transpose(0, 1)

                def strict():
                    torch.backends.cuda.matmul.allow_tf32 = False
                    if s == 1:
                        return a @ b
                    return torch.bmm(per_chunk(a, m), b.view(s, c, n)).sum(0)

                def three():
                    torch.backends.cuda.matmul.allow_tf32 = True
                    if s == 1:
                        out = a_lo @ b_hi
                        out.addmm_(a_hi, b_lo)
                        return out.addmm_(a_hi, b_hi)
                    out = torch.bmm(per_chunk(a_lo, m), b_hi.view(s, c, n))
                    out.baddbmm_(per_chunk(a_hi, m), b_lo.view(s, c, n))
                    return out.baddbmm_(per_chunk(a_hi, m), b_hi.view(s, c, n)).sum(0)
                e32, e3 = errors(strict(), ref), errors(three(), ref)
                t32, t3 = device_us(torch, strict, args.reps), device_us(torch, three, args.reps)
                ts = device_us(torch, lambda: (split(a), split(b)), args.reps)
                torch.backends.cuda.matmul.allow_tf32 = allowed
                print(f"| {sid} | {name} | {m}, {n}, {k} | {c} | {t32:.1f} | {t3:.1f} | "
                      f"{ts:.1f} | {e32[0]:.1e}, {e32[1]:.1e} | {e3[0]:.1e}, {e3[1]:.1e} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
