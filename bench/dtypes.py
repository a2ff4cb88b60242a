"""Speed in each precision: cugru against torch.nn.GRU on cuDNN in the same precision.

    python -m bench.dtypes [--shapes S1,...,O1,...] [--precisions tf32,float16,...]
                           [--repeat N] [--json FILE]

The precisions (float32 strict is bench.gru's and bench.offtable's):
  tf32      float32 data; ours math="tf32", cuDNN with torch.backends.cudnn.allow_tf32
  float16   float16 data in both (ours computes in float32, cugru/_half.py, with the
            default math for half data, "tf32": cuBLAS' products on tensor cores, as
            cuDNN's half-precision products are)
  bfloat16  bfloat16 data in both, likewise
  float16-strict, bfloat16-strict   that data in both, ours with math="strict" (every
            product in float32)
For each shape (S1-S10 by default, the off-table shapes O1-O16 on request) and precision,
a train step (forward + backward with a given dy) and a forward-only inference pass,
path="auto", device time (CUDA events around back-to-back calls, ours and cuDNN's in turn
over rounds, bench.timing.time_passes); ratio =
cuDNN's time / ours. The inputs are drawn in float32 and rounded to the precision's dtype,
the same values for both. Goals: geomean >= 2x in each precision, train and inference, no
shape below 1x; the shapes below are listed under the table. Accuracy in these precisions
is bench.precision's.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from . import timing
from .gru import ours_calls, torch_gru_calls
from .offtable import OFF_TABLE
from .precision import np_dtype
from .shapes import SHAPES, id_list, make_problem

#: precision -> (data dtype name, our math=, cuDNN with TF32 allowed)
PRECISIONS = {"tf32": ("float32", "tf32", True), "float16": ("float16", "tf32", False),
              "bfloat16": ("bfloat16", "tf32", False),
              "float16-strict": ("float16", "strict", False),
              "bfloat16-strict": ("bfloat16", "strict", False)}
ALL = {**{k: (v, "S1-S10") for k, v in SHAPES.items()}, **OFF_TABLE}
#: ratio floors per shape, and the geomean goal (cuDNN time / ours)
FLOOR, GEOMEAN_GOAL = 1.0, 2.0


def run(ids, repeat, precisions):
    """Rows of device times (ms) per shape and precision: ours (path="auto") and cuDNN's."""
    import cupy as cp
    torch = timing.torch_cuda()
    if torch is None:
        raise SystemExit("bench.dtypes needs torch with CUDA (cuDNN is the baseline)")
    rows = []
    for sid in ids:
        (T, B, I, H, bi), why = ALL[sid]
        base = make_problem(T, B, I, H, bi, dtype=np.float32)
        for prec in precisions:
            dt, math, tf32 = PRECISIONS[prec]
            p = {k: v.astype(np_dtype(dt)) if isinstance(v, np.ndarray) else v
                 for k, v in base.items()}
            row = {"id": sid, "shape": [T, B, I, H, bi], "precision": prec}
            n = timing.repeats_for(T, repeat)
            timing.time_passes(row, {"ours": ours_calls(p, cp, "auto", math),
                                     "cudnn": torch_gru_calls(torch, p, "cuda", tf32,
                                                              getattr(torch, dt))}, n)
            rows.append(row)
            print(f"  {sid} {prec}: {row}", file=sys.stderr, flush=True)
    return rows


def _ratio(r, kind):
    return r[f"cudnn {kind} ms"] / r[f"ours {kind} ms"]


def below_floor(rows):
    """The lines naming each shape, precision and pass below FLOOR."""
    return [f"- {r['id']} {r['precision']} {kind}: {_ratio(r, kind):.2f}x"
            for r in rows for kind in ("train", "infer") if _ratio(r, kind) < FLOOR]


def markdown(rows):
    out = ["cugru (path='auto') against torch.nn.GRU on cuDNN in the same precision, device "
           f"time, ms (ours and cuDNN's in turn over {timing.ROUNDS} rounds); ratio = cuDNN / "
           "ours. tf32: float32 data, ours math='tf32', cuDNN with TF32 allowed; float16 "
           "and bfloat16: the data's dtype in both, ours with its default math for half "
           "data, 'tf32', or with math='strict' (-strict: every product in float32).", "",
           "| id | T, B, I, H, bi | precision | train: ours | cuDNN | ratio | "
           "inference: ours | cuDNN | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['id']} | {', '.join(map(str, r['shape']))} | {r['precision']} | "
                   f"{r['ours train ms']:.3f} | {r['cudnn train ms']:.3f} | "
                   f"{_ratio(r, 'train'):.2f}x | {r['ours infer ms']:.3f} | "
                   f"{r['cudnn infer ms']:.3f} | {_ratio(r, 'infer'):.2f}x |")
    out.append("")
    for prec in [p for p in PRECISIONS if any(r["precision"] == p for r in rows)]:
        for table in ("S1-S10", "off-table"):
            sel = [r for r in rows if r["precision"] == prec
                   and (r["id"] in SHAPES) == (table == "S1-S10")]
            if sel:
                g = {k: timing.geomean([_ratio(r, k) for r in sel]) for k in ("train", "infer")}
                out.append(f"- {prec}, {table} ({len(sel)} shapes): geomean train "
                           f"{g['train']:.2f}x, inference {g['infer']:.2f}x (goal "
                           f"{GEOMEAN_GOAL}x)")
    return out + ["", f"Below {FLOOR}x:"] + (below_floor(rows) or ["- none"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dtypes",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--shapes", type=id_list(ALL), default=list(SHAPES),
                    help="comma-separated ids of S1-S10 and O1-O16")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated, of " + ", ".join(PRECISIONS))
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    chosen = [p for p in args.precisions.split(",") if p]
    if not chosen or any(p not in PRECISIONS for p in chosen):
        ap.error(f"--precisions must name some of {', '.join(PRECISIONS)}, "
                 f"got {args.precisions!r}")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    timing.require_gpu()
    rows = run(args.shapes, args.repeat, chosen)
    timing.publish(markdown(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
