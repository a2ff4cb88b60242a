"""The book's weight updates: SGD, Momentum, AdaGrad, RMSProp, AdaDelta, Adam.

All work in place: ``delta_weights`` (D) holds the descent direction ``-dL/dw`` summed over a
batch (as calc_delta_weights leaves it); each update uses ``d = D/batch_size``, changes
``weights`` and the moment arrays, and sets D to zero. The element count (the book's
``total``) is implied by the arrays: any shape, all the same, float32 or float64,
C-contiguous, not overlapping. They return None.

variant="standard" (default) fixes the book's defects (docs/fidelity.md): decoupled,
lr-scaled regularisation ``w -= lr*(lambda1*sign(w) + lambda2*w)``, real epsilons, AdaGrad's
gradient factor, Zeiler's AdaDelta, Adam's bias correction by step ``t``.
variant="book" keeps the book's formulas as written.

Scalars are checked by one rule for every update and variant: finite in the arrays' dtype;
the regularisation factors and eps >= 0; every decay rate (beta, beta1, beta2) in [0, 1).
"""
from __future__ import annotations

import numpy as np

from . import _launch, checks, oracle, runtime

UPDATE_KERNELS = ("sgd_update", "momentum_update", "adagrad_update", "rmsprop_update",
                  "adadelta_update", "adam_update")
#: the tensor-list kernels' table (cukernels.multi): per tensor, one 64-bit word for each of
#: these, in this order, padded to MT_FIELDS words (rendered into optim.cu as MT_<NAME>)
MT_LAYOUT = ("D", "W", "S1", "S2", "N", "FIRST", "VEC")
MT_FIELDS = 8


def _instances():
    """One module per element type for the single-tensor kernels and one for the list
    kernels, so a call compiles only the form it runs."""
    out = {}
    for c in _launch.CTYPES:
        out[c] = tuple(f"{k}<{c},{b}>" for k in UPDATE_KERNELS for b in _launch.BOOLS)
        out[f"{c}-multi"] = tuple(f"{k}_multi<{c},{b}>" for k in UPDATE_KERNELS
                                  for b in _launch.BOOLS)
    return out


runtime.register(runtime.Source(
    "optim.cu", _launch.KERNEL_DIR, _instances,
    defines=lambda: {"MT_FIELDS": MT_FIELDS, **{f"MT_{k}": i for i, k in enumerate(MT_LAYOUT)}}))
#: the range of each scalar: (lowest, highest or None); decay rates stay below their highest
_RANGES = {"learning_rate": (None, None), "lambda1": (0.0, None), "lambda2": (0.0, None),
           "eps": (0.0, None), "beta": (0.0, 1.0), "beta1": (0.0, 1.0), "beta2": (0.0, 1.0)}


def _plain_call(delta_weights, weights, states, batch_size, variant, scalars):
    """Whether the call is the common one, checked with the least host work: every array a
    C-contiguous cupy array of one float dtype and shape, none overlapping another; an int
    batch_size >= 1; a known variant; every scalar a plain float inside its range and
    float32's. Anything else (every error included) goes through the general checks, which
    decide it the same way and word the errors."""
    nd = checks.gpu_flat_type()
    if nd is None or type(weights) is not nd:
        return False
    dt, shape = weights.dtype, weights.shape
    if dt not in checks.FLOAT_DTYPES or not weights.ndim or not weights.size:
        return False
    arrays = (delta_weights, weights, *states.values())
    for a in arrays:
        if type(a) is not nd or a.dtype is not dt or a.shape != shape or not a._c_contiguous:
            return False
    # (all of one size: no two overlap where their starts lie that size apart or more)
    starts = sorted(a.data.ptr for a in arrays)
    nbytes = weights.nbytes
    for a0, b0 in zip(starts, starts[1:]):
        if b0 - a0 < nbytes:
            return False
    if type(batch_size) is not int or batch_size < 1 or variant not in _VARIANTS:
        return False
    limit = checks.F32_OVERFLOW
    for name, value in scalars.items():
        low, high = _RANGES[name]
        if not (type(value) is float and (low is None or value >= low) and (
                value < high if high is not None else -limit < value < limit)):
            return False
    return True


