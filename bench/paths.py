"""Every GPU path of ours on each shape, and whether path="auto" takes the fastest.

The shapes: the S1-S10 table, the off-table shapes (bench/offtable.py) and hidden sizes
beside the tiles' edges (H not a multiple of the 16-byte pack next to one that is).

    python -m bench.paths [--shapes S1,O1,A1,...] [--dtypes float32,float64] [--repeat N] [--json FILE]

For each shape and pass (train step, inference): the device time of path="auto", "steps",
"fast" (fast_plan's split, where one fits) and "resident" (the resident kernels in both
passes, where a split fits), timed in turn over ROUNDS rounds (the
median of the rounds), the plan each runs, and auto's time over the fastest of them. A
shape where auto is more than SLACK slower is listed.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from . import timing
from .gru import ours_calls
from .offtable import OFF_TABLE
from .shapes import SHAPES, make_problem, shapes_main

#: shapes beside the tiles' edges: id -> ((T, B, I, H, bidirectional), what for)
EDGES = {
    "A1": ((100, 64, 40, 132, False), "H = 132: a cluster of 8 whose last block has no units"),
    "A2": ((100, 16, 64, 196, True), "H = 196, bidirectional: likewise"),
    "A3": ((50, 20, 128, 650, False), "H = 650: grid scope, rows not on 16-byte boundaries"),
    "A4": ((50, 20, 128, 652, False), "H = 652: beside A3, rows on 16-byte boundaries"),
    "A5": ((100, 8, 64, 258, False), "H = 258, B = 8: grid scope, unaligned rows"),
    "A6": ((100, 8, 64, 260, False), "H = 260, B = 8: beside A5, aligned"),
}
ALL = {**{k: (v, "S1-S10") for k, v in SHAPES.items()}, **OFF_TABLE, **EDGES}
PATHS = ("auto", "steps", "fast", "resident")


def probe_args(doc, default_ids, argv, extra=()):
    """The command line of a probe of these shapes (tools/rows_probe.py, inference_sweep.py):
    shape ids (default `default_ids`), --repeat, and `extra` ((flag, type, default, help)
    each); an unknown id stops with argparse's error naming it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=list(default_ids), help="shape ids of bench.paths")
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    for flag, kind, default, text in extra:
        ap.add_argument(flag, type=kind, default=default, help=text)
    args = ap.parse_args(argv)
    bad = [i for i in args.ids if i not in ALL]
    if bad:
        ap.error(f"unknown shape id(s) {bad}; choose from {', '.join(ALL)}")
    return args


