"""cugru against cuDNN on shapes off the S1-S10 table, chosen before any tuning for them.

    python -m bench.offtable [--shapes O1,O2,...] [--repeat N] [--json FILE]

The table (OFF_TABLE) was fixed before work on the shapes cuDNN still wins began, so that
the kernels are not tuned to it; it stays in the benchmark and every shape is reported.
What it covers: hidden sizes that are not multiples of 8 (77, 130, 200, 250, 650, 700),
hidden sizes from 512 to 2048, batches of 1, 3, 7, 512 and 1024, one step (T = 1) and
long sequences (T = 1000 and 2000), both directions, input sizes that are not multiples of
4. Each shape is timed in float32 (cuDNN FP32 strict) and float64, train step and
inference, path="auto" (what a user gets) against torch.nn.GRU, device time (CUDA events
around back-to-back calls, ours and cuDNN's in turn over rounds, as bench.gru).
Floors: float32 train >= 1.2x and inference >= 1.0x; float64 >= 1.0x; a shape below its
floor is listed under the table.
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing
from .gru import ours_calls, torch_gru_calls
from .shapes import make_problem, shapes_main

#: id -> (T, B, I, H, bidirectional), and what each shape is there for
OFF_TABLE = {
    "O1": ((100, 64, 40, 130, False), "H = 130, not a multiple of 4"),
    "O2": ((100, 32, 64, 250, True), "H = 250, bidirectional"),
    "O3": ((50, 20, 128, 700, False), "H = 700, B = 20"),
    "O4": ((100, 1, 64, 512, False), "B = 1, H = 512"),
    "O5": ((100, 3, 128, 1024, True), "B = 3, H = 1024, bidirectional"),
    "O6": ((50, 32, 256, 2048, False), "H = 2048"),
    "O7": ((64, 512, 64, 128, False), "B = 512"),
    "O8": ((32, 1024, 32, 64, True), "B = 1024, bidirectional"),
    "O9": ((1, 64, 128, 256, False), "T = 1"),
    "O10": ((1, 1, 16, 1536, True), "T = 1, B = 1, H = 1536, bidirectional"),
    "O11": ((1000, 8, 32, 96, False), "T = 1000, B = 8"),
    "O12": ((2000, 1, 16, 200, True), "T = 2000, B = 1, H = 200, bidirectional"),
    "O13": ((256, 512, 64, 128, False), "B = 512, T = 256"),
    "O14": ((100, 48, 90, 650, True), "H = 650, I = 90, bidirectional"),
    "O15": ((20, 7, 33, 77, False), "B = 7, I = 33, H = 77: nothing aligned"),
    "O16": ((500, 16, 80, 1000, False), "H = 1000, T = 500"),
}
#: (dtype, train floor, inference floor): ratio cuDNN time / ours
FLOORS = {"float32": (1.2, 1.0), "float64": (1.0, 1.0)}


def run(ids, repeat, dtypes=tuple(FLOORS)):
    """Rows of times (ms) per shape and dtype: ours (path="auto") and torch.nn.GRU's."""
    import cupy as cp
    torch = timing.torch_cuda()
    if torch is None:
        raise SystemExit("bench.offtable needs torch with CUDA (cuDNN is the baseline)")
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for sid in ids:
        (T, B, I, H, bi), why = OFF_TABLE[sid]
        for dt in dtypes:
            p = make_problem(T, B, I, H, bi, dtype=np.dtype(dt))
            row = {"id": sid, "shape": [T, B, I, H, bi], "why": why, "dtype": dt}
            n = timing.repeats_for(T, repeat)
            timing.time_passes(row, {"ours": ours_calls(p, cp, "auto"),
                                     "cudnn": torch_gru_calls(torch, p, "cuda", False,
                                                              getattr(torch, dt))}, n)
            rows.append(row)
            print(f"  {sid} {dt}: {row}", file=sys.stderr, flush=True)
    return rows


def below_floor(rows):
    """The lines naming each shape and pass below its floor."""
    out = []
    for r in rows:
        for kind, floor in zip(("train", "infer"), FLOORS[r["dtype"]]):
            ratio = r[f"cudnn {kind} ms"] / r[f"ours {kind} ms"]
            if ratio < floor:
                out.append(f"- {r['id']} {r['dtype']} {kind}: {ratio:.2f}x (floor {floor}x)")
    return out


def markdown(rows):
    out = ["Shapes off the table (chosen before tuning), path='auto' against torch.nn.GRU on "
           "cuDNN (FP32 strict; float64), device time, ms (ours and cuDNN's in turn over "
           f"{timing.ROUNDS} rounds); ratio = cuDNN / ours", "",
           "| id | T, B, I, H, bi | what for | dtype | train: ours | cuDNN | ratio | "
           "inference: ours | cuDNN | ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tr = r["cudnn train ms"] / r["ours train ms"]
        inf = r["cudnn infer ms"] / r["ours infer ms"]
        out.append(f"| {r['id']} | {', '.join(map(str, r['shape']))} | {r['why']} | "
                   f"{r['dtype']} | {r['ours train ms']:.3f} | {r['cudnn train ms']:.3f} | "
                   f"{tr:.2f}x | {r['ours infer ms']:.3f} | {r['cudnn infer ms']:.3f} | "
                   f"{inf:.2f}x |")
    for dt in sorted({r["dtype"] for r in rows}):
        sel = [r for r in rows if r["dtype"] == dt]
        g = {k: timing.geomean([r[f"cudnn {k} ms"] / r[f"ours {k} ms"] for r in sel])
             for k in ("train", "infer")}
        out.append(f"| geomean ({len(sel)} shapes) | | | {dt} | | | {g['train']:.2f}x | | | "
                   f"{g['infer']:.2f}x |")
    low = below_floor(rows)
    return out + ["", "Below the floors (float32: train 1.2x, inference 1.0x; float64: 1.0x):"] \
        + (low or ["- none"])


def main(argv=None) -> int:
    return shapes_main(__doc__, OFF_TABLE, run, markdown, argv, dtypes="float32,float64", repeat=20)


if __name__ == "__main__":
    sys.exit(main())
