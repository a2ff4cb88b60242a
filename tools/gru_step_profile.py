"""Run fast-path passes of a benchmark shape, for a profiler to look at.

    ncu --kernel-name regex:gru_tile ... python tools/gru_step_profile.py S7 [train]
    python tools/gru_step_profile.py S1 [train] --host

Runs the forward pass (inference, or with `train` the forward pass keeping the history and
the backward recurrence) of shape S1-S10 once on the plan fast_plan chooses, after one
warm-up pass. With --host: the public calls (gru_forward, and gru_backward with `train`)
200 times under cProfile, printing where the host's time goes.
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


if __name__ == "__main__":
    main(sys.argv[1:])
