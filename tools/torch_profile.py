"""The host's work in a cugru.torch.GRU call at T = B = I = H = 1 (where a call costs its
host time): cProfile of back-to-back train steps, and the time of each conversion between
torch and CuPy arrays on its own.

    python tools/torch_profile.py [--steps N]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--trace", action="store_true", help="also torch.profiler's table")
    args = ap.parse_args(argv)
    import cupy as cp
    import torch

    import cugru.torch as ct
    gru = ct.GRU(1, 1, device="cuda")
    x = torch.randn(1, 1, 1, device="cuda", requires_grad=True)
    dy = torch.ones(1, 1, 1, device="cuda")

    def step():
        y, _ = gru(x)
        torch.autograd.backward(y, dy)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
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


if __name__ == "__main__":
    sys.exit(main())
