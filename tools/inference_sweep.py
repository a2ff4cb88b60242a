"""Each shape's inference call timed on every plan of ours, beside path="auto" and cuDNN.

The data behind the planner's choice for forward passes that keep no history.

    python tools/inference_sweep.py O11 O13 O7 S1 S2 ...   (GPU needed; bench.paths' ids:
                                                            S1-S10, O1-O16, A1-A6)

For each shape (float32): the device ms of gru_forward(training=False) as path="auto" runs
it, of torch.nn.GRU's inference on cuDNN (TF32 off) where torch is installed, and of the
same pass on every tile split the built tile kernels hold (each rows-per-group count), on
the per-step path and on the small path where it holds the shape; the fastest first, the
plan auto takes marked *. The tile ranking (cugru._plan.tile_rank) orders the forward pass
with history and the inference pass alike; this shows where the two part.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def candidates(plans, B, H, D):
    """[plan]: every split of the float32 tile kernels that can run the shape here
    (plans.tile_splits: what fast_plan ranks), the per-step plan, and the small plan where
    it holds the shape."""
    out = [split for split, _ in plans.tile_splits(B, H, D, np.float32)]
    out.append(plans.STEPS)
    if plans.SMALL.fits(B, H, D):
        out.append(plans.SMALL)
    return out


def describe(plan):
    """One line of a plan's geometry."""
    if not hasattr(plan, "tile"):
        return type(plan).__name__
    return (f"tile {plan.tile} (cluster, packs, most rows, threads, units per thread), "
            f"{plan.rows} rows, {plan.units} units a block, {plan.groups} groups")


def main(argv=None):
    from bench.paths import probe_args, probe_problems
    args = probe_args(__doc__, ["O11", "O13", "O7", "S1", "S2"], argv,
                      [("--top", int, 8, "plans listed per shape, fastest first")])
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    import cugru
    from cugru import plans
    torch = timing.torch_cuda()
    for sid, (T, B, I, H, bi, D), a, w, n in probe_problems(args.ids, args.repeat):
        auto = plans.choose("auto", B, H, D, np.dtype(np.float32), T=T, I=I)

        def ms(fn):
            return timing.gpu_time_us(fn, n_repeat=n) / 1e3
        t_auto = ms(lambda: cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi,
                                              training=False))
        line = f"{sid} (T, B, I, H, D = {T}, {B}, {I}, {H}, {D}): auto {t_auto:.3f} ms"
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = False
            gru = torch.nn.GRU(I, H, bidirectional=bi).cuda()
            tx, th0 = torch.as_tensor(a["x"]), torch.as_tensor(a["h0"])

            def cudnn():
                with torch.no_grad():
                    gru(tx, th0)
            line += f", cuDNN {ms(cudnn):.3f} ms"
        print(line, flush=True)
        timed = []
        for plan in candidates(plans, B, H, D):
            timed.append((ms(lambda plan=plan: plans.forward(
                a["x"], a["h0"], *w, plan, bidirectional=bi, training=False)), plan))
        timed.sort(key=lambda t: t[0])
        for t, plan in timed[:args.top]:
            print(f"  {t:.3f} ms {'*' if plan == auto else ' '} {describe(plan)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
