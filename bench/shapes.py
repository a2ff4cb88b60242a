"""The benchmark shapes and problem builders, shared by the benchmarks, the tools and the
tests.

SHAPES is the spec's table of GRU shapes S1-S10 (T, B, I, H, bidirectional), the shapes the
GRU benchmark reports against cuDNN. TINY is the call-cost shape (T = B = I = H = 1): a call
there costs its host time.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

#: id -> (T, B, I, H, bidirectional), the spec's table
SHAPES = {
    "S1": (100, 64, 40, 64, False), "S2": (100, 64, 40, 128, False),
    "S3": (100, 64, 40, 256, False), "S4": (100, 64, 40, 128, True),
    "S5": (200, 32, 80, 256, True), "S6": (100, 1, 40, 256, False),
    "S7": (500, 1, 64, 128, False), "S8": (100, 64, 512, 512, False),
    "S9": (100, 64, 1024, 1024, False), "S10": (50, 256, 512, 512, True),
}
#: the shapes whose train step's peak memory the GRU benchmark reports
MEMORY_SHAPES = ("S3", "S9", "S10")
#: the shapes the GRU benchmark runs on the CPU fallback too
CPU_SHAPES = ("S1", "S2")
#: the call-cost shape: every size 1, one direction
TINY = (1, 1, 1, 1, False)


def make_problem(T, B, I, H, bi, seed=0, dtype=np.float32):
    """Random GRU inputs (numpy): x, h0, the weights in torch's init range 1/sqrt(H), dy."""
    rng = np.random.default_rng(seed)
    D, k = (2 if bi else 1), 1 / math.sqrt(H)
    u = lambda *s: rng.uniform(-k, k, s).astype(dtype)  # noqa: E731
    return dict(x=rng.standard_normal((T, B, I)).astype(dtype),
                h0=rng.standard_normal((D, B, H)).astype(dtype),
                w_ih=u(D, 3 * H, I), w_hh=u(D, 3 * H, H), b_ih=u(D, 3 * H), b_hh=u(D, 3 * H),
                dy=rng.standard_normal((T, B, D * H)).astype(dtype), bi=bi)


def id_list(table):
    """An argparse type: comma-separated ids of `table` (a dict), each checked."""
    def parse(value):
        ids = [s for s in value.split(",") if s]
        bad = [s for s in ids if s not in table]
        if bad or not ids:
            raise argparse.ArgumentTypeError(f"unknown shape id(s) {bad or value!r}; "
                                             f"choose from {', '.join(table)}")
        return ids
    return parse


def shapes_main(doc, table, run, markdown, argv=None, dtypes="float32,float64", repeat=20):
    """The command line of a benchmark over ids of `table` and float dtypes (--shapes,
    --dtypes, --repeat, --json): rows = run(ids, repeat, dtypes), printed as markdown(rows)
    and written as JSON with --json."""
    from . import timing
    ap = argparse.ArgumentParser(description=doc.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--shapes", type=id_list(table), default=list(table),
                    help="comma-separated ids")
    ap.add_argument("--dtypes", default=dtypes, help="float32 and/or float64")
    ap.add_argument("--repeat", type=int, default=repeat, help="timed calls per measurement")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    chosen = [d for d in args.dtypes.split(",") if d]
    if not chosen or any(d not in ("float32", "float64") for d in chosen):
        ap.error(f"--dtypes must name float32 and/or float64, got {args.dtypes!r}")
    timing.require_gpu()
    rows = run(args.shapes, args.repeat, chosen)
    timing.publish(markdown(rows), rows, args.json)
    return 0
