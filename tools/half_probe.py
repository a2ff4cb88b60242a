"""Where a half-precision inference call's host time goes, on S1 and S2 (or the shapes
given): the whole call in float32 (math="tf32") and in float16, the pieces of each (the
argument checks, the widening, the float32 pass, the rounding), and torch's
float16 call, each the median of rounds of back-to-back calls taken in turn (µs per call:
where the host sets the pace this is its time), then the host's issue time and the GPU's
time of each whole call apart (bench.timing.held_times_us).

    python tools/half_probe.py [--shapes S1,S2]      (GPU needed; torch for its row)
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def per_call_us(fns, n=400, rounds=7):
    """{name: µs per call}: the median over rounds of n back-to-back calls, fns in turn."""
    import cupy as cp
    times = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(30):
            f()
    cp.cuda.Device().synchronize()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            cp.cuda.Device().synchronize()
            times[k].append((time.perf_counter() - t0) / n * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def pieces(shape, torch):
    """{name: callable}: the calls and pieces timed for one shape."""
    import cupy as cp

    from bench.gru import ours_calls
    from bench.shapes import make_problem
    from cugru import _args, _half, _passes, _plan
    base = make_problem(*shape)
    T, B, I, H, bi = shape
    D = 2 if bi else 1
    f32 = np.dtype(np.float32)
    plan = _plan.choose("auto", B, H, D, f32, False, T, I, math="tf32")
    out = {}
    for dt in (np.float32, np.float16):
        name = np.dtype(dt).name
        p = {k: v.astype(dt) if isinstance(v, np.ndarray) else v for k, v in base.items()}
        out[f"{name} inference, the whole call"] = ours_calls(p, cp, "auto", math="tf32")[1]
        g = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        w = (g["w_ih"], g["w_hh"], g["b_ih"], g["b_hh"])
        a = _args.forward_args(g["x"], g["h0"], *w, bi, False)
        out[f"{name}: forward_args"] = lambda g=g, w=w: _args.forward_args(g["x"], g["h0"], *w,
                                                                           bi, False)
        if dt == np.float16:
            out["float16: the widening alone"] = lambda a=a: _half.widen(
                a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh, temporaries="half forward")
            y32, h32 = cp.zeros((T, B, D * H), f32), cp.zeros((D, B, H), f32)
            out["float16: the rounding alone"] = lambda: _half.narrow(np.float16, y32, h32)
            out["float16: _half.forward"] = lambda a=a: _half.forward(a, plan, "tf32")
        else:
            out["float32: _passes.forward"] = lambda a=a: _passes.forward(a, plan, "tf32")
    if torch is not None:
        gru = torch.nn.GRU(I, H, bidirectional=bi).cuda().half()
        tx = torch.as_tensor(cp.asarray(base["x"].astype(np.float16)))
        th0 = torch.as_tensor(cp.asarray(base["h0"].astype(np.float16)))

        def theirs():
            with torch.no_grad():
                return gru(tx, th0)
        out["torch.nn.GRU float16 inference"] = theirs
    return plan, out


def main(argv=None):
    from bench import shapes, timing
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=shapes.id_list(shapes.SHAPES), default=["S1", "S2"])
    args = ap.parse_args(argv)
    timing.require_gpu()
    torch = timing.torch_cuda()
    for sid in args.shapes:
        plan, fns = pieces(shapes.SHAPES[sid], torch)
        print(f"{sid} {shapes.SHAPES[sid]}: {plan}")
        for name, us in per_call_us(fns).items():
            print(f"  {name:40s} {us:8.1f} µs a call")
        for name, fn in fns.items():
            if "whole call" in name or "torch" in name:
                host, device = timing.held_times_us(fn, 20)
                print(f"  {name:40s} host {host:.1f} µs, GPU {device:.1f} µs")


if __name__ == "__main__":
    main()
