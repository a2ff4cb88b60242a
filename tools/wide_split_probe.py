"""A wide backward pass's per-step product split along k, and its tail's weight sums in
chunks of rows: time and accuracy for each setting.

    python tools/wide_split_probe.py [ids] [--slices 1,2,3,...] [--chunks 1,2,...]
                                     [--repeat N]
        (GPU needed; ids of bench.paths (S1-S10, O1-O16, A1-A6) or of WIDE_SHAPES below)

A float32 backward pass under math="strict" with B >= WIDE_BACKWARD_MIN_ROWS and
WIDE_MIN_H <= H <= WIDE_MAX_H (cugru._plan.wide_products) runs its per-step products in
float64; the backward one (dh += W_hh' @ dgh, k = 3H) is split into
cugru._plan.WIDE_SPLIT_SLICES slices (wide_split), their products added into dh by
gru_add_chunks; its tail (cugru._passes.wide_tail) sums dW_ih and dW_hh over the T*B rows
in up to cugru._passes.WIDE_WGRAD_CHUNKS chunks (row_chunks). The settings timed: each
slice count S of --slices with the tail's sums in one chunk, then each chunk count C > 1 of
--chunks with the product whole. For each shape and setting: the backward pass's device
ms (CUDA events around back to back gru_backward calls on one forward's history, the
settings timed in turn over ROUNDS rounds, the median), whether two calls give the same
bits, and the normwise error of dx, dh0, dW_ih and dW_hh against the float64 pass of the
same inputs. A shape whose backward pass is not wide on this GPU is reported and skipped.
A slice count whose parts (S x D x B x H float64) exceed cugru._device.SCRATCH_BYTES is
marked: its parts are allocated on each call, so its pointer table and graph may be
rebuilt between calls (a time above the kernels' own).
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
def wide_slices(S, chunks=1):
    """Inside the block, wide backward passes split their product into S slices
    (cugru._plan.WIDE_SPLIT_SLICES) and sum their tail's weight gradients in up to `chunks`
    chunks (cugru._passes.WIDE_WGRAD_CHUNKS); the settings before are restored after."""
    from cugru import _passes, _plan
    was = _plan.WIDE_SPLIT_SLICES, _passes.WIDE_WGRAD_CHUNKS
    _plan.WIDE_SPLIT_SLICES, _passes.WIDE_WGRAD_CHUNKS = int(S), int(chunks)
    try:
        yield
    finally:
        _plan.WIDE_SPLIT_SLICES, _passes.WIDE_WGRAD_CHUNKS = was


def slice_counts(text, flag="--slices"):
    """--slices (or --chunks): comma-separated counts of 1 or more."""
    got = [int(v) for v in text.split(",") if v.strip()]
    if not got or min(got) < 1:
        raise ValueError(f"{flag} takes counts of 1 or more, got {text!r}")
    return got


def parse(argv):
    import argparse

    from bench.paths import ALL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10", *WIDE_SHAPES])
    ap.add_argument("--slices", default="1,2,4")
    ap.add_argument("--chunks", default="2,3,4,6,8")
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per measurement")
    args = ap.parse_args(argv)
    bad = [i for i in args.ids if i not in ALL and i not in WIDE_SHAPES]
    if bad:
        ap.error(f"unknown shape id(s) {bad}; choose from {', '.join([*ALL, *WIDE_SHAPES])}")
    try:
        args.slices = slice_counts(args.slices)
        args.chunks = slice_counts(args.chunks, "--chunks")
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
    from cugru import _device, _passes, _plan, plans
    if not _device.has_batched_pointers():
        raise SystemExit("the split needs cuBLAS' batched GEMM of pointer tables, not found "
                         "here (cugru._device.has_batched_pointers): every count runs unsplit")
    print("| id | T, B, I, H, bi | slices | tail's chunks | backward ms | same bits twice | "
          "dx | dh0 | dW_ih | dW_hh |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sid in args.ids:
        T, B, I, H, bi = WIDE_SHAPES[sid] if sid in WIDE_SHAPES else ALL[sid][0]
        if not plans.wide_products(B, H, 4, "strict", backward=True):
            print(f"| {sid} | {T}, {B}, {I}, {H}, {bi} | not wide on this GPU | | | | | | | |")
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
        # (the tail's chunk counts that give that many chunks: at least MIN_CHUNK_ROWS rows)
        chunks = [C for C in args.chunks
                  if C > 1 and len(_passes.row_chunks(T * B, C)) == C]
        settings = [(S, 1) for S in counts] + [(1, C) for C in chunks]
        times = {k: [] for k in settings}
        for _ in range(ROUNDS):
            for k in settings:
                with wide_slices(*k):
                    times[k].append(event_ms(cp, backward, args.repeat))
        for S, C in settings:
            with wide_slices(S, C):
                first, second = backward(), backward()
            same = all(bool(cp.array_equal(u, v)) for u, v in zip(first, second))
            errs = [normwise(cp, first[i], ref[i]) for i in (0, 1, 2, 3)]
            parts = S * (2 if bi else 1) * B * H * 8 if S > 1 else 0
            big = " (parts beyond the kept scratch)" if parts > _device.SCRATCH_BYTES else ""
            print(f"| {sid} | {T}, {B}, {I}, {H}, {bi} | {S}{big} | {C} | "
                  f"{statistics.median(times[S, C]):.3f} | {same} | "
                  + " | ".join(f"{e:.1e}" for e in errs) + " |")
        skipped = sorted(set(args.slices) - set(counts))
        if skipped:
            print(f"| {sid} | | {skipped}: not a split of k = {3 * H} into slices of "
                  f"{_plan.WIDE_SPLIT_MIN_TERMS} or more | | | | | | | |")
        skipped = sorted(set(args.chunks) - set(chunks) - {1})
        if skipped:
            print(f"| {sid} | | | {skipped}: not that many chunks of {_passes.MIN_CHUNK_ROWS} "
                  f"rows or more in {T * B} | | | | | | |")


def _with(S, fn):
    with wide_slices(S):
        return fn()
