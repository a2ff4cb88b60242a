"""A catalogue of every public function with an input builder, shared by the CPU and GPU tests.

case.make(rng, n, dtype) -> (args, kwargs): numpy arrays and scalars for a problem of about n
elements. case.outputs(result, args) -> the arrays to compare: the return value, or for the
in-place functions the arrays they update. `oracle` is the numpy twin to compare against.
"""
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import cukernels as ck
from cukernels import oracle


@dataclass
class Case:
    name: str
    fn: Callable
    oracle: Callable
    make: Callable
    mutates: tuple = ()             # indices of args changed in place
    kwargs_out: bool = True         # accepts out=
    dense: bool = False
    extra: dict = field(default_factory=dict)

    def outputs(self, result, args):
        if self.mutates:
            return [args[i] for i in self.mutates]
        return [result]


def _u(rng, shape, dtype, lo=-3.0, hi=3.0):
    return rng.uniform(lo, hi, shape).astype(dtype)


def _pos(rng, shape, dtype):
    return rng.uniform(0.05, 0.95, shape).astype(dtype)


def unary(name, *scalars):
    return Case(name, getattr(ck, name), getattr(oracle, name),
                lambda rng, n, dt: ((_u(rng, n, dt), *scalars), {}))


def binary(name, *scalars, first=_u):
    return Case(name, getattr(ck, name), getattr(oracle, name),
                lambda rng, n, dt: ((first(rng, n, dt), _u(rng, n, dt), *scalars), {}))


def _swish_d(rng, n, dt):
    x = _u(rng, n, dt)
    return (oracle.swish_activation(x, 1.3), _u(rng, n, dt), 1.3, x), {}


def _loss(code, variant):
    return Case(f"calc_output_gradient[{code},{variant}]", ck.calc_output_gradient,
                oracle.calc_output_gradient,
                lambda rng, n, dt: ((_pos(rng, n, dt), _pos(rng, n, dt), code),
                                    {"variant": variant}))


def _opt(name, nmom, variant, *scalars, **kw):
    def make(rng, n, dt):
        args = [_u(rng, n, dt), _u(rng, n, dt)] + [_pos(rng, n, dt) for _ in range(nmom)]
        kwargs = {"variant": variant, **kw}
        if name == "adam_update" and variant == "standard":
            kwargs["t"] = 3
        return (*args, 4, *scalars), kwargs
    return Case(f"{name}[{variant}]", getattr(ck, name), getattr(oracle, name), make,
                mutates=tuple(range(2 + nmom)), kwargs_out=False)


ELEMENTWISE = [
    unary("line_activation", 1.5, -0.25), unary("sigmoid_activation", 1.2, 0.1),
    binary("sigmoid_derivative", 1.2, 0.1, first=_pos), unary("tanh_activation"),
    binary("tanh_derivative", first=_pos), unary("lrelu_activation", 0.2),
    binary("lrelu_derivative", 0.2), unary("swish_activation", 1.3),
    Case("swish_derivative", ck.swish_derivative, oracle.swish_derivative, _swish_d),
    binary("mask_mult"),
] + [_loss(c, v) for c in (0, 1, 2, 3, 9) for v in ("standard", "book")]

UPDATES = []
for _v in ("standard", "book"):
    UPDATES += [
        _opt("sgd_update", 0, _v, 0.01, 1e-3, 1e-2),
        _opt("momentum_update", 1, _v, 0.01, 0.9, 1e-3, 1e-2),
        _opt("adagrad_update", 1, _v, 0.01, 1e-3, 1e-2),
        _opt("rmsprop_update", 1, _v, 0.01, 0.9, 1e-3, 1e-2),
        _opt("adadelta_update", 2, _v, 0.9, 0.99, 1e-3, 1e-2),
        _opt("adam_update", 2, _v, 0.01, 0.9, 0.99, 1e-3, 1e-2),
    ]

BY_NAME = {c.name: c for c in ELEMENTWISE + UPDATES}


def dense_args(rng, n, i, batch, dtype):
    # weights scaled as a layer is initialised (uniform, variance ~ 1/I): activations of
    # tanh/sigmoid stay away from float32 denormals, which the GPU flushes to zero
    lim = float(np.sqrt(3.0 / i))
    W = _u(rng, (n, i + 1), dtype, -lim, lim)
    x = _u(rng, i if batch is None else (batch, i), dtype)
    g = _u(rng, n if batch is None else (batch, n), dtype)
    return W, x, g
