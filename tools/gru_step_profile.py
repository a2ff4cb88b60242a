"""Run fast-path passes of a benchmark shape, for a profiler to look at.

    ncu --kernel-name regex:gru_tile ... python tools/gru_step_profile.py S7 [train]
    python tools/gru_step_profile.py S1 [train] --host
    python tools/gru_step_profile.py S1 --pieces
    python tools/gru_step_profile.py tiny train --host

A shape id is one of bench/shapes.py's SHAPES, or "tiny" (T = B = I = H = 1, its TINY).

Runs the forward pass (inference, or with `train` the forward pass keeping the history and
the backward recurrence) of shape S1-S10 once on the plan fast_plan chooses, after one
warm-up pass (cugru.plans runs the passes). With --host: the public calls (gru_forward,
and gru_backward with `train`) 200 times under cProfile, printing where the host's time
goes. With --pieces: the host time of each piece of an inference call (argument checks,
plan, allocations, the input GEMM, the launch), each timed alone over many repeats.
"""
import os
import sys

import numpy as np

# (run as a script: the repository root holds the bench package)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def shape_of(sid):
    from bench.shapes import SHAPES, TINY
    return TINY if sid == "tiny" else SHAPES[sid]


def main(argv):
    import cupy as cp

    from bench.shapes import make_problem
    from cugru import plans
    sid, train = argv[0], "train" in argv[1:]
    if "--host" in argv:
        return host_profile(sid, train)
    if "--pieces" in argv:
        return host_pieces(sid)
    T, B, I, H, bi = shape_of(sid)
    D = 2 if bi else 1
    p = make_problem(T, B, I, H, bi)
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    plan = plans.fast_plan(B, H, D, np.float32)
    back = plans.fast_plan(B, H, D, np.float32, backward=True)
    if plan is None or (train and back is None):
        raise SystemExit(f"{sid}: no persistent plan holds this shape on this GPU")
    print(sid, plan, back if train else "", file=sys.stderr)
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    for _ in range(2):
        y, hn, saved = plans.forward(a["x"], a["h0"], *w, plan, bidirectional=bi,
                                     training=train)
        if train:
            plans.backward_recurrence(a["dy"], None, saved, back)
    cp.cuda.runtime.deviceSynchronize()


def host_profile(sid, train, calls=200):
    import cProfile
    import pstats
    import time

    import cupy as cp

    import cugru
    from bench.shapes import make_problem
    T, B, I, H, bi = shape_of(sid)
    p = make_problem(T, B, I, H, bi)
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])

    def call():
        y, hn, saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi,
                                         training=train)
        if train:
            cugru.gru_backward(a["dy"], None, saved)
    call()
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t0) / calls
    cp.cuda.runtime.deviceSynchronize()
    wall = (time.perf_counter() - t0) / calls
    print(f"{sid} {'train' if train else 'inference'}: host {host * 1e6:.1f} us per call, "
          f"with the device {wall * 1e6:.1f} us")
    prof = cProfile.Profile()
    prof.runcall(lambda: [call() for _ in range(calls)])
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def host_pieces(sid, reps=2000):
    import time

    import cupy as cp

    import cugru
    from bench.shapes import make_problem
    from cugru import _args, _device, _passes, _plan
    T, B, I, H, bi = shape_of(sid)
    D = 2 if bi else 1
    p = make_problem(T, B, I, H, bi)
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    x, dt = a["x"], a["x"].dtype
    args = _args.forward_args(x, a["h0"], *w, bi, False)
    plan = _plan.choose("auto", B, H, D, dt, False, T, I)
    fwd = _passes.ForwardPass(args)
    kern = plan.kernels("float")[1] if isinstance(plan, _plan.TilePlan) else None

    def in_loop(body):
        def run():
            with _device.Loop(dt) as loop:
                body(loop)
        return run

    def gemm(loop):
        G = 3 * H
        loop.gemm(True, False, D * G, T * B, I, a["w_ih"].data.ptr, I, 0, x.data.ptr, I, 0,
                  0.0, fwd.gi.data.ptr, D * G, 0)

    pieces = {
        "gru_forward (all)": lambda: cugru.gru_forward(x, a["h0"], *w, bidirectional=bi,
                                                       training=False),
        "forward_args": lambda: _args.forward_args(x, a["h0"], *w, bi, False),
        "choose": lambda: _plan.choose("auto", B, H, D, dt, False, T, I),
        "ForwardPass (allocations)": lambda: _passes.ForwardPass(args),
        "copy_bytes (h0)": lambda: _device.copy_bytes(fwd.hs.data.ptr, a["h0"].data.ptr,
                                                      B * H * D * dt.itemsize),
        "Loop enter/exit": in_loop(lambda loop: None),
        "Loop + input GEMM": in_loop(gemm),
    }
    if kern is not None:
        pieces["plan.kernels"] = lambda: plan.kernels("float")
        pieces["forward_args of the plan"] = lambda: plan.forward_args(fwd)
        pieces["Loop + launch"] = in_loop(lambda loop: plan.forward(loop, fwd))
    for name, f in pieces.items():
        f()
        cp.cuda.runtime.deviceSynchronize()
        total = 0.0
        for k in range(0, reps, 100):
            t0 = time.perf_counter()
            for _ in range(100):
                f()
            total += time.perf_counter() - t0
            cp.cuda.runtime.deviceSynchronize()
        print(f"{sid} {name:26s} {total / reps * 1e6:8.1f} us host per call", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
