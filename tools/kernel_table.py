"""Where a train step's device time goes: the kernels of one step, by total time.

    python tools/kernel_table.py [ids] [--rows N]

For each shape id of bench.paths' table: three train steps (path="auto", gru_forward then
gru_backward, after warm-up steps) under torch.profiler, whose CUDA trace (CUPTI) records
every kernel of the process: ours, CuPy's and cuBLAS'. Prints the last step's span, the
device's busy and idle time in it, and its kernels grouped by name (total µs, calls, µs a
call), the longest first. GPU and torch needed.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

STEPS = 3


def step_kernels(torch, train):
    """The device events (name, start, end µs) of the last of STEPS train steps."""
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10"])
    ap.add_argument("--rows", type=int, default=16)
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    from bench.gru import ours_calls
    from bench.paths import ALL
    from bench.shapes import make_problem
    for sid in args.ids:
        train, _ = ours_calls(make_problem(*ALL[sid][0]), cp)
        events = step_kernels(torch, train)
        span = events[-1][2] - events[0][1]
        groups = {}
        for name, start, end in events:
            g = groups.setdefault(name, [0, 0.0])
            g[0] += 1
            g[1] += end - start
        busy = sum(t for _, t in groups.values())
        print(f"\n{sid}: {len(events)} kernels a step, span {span:.1f} µs, busy {busy:.1f}, "
              f"idle {span - busy:.1f}\n")
        print("| kernel | µs | calls | µs a call |\n|---|---|---|---|")
        for name, (n, t) in sorted(groups.items(), key=lambda g: -g[1][1])[:args.rows]:
            print(f"| `{name[:90]}` | {t:.1f} | {n} | {t / n:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
