"""The GRU cell's float sigmoid and tanh: how accurate, and what they cost a step.

    python tools/cell_probe.py                 # accuracy over every float32 input
    python tools/cell_probe.py O11 S7 O13      # and the forward tile step of those shapes

Accuracy: the kernel gru_cell_error_probe (cugru/kernels/gru_probes.cu) runs the cell's
functions as built (gru_common.cuh: the chip's ex2 and rcp approximations, made accurate
again around them), their IEEE forms (expf and a division; tanhf) and the fast intrinsics
(__expf and __fdividef; tanh.approx) on all 2^32 float32 bit patterns (and on those of |v|
<= 16 alone) and prints the largest error of each against double, in units of the last
place of the exact value (where it is a normal float32), the largest absolute error where
the exact value is smaller (subnormal inputs are taken at their own value), and the count
of results that are NaN against a number or the other way round, or a zero of the wrong
sign.

Time: each shape's forward (inference) tile kernel of its plan (as tools/gru_tile_diag.py
builds it), compiled three ways: as built, with the IEEE cell, and with the fast intrinsics
(__expf, __fdividef, tanh.approx: what the cell would cost with no accuracy kept), timed in
turn over 5 rounds; µs a step, median of each.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

FUNCTIONS = ("sigmoid", "tanh", "sigmoid, IEEE form", "tanh, IEEE form", "sigmoid, fast form",
             "tanh, fast form")


def cell_errors(first=0, stride=1, count=1 << 32):
    """{function: (largest ulps, largest absolute error below FLT_MIN, disagreements: NaN
    or a zero's sign)} over the inputs first + i * stride (i < count)"""
    import cupy as cp

    import cugru  # noqa: F401  (registers the sources)
    from cugru import _catalog
    from cukernels import runtime
    kern = runtime.kernel("gru_probes.cu", _catalog.CELL_ERROR_PROBE)
    out = cp.zeros((len(FUNCTIONS), 3), cp.uint64)
    blocks = cp.cuda.Device().attributes["MultiProcessorCount"] * 8
    for fn in range(len(FUNCTIONS)):
        kern.launch((blocks,), (256,), {"fn": fn, "first": first, "stride": stride,
                                         "count": count, "out": out[fn]})
    v = cp.asnumpy(out)
    f = v[:, :2].copy().view(np.float64)
    return {name: (float(f[k, 0]), float(f[k, 1]), int(v[k, 2]))
            for k, name in enumerate(FUNCTIONS)}


def main(argv):
    small = 0x41800001                       # (the bit patterns of 0 .. 16)
    for label, ranges in (("every float32 input", [(0, 1 << 32)]),
                          ("|v| <= 16", [(0, small), (0x80000000, small)])):
        parts = [cell_errors(first, count=count) for first, count in ranges]
        print(f"{label}: largest error in ulps (exact value >= FLT_MIN), largest absolute "
              "error below it, disagreements (NaN, a zero's sign)")
        for name in FUNCTIONS:
            ulps, tiny = (max(p[name][k] for p in parts) for k in (0, 1))
            bad = sum(p[name][2] for p in parts)
            print(f"  {name:20s} {ulps:10.3f} ulp   {tiny:.3g}   {bad}")
    if argv:
        step_times(argv)


def step_times(sids, rounds=5):
    from bench.paths import ALL
    from cugru import plans
    from cukernels import runtime
    from gru_tile_diag import cell_variant, step_us, tile_launcher
    src = runtime.source("gru_tile.cu").text()
    kinds = {"as built": src, "IEEE cell": cell_variant(src, "ieee"),
             "fast intrinsics": cell_variant(src, "fast")}
    for sid in sids:
        (T, B, I, H, bi), _ = ALL[sid]
        plan = plans.fast_plan(B, H, 2 if bi else 1, np.float32)
        if not isinstance(plan, plans.TilePlan) or not plan.cluster:
            print(f"{sid}: {plan} is not a tile plan at block or cluster scope; left out")
            continue
        launches = {k: tile_launcher(s, sid, plan, False)[0] for k, s in kinds.items()}
        times = {k: [] for k in kinds}
        for _ in range(rounds):
            for k, launch in launches.items():
                times[k].append(step_us(launch, T))
        print(f"{sid} (T, B, I, H, bi = {T}, {B}, {I}, {H}, {bi}) {plan}, µs a step:")
        for k, v in times.items():
            print(f"  {k:16s} {np.median(v):.4f}   (" + " ".join(f"{t:.4f}" for t in v) + ")")


if __name__ == "__main__":
    main(sys.argv[1:])
