"""Print (and save) the cukernels benchmark table: ours against the baselines timed in the
same run, then the cost of a call (bench/calls.py).

    python -m bench.run [--groups elementwise,update,softmax,dense] [--out DIR] [--repeat N]

Needs a CUDA GPU with CuPy; torch (with CUDA) adds the torch baselines. Writes
DIR/bench.json and DIR/bench.md when --out is given.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import calls, cases, timing


def judge(b: cases.Bench, row: dict) -> str:
    """'met', 'missed by ...' or '' (no goal measurable) for the case's goal."""
    checks = []
    if "% of copy" in b.goal and row.get("copy_frac") is not None:
        want = 0.85 if "85%" in b.goal else 0.80
        checks.append((row["copy_frac"] >= want, f"{row['copy_frac']:.0%} of copy < {want:.0%}"))
    for label, want in (("torch Adam(fused)", 1.0), ("torch.softmax", 1.0), ("torch.addmm", 0.9),
                        ("torch.mm", 0.9), ("torch.addmm_", 0.9)):
        if label in row["baselines"] and (label in b.goal or "0.9x torch" in b.goal):
            ratio = row["baselines"][label]["speedup"]
            checks.append((ratio >= want, f"{ratio:.2f}x {label} < {want}x"))
    if not checks:
        return ""
    missed = [msg for ok, msg in checks if not ok]
    return "met" if not missed else "missed: " + "; ".join(missed)


def run(groups, repeat):
    copy = timing.copy_bandwidth_gbs()
    rows = []
    for group in groups:
        for b in cases.GROUPS[group]():
            us = timing.gpu_time_us(b.ours, n_repeat=repeat)
            row = {"case": b.name, "group": b.group, "ours_us": us, "goal": b.goal,
                   "gbs": None, "copy_frac": None, "tflops": None, "baselines": {}}
            if b.bytes:
                row["gbs"] = b.bytes / us / 1e3
                row["copy_frac"] = row["gbs"] / copy
            if b.flops:
                row["tflops"] = b.flops / us / 1e6
            for label, fn in b.baselines.items():
                bu = timing.gpu_time_us(fn, n_repeat=repeat)
                row["baselines"][label] = {"us": bu, "speedup": bu / us}
            row["verdict"] = judge(b, row)
            rows.append(row)
            print(f"  {b.name}: {us:.1f} us", file=sys.stderr, flush=True)
    return copy, rows, calls.measure()


def markdown(copy, rows, host, device, before=None, before_label="before") -> str:
    lines = [f"Device: {device}. Measured device-to-device copy bandwidth: {copy:.0f} GB/s "
             "(bytes read + written). Times are medians of CUDA-event intervals around "
             "back-to-back calls (device time per call); speedup = baseline time / our time "
             "(> 1: ours is faster).", "",
             "| case | ours (us) | GB/s | % of copy | TFLOP/s | baselines: time (us), speedup | goal | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base = "; ".join(f"{k}: {v['us']:.1f}, {v['speedup']:.2f}x" for k, v in r["baselines"].items())
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        lines.append(f"| {r['case']} | {r['ours_us']:.1f} | {fmt(r['gbs'], '.0f')} | "
                     f"{fmt(r['copy_frac'], '.0%')} | {fmt(r['tflops'], '.1f')} | {base} | "
                     f"{r['goal']} | {r['verdict']} |")
    lines += ["", "### What a call costs", "",
              "Wall clock per call of back-to-back calls on tiny inputs (the GRU at T = B = I = "
              "H = 1, 64 elements otherwise), where the GPU's work is negligible: the host's "
              "work per call (bench/calls.py), beside torch's own call. The rows without a "
              "goal are no call of ours: a bare CuPy RawKernel launch on the same 64 elements "
              "(into a kept array, and into a new one from cupy.empty), timed in the "
              "elementwise call's rounds.", ""]
    lines += calls.markdown(host, before, before_label)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cukernels benchmarks against baselines")
    ap.add_argument("--groups", default=",".join(cases.GROUPS))
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--before", default=None,
                    help="bench/calls.py's JSON of an earlier tree, shown beside the call costs")
    ap.add_argument("--before-label", default="before")
    args = ap.parse_args(argv)
    timing.require_gpu()
    import cupy as cp
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    copy, rows, host = run(args.groups.split(","), args.repeat)
    before = None
    if args.before:
        with open(args.before) as f:
            before = json.load(f)
    table = markdown(copy, rows, host, dev, before, args.before_label)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench.json"), "w") as f:
            json.dump({"device": dev, "copy_gbs": copy, "rows": rows, "host": host}, f, indent=1)
        with open(os.path.join(args.out, "bench.md"), "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
