"""A wide backward pass's per-step product split along k: time and accuracy for each
slice count.

    python tools/wide_split_probe.py [ids] [--slices 1,2,3,...] [--repeat N]
        (GPU needed; ids of bench.paths (S1-S10, O1-O16, A1-A6) or of WIDE_SHAPES below)

A float32 backward pass under math="strict" with B >= WIDE_BACKWARD_MIN_ROWS and
WIDE_MIN_H <= H <= WIDE_MAX_H (cugru._plan.wide_products) runs its per-step products in
float64; the backward one (dh += W_hh' @ dgh, k = 3H) is split into
cugru._plan.WIDE_SPLIT_SLICES slices (wide_split), their products added into dh by
gru_add_chunks. For each shape and each slice count S of --slices (1: one product a step),
with WIDE_SPLIT_SLICES set to S: the backward pass's device ms (CUDA events around back to
back gru_backward calls on one forward's history, the slice counts timed in turn over
ROUNDS rounds, the median), whether two calls give the same bits, and the normwise error of
dx, dh0, dW_ih and dW_hh against the float64 pass of the same inputs. A shape whose backward
pass is not wide on this GPU is reported and skipped. A slice count whose parts (S x D x
B x H float64) exceed cugru._device.SCRATCH_BYTES is marked: its parts are allocated on
each call, so its pointer table and graph may be rebuilt between calls (a time above the
kernels' own).
"""
import contextlib
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from large_h_probe import event_ms  # noqa: E402  (events around back-to-back calls)

#: shapes of wide backward passes beside S10 (the only one in bench.paths), chosen before
#: any timing: H at both ends of the wide range and between, one and two directions
WIDE_SHAPES = {"W1": (64, 128, 256, 1024, False), "W2": (32, 512, 512, 768, True),
               "W3": (100, 192, 128, 640, False)}
ROUNDS = 5


@contextlib.contextmanager
def wide_slices(S):
    """Inside the block, wide backward passes split their product into S slices
    (cugru._plan.WIDE_SPLIT_SLICES); the setting before is restored after."""
    from cugru import _plan
    was = _plan.WIDE_SPLIT_SLICES
    _plan.WIDE_SPLIT_SLICES = int(S)
    try:
        yield
    finally:
        _plan.WIDE_SPLIT_SLICES = was


def slice_counts(text):
    """--slices: comma-separated counts of 1 or more."""
    got = [int(v) for v in text.split(",") if v.strip()]
    if not got or min(got) < 1:
        raise ValueError(f"--slices takes counts of 1 or more, got {text!r}")
    return got


def parse(argv):
    import argparse

    from bench.paths import ALL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10", *WIDE_SHAPES])
    ap.add_argument("--slices", default="1,2,3,4,6,8,12")
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per measurement")
    args = ap.parse_args(argv)
    bad = [i for i in args.ids if i not in ALL and i not in WIDE_SHAPES]
    if bad:
        ap.error(f"unknown shape id(s) {bad}; choose from {', '.join([*ALL, *WIDE_SHAPES])}")
    try:
        args.slices = slice_counts(args.slices)
    except ValueError as e:
        ap.error(str(e))
    return args


def normwise(cp, got, ref):
    return float(cp.abs(got.astype(np.float64) - ref).max() / cp.abs(ref).max())


def main(argv=None):
    args = parse(argv)
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    import cugru
    from bench.paths import ALL
    from bench.shapes import make_problem
    from cugru import _device, _plan, plans
    if not _device.has_batched_pointers():
        raise SystemExit("the split needs cuBLAS' batched GEMM of pointer tables, not found "
                         "here (cugru._device.has_batched_pointers): every count runs unsplit")
    print("| id | T, B, I, H, bi | slices | backward ms | same bits twice | dx | dh0 | dW_ih | "
          "dW_hh |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sid in args.ids:
        T, B, I, H, bi = WIDE_SHAPES[sid] if sid in WIDE_SHAPES else ALL[sid][0]
        if not plans.wide_products(B, H, 4, "strict", backward=True):
            print(f"| {sid} | {T}, {B}, {I}, {H}, {bi} | not wide on this GPU | | | | | | |")
            continue
        prob = make_problem(T, B, I, H, bi)
        ref = None
        for dt in (np.float64, np.float32):
            a = {k: cp.asarray(v.astype(dt)) for k, v in prob.items() if k != "bi"}
            w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
            saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi, path="steps")[2]
            backward = (lambda a=a, saved=saved:
                        cugru.gru_backward(a["dy"], None, saved, path="steps"))
            if dt == np.float64:
                ref = backward()
        counts = [S for S in args.slices if _with(S, lambda: _plan.wide_split(H)) == S]
        times = {S: [] for S in counts}
        for _ in range(ROUNDS):
            for S in counts:
                with wide_slices(S):
                    times[S].append(event_ms(cp, backward, args.repeat))
        for S in counts:
            with wide_slices(S):
                first, second = backward(), backward()
            same = all(bool(cp.array_equal(u, v)) for u, v in zip(first, second))
            errs = [normwise(cp, first[i], ref[i]) for i in (0, 1, 2, 3)]
            parts = S * (2 if bi else 1) * B * H * 8 if S > 1 else 0
            big = " (parts beyond the kept scratch)" if parts > _device.SCRATCH_BYTES else ""
            print(f"| {sid} | {T}, {B}, {I}, {H}, {bi} | {S}{big} | "
                  f"{statistics.median(times[S]):.3f} | {same} | "
                  + " | ".join(f"{e:.1e}" for e in errs) + " |")
        skipped = sorted(set(args.slices) - set(counts))
        if skipped:
            print(f"| {sid} | | {skipped}: not a split of k = {3 * H} into slices of "
                  f"{_plan.WIDE_SPLIT_MIN_TERMS} or more | | | | | | |")


def _with(S, fn):
    with wide_slices(S):
        return fn()


if __name__ == "__main__":
    main(sys.argv[1:])