_VARIANTS = ("standard", "book")


def _prepare(delta_weights, weights, states, batch_size, variant, scalars):
    """Check the arrays and scalars; True to run the kernels, False for the oracle. Returns
    (gpu, {name: scalar in the arrays' dtype})."""
    if _plain_call(delta_weights, weights, states, batch_size, variant, scalars):
        return True, scalars
    arrays = {"delta_weights": delta_weights, "weights": weights, **states}
    xp = checks.backend(**arrays)
    dt = checks.check_array("weights", weights, ndim=None)
    checks.check_same("weights", weights, **arrays)    # (weights against itself: a no-op)
    checks.check_distinct(**arrays)
    checks.integer("batch_size", batch_size, min_value=1)
    checks.variant_of(variant)
    return xp is not np, check_scalars(dt, scalars)


def check_scalars(dt, scalars):
    """{name: scalar in dtype dt}, each checked against its range (_RANGES); errors name it."""
    wrapped = {}
    limit = checks.F32_OVERFLOW
    for name, value in scalars.items():
        low, high = _RANGES[name]
        # (a plain float inside its range and float32's, as most calls pass, needs no more
        # checks; checks.real decides every other value and words the errors)
        if type(value) is float and (low is None or value >= low) and (
                value < high if high is not None else -limit < value < limit):
            wrapped[name] = value
        else:
            wrapped[name] = checks.real(name, value, dt, min_value=low, max_value=high,
                                        below_max=True)
    return wrapped


_NAMES = {(k, c, v): f"{k}<{c},{_launch.BOOLS[v == 'book']}>" for k in UPDATE_KERNELS
          for c in _launch.CTYPES for v in ("standard", "book")}
_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}


def kernel_scalars(batch_size, sc, c1=0.0, c2=0.0):
    """The update kernels' scalar arguments (batch, lr, beta1, beta2, l1, l2, eps, c1, c2)
    from the checked scalars `sc` (by argument name); a rule's unused ones are 0."""
    g = sc.get
    return (float(batch_size), g("learning_rate", 0.0), g("beta", g("beta1", 0.0)),
            g("beta2", 0.0), g("lambda1", 0.0), g("lambda2", 0.0), g("eps", 0.0), c1, c2)


def adam_factors(variant, learning_rate, beta1, beta2, t):
    """Adam's step check and its bias factors (c1, c2) for the kernels: t an int >= 1 for
    variant="standard" (an error naming t otherwise); (0, 0) for the book's."""
    if variant == "standard" and not (type(t) is int and t >= 1):
        if t is None:
            raise ValueError("t (the step number, from 1) is required for variant='standard'")
        checks.integer("t", t, min_value=1)
    if variant == "book":
        return 0.0, 0.0
    return oracle.adam_bias_factors(learning_rate, beta1, beta2, t)


def _run(name, variant, delta_weights, weights, s1, s2, batch_size, sc, c1=0.0, c2=0.0):
    """Launch the update kernel `name` with the checked scalars `sc` (by argument name)."""
    _launch.launch_update(_NAMES[name, _CTYPE[weights.dtype], variant],
                          delta_weights, weights, s1, s2,
                          *kernel_scalars(batch_size, sc, c1, c2))


def sgd_update(delta_weights, weights, batch_size, learning_rate=3e-4, lambda1=0.0,
               lambda2=0.0, *, variant="standard"):
    """SGDUpdate: ``w = reg(w) + lr*D/batch``; D = 0."""
    gpu, sc = _prepare(delta_weights, weights, {}, batch_size, variant,
                       {"learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2})
    if not gpu:
        return oracle.sgd_update(delta_weights, weights, batch_size, learning_rate, lambda1,
                                 lambda2, variant=variant)
    _run("sgd_update", variant, delta_weights, weights, None, None, batch_size, sc)


def momentum_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                    lambda1=0.0, lambda2=0.0, *, variant="standard"):
    """MomentumUpdate: ``m = lr*d + beta*m; w = reg(w) + m``; D = 0 (m equals -lr*torch's buffer)."""
    gpu, sc = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                       {"learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
                        "lambda2": lambda2})
    if not gpu:
        return oracle.momentum_update(delta_weights, weights, momentum, batch_size,
                                      learning_rate, beta, lambda1, lambda2, variant=variant)
    _run("momentum_update", variant, delta_weights, weights, momentum, None, batch_size, sc)


def adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-10):
    """AdaGradUpdate: ``G += d*d; w = reg(w) + lr*d/(sqrt(G) + eps)``; book: ``+ lr/sqrt(G + 1e-37)``."""
    gpu, sc = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                       {"learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2,
                        "eps": eps})
    if not gpu:
        return oracle.adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate,
                                     lambda1, lambda2, variant=variant, eps=eps)
    _run("adagrad_update", variant, delta_weights, weights, momentum, None, batch_size, sc)


def rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-8):
    """RMSPropUpdate: ``G = beta*G + (1 - beta)*d*d; w = reg(w) + lr*d/(sqrt(G) + eps)``."""
    gpu, sc = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                       {"learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
                        "lambda2": lambda2, "eps": eps})
    if not gpu:
        return oracle.rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate,
                                     beta, lambda1, lambda2, variant=variant, eps=eps)
    _run("rmsprop_update", variant, delta_weights, weights, momentum, None, batch_size, sc)


def adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size, beta1=0.9,
                    beta2=0.999, lambda1=0.0, lambda2=0.0, *, variant="standard",
                    learning_rate=1.0, eps=1e-6):
    """AdaDeltaUpdate. Standard (Zeiler, as torch.optim.Adadelta with rho = beta1 = beta2):
    ``G = b2*G + (1-b2)*d*d; u = d*sqrt(W + eps)/sqrt(G + eps); W = b1*W + (1-b1)*u*u;
    w = reg(w) + lr*u`` (momentum_w = W, the squared updates; momentum_g = G).
    Book: W averages the squared weights and ``w += d*sqrt(W)/(sqrt(G) + 1e-37)``.
    """
    gpu, sc = _prepare(delta_weights, weights,
                       {"momentum_w": momentum_w, "momentum_g": momentum_g}, batch_size, variant,
                       {"beta1": beta1, "beta2": beta2, "lambda1": lambda1, "lambda2": lambda2,
                        "learning_rate": learning_rate, "eps": eps})
    if not gpu:
        return oracle.adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size,
                                      beta1, beta2, lambda1, lambda2, variant=variant,
                                      learning_rate=learning_rate, eps=eps)
    _run("adadelta_update", variant, delta_weights, weights, momentum_w, momentum_g, batch_size,
         sc)


def adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size, learning_rate=3e-4,
                beta1=0.9, beta2=0.999, lambda1=0.0, lambda2=0.0, *, t=None,
                variant="standard", eps=1e-8):
    """AdamUpdate. Standard (torch.optim.Adam; AdamW when lambda2 > 0), step ``t`` from 1:
    ``M = b1*M + (1-b1)*d; V = b2*V + (1-b2)*d*d;
    w = reg(w) + lr*(M/(1-b1^t))/(sqrt(V/(1-b2^t)) + eps)``.
    Book: bias correction by ``(1 - b)`` with no step counter, ``1e-37`` for eps; ``t`` unused.
    """
    gpu, sc = _prepare(delta_weights, weights,
                       {"momentum_m": momentum_m, "momentum_v": momentum_v}, batch_size, variant,
                       {"learning_rate": learning_rate, "beta1": beta1, "beta2": beta2,
                        "lambda1": lambda1, "lambda2": lambda2, "eps": eps})
    c1, c2 = adam_factors(variant, learning_rate, beta1, beta2, t)
    if not gpu:
        return oracle.adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size,
                                  learning_rate, beta1, beta2, lambda1, lambda2, t=t,
                                  variant=variant, eps=eps)
    _run("adam_update", variant, delta_weights, weights, momentum_m, momentum_v, batch_size, sc,
         c1=c1, c2=c2)
