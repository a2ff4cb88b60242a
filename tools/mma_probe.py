"""The tile kernels' product on tensor cores (their MMA instances) against their FMA product.

    python tools/mma_probe.py [ids ...] [--precisions tf32,float16] [--repeat N]

For each shape (bench.paths' ids: S1-S10, O1-O16, A1-A6) and precision (bench.dtypes'
names: tf32 is float32 data with math="tf32", float16 and bfloat16 their data with the
default math, "tf32"): the device ms of path="auto"'s train step and inference with the
MMA kernels (plans.use_mma(True), what a call runs), without them (the plans' FMA kernels,
the products outside the recurrence on tensor cores as before; the same plans but where an
8-row tile has a 4-row sibling, which the planner then takes: O7 and O13), and of
torch.nn.GRU on cuDNN in that precision, the three timed in turn over rounds
(bench.timing.time_passes). Ours run eagerly in both ways (plans.use_graphs(False)), so the
two differ in the recurrence's kernels alone. Each line names the forward and backward
plans of the MMA way and marks those whose passes run the MMA kernels.
"""
import os
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: shapes whose passes take tile kernels of 8 rows a group (MMA_TILES) on an H100, and S1,
#: S2 beside them (one row a group: no MMA kernel); O7 and O13 take tiles of 4 rows in
#: strict passes (plans.FOUR_ROW_TILES, no MMA kernel) and their 8-row siblings under TF32,
#: so here "fma" (the MMA kernels off) is the 4-row tiles there
DEFAULT_IDS = ("S1", "S2", "S3", "S5", "S8", "O1", "O2", "O7", "O8", "O13", "A1", "A2")


def mma_label(plans, plan, D):
    """A plan's name, with " +mma" where a float32 pass under math="tf32" runs its MMA
    kernels (TilePlan.runs_mma)."""
    from bench.paths import plan_name
    name = plan_name(plan)
    tf32 = types.SimpleNamespace(math="tf32", qat=False, lengths=None, ctype="float", D=D)
    if isinstance(plan, plans.TilePlan) and plan.runs_mma(tf32):
        name += " +mma"
    return name


def main(argv=None):
    from bench.paths import ALL, probe_args
    args = probe_args(__doc__, DEFAULT_IDS, argv,
                      [("--precisions", str, "tf32,float16", "bench.dtypes' precisions")])
    from bench import timing
    from bench.dtypes import PRECISIONS
    from bench.gru import ours_calls, torch_gru_calls
    from bench.precision import np_dtype
    from bench.shapes import make_problem
    precisions = [p for p in args.precisions.split(",") if p]
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise SystemExit(f"--precisions: unknown {bad or args.precisions!r}; choose from "
                         f"{', '.join(PRECISIONS)}")
    timing.require_gpu()
    import cupy as cp

    from cugru import plans
    torch = timing.torch_cuda()
    graphs = plans.use_graphs(False)
    print("| id | precision | plans (forward; backward) | train: mma | fma | cuDNN | "
          "fma/mma | cuDNN/mma | infer: mma | fma | cuDNN | fma/mma | cuDNN/mma |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for sid in args.ids:
            (T, B, I, H, bi), _ = ALL[sid]
            D = 2 if bi else 1
            f32 = np.dtype(np.float32)
            names = "; ".join(mma_label(plans, plans.choose("auto", B, H, D, f32, bw, T, I,
                                                            math="tf32"), D)
                              for bw in (False, True))
            base = make_problem(T, B, I, H, bi, dtype=np.float32)
            for prec in precisions:
                dt, math, tf32 = PRECISIONS[prec]
                p = {k: v.astype(np_dtype(dt)) if isinstance(v, np.ndarray) else v
                     for k, v in base.items()}
                train, infer = ours_calls(p, cp, "auto", math)

                def way(fn, on):
                    def run():
                        was = plans.use_mma(on)
                        try:
                            return fn()
                        finally:
                            plans.use_mma(was)
                    return run
                calls = {"mma": (way(train, True), way(infer, True)),
                         "fma": (way(train, False), way(infer, False))}
                if torch is not None:
                    calls["cudnn"] = torch_gru_calls(torch, p, "cuda", tf32, getattr(torch, dt))
                row = {}
                timing.time_passes(row, calls, timing.repeats_for(T, args.repeat))
                cells = []
                for kind in ("train", "infer"):
                    mma, fma = row[f"mma {kind} ms"], row[f"fma {kind} ms"]
                    cu = row.get(f"cudnn {kind} ms", float("nan"))
                    cells += [f"{mma:.3f}", f"{fma:.3f}", f"{cu:.3f}", f"{fma / mma:.2f}x",
                              f"{cu / mma:.2f}x"]
                print(f"| {sid} | {prec} | {names} | " + " | ".join(cells) + " |", flush=True)
    finally:
        plans.use_graphs(graphs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
