"""Where a train step's device time goes: the kernels of one step, by total time.

    python tools/kernel_table.py [ids] [--rows N] [--inference] [--dtype float64] [--cudnn]

For each shape id of bench.paths' table: three train steps (path="auto", gru_forward then
gru_backward, after warm-up steps; with --inference three inference calls) under
torch.profiler, whose CUDA trace (CUPTI) records every kernel of the process: ours, CuPy's
and cuBLAS'. Prints the last step's span, the device's busy and idle time in it, the wall
time of a call among 200 back to back (where it is well above the busy time, the host sets
the pace), and its kernels grouped by name (total µs, calls, µs a call, overlaps counted
in each), the longest first.
With --cudnn, torch.nn.GRU's call on cuDNN (TF32 off) the same way after ours. GPU and
torch needed.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS = 3


def step_kernels(torch, train):
    """The device events (name, start, end µs) of the last of STEPS calls of `train`."""
    from torch.profiler import ProfilerActivity, profile
    import cupy as cp
    for _ in range(4):
        train()
    cp.cuda.Device().synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            train()
        cp.cuda.Device().synchronize()
    events = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type.name == "CUDA"), key=lambda e: e[1])
    return events[-(len(events) // STEPS):]


def span_busy(events):
    """(span, busy) µs of the events (name, start, end): from the first start to the last
    end, and the time at least one of them runs (kernels on several streams overlap)"""
    span = max(e[2] for e in events) - min(e[1] for e in events)
    busy, reach = 0.0, None
    for _, start, end in sorted(events, key=lambda e: e[1]):
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    return span, busy


def wall_us(fn, sync, n=200):
    """wall µs a call of `fn` among n back to back (after 20), the device synchronized at
    the ends"""
    import time
    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10"])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--inference", action="store_true")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    ap.add_argument("--cudnn", action="store_true")
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    from bench.gru import ours_calls, torch_gru_calls
    from bench.paths import ALL
    from bench.shapes import make_problem
    which = 1 if args.inference else 0
    for sid in args.ids:
        p = make_problem(*ALL[sid][0], dtype=np.dtype(args.dtype))
        calls = [("ours", ours_calls(p, cp)[which], cp.cuda.Device().synchronize)]
        if args.cudnn:
            fn = torch_gru_calls(torch, p, "cuda", False, getattr(torch, args.dtype))[which]
            calls.append(("cuDNN", fn, torch.cuda.synchronize))
        for who, fn, sync in calls:
            events = step_kernels(torch, fn)
            span, busy = span_busy(events)
            groups = {}
            for name, start, end in events:
                g = groups.setdefault(name, [0, 0.0])
                g[0] += 1
                g[1] += end - start
            print(f"\n{sid} {args.dtype} {'inference' if which else 'train step'}, {who}: "
                  f"{len(events)} kernels a call, span {span:.1f} µs, busy {busy:.1f}, idle "
                  f"{span - busy:.1f}; wall {wall_us(fn, sync):.1f} µs a call\n")
            print("| kernel | µs | calls | µs a call |\n|---|---|---|---|")
            for name, (n, t) in sorted(groups.items(), key=lambda g: -g[1][1])[:args.rows]:
                print(f"| `{name[:90]}` | {t:.1f} | {n} | {t / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
