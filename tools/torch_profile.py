"""The host's work in a cugru.torch.GRU call at T = B = I = H = 1 (where a call costs its
host time): cProfile of back-to-back train steps, and the time of each conversion between
torch and CuPy arrays on its own.

    python tools/torch_profile.py [--steps N] [--trace] [--timeline]

--timeline: the adapter's functions wrapped with clocks, and a train step's time split into
them (each function's own time, and the gaps between them: torch's dispatch, autograd's
engine and its thread), the median of the steps.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--trace", action="store_true", help="also torch.profiler's table")
    ap.add_argument("--timeline", action="store_true",
                    help="only the clocked split of a train step")
    ap.add_argument("--shape", default="1,1,1,1", help="T,B,I,H of the layer (default "
                    "1,1,1,1: a call costs its host time)")
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for --timeline "
                    "(the oracle's path: a check of this tool)")
    args = ap.parse_args(argv)
    import torch

    import cugru.torch as ct
    dev = args.device
    T, B, I, H = (int(v) for v in args.shape.split(","))
    gru = ct.GRU(I, H, device=dev, dtype=torch.float32)
    x = torch.randn(T, B, I, device=dev, requires_grad=True)
    dy = torch.ones(T, B, H, device=dev)

    def step():
        y, _ = gru(x)
        torch.autograd.backward(y, dy)
    sync = torch.cuda.synchronize if dev != "cpu" else (lambda: None)
    for _ in range(20):
        step()
    sync()
    if args.timeline:
        return timeline(ct, torch, step, args.steps, sync)
    import cupy as cp
    c = cp.ones(3, cp.float32)
    import cugru
    weights = gru._layer_weights(0, 1)
    on = ct._OnDevice(x.device)
    w_cp = [on.arr(t) for t in weights]
    x_cp = on.arr(x)

    def in_device(fn):
        def run():
            with ct._OnDevice(x.device):
                return fn()
        return run

    saved = ct._layer_forward(x, None, weights, None, False, True, None)

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, v):
            return v * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def trivial():
        torch.autograd.backward(Twice.apply(x), dy)

    def frozen():
        for w in gru.parameters():
            w.requires_grad_(False)
        try:
            step()
        finally:
            for w in gru.parameters():
                w.requires_grad_(True)

    def one_thread():
        with torch.autograd.set_multithreading_enabled(False):
            step()

    def infer():
        with torch.no_grad():
            return gru(x)
    pieces = {
        "cupy.from_dlpack(tensor)": lambda: cp.from_dlpack(x.detach()),
        "torch.from_dlpack(cupy array)": lambda: torch.from_dlpack(c),
        "torch.from_dlpack inside _OnDevice": in_device(lambda: torch.from_dlpack(c)),
        "_OnDevice(...) entered and left": in_device(lambda: None),
        "_OnDevice.arr(tensor)": lambda: on.arr(x),
        "x.new_empty(0)": lambda: x.new_empty(0),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(0),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "cugru.gru_forward(training=False) (cupy)":
            lambda: cugru.gru_forward(x_cp, None, *w_cp, training=False),
        "cugru.gru_forward inside _OnDevice": in_device(
            lambda: cugru.gru_forward(x_cp, None, *w_cp, training=False)),
        "_layer_forward(training=False)":
            lambda: ct._layer_forward(x, None, weights, None, False, False, None),
        "module call, no_grad": infer,
        "_layer_forward(training=True)":
            lambda: ct._layer_forward(x, None, weights, None, False, True, None),
        "_layer_backward": lambda: ct._layer_backward(
            dy, None, x, weights, *saved[5:7], *saved[2:4], None, None, None, False, None),
        "a trivial autograd.Function, forward and backward": trivial,
        "module call with autograd, no backward": lambda: gru(x),
        "train step, parameters frozen": frozen,
        "train step, autograd on the calling thread": one_thread,
        "train step": step}
    for name, fn in pieces.items():
        n = 200 if name == "train step" else 2000
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        print(f"{name:44s} {(time.perf_counter() - t0) / n * 1e6:8.1f} µs", flush=True)
    torch.cuda.synchronize()
    if args.trace:      # torch's own profiler: the runtime calls (a sync would show here)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            for _ in range(20):
                step()
            torch.cuda.synchronize()
        print(tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(35)
    return 0


WRAPPED = ("GRU.forward", "layer", "_EagerLayer.forward", "_EagerLayer.backward",
           "_eager_forward", "_eager_backward", "_place", "_OnDevice.__init__",
           "_OnDevice.__enter__", "_OnDevice.__exit__", "_OnDevice.arr", "_OnDevice.tensor",
           "_OnDevice.unowned", "_OnDevice._allocate", "_OnDevice._make", "gru_forward",
           "gru_backward", "_stacked", "_lengths")


def timeline(ct, torch, step, steps, sync):
    """A train step split by clocks around the adapter's functions (see the module doc)."""
    import threading
    from collections import defaultdict
    clock = time.perf_counter_ns
    events = []

    def clocked(label, fn):
        def run(*a, **k):
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                events.append((label, t0, clock(), threading.get_ident()))
        return run
    for label in WRAPPED:
        owner_name, _, attr = label.rpartition(".")
        owner = getattr(ct, owner_name) if owner_name else ct
        fn = owner.__dict__[attr] if owner_name else getattr(ct, attr)
        if isinstance(fn, staticmethod):
            setattr(owner, attr, staticmethod(clocked(label, fn.__func__)))
        else:
            setattr(owner, attr, clocked(label, fn))
    backward = torch.autograd.backward
    torch.autograd.backward = clocked("torch.autograd.backward", backward)
    per_step = []
    try:
        for _ in range(10):
            step()
        sync()
        start = clock()
        for _ in range(steps):
            del events[:]
            t0 = clock()
            step()
            t1 = clock()
            per_step.append((t1 - t0, list(events)))
        sync()
        wall = (clock() - start) / steps / 1e3
    finally:
        torch.autograd.backward = backward
    sync()
    print(f"wall clock per step, back to back: {wall:.1f} µs (the host's part below: where "
          "it is the wall clock, the host waits or works, else the GPU sets the pace)")
    main_thread = threading.get_ident()
    own = defaultdict(list)
    for total, evs in per_step:
        # each event's own time: its span less the spans of the events directly inside it
        # (same thread)
        sums = defaultdict(float)
        for i, (label, a, b, th) in enumerate(evs):
            inner = [(a2, b2) for j, (_, a2, b2, th2) in enumerate(evs)
                     if j != i and th2 == th and a <= a2 and b2 <= b and (a2, b2) != (a, b)]
            top = [(a2, b2) for a2, b2 in inner
                   if not any(a3 <= a2 and b2 <= b3 and (a3, b3) != (a2, b2)
                              for a3, b3 in inner)]
            sums[label + ("" if th == main_thread else " [autograd thread]")] += \
                (b - a - sum(b2 - a2 for a2, b2 in top)) / 1e3
        tops = [(a, b) for (_, a, b, th) in evs if th == main_thread]
        tops = [(a, b) for a, b in tops
                if not any(a3 <= a and b <= b3 and (a3, b3) != (a, b) for a3, b3 in tops)]
        sums["(the step outside the clocked functions)"] = \
            (total - sum(b - a for a, b in tops)) / 1e3
        sums["(the train step)"] = total / 1e3
        for k, v in sums.items():
            own[k].append(v)
    print(f"train step, median of {steps} steps, µs (own time: less the clocked functions "
          "called inside)")
    for k, v in sorted(own.items(), key=lambda kv: -float(np.median(kv[1]))):
        print(f"{k:60s} {np.median(v):8.1f}")
    # one step's order of events, for the gaps between them
    total, evs = per_step[len(per_step) // 2]
    start = min(a for _, a, _, _ in evs)
    print("\none step, in order of start (µs from the first clocked call; span):")
    for label, a, b, th in sorted(evs, key=lambda e: e[1]):
        tag = "" if th == main_thread else "  [autograd thread]"
        print(f"{(a - start) / 1e3:9.1f} {(b - a) / 1e3:8.1f}  {label}{tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
