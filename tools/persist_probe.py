"""The persist kernels against the per-step path, pass by pass, on the shapes where
fast_plan gives a persist split (no tile split holds them): the data behind path="auto"'s
rule for the persist kernels (cugru._plan.auto_takes).

    python tools/persist_probe.py [--T 50] [--I 128] [--repeat 20]   (GPU needed)

For D = 1, 2, H = 384 ... 1536 and B = 1 ... 32 (while B * 3H * H is at most twice
PERSIST_AUTO_MAX_WORK), where fast_plan gives a PersistPlan: device µs per step of the
forward pass without history (inference), with history (train) and the backward pass
(recurrence and tail), each on the persist split (the backward on fast_plan's backward
split, named) and on the per-step path, with the persist cost model's estimate (cycles at
the SM clock) and the plans path="auto" takes.
"""
import argparse
import itertools
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

BATCHES = (1, 2, 3, 4, 8, 16, 32)
HIDDEN = (384, 512, 768, 1024, 1536)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--T", type=int, default=50, help="sequence length")
    ap.add_argument("--I", type=int, default=128, help="input size")
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    args = ap.parse_args(argv)
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    from bench.paths import plan_name
    from bench.shapes import make_problem
    from cugru import _plan, plans
    mhz = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["clockRate"] / 1e3
    f32 = np.dtype(np.float32)
    print("| D | H | B | B·3H·H / 2^24 | model µs | inference: persist | steps | "
          "train forward: persist | steps | backward: fast_plan's | steps | its plan | "
          "auto forward | auto backward |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for D, H, B in itertools.product((1, 2), HIDDEN, BATCHES):
        if B * 3 * H * H > 2 * plans.PERSIST_AUTO_MAX_WORK:
            continue
        fwd = plans.fast_plan(B, H, D, f32)
        if not isinstance(fwd, plans.PersistPlan):
            continue
        bwd = plans.fast_plan(B, H, D, f32, backward=True) or plans.STEPS
        p = make_problem(args.T, B, args.I, H, D == 2)
        a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
        us = {}
        for name, f_plan, b_plan in (("persist", fwd, bwd), ("steps", plans.STEPS, plans.STEPS)):
            def forward(training, plan=f_plan):
                return plans.forward(a["x"], a["h0"], *w, plan, bidirectional=D == 2,
                                     training=training)
            us[name, "infer"] = timing.gpu_time_us(lambda: forward(False), args.repeat)
            us[name, "train"] = timing.gpu_time_us(lambda: forward(True), args.repeat)
            saved = forward(True)[2]
            us[name, "backward"] = timing.gpu_time_us(
                lambda plan=b_plan: plans.backward(a["dy"], None, saved, plan), args.repeat)
        auto = [plan_name(plans.choose("auto", B, H, D, f32, bw, args.T, args.I))
                for bw in (False, True)]
        per_step = {k: v / args.T for k, v in us.items()}
        print(f"| {D} | {H} | {B} | {B * 3 * H * H / plans.PERSIST_AUTO_MAX_WORK:.2f} | "
              f"{_plan.persist_cost(fwd, B, H, D) / mhz:.1f} | "
              + " | ".join(f"{per_step[n, k]:.1f}" for k in ("infer", "train", "backward")
                           for n in ("persist", "steps"))
              + f" | {plan_name(bwd)} | {auto[0]} | {auto[1]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
