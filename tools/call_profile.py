"""Where a call's host time goes: each call of bench/calls.py (tiny inputs, where a call
costs its host time) run many times under cProfile, the functions that took the most time
of their own first. With --variants: A/B timings of the pieces a small call is made of, in
one process, taken in turn (a host's speed drifts within a run), µs per operation, the
median of rounds: which way to allocate, view and launch is cheaper on the host at hand.

    python tools/call_profile.py [--calls N] [--top K]
    python tools/call_profile.py --variants [--rounds 7] [--calls 2000]
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--variants", action="store_true", help="A/B timings of a call's pieces")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    if args.variants:
        return variants(args)
    import cupy as cp

    from bench import calls
    for name, ours, _ in calls.cases():
        for _ in range(20):
            ours()
        cp.cuda.Device().synchronize()
        prof = cProfile.Profile()
        prof.runcall(lambda: [ours() for _ in range(args.calls)])
        cp.cuda.Device().synchronize()
        print(f"==== {name}: {args.calls} calls under cProfile")
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(args.top)



SIX = ((1, 1, 1), (1, 1, 1), (1, 3, 1), (1, 3, 1), (1, 3), (1, 3))


def _per_result(fn, runtime):
    """fn with each result on an allocation of its own: runtime.empty_set's other way
    (its set of small results on one allocation), swapped in for the call."""
    def one_each(dtype, shapes):
        return tuple(runtime.empty(s, dtype) for s in shapes)

    def call():
        was, runtime.empty_set = runtime.empty_set, one_each
        try:
            fn()
        finally:
            runtime.empty_set = was
    return call


def variants(args):
    import cupy as cp

    import cugru
    import cukernels as ck
    from cukernels import _launch, runtime
    v = cp.random.default_rng(0).random(64, dtype=cp.float32)
    out = cp.empty_like(v)
    flat = cp.empty(4096, cp.float32)
    k = runtime.kernel("activations.cu", "sigmoid_activation<float>", _launch.EW_PARAMS)
    p = v.data.ptr
    f32, i64, i32 = np.float32, np.int64, np.int32
    x, h0 = (cp.asarray(np.full(s, 0.1, np.float32)) for s in ((1, 1, 1), (1, 1, 1)))
    w = [cp.asarray(np.full(s, 0.1, np.float32)) for s in ((1, 3, 1), (1, 3, 1), (1, 3),
                                                           (1, 3))]
    dy = cp.asarray(np.full((1, 1, 1), 0.1, np.float32))

    def gru_infer():
        cugru.gru_forward(x, h0, *w, training=False)

    def gru_train(path="auto"):
        y, hn, s = cugru.gru_forward(x, h0, *w, path=path)
        cugru.gru_backward(dy, None, s, path=path)

    from cugru import _args, _device, _passes, _plan
    from bench import timing
    a_train = _args.forward_args(x, h0, *w, False, True)
    fwd_pass = _passes.ForwardPass(a_train, True)
    y0, hn0, saved0 = cugru.gru_forward(x, h0, *w)
    bwd_pass = _passes.BackwardPass(dy, None, saved0, True)
    loop0 = _device.Loop(np.float32)
    held = {"GRU train step": gru_train, "gru_forward inference": gru_infer}
    for name, fn in held.items():
        host, device = timing.held_times_us(fn, n_repeat=20)
        print(f"{name}: host issue {host:.1f} µs, device {device:.1f} µs (a spin kernel "
              "holds the GPU while the host queues 20 calls)")

    from cugru.saved import GruSaved
    from cukernels import checks, optim
    D_, wt, m1, m2 = (cp.asarray(np.full(64, 0.1, np.float32)) for _ in range(4))
    dt = v.dtype
    try:
        import torch
        tv = torch.as_tensor(v) if torch.cuda.is_available() else None
    except ImportError:
        tv = None

    k.launch_values((1,), (256,), (p, p, p, out.data.ptr, 64, 1.0, 0.0, 0, True))
    _, block_addrs, _ = runtime._shared_block()       # (packed by the launch above)
    launch_kernel, stream_ptr = cp.cuda.driver.launchKernel, cp.cuda.get_current_stream().ptr
    pieces = {
        "cp.empty((64,), f32)": lambda: cp.empty((64,), cp.float32),
        "flat[0:64].reshape((8, 8))": lambda: flat[0:64].reshape((8, 8)),
        "flat[0:64] (a slice)": lambda: flat[0:64],
        "packed launch (launch_values)": lambda: k.launch_values(
            (1,), (256,), (p, p, p, out.data.ptr, 64, 1.0, 0.0, 0, True)),
        "bare cuLaunchKernel (CuPy's wrapper, packed block)": lambda: launch_kernel(
            k.ptr, 1, 1, 1, 256, 1, 1, 0, stream_ptr, block_addrs, 0),
        "CuPy RawKernel call": lambda: k.raw((1,), (256,), (v, v, v, out, i64(64), f32(1.0),
                                                             f32(0.0), i32(0), i32(1))),
        "sigmoid_activation": lambda: ck.sigmoid_activation(v),
        "cp.cuda.get_current_stream().ptr": lambda: cp.cuda.get_current_stream().ptr,
        "gru_forward inference": gru_infer,
        "GRU train step": gru_train,
        "GRU train step, path='steps'": lambda: gru_train("steps"),
        "GRU: forward_args": lambda: _args.forward_args(x, h0, *w, False, True),
        "GRU: choose": lambda: _plan.choose("auto", 1, 1, 1, x.dtype, False, 1, 1),
        "GRU: ForwardPass (training, small)": lambda: _passes.ForwardPass(a_train, True),
        "GRU: Loop()": lambda: _device.Loop(x.dtype),
        "GRU: SMALL.forward launch": lambda: _plan.SMALL.forward(loop0, fwd_pass),
        "GRU: _passes.forward (training)": lambda: _passes.forward(a_train, _plan.SMALL),
        "GRU: backward_args": lambda: _args.backward_args(dy, None, saved0),
        "GRU: forward_args, general checks": lambda: _args.forward_args(
            x, h0, *w, np.False_, True),
        "GRU: the 4 forward results (dev.outputs)": lambda: _device.outputs(
            dt, (1, 1, 1), (1, 1, 1), (1, 2, 1, 1), (1, 1, 1, 4)),
        "GRU: the 6 backward results (dev.outputs)": lambda: _device.outputs(
            dt, (1, 1, 1), (1, 1, 1), (1, 3, 1), (1, 3, 1), (1, 3), (1, 3)),
        "GRU: dev.scratch (backward)": lambda: _device.scratch(
            "backward", dt, (1, 1, 1, 3), (1, 1, 1, 3)),
        "GRU: dev.capturing": lambda: _device.capturing(cp),
        "GRU: GruSaved(...)": lambda: GruSaved(x, w[0], w[1], None, None, False),
        "cp.ndarray((1, 2, 1, 1), np.dtype(f32))": lambda: cp.ndarray((1, 2, 1, 1), dt),
        "GRU: BackwardPass (small)": lambda: _passes.BackwardPass(dy, None, saved0, True),
        "GRU: SMALL.backward launch": lambda: _plan.SMALL.backward(loop0, bwd_pass),
        "GRU: gru_backward": lambda: cugru.gru_backward(dy, None, saved0),
        "GRU train step, path='fast'": lambda: gru_train("fast"),
        "checks.backend(inputs=v, out=None)": lambda: checks.backend(inputs=v, out=None),
        "checks.check_array(v)": lambda: checks.check_array("inputs", v, ndim=None),
        "checks.real('a', 1.0, dt)": lambda: checks.real("a", 1.0, dt),
        "runtime.kernel(...) lookup": lambda: runtime.kernel(
            "activations.cu", "sigmoid_activation<float>", _launch.EW_PARAMS),
        "v.data.ptr": lambda: v.data.ptr,
        "cp.cuda.runtime.getDevice()": cp.cuda.runtime.getDevice,
        "flat.data + 256 (a MemoryPointer)": lambda: flat.data + 256,
        "cp.ndarray((8, 8), f32, memptr=flat.data + 256)": lambda: cp.ndarray(
            (8, 8), cp.float32, flat.data + 256),
        "cp.empty((8, 8), f32)": lambda: cp.empty((8, 8), cp.float32),
        "cp.ndarray((8, 8), f32)": lambda: cp.ndarray((8, 8), cp.float32),
        "6 results: cp.empty each": lambda: [cp.empty(sh, cp.float32) for sh in SIX],
        "6 results: runtime.empty_set (one allocation)": lambda: runtime.empty_set(
            cp.float32, SIX),
        "GRU train step, an allocation per result": _per_result(gru_train, runtime),
        "gru_forward inference, an allocation per result": _per_result(gru_infer, runtime),
        "launch_elementwise into out": lambda: _launch.launch_elementwise(
            "activations.cu", "sigmoid_activation<float>", (v,), out, a=1.0),
        "sigmoid_activation(v, out=out)": lambda: ck.sigmoid_activation(v, out=out),
        "optim._prepare (adam's checks)": lambda: optim._prepare(
            D_, wt, {"momentum_m": m1, "momentum_v": m2}, 4, "standard",
            {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "lambda1": 0.0,
             "lambda2": 0.0, "eps": 1e-8}),
        "checks.check_distinct (4 arrays)": lambda: checks.check_distinct(
            delta_weights=D_, weights=wt, momentum_m=m1, momentum_v=m2),
        "adam_update": lambda: ck.adam_update(D_, wt, m1, m2, 4, 1e-3, t=3),
        "adam: optim.adam_factors": lambda: optim.adam_factors("standard", 1e-3, 0.9, 0.999, 3),
        "adam: optim._run (the launch)": lambda: optim._run(
            "adam_update", "standard", D_, wt, m1, m2, 4, {"learning_rate": 1e-3}),
        "sgd_update": lambda: ck.sgd_update(D_, wt, 4, 1e-3),
        "sigmoid: _launch.launch_unary": lambda: _launch.launch_unary(
            "activations.cu", "sigmoid_activation<float>", v, 1.0, 0.0),
        **({"torch.sigmoid": lambda: torch.sigmoid(tv),
            "torch.empty(64)": lambda: torch.empty(64, device="cuda")} if tv is not None
           else {}),
    }
    times = {name: [] for name in pieces}
    for fn in pieces.values():
        for _ in range(50):
            fn()
    cp.cuda.Device().synchronize()
    for _ in range(args.rounds):
        for name, fn in pieces.items():
            n = args.calls if "gru" not in name.lower() else args.calls // 4
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            cp.cuda.Device().synchronize()
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    for name, ts in times.items():
        print(f"{name:42s} {statistics.median(ts):7.2f} µs  (rounds: "
              + " ".join(f"{t:.1f}" for t in ts) + ")")



if __name__ == "__main__":
    main()
