"""The numpy GRU: the reference the kernels are tested against, and the CPU fallback.

Same names, signatures and results as cugru.gru_forward / cugru.gru_backward, computed in
the dtype of the inputs. The maths is torch.nn.GRU's (gate order r | z | n, the reset gate
applied to W_hn h + b_hn), written step by step as in docs/api.md:

    r  = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
    z  = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
    hn = W_hn h + b_hn
    n  = tanh(W_in x + b_in + r * hn)
    h' = (1 - z) * n + z * h

and backwards, per step with dh = dy_t + (the gradient carried from the later steps):

    dn = dh (1 - z)(1 - n^2);  dz = dh (h - n) z (1 - z);  dr = dn hn r (1 - r)
    d_gate_i = [dr, dz, dn];   d_gate_h = [dr, dz, dn r];  dh_prev = dh z + d_gate_h W_hh
"""
from __future__ import annotations

import numpy as np

from ._args import backward_args, check_path, forward_args, shaped_grads
from .saved import GruSaved


def _sigmoid(v):
    with np.errstate(over="ignore"):     # exp(-v) = inf for v << 0 gives the right 0
        return 1 / (1 + np.exp(-v))


def _step_order(a, d):
    """A (T, ...) array in direction d's step order (time reversed for d = 1)."""
    return a if d == 0 else a[::-1]


def gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, *, bidirectional=False, training=True,
                path="auto"):
    """(y (T, B, D*H), h_n (D, B, H), saved or None) on numpy arrays (`path` picks a GPU
    path; it is checked and has no effect here)."""
    check_path(path)
    a = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training)
    if a.xp is not np:
        raise TypeError("cugru.oracle runs on numpy arrays; call cugru.gru_forward for cupy")
    return forward(a)


def forward(a):
    """The forward pass on checked arguments (cugru._args.ForwardArgs of numpy arrays)."""
    x, h0, w_ih, w_hh, b_ih, b_hh = a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh
    T, B, I, H, D = a.dims
    dt = x.dtype
    hs = np.empty((D, T + 1, B, H), dt)
    hs[:, 0] = 0 if h0 is None else h0
    gates = np.empty((D, T, B, 4 * H), dt)
    y = np.empty((T, B, D * H), dt)
    for d in range(D):
        gi = (x.reshape(T * B, I) @ w_ih[d].T + b_ih[d]).reshape(T, B, 3 * H)
        gi = _step_order(gi, d)
        for s in range(T):
            h = hs[d, s]
            gh = h @ w_hh[d].T + b_hh[d]
            r = _sigmoid(gi[s, :, :H] + gh[:, :H])
            z = _sigmoid(gi[s, :, H:2 * H] + gh[:, H:2 * H])
            hn = gh[:, 2 * H:]
            n = np.tanh(gi[s, :, 2 * H:] + r * hn)
            hs[d, s + 1] = (1 - z) * n + z * h
            gates[d, s] = np.concatenate([r, z, n, hn], axis=1)
        _step_order(y, d)[:, :, d * H:(d + 1) * H] = hs[d, 1:]
    h_n = hs[:, T].copy()
    saved = GruSaved(x, w_ih, w_hh, hs, gates, a.squeeze) if a.training else None
    return y, h_n, saved


def gru_backward(dy, dh_n, saved, *, path="auto"):
    """(dx, dh0, dw_ih, dw_hh, db_ih, db_hh) on numpy arrays, from gru_forward's `saved`."""
    check_path(path)
    xp, dims = backward_args(dy, dh_n, saved)
    if xp is not np:
        raise TypeError("cugru.oracle runs on numpy arrays; call cugru.gru_backward for cupy")
    return backward(dy, dh_n, saved)


def backward(dy, dh_n, saved):
    """The backward pass on checked arguments (numpy arrays)."""
    T, B, I, H, D = saved.dims
    dt = dy.dtype
    dgi = np.empty((T, B, D, 3 * H), dt)      # time order: the rows of x
    dgh = np.empty((D, T, B, 3 * H), dt)      # step order: the rows of hs
    dh0 = np.zeros((D, B, H), dt) if dh_n is None else dh_n.copy()
    for d in range(D):
        dy_d = _step_order(dy[:, :, d * H:(d + 1) * H], d)
        dgi_d = _step_order(dgi[:, :, d], d)
        carry = dh0[d]
        for s in range(T - 1, -1, -1):
            g = saved.gates[d, s]
            r, z, n, hn = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
            dh = dy_d[s] + carry
            dn = dh * (1 - z) * (1 - n * n)
            dz = dh * (saved.hs[d, s] - n) * z * (1 - z)
            dr = dn * hn * r * (1 - r)
            dgi_d[s] = np.concatenate([dr, dz, dn], axis=1)
            dgh[d, s] = np.concatenate([dr, dz, dn * r], axis=1)
            carry = dh * z + dgh[d, s] @ saved.w_hh[d]
        dh0[d] = carry
    rows_i = dgi.reshape(T * B, D, 3 * H)
    x2 = saved.x.reshape(T * B, I)
    dw_ih = np.stack([rows_i[:, d].T @ x2 for d in range(D)])
    dw_hh = np.stack([dgh[d].reshape(T * B, 3 * H).T @ saved.hs[d, :T].reshape(T * B, H)
                      for d in range(D)])
    db_ih = rows_i.sum(axis=0)
    db_hh = dgh.sum(axis=(1, 2))
    dx = (dgi.reshape(T * B, D * 3 * H) @ saved.w_ih.reshape(D * 3 * H, I)).reshape(T, B, I)
    return (dx, dh0) + shaped_grads(saved, dw_ih, dw_hh, db_ih, db_hh)
