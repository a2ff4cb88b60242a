"""The cukernels benchmark cases: every case pairs our kernel with baselines timed in the
same run (bench/run.py times them; bench/test_bench.py runs them under pytest-benchmark).

A case builds its arrays once and returns callables. Memory-bound cases report GB/s of the
bytes that must move (each input read once, each output written once) and the fraction of
the measured device-to-device copy bandwidth; GEMM-shaped cases report TFLOP/s and the ratio
to torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .timing import torch_cuda as _torch

N_ELEM = 2**26          # elementwise and update kernels
FF_N, FF_I = 8192, 8192  # dense layer: weights 8192 x 8193


@dataclass
class Bench:
    name: str
    group: str                      # elementwise | update | softmax | dense
    ours: Callable
    baselines: dict = field(default_factory=dict)
    bytes: int = 0                  # bytes that must move (0: compute-bound, use flops)
    flops: int = 0
    goal: str = ""


def _cp():
    import cupy
    return cupy


def _rand(cp, shape, dtype=np.float32, lo=-2.0, hi=2.0, seed=0):
    return cp.random.default_rng(seed).uniform(lo, hi, shape).astype(dtype)


def elementwise_cases():
    import cukernels as ck
    cp = _cp()
    n = N_ELEM
    x, g = _rand(cp, n, seed=1), _rand(cp, n, seed=2)
    y = ck.sigmoid_activation(x)
    t, o = _rand(cp, n, lo=0.05, hi=0.95, seed=3), _rand(cp, n, lo=0.05, hi=0.95, seed=4)
    out = cp.empty_like(x)
    one = np.float32(1)
    rows = [
        ("line_activation", lambda: ck.line_activation(x, 1.5, 0.5, out=out),
         lambda: cp.multiply(x, np.float32(1.5), out=out) + np.float32(0.5), 1),
        ("sigmoid_activation", lambda: ck.sigmoid_activation(x, out=out),
         lambda: one / (one + cp.exp(-x)), 1),
        ("sigmoid_derivative", lambda: ck.sigmoid_derivative(y, g, out=out),
         lambda: cp.clip(y, 0, 1) * (one - cp.clip(y, 0, 1)) * g, 2),
        ("tanh_activation", lambda: ck.tanh_activation(x, out=out), lambda: cp.tanh(x), 1),
        ("tanh_derivative", lambda: ck.tanh_derivative(y, g, out=out),
         lambda: (one - y * y) * g, 2),
        ("lrelu_activation", lambda: ck.lrelu_activation(x, out=out),
         lambda: cp.where(x > 0, x, np.float32(0.3) * x), 1),
        ("lrelu_derivative", lambda: ck.lrelu_derivative(y, g, out=out),
         lambda: cp.where(y > 0, one, np.float32(0.3)) * g, 2),
        ("swish_activation", lambda: ck.swish_activation(x, out=out),
         lambda: x / (one + cp.exp(-x)), 1),
        ("swish_derivative", lambda: ck.swish_derivative(y, g, 1.0, x, out=out),
         lambda: (y + (one - y) / (one + cp.exp(-x))) * g, 3),
        ("mask_mult", lambda: ck.mask_mult(x, g, out=out), lambda: cp.multiply(x, g, out=out), 2),
        ("calc_output_gradient[3]", lambda: ck.calc_output_gradient(t, o, 3, out=out),
         lambda: (t - o) / (o * (one - o) + np.float32(1e-7)), 2),
    ]
    return [Bench(name, "elementwise", f, {"plain CuPy": base}, bytes=(nin + 1) * 4 * n,
                  goal=">= 85% of copy")
            for name, f, base, nin in rows]


def update_cases():
    import cukernels as ck
    cp, torch = _cp(), _torch()
    n = N_ELEM
    D, w = _rand(cp, n, seed=5), _rand(cp, n, seed=6)
    m1, m2 = _rand(cp, n, lo=0.1, hi=1.0, seed=7), _rand(cp, n, lo=0.1, hi=1.0, seed=8)
    lr, B = np.float32(1e-3), np.float32(4)

    def cupy_adam():   # the same maths as a plain CuPy composition (D is zeroed too)
        d = D / B
        m1[...] = np.float32(0.9) * m1 + np.float32(0.1) * d
        m2[...] = np.float32(0.999) * m2 + np.float32(0.001) * d * d
        w[...] = w + lr * np.float32(10) * m1 / (cp.sqrt(m2) * np.float32(1.2) + np.float32(1e-8))
        D.fill(0)

    rows = [
        ("sgd_update", lambda: ck.sgd_update(D, w, 4, 1e-3), 4,
         {"plain CuPy": lambda: (w.__iadd__(lr * (D / B)), D.fill(0))}),
        ("momentum_update", lambda: ck.momentum_update(D, w, m1, 4, 1e-3), 6, {}),
        ("adagrad_update", lambda: ck.adagrad_update(D, w, m1, 4, 1e-3), 6, {}),
        ("rmsprop_update", lambda: ck.rmsprop_update(D, w, m1, 4, 1e-3), 6, {}),
        ("adadelta_update", lambda: ck.adadelta_update(D, w, m1, m2, 4), 8, {}),
        ("adam_update", lambda: ck.adam_update(D, w, m1, m2, 4, 1e-3, t=10), 8,
         {"plain CuPy": cupy_adam}),
    ]
    if torch is not None:
        tw = torch.nn.Parameter(torch.randn(n, device="cuda"))
        tw.grad = torch.randn(n, device="cuda")
        opts = {
            "sgd_update": ("torch SGD(fused)", torch.optim.SGD([tw], lr=1e-3, fused=True)),
            "momentum_update": ("torch SGD(momentum, fused)",
                                torch.optim.SGD([tw], lr=1e-3, momentum=0.9, fused=True)),
            "adagrad_update": ("torch Adagrad(foreach)", torch.optim.Adagrad([tw], lr=1e-3, foreach=True)),
            "rmsprop_update": ("torch RMSprop(foreach)", torch.optim.RMSprop([tw], lr=1e-3, foreach=True)),
            "adadelta_update": ("torch Adadelta(foreach)", torch.optim.Adadelta([tw], foreach=True)),
            "adam_update": ("torch Adam(fused)", torch.optim.Adam([tw], lr=1e-3, fused=True)),
        }
        for name, _, _, base in rows:
            label, opt = opts[name]
            base[label] = opt.step
    return [Bench(name, "update", f, base, bytes=k * 4 * n,
                  goal=">= 85% of copy" + ("; >= 1.0x torch Adam(fused)" if name == "adam_update" else ""))
            for name, f, k, base in rows]


def softmax_cases():
    import cukernels as ck
    cp, torch = _cp(), _torch()
    cases = []
    for rows, cols in ((4096, 4096), (65536, 128)):
        x = _rand(cp, (rows, cols), lo=-8, hi=8, seed=9)
        out = cp.empty_like(x)
        base = {}
        if torch is not None:
            tx = torch.as_tensor(x, device="cuda")
            base["torch.softmax"] = lambda tx=tx: torch.softmax(tx, dim=-1)
        cases.append(Bench(f"softmax_activation {rows}x{cols}", "softmax",
                           lambda x=x, out=out: ck.softmax_activation(x, out=out), base,
                           bytes=2 * 4 * rows * cols, goal=">= 1.0x torch.softmax"))
    return cases


def dense_cases():
    import cukernels as ck
    cp, torch = _cp(), _torch()
    n, i = FF_N, FF_I
    W = _rand(cp, (n, i + 1), lo=-0.01, hi=0.01, seed=10)
    cases = []
    tW = torch.as_tensor(W, device="cuda") if torch is not None else None
    for b in (1, 256):
        x = _rand(cp, (b, i), seed=11)
        g = _rand(cp, (b, n), seed=12)
        D = cp.zeros_like(W)
        flops = 2 * b * n * i
        bytes_ = 4 * (W.size + x.size + g.size) if b == 1 else 0
        goal_mem = ">= 80% of copy"
        base_ff, base_hg, base_dw = {}, {}, {}
        if torch is not None:
            tx, tg = torch.as_tensor(x, device="cuda"), torch.as_tensor(g, device="cuda")
            tD = torch.zeros_like(tW)
            WI, bias = tW[:, :i], tW[:, i]
            base_ff["torch.addmm"] = lambda tx=tx: torch.addmm(bias, tx, WI.t())
            base_hg["torch.mm"] = lambda tg=tg: tg @ WI

            def tdelta(tx=tx, tg=tg, tD=tD):
                tD[:, :i].addmm_(tg.t(), tx)
                tD[:, i] += tg.sum(0)
            base_dw["torch.addmm_"] = tdelta
        xs = x[0] if b == 1 else x
        gs = g[0] if b == 1 else g
        goal = goal_mem if b == 1 else ">= 0.9x torch"
        cases += [
            Bench(f"perceptron_feed_forward B={b}", "dense",
                  lambda xs=xs: ck.perceptron_feed_forward(xs, W), base_ff, bytes_, flops, goal),
            Bench(f"calc_hidden_gradient B={b}", "dense",
                  lambda gs=gs: ck.calc_hidden_gradient(W, gs), base_hg, bytes_, flops, goal),
            Bench(f"calc_delta_weights B={b}", "dense",
                  lambda xs=xs, gs=gs, D=D: ck.calc_delta_weights(xs, D, gs), base_dw,
                  2 * bytes_, flops, goal),
        ]
    return cases


GROUPS = {"elementwise": elementwise_cases, "update": update_cases, "softmax": softmax_cases,
          "dense": dense_cases}
