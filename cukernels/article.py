"""The article's four kernels: FeedForward, CaclOutputGradient, CaclHiddenGradient, UpdateWeights.

Same layout as the book (weights (N, I + 1), bias in the last column); the article's codes
for `activation` are 0 tanh, 1 sigmoid, anything else identity. Inputs are one vector or a
batch (B, ...), which behaves as B calls in a row. numpy arrays run the numpy oracle, cupy
arrays the kernels of kernels/dense.cu and kernels/losses.cu.
"""
from __future__ import annotations

import numpy as np

from . import _launch, checks, oracle, runtime
from .dense import _layer, feed_forward_gpu, flat_launch, hidden_gradient_gpu


def _act_code(activation):
    code = checks.integer("activation", activation)
    return code if code in (0, 1) else 2


def feed_forward(matrix_w, matrix_i, activation):
    """FeedForward: ``o = act(W[:, :I] @ x + W[:, I])``; act 0 tanh, 1 sigmoid, other identity.

    matrix_w (N, I + 1); matrix_i (I,) or (B, I). Returns (N,) or (B, N).
    """
    xp = checks.backend(matrix_w=matrix_w, matrix_i=matrix_i)
    _layer("matrix_w", matrix_w, "matrix_i", matrix_i, lambda n, i: i, "I = columns - 1")
    act = _act_code(activation)
    if xp is np:
        return oracle.article_feed_forward(matrix_w, matrix_i, act)
    return feed_forward_gpu(matrix_i, matrix_w, act)


def calc_output_gradient(matrix_t, matrix_o, activation):
    """CaclOutputGradient: target clamped to the activation's range, ``(t - o)*f'(o)``.

    tanh: ``(clamp(t,-1,1) - o)*(1 + o)*(1 - o')``; sigmoid: ``(clamp(t,0,1) - o)*o''*(1 - o')``
    with the article's guards ``o' = 0.99 if o == 1``, ``o'' = 0.01 if o == 0``; any other
    activation: ``t - o`` (the article leaves 0 there, which stops a linear output from learning).
    """
    xp = checks.backend(matrix_t=matrix_t, matrix_o=matrix_o)
    checks.check_array("matrix_t", matrix_t, ndim=None)
    checks.check_same("matrix_t", matrix_t, matrix_o=matrix_o)
    act = _act_code(activation)
    if xp is np:
        return oracle.article_calc_output_gradient(matrix_t, matrix_o, act)
    return _launch.launch_elementwise(
        "losses.cu", f"article_output_gradient<{_launch.ctype(matrix_t.dtype)}>",
        (matrix_t, matrix_o), xp.empty_like(matrix_t), code=act)


def calc_hidden_gradient(matrix_w, matrix_g, matrix_o, activation):
    """CaclHiddenGradient: ``s[i] = sum_k g[k]*W[k, i]`` through the NEXT layer's weights
    (N_next, I + 1), then ``(clamp(s + o) - o)*f'(o)`` with the article's range clamp and guards
    (identity: ``s``). matrix_g (N_next,) or (B, N_next); matrix_o (I,) or (B, I), this layer's
    outputs. Indexing is the correct ``W[k*(I + 1) + i]`` and no bias weight enters the sum.
    """
    xp = checks.backend(matrix_w=matrix_w, matrix_g=matrix_g, matrix_o=matrix_o)
    _, i = _layer("matrix_w", matrix_w, "matrix_g", matrix_g, lambda n, i: n, "N = rows")
    _layer("matrix_w", matrix_w, "matrix_o", matrix_o, lambda n, i: i, "I = columns - 1")
    if matrix_o.shape[:-1] != matrix_g.shape[:-1]:
        raise ValueError(f"matrix_o {tuple(matrix_o.shape)} and matrix_g {tuple(matrix_g.shape)} "
                         "must both be single vectors or batches of the same size")
    act = _act_code(activation)
    if xp is np:
        return oracle.article_calc_hidden_gradient(matrix_w, matrix_g, matrix_o, act)
    return hidden_gradient_gpu(matrix_w, matrix_g, matrix_o.reshape(-1, i), act)


def update_weights(matrix_w, matrix_g, matrix_i, matrix_dw, learning_rates, momentum):
    """UpdateWeights, in place: ``u = lr*g[n]*(x[j] if j < I else 1) + momentum*dW[n, j];
    dW[n, j] = u; W[n, j] += u`` (SGD with momentum at batch size 1; a batch is B steps).

    matrix_w, matrix_dw (N, I + 1); matrix_g (N,) or (B, N); matrix_i (I,) or (B, I).
    """
    xp = checks.backend(matrix_w=matrix_w, matrix_g=matrix_g, matrix_i=matrix_i,
                        matrix_dw=matrix_dw)
    n, i = _layer("matrix_w", matrix_w, "matrix_i", matrix_i, lambda n, i: i, "I = columns - 1")
    _layer("matrix_w", matrix_w, "matrix_g", matrix_g, lambda n, i: n, "N = rows")
    checks.check_same("matrix_w", matrix_w, matrix_dw=matrix_dw)
    if matrix_i.shape[:-1] != matrix_g.shape[:-1]:
        raise ValueError(f"matrix_i {tuple(matrix_i.shape)} and matrix_g {tuple(matrix_g.shape)} "
                         "must both be single vectors or batches of the same size")
    checks.check_distinct(matrix_w=matrix_w, matrix_dw=matrix_dw, matrix_g=matrix_g,
                          matrix_i=matrix_i)
    lr = checks.real("learning_rates", learning_rates, matrix_w.dtype)
    mom = checks.real("momentum", momentum, matrix_w.dtype)
    if xp is np:
        return oracle.article_update_weights(matrix_w, matrix_g, matrix_i, matrix_dw, lr, mom)
    x2, g2 = matrix_i.reshape(-1, i), matrix_g.reshape(-1, n)
    grid, vec, inv_l = flat_launch(matrix_w, matrix_dw)
    runtime.launch("dense.cu", f"article_update_weights<{_launch.ctype(matrix_w.dtype)}>", grid,
                   (256,), {"W": matrix_w, "g": g2, "x": x2, "dW": matrix_dw, "B": x2.shape[0],
                            "N": n, "I": i, "lr": lr, "momentum": mom, "inv_L": inv_l,
                            "vec": vec})
