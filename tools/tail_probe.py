"""A train step's large products in float64 on float32 data, and beside the recurrence: two
measurements for the design of the input projection and the tail.

    python tools/tail_probe.py [ids] [--reps N] [--steps N] [--parts wide,overlap]

wide: for each of the four large GEMMs (split_tf32_probe.gemms: the input projection, dx,
dW_ih, dW_hh), device µs of cuBLAS' float32 product (TF32 off) and of its float64 product on
float64 copies of the operands, in one call over the whole sum; the conversions apart (each
operand to float64, the result back to float32); each product's error against the float64
product of the float32 operands (the float64 one rounded to float32).
overlap: the recurrence's per-step product in float64 (both directions batched, B rows, 3H x
H), --steps of them each followed by a pointwise pass over its result, replayed from a CUDA
graph on a stream of high priority (then of the same priority), alone and while half of the
rows' dW_ih product (float32) runs on a stream of low priority: device µs of the steps and
of the product, alone and together.
GPU and torch needed.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from split_tf32_probe import device_us, errors, gemms  # noqa: E402


def wide(torch, sid, shape, reps, gen):
    T, B, I, H, bi = shape
    for name, m, n, k in gemms(T, B, I, H, bi):
        a = torch.randn(m, k, device="cuda", generator=gen)
        b = torch.randn(k, n, device="cuda", generator=gen) / H ** 0.5
        a64, b64 = a.double(), b.double()
        ref = a64 @ b64
        t32 = device_us(torch, lambda: a @ b, reps)
        t64 = device_us(torch, lambda: a64 @ b64, reps)
        ta = device_us(torch, lambda: a.double(), reps)
        tb = device_us(torch, lambda: b.double(), reps)
        tc = device_us(torch, lambda: ref.float(), reps)
        e32, e64 = errors(a @ b, ref), errors(ref.float(), ref)
        flops = 2 * m * n * k
        print(f"| {sid} | {name} | {m}, {n}, {k} | {t32:.1f} ({flops / t32 / 1e6:.1f}) | "
              f"{t64:.1f} ({flops / t64 / 1e6:.1f}) | {ta:.1f}, {tb:.1f}, {tc:.1f} | "
              f"{e32[1]:.1e} | {e64[1]:.1e} |", flush=True)


def overlap(torch, sid, shape, steps, gen):
    T, B, I, H, bi = shape
    D, G = (2 if bi else 1), 3 * H
    w = torch.randn(D, H, G, device="cuda", generator=gen, dtype=torch.float64) / H ** 0.5
    h = torch.randn(D, B, H, device="cuda", generator=gen, dtype=torch.float64)
    gh = torch.empty(D, B, G, device="cuda", dtype=torch.float64)
    rows = T * B // 2
    x = torch.randn(I, rows, device="cuda", generator=gen)
    dg = torch.randn(rows, D * G, device="cuda", generator=gen)
    dw = torch.empty(I, D * G, device="cuda")
    lo = torch.cuda.Stream(priority=0)
    row = [sid, str(steps)]
    for priority in (-1, 0):
        hi = torch.cuda.Stream(priority=priority)

        def run_steps():
            for _ in range(steps):
                torch.bmm(h, w, out=gh)
                torch.tanh(gh[:, :, :H], out=h)
        with torch.cuda.stream(hi):
            run_steps()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=hi):
            run_steps()

        def timed(with_steps, with_product):
            torch.cuda.synchronize()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record(lo)
            if with_product:
                with torch.cuda.stream(lo):
                    torch.mm(x, dg, out=dw)
            ev[1].record(lo)
            hi.wait_event(ev[0])
            if with_steps:
                with torch.cuda.stream(hi):
                    graph.replay()
            ev[2].record(hi)
            torch.cuda.synchronize()
            return ev[0].elapsed_time(ev[2]) * 1000, ev[0].elapsed_time(ev[1]) * 1000

        cases = ((True, False), (False, True), (True, True))
        for case in cases:
            timed(*case)
        got = {case: sorted(timed(*case) for _ in range(5))[2] for case in cases}
        alone_s, alone_p = got[cases[0]][0], got[cases[1]][1]
        both_s, both_p = got[cases[2]]
        row += [f"{alone_s:.1f}", f"{alone_p:.1f}", f"{both_s:.1f}", f"{both_p:.1f}"]
    print("| " + " | ".join(row) + " |", flush=True)


def header(columns):
    """A markdown table's head of `columns`."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10", "S9", "S8", "O14", "O16"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--parts", default="wide,overlap")
    args = ap.parse_args(argv)
    import torch

    from bench.paths import ALL
    parts = args.parts.split(",")
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    if "wide" in parts:
        header(["id", "product", "m, n, k", "float32 µs (TFLOP/s)", "float64 µs (TFLOP/s)",
                "to float64: a, b; result to float32 (µs)", "float32 rms error",
                "float64 rounded rms error"])
        for sid in args.ids:
            wide(torch, sid, ALL[sid][0], args.reps, gen)
    if "overlap" in parts:
        print()
        header(["id", "steps", "steps alone (µs)", "dW_ih half alone", "steps with it",
                "dW_ih with the steps", "the same, steps' stream of the same priority: steps "
                "alone", "dW_ih alone", "steps with it", "dW_ih with them"])
        for sid in args.ids:
            overlap(torch, sid, ALL[sid][0], args.steps, gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
