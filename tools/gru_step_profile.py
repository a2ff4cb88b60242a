"""Run fast-path passes of a benchmark shape, for a profiler to look at.

    ncu --kernel-name regex:gru_tile ... python tools/gru_step_profile.py S7 [train]
    python tools/gru_step_profile.py S1 [train] --host
    python tools/gru_step_profile.py S1 --pieces

Runs the forward pass (inference, or with `train` the forward pass keeping the history and
the backward recurrence) of shape S1-S10 once on the plan fast_plan chooses, after one
warm-up pass. With --host: the public calls (gru_forward, and gru_backward with `train`)
200 times under cProfile, printing where the host's time goes. With --pieces: the host time of each
piece of a fast-path inference call (argument checks, plan, allocations, the input GEMM,
the launch), each timed alone over many repeats.
"""
import sys

import numpy as np


def main(argv):
    import cupy as cp

    from bench.gru import SHAPES, make_problem
    from cugru import gru
    from cugru._args import GruSaved
    sid, train = argv[0], "train" in argv[1:]
    if "--host" in argv:
        return host_profile(sid, train)
    if "--pieces" in argv:
        return host_pieces(sid)
    T, B, I, H, bi = SHAPES[sid]
    D = 2 if bi else 1
    p = make_problem(T, B, I, H, bi)
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    plan = gru.fast_plan(B, H, D, np.float32)
    print(sid, plan, file=sys.stderr)
    dims = (T, B, I, H, D)
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    for _ in range(2):
        y, hn, hs, gates = gru._forward_gpu(a["x"], a["h0"], *w, dims, train, plan)
        if train:
            saved = GruSaved(a["x"], a["w_ih"], a["w_hh"], hs, gates, False)
            gru._backward_recurrence(a["dy"], None, saved, dims, plan)
    cp.cuda.runtime.deviceSynchronize()


def host_profile(sid, train, calls=200):
    import cProfile
    import pstats
    import time

    import cupy as cp

    import cugru
    from bench.gru import SHAPES, make_problem
    T, B, I, H, bi = SHAPES[sid]
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

    from bench.gru import SHAPES, make_problem
    from cugru import _args, gru
    from cukernels import _rt
    T, B, I, H, bi = SHAPES[sid]
    D = 2 if bi else 1
    p = make_problem(T, B, I, H, bi)
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    x, dt, G = a["x"], a["x"].dtype, 3 * H
    plan = gru.fast_plan(B, H, D, np.float32)
    fn = gru._persist_kernel(plan.forward_kernel("float", False), plan.smem_fwd)
    gi, hs = cp.empty((T, B, D, G), dt), cp.empty((D, 2, B, H), dt)
    y, h_n = cp.empty((T, B, D * H), dt), cp.empty((D, B, H), dt)
    i32 = np.int32
    args = (gi, a["w_hh"], a["b_ih"], a["b_hh"], hs, y, y, h_n, i32(T), i32(B), i32(H), i32(2),
            i32(plan.units), i32(plan.lanes), i32(plan.rows)) + plan.launch_args(cp, D)

    def gemm(loop):
        loop.gemm(True, False, D * G, T * B, I, a["w_ih"].data.ptr, I, 0, x.data.ptr, I, 0,
                  0.0, gi.data.ptr, D * G, 0)

    def in_loop(body):
        def run():
            with _rt.StepLoop(dt) as loop:
                body(loop)
        return run

    pieces = {
        "gru_forward (all)": lambda: gru.gru_forward(x, a["h0"], *w, bidirectional=bi,
                                                     training=False),
        "forward_args": lambda: _args.forward_args(x, a["h0"], *w, bi, False),
        "_choose": lambda: gru._choose("auto", B, H, D, dt),
        "cupy.empty x4": lambda: [cp.empty((T, B, D, G), dt), cp.empty((D, 2, B, H), dt),
                                  cp.empty((T, B, D * H), dt), cp.empty((D, B, H), dt)],
        "copy_bytes (h0)": lambda: _rt.copy_bytes(hs.data.ptr, a["h0"].data.ptr,
                                                  B * H * D * dt.itemsize),
        "StepLoop enter/exit": in_loop(lambda loop: None),
        "StepLoop + input GEMM": in_loop(gemm),
        "kernel lookup + name": lambda: gru._persist_kernel(plan.forward_kernel("float", False),
                                                            plan.smem_fwd),
        "launch_args": lambda: plan.launch_args(cp, D),
        "StepLoop + launch": in_loop(lambda loop: loop.launch(
            fn, (plan.blocks, D), (plan.threads,), args, shared_mem=plan.smem_fwd,
            cooperative=not plan.cluster)),
    }
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
        print(f"{sid} {name:24s} {total / reps * 1e6:8.1f} us host per call", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
