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
"""
from __future__ import annotations

from . import _rt, oracle


def _prepare(delta_weights, weights, states, batch_size, variant, scalars):
    arrays = {"delta_weights": delta_weights, "weights": weights, **states}
    xp = _rt.backend(**arrays)
    _rt.check_array("weights", weights, ndim=None)
    _rt.check_same("weights", weights, delta_weights=delta_weights, **states)
    _rt.check_distinct(**arrays)
    _rt.integer("batch_size", batch_size, min_value=1)
    _rt.variant_of(variant)
    for name, (value, low) in scalars.items():
        _rt.real(name, value, weights.dtype, min_value=low)
    return xp is _rt.cupy_module()


def sgd_update(delta_weights, weights, batch_size, learning_rate=3e-4, lambda1=0.0,
               lambda2=0.0, *, variant="standard"):
    """SGDUpdate: ``w = reg(w) + lr*D/batch``; D = 0."""
    gpu = _prepare(delta_weights, weights, {}, batch_size, variant,
                   {"learning_rate": (learning_rate, None), "lambda1": (lambda1, 0.0),
                    "lambda2": (lambda2, 0.0)})
    if not gpu:
        return oracle.sgd_update(delta_weights, weights, batch_size, learning_rate, lambda1,
                                 lambda2, variant=variant)
    _rt.launch_update("sgd_update", variant, delta_weights, weights, None, None, batch_size,
                      learning_rate, 0.0, 0.0, lambda1, lambda2, 0.0, 0.0, 0.0)


def momentum_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                    lambda1=0.0, lambda2=0.0, *, variant="standard"):
    """MomentumUpdate: ``m = lr*d + beta*m; w = reg(w) + m``; D = 0 (m equals -lr*torch's buffer)."""
    gpu = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                   {"learning_rate": (learning_rate, None), "beta": (beta, 0.0),
                    "lambda1": (lambda1, 0.0), "lambda2": (lambda2, 0.0)})
    if not gpu:
        return oracle.momentum_update(delta_weights, weights, momentum, batch_size,
                                      learning_rate, beta, lambda1, lambda2, variant=variant)
    _rt.launch_update("momentum_update", variant, delta_weights, weights, momentum, None,
                      batch_size, learning_rate, beta, 0.0, lambda1, lambda2, 0.0, 0.0, 0.0)


def adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-10):
    """AdaGradUpdate: ``G += d*d; w = reg(w) + lr*d/(sqrt(G) + eps)``; book: ``+ lr/sqrt(G + 1e-37)``."""
    gpu = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                   {"learning_rate": (learning_rate, None), "lambda1": (lambda1, 0.0),
                    "lambda2": (lambda2, 0.0), "eps": (eps, 0.0)})
    if not gpu:
        return oracle.adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate,
                                     lambda1, lambda2, variant=variant, eps=eps)
    _rt.launch_update("adagrad_update", variant, delta_weights, weights, momentum, None,
                      batch_size, learning_rate, 0.0, 0.0, lambda1, lambda2, eps, 0.0, 0.0)


def rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-8):
    """RMSPropUpdate: ``G = beta*G + (1 - beta)*d*d; w = reg(w) + lr*d/(sqrt(G) + eps)``."""
    gpu = _prepare(delta_weights, weights, {"momentum": momentum}, batch_size, variant,
                   {"learning_rate": (learning_rate, None), "beta": (beta, 0.0),
                    "lambda1": (lambda1, 0.0), "lambda2": (lambda2, 0.0), "eps": (eps, 0.0)})
    if not gpu:
        return oracle.rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate,
                                     beta, lambda1, lambda2, variant=variant, eps=eps)
    _rt.launch_update("rmsprop_update", variant, delta_weights, weights, momentum, None,
                      batch_size, learning_rate, beta, 0.0, lambda1, lambda2, eps, 0.0, 0.0)


def adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size, beta1=0.9,
                    beta2=0.999, lambda1=0.0, lambda2=0.0, *, variant="standard",
                    learning_rate=1.0, eps=1e-6):
    """AdaDeltaUpdate. Standard (Zeiler, as torch.optim.Adadelta with rho = beta1 = beta2):
    ``G = b2*G + (1-b2)*d*d; u = d*sqrt(W + eps)/sqrt(G + eps); W = b1*W + (1-b1)*u*u;
    w = reg(w) + lr*u`` (momentum_w = W, the squared updates; momentum_g = G).
    Book: W averages the squared weights and ``w += d*sqrt(W)/(sqrt(G) + 1e-37)``.
    """
    gpu = _prepare(delta_weights, weights, {"momentum_w": momentum_w, "momentum_g": momentum_g},
                   batch_size, variant,
                   {"beta1": (beta1, 0.0), "beta2": (beta2, 0.0), "lambda1": (lambda1, 0.0),
                    "lambda2": (lambda2, 0.0), "learning_rate": (learning_rate, None),
                    "eps": (eps, 0.0)})
    if not gpu:
        return oracle.adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size,
                                      beta1, beta2, lambda1, lambda2, variant=variant,
                                      learning_rate=learning_rate, eps=eps)
    _rt.launch_update("adadelta_update", variant, delta_weights, weights, momentum_w, momentum_g,
                      batch_size, learning_rate, beta1, beta2, lambda1, lambda2, eps, 0.0, 0.0)


def adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size, learning_rate=3e-4,
                beta1=0.9, beta2=0.999, lambda1=0.0, lambda2=0.0, *, t=None,
                variant="standard", eps=1e-8):
    """AdamUpdate. Standard (torch.optim.Adam; AdamW when lambda2 > 0), step ``t`` from 1:
    ``M = b1*M + (1-b1)*d; V = b2*V + (1-b2)*d*d;
    w = reg(w) + lr*(M/(1-b1^t))/(sqrt(V/(1-b2^t)) + eps)``.
    Book: bias correction by ``(1 - b)`` with no step counter, ``1e-37`` for eps; ``t`` unused.
    """
    gpu = _prepare(delta_weights, weights, {"momentum_m": momentum_m, "momentum_v": momentum_v},
                   batch_size, variant,
                   {"learning_rate": (learning_rate, None), "beta1": (beta1, 0.0),
                    "beta2": (beta2, 0.0), "lambda1": (lambda1, 0.0), "lambda2": (lambda2, 0.0),
                    "eps": (eps, 0.0)})
    if variant == "standard":
        if t is None:
            raise ValueError("t (the step number, from 1) is required for variant='standard'")
        _rt.integer("t", t, min_value=1)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"beta1 and beta2 must be in [0, 1), got {beta1} and {beta2}")
    if not gpu:
        return oracle.adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size,
                                  learning_rate, beta1, beta2, lambda1, lambda2, t=t,
                                  variant=variant, eps=eps)
    c1, c2 = (0.0, 0.0) if variant == "book" else oracle.adam_bias_factors(learning_rate, beta1,
                                                                            beta2, t)
    _rt.launch_update("adam_update", variant, delta_weights, weights, momentum_m, momentum_v,
                      batch_size, learning_rate, beta1, beta2, lambda1, lambda2, eps, c1, c2)
