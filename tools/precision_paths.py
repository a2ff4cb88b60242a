"""Where an accuracy figure comes from: for shapes of S1-S10, each draw of bench.precision's
float32 inputs, the normwise error against torch.nn.GRU in float64 of cuDNN strict and with
TF32, of ours on each path and math, and of our numpy path in float32 (the CPU's float32
BLAS): which results TF32 touches in each, and how far one draw's error moves at float32's
rounding.

    python tools/precision_paths.py [S6,S7] [--draws N]     (GPU and torch with CUDA needed)
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: both passes of ours on each
PATHS = ("auto", "steps", "fast")
MATHS = ("strict", "tf32")


def rows_of(sid, seed):
    """{implementation: eight normwise errors} for one draw of shape `sid`."""
    import cupy as cp
    import torch

    from bench.precision import normwise, problem, run_ours, run_torch
    from bench.shapes import SHAPES
    p = problem(SHAPES[sid], np.float32, seed=seed)
    ref = run_torch(p, torch.float64, "cuda")
    got = {"cuDNN strict": run_torch(p, torch.float32, "cuda", False),
           "cuDNN TF32": run_torch(p, torch.float32, "cuda", True)}
    for path in PATHS:
        for math in MATHS:
            try:
                got[f"ours {path}, {math}"] = run_ours(p, cp, math, path)
            except ValueError as e:     # (a path this shape does not take)
                print(f"{sid} draw {seed}: path={path} math={math} refused: {e}")
    got["ours numpy, float32"] = run_ours(p, np, "strict")
    return {k: [normwise(a, r) for a, r in zip(v, ref)] for k, v in got.items()}


def main(argv=None):
    from bench.precision import DRAWS, NAMES
    from bench.shapes import SHAPES, id_list
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="?", type=id_list(SHAPES), default=["S6"],
                    help="comma-separated ids of S1-S10")
    ap.add_argument("--draws", type=int, default=DRAWS,
                    help="draws of the inputs (seeds 0..N-1)")
    args = ap.parse_args(argv)
    if args.draws < 1:
        ap.error(f"--draws must be at least 1, got {args.draws}")
    import torch
    if not torch.cuda.is_available():
        ap.error("needs torch with a CUDA GPU (cuDNN is the comparison)")
    torch.backends.cuda.matmul.allow_tf32 = False
    print("| shape | draw | implementation | " + " | ".join(NAMES) + " |")
    print("|---|---|---|" + "---|" * len(NAMES))
    for sid in args.shapes:
        for seed in range(args.draws):
            for name, errs in rows_of(sid, seed).items():
                print(f"| {sid} | {seed} | {name} | "
                      + " | ".join(f"{e:.2e}" for e in errs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
