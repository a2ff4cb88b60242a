"""Every split of the resident kernels that fits a shape, timed against the per-step path's
passes: whether resident_split picks the fastest split, and what a step costs.

    python tools/resident_ab.py [ids ...] [--repeat N] [--dtype float32|float64]  (GPU needed)

For each shape of bench.paths' table (default: those where a resident split fits on an
H200: the per-step path's forward shapes S9, S10, O5, O14, O16, and the tile plans' S8 and
O3), float32 strict (or float64, where no resident split runs: the per-step path against
fast_plan's split alone): the forward pass with its history (train) and without (inference),
and the backward pass's recurrence (plans.backward_recurrence: the gate gradients and dh0,
without the tail every plan shares), on each split of plans.RESIDENT_SPLITS whose blocks
fit the GPU's SMs and shared memory, on the per-step path and on fast_plan's split (where
one fits: its own backward plan), timed in turn over rounds
(bench.timing.interleaved_gpu_us, device ms), with µs a step. The split resident_split
picks is marked; every split's outputs are checked against the per-step path's (the
largest difference of y, and of dh0, relative to its largest value, must stay within
CHECK_TOL: float32 sums of H or 3H terms in another order).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEFAULT_IDS = ("S8", "S9", "S10", "O3", "O5", "O14", "O16")
CHECK_TOL = 1e-4


def main(argv=None):
    from bench.paths import probe_args, probe_problems
    args = probe_args(__doc__, DEFAULT_IDS, argv,
                      [("--dtype", np.dtype, "float32",
                        "float32, or float64 (no resident split)")])
    dtype = args.dtype
    if dtype not in (np.float32, np.float64):
        raise SystemExit(f"--dtype must be float32 or float64, got {dtype}")
    from bench import timing
    timing.require_gpu()
    import cupy as cp
    from bench.paths import plan_name
    from cugru import plans
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    smem = dev.attributes["MaxSharedMemoryPerBlockOptin"]
    print(f"{cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}: {sms} SMs, "
          f"{smem} bytes of shared memory a block")
    print("| id | T, B, I, H, D | plan | train fwd (ms) | µs a step | inference (ms) | "
          "µs a step | backward recurrence (ms) | µs a step | y, dh0 against steps | picked |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    failed = 0
    for sid, (T, B, I, H, bi, D), a, w, n in probe_problems(args.ids, args.repeat, dtype):
        resident = plans.resident_applies(dtype)
        splits = plans.resident_splits(B, H, D, sms, smem) if resident else []
        picked = plans.resident_split(B, H, D, sms, smem) if resident else None
        x, h0 = a["x"], a["h0"]

        def calls(plan):
            return (lambda: plans.forward(x, h0, *w, plan, bidirectional=bi),
                    lambda: plans.forward(x, h0, *w, plan, bidirectional=bi, training=False))
        dy, dh_n = a["dy"], None
        saved = plans.forward(x, h0, *w, plans.STEPS, bidirectional=bi)[2]
        ref = plans.forward(x, h0, *w, plans.STEPS, bidirectional=bi, training=False)[0]
        ref_dh0 = plans.backward_recurrence(dy, dh_n, saved, plans.STEPS)[1].copy()
        fast = plans.fast_plan(B, H, D, dtype)
        fast_back = plans.fast_plan(B, H, D, dtype, backward=True)
        ours = [(plans.STEPS, plans.STEPS)] + ([(fast, fast_back)] if fast is not None else []) \
            + [(p, p) for p in splits]
        fns, errs = {}, {}
        for plan, back in ours:
            name = plan_name(plan)
            fns[name + " train"], fns[name + " infer"] = calls(plan)
            y = plans.forward(x, h0, *w, plan, bidirectional=bi, training=False)[0]
            kept = plans.forward(x, h0, *w, plan, bidirectional=bi)[2]
            fns[name + " back"] = (lambda b=back, k=kept:
                                   plans.backward_recurrence(dy, dh_n, k, b)) if back else None
            dh0 = plans.backward_recurrence(dy, dh_n, kept, back)[1] if back else ref_dh0
            errs[name] = max(float(cp.abs(y - ref).max() / cp.abs(ref).max()),
                             float(cp.abs(dh0 - ref_dh0).max() / cp.abs(ref_dh0).max()))
        us = timing.interleaved_gpu_us({k: f for k, f in fns.items() if f is not None},
                                       n_repeat=n, rounds=5)
        for plan, back in ours:
            name = plan_name(plan)
            tr, inf = us[name + " train"], us[name + " infer"]
            bk = f"{us[name + ' back'] / 1e3:.3f} | {us[name + ' back'] / T:.1f}" if back \
                else "- | -"
            ok = errs[name] <= CHECK_TOL
            failed += not ok
            print(f"| {sid} | {T}, {B}, {I}, {H}, {D} | {name} | {tr / 1e3:.3f} | {tr / T:.1f} | "
                  f"{inf / 1e3:.3f} | {inf / T:.1f} | {bk} | "
                  f"{errs[name]:.1e}{'' if ok else ' FAIL'} | {'yes' if plan == picked else ''} |",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
