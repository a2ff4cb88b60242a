"""A repeated inference call on the per-step plan, its whole pass captured into one graph.

    python tools/step_graph_probe.py [O10 O9 ...] [--repeat N]   (GPU needed; bench.paths'
                                                                  ids: S1-S10, O1-O16, A1-A6)

For each shape, in float32 and float64: gru_forward(training=False, path="steps") called
again and again on the same arrays, with the whole pass replayed from one CUDA graph (what
the per-step plan does where its products are not wide) and with its recurrence alone
replayed and h0's slots, the projection and h_n's copies issued call by call (the form
before; `whole_pass_capture(False)`), timed in turn: host µs a call (back to back, one
synchronization at the end: what a one-step decoding loop waits on) and device µs (CUDA
events, as bench.offtable times calls); cuDNN's inference (TF32 off) the same way where
torch is installed. Both forms' y and h_n must agree bit for bit. A shape whose float32
products are wide (cugru._plan.wide_products) is marked: its pass is not captured whole.
Each of our calls is wrapped in the setting's context manager (about a microsecond of host
time that cuDNN's calls do not pay).
"""
import contextlib
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


@contextlib.contextmanager
def whole_pass_capture(on):
    """Inside the block, the per-step plan's inference pass is captured whole (`on`) or
    not (cugru._plan.StepsPlan.captures); the setting before is restored after."""
    from cugru import _plan
    was = _plan.StepsPlan.captures
    _plan.StepsPlan.captures = bool(on)
    try:
        yield
    finally:
        _plan.StepsPlan.captures = was


def in_setting(on, fn):
    """fn, called with the per-step plan's whole-pass capture set to `on`."""
    def call():
        with whole_pass_capture(on):
            return fn()
    return call


def main(argv=None):
    from bench.paths import ALL, probe_args
    args = probe_args(__doc__, ["O10", "O9", "S6"], argv)
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    import cugru
    from bench.gru import torch_gru_calls
    from bench.shapes import make_problem
    from cugru import _plan
    torch = timing.torch_cuda()
    for sid in args.ids:
        (T, B, I, H, bi), _ = ALL[sid]
        n = timing.repeats_for(T, args.repeat)
        for dtype in (np.float32, np.float64):
            p = make_problem(T, B, I, H, bi, dtype=dtype)
            a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}

            def infer():
                return cugru.gru_forward(a["x"], a["h0"], a["w_ih"], a["w_hh"], a["b_ih"],
                                         a["b_hh"], bidirectional=bi, training=False,
                                         path="steps")[:2]
            calls = {"whole pass": in_setting(True, infer),
                     "recurrence": in_setting(False, infer)}
            got = {k: [cp.asnumpy(v) for v in fn()] for k, fn in calls.items()
                   for _ in range(3)}      # (eager, captured, replayed: the last kept)
            same = all(np.array_equal(u, v) for u, v in zip(*got.values()))
            if torch is not None:
                tdt = {np.float32: torch.float32, np.float64: torch.float64}[dtype]
                calls["cuDNN"] = torch_gru_calls(torch, p, "cuda", False, tdt)[1]
            host = timing.interleaved_host_us(calls, n_repeat=max(50, 10 * n))
            device = timing.interleaved_gpu_us(calls, n_repeat=n)
            wide = _plan.wide_products(B, H, np.dtype(dtype).itemsize, "strict")
            print(f"{sid} (T, B, I, H, bi = {T}, {B}, {I}, {H}, {bi}) "
                  f"{np.dtype(dtype).name}{', wide products' if wide else ''}: "
                  f"bits {'equal' if same else 'DIFFER'}", flush=True)
            for k in calls:
                print(f"  {k:11s} host {host[k]:8.1f} µs a call   device {device[k]:8.1f} µs",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