def probe_problems(ids, repeat, dtype=np.float32):
    """For each shape id, (id, (T, B, I, H, bidirectional, D), the problem's cupy arrays by
    name (of `dtype`), the four weights in gru_forward's order, timed calls per
    measurement)."""
    import cupy as cp
    for sid in ids:
        (T, B, I, H, bi), _ = ALL[sid]
        a = {k: cp.asarray(v) for k, v in make_problem(T, B, I, H, bi, dtype=dtype).items()
             if isinstance(v, np.ndarray)}
        yield (sid, (T, B, I, H, bi, 2 if bi else 1), a,
               (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"]), timing.repeats_for(T, repeat))


#: auto may be this much slower than the fastest of our paths before a shape is listed (two
#: runs of one path differ by a few percent)
SLACK = 1.05
#: rounds over which the paths of a shape are timed in turn (timing.time_passes)
ROUNDS = 5


def plan_name(plan) -> str:
    """A short name of a plan: small, steps, persist(blocks), tile(scope, cluster, ...)."""
    from cugru import plans
    if plan is None:
        return "-"
    if plan is plans.SMALL:
        return "small"
    if plan is plans.STEPS:
        return "steps"
    if isinstance(plan, plans.PersistPlan):
        return f"persist({plan.blocks} blocks)"
    if isinstance(plan, plans.ResidentPlan):
        return f"resident({plan.rows}x{plan.units}, k/{plan.k_split}, {plan.blocks} blocks)"
    return f"tile({plan.scope}, {plan.tile}, {plan.units} units)"


def plans_of(path, T, B, I, H, D, dtype):
    """(forward plan, backward plan) names of a path on a shape."""
    from cugru import plans
    try:
        return tuple(plan_name(plans.choose(path, B, H, D, np.dtype(dtype), bw, T, I))
                     for bw in (False, True))
    except ValueError:
        return None


def run(ids, repeat, dtypes=("float32",)):
    """Rows: per shape and dtype, each path's plans and train and inference times (ms)."""
    import cupy as cp
    rows = []
    for sid in ids:
        (T, B, I, H, bi), why = ALL[sid]
        D = 2 if bi else 1
        for dt in dtypes:
            p = make_problem(T, B, I, H, bi, dtype=np.dtype(dt))
            row = {"id": sid, "shape": [T, B, I, H, bi], "why": why, "dtype": dt}
            n = timing.repeats_for(T, repeat)
            calls = {}
            for path in PATHS:
                names = plans_of(path, T, B, I, H, D, dt)
                row[f"{path} plans"] = names
                if names is not None:   # (path="fast" or "resident" where no split fits)
                    calls[path] = ours_calls(p, cp, path)
            # (the paths in turn, over rounds: auto and a path running the same plan are
            # then timed over the same stretches of a host whose pace drifts)
            timing.time_passes(row, calls, n, ROUNDS)
            rows.append(row)
            print(f"  {sid} {dt}: {row}", file=sys.stderr, flush=True)
    return rows


def over_best(row, kind):
    """auto's time over the fastest path's, for `kind` "train" or "infer"."""
    times = [row[f"{p} {kind} ms"] for p in PATHS if f"{p} {kind} ms" in row]
    return row[f"auto {kind} ms"] / min(times)


def same_plans(row, path, kind):
    """Whether `path` runs the plans path="auto" runs for `kind` (train: both passes'; infer:
    the forward pass's)."""
    ours, theirs = row["auto plans"], row[f"{path} plans"]
    if theirs is None:
        return False
    return tuple(ours) == tuple(theirs) if kind == "train" else ours[0] == theirs[0]


def slower(rows):
    """The lines naming each shape and pass where auto is more than SLACK over the best; a
    best path that runs auto's very plans is said to (its gap is the host's pace between
    the timings, not the planner's choice)."""
    out = []
    for r in rows:
        for kind in ("train", "infer"):
            ratio = over_best(r, kind)
            if ratio > SLACK:
                best = min((p for p in PATHS if f"{p} {kind} ms" in r),
                           key=lambda p: r[f"{p} {kind} ms"])
                line = (f"- {r['id']} {r['dtype']} {kind}: auto {ratio:.2f}x the time of "
                        f"path='{best}'")
                if same_plans(r, best, kind):
                    line += (", which runs the same plans (the host's pace between the "
                             "timings, not the choice)")
                out.append(line)
    return out


def markdown(rows):
    out = ["Our paths on each shape, device time, ms (auto / best: path='auto' over the fastest "
           "of them); plans forward | backward", "",
           "| id | T, B, I, H, bi | dtype | auto plans | train: auto | steps | fast | resident | "
           "auto / best | inference: auto | steps | fast | resident | auto / best | fast plans "
           "| resident plan |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ms(r, key):
        return f"{r[key]:.3f}" if key in r else "-"
    for r in rows:
        auto = " \\| ".join(r["auto plans"])
        fast = " \\| ".join(r["fast plans"]) if r["fast plans"] else "none fits"
        res = r["resident plans"][0] if r.get("resident plans") else "none fits"
        cells = [r["id"], ", ".join(map(str, r["shape"])), r["dtype"], auto]
        for kind in ("train", "infer"):
            cells += [ms(r, f"{p} {kind} ms") for p in PATHS] + [f"{over_best(r, kind):.2f}"]
        out.append("| " + " | ".join(cells + [fast, res]) + " |")
    return out + ["", f"Where auto is more than {SLACK}x the fastest of our paths:"] \
        + (slower(rows) or ["- none"])


def main(argv=None) -> int:
    return shapes_main(__doc__, ALL, run, markdown, argv, dtypes="float32", repeat=10)


if __name__ == "__main__":
    sys.exit(main())
