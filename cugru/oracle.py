"""The numpy GRU: the reference the kernels are tested against, and the CPU fallback.

Same names, signatures and results as cugru.gru_forward / cugru.gru_backward, computed in
the dtype of the inputs; float16 and bfloat16 data are computed in float32 from the
rounded inputs (exact in float32), the history kept in float32 and the results rounded
once to the data's dtype (the weight gradients summed over every step and row first). The maths is torch.nn.GRU's (gate order r | z | n, the reset gate
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

from ._args import (backward_args, check_math, check_path, compute_dtype, forward_args,
                    shaped_grads)
from .quant import GATE_N, GATE_RZ, fake_quant, quant_rows
from .saved import GruSaved


def _sigmoid(v):
    with np.errstate(over="ignore"):     # exp(-v) = inf for v << 0 gives the right 0
        return 1 / (1 + np.exp(-v))


def _step_order(a, d):
    """A (T, ...) array in direction d's step order (time reversed for d = 1)."""
    return a if d == 0 else a[::-1]


def gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, *, bidirectional=False, training=True,
                path="auto", quant=None, lengths=None, math=None):
    """(y (T, B, D*H), h_n (D, B, H), saved or None) on numpy arrays (`path` picks a GPU
    path and `math` the GPU's products; both are checked, and here every product is
    strict)."""
    check_path(path)
    a = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training, quant, lengths)
    if a.xp is not np:
        raise TypeError("cugru.oracle runs on numpy arrays; call cugru.gru_forward for cupy")
    return forward(a, check_math(math, a.x.dtype))


def _fq(v, qparams):
    """(fq(v), the straight-through estimator's mask: 1 where nothing was clipped), or
    (v, 1) where `qparams` is None (nothing quantized there)."""
    if qparams is None:
        return v, 1
    vq, inside = fake_quant(v, qparams)
    return vq, inside.astype(v.dtype)


def _runs(lengths, T, B, d):
    """(T, B, 1) booleans in direction d's step order: whether step s runs on row b (its
    time below the row's length); None where every step runs."""
    if lengths is None:
        return None
    return _step_order(np.arange(T)[:, None] < lengths[None, :], d)[:, :, None]


def _gate_grids(quant):
    """The grids of r and z, and of n, in a quantization-aware pass (None: not quantized)."""
    return (GATE_RZ, GATE_N) if quant.gates else (None, None)


def forward(a, math="strict"):
    """The forward pass on checked arguments (cugru._args.ForwardArgs of numpy arrays);
    `math` is recorded in the history (gru_backward's default) and computes strict."""
    data = a.x.dtype
    dt = compute_dtype(data)     # (float32 for float16 and bfloat16 data: casts are exact)
    x, h0, w_ih, w_hh, b_ih, b_hh = (None if v is None else v.astype(dt, copy=False)
                                     for v in (a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh))
    T, B, I, H, D = a.dims
    q = a.quant
    if q is not None:                 # the quantized operands, once per call
        x = _fq(x, q.x_qparams)[0]
        w_ih, w_hh = quant_rows(w_ih, q.weight_bits)[0], quant_rows(w_hh, q.weight_bits)[0]
        if h0 is not None:
            h0 = _fq(h0, q.h_qparams)[0]
        g_rz, g_n = _gate_grids(q)
    hs = np.empty((D, T + 1, B, H), dt)
    hs[:, 0] = 0 if h0 is None else h0
    gates = np.empty((D, T, B, 4 * H), dt)
    y = np.empty((T, B, D * H), dt)
    for d in range(D):
        gi = (x.reshape(T * B, I) @ w_ih[d].T + b_ih[d]).reshape(T, B, 3 * H)
        gi = _step_order(gi, d)
        runs = _runs(a.lengths, T, B, d)
        for s in range(T):
            h = hs[d, s]
            gh = h @ w_hh[d].T + b_hh[d]
            r = _sigmoid(gi[s, :, :H] + gh[:, :H])
            z = _sigmoid(gi[s, :, H:2 * H] + gh[:, H:2 * H])
            hn = gh[:, 2 * H:]
            if q is None:
                n = np.tanh(gi[s, :, 2 * H:] + r * hn)
                hs[d, s + 1] = (1 - z) * n + z * h
            else:                     # (the history keeps the gates before their quantizers)
                rq, zq = _fq(r, g_rz)[0], _fq(z, g_rz)[0]
                n = np.tanh(gi[s, :, 2 * H:] + rq * hn)
                nq = _fq(n, g_n)[0]
                hs[d, s + 1] = _fq((1 - zq) * nq + zq * h, q.h_qparams)[0]
            if runs is not None:      # (beyond a row's length its state carries over)
                hs[d, s + 1] = np.where(runs[s], hs[d, s + 1], h)
            gates[d, s] = np.concatenate([r, z, n, hn], axis=1)
        y_d = hs[d, 1:] if runs is None else np.where(runs, hs[d, 1:], 0)
        _step_order(y, d)[:, :, d * H:(d + 1) * H] = y_d
    h_n = hs[:, T].astype(data)           # (a copy in any dtype)
    y = y.astype(data, copy=False)
    if not a.training:
        return y, h_n, None
    if q is None:                         # (x and the weights as given: views, no copies)
        return y, h_n, GruSaved(a.x, a.w_ih, a.w_hh, hs, gates, a.squeeze, lengths=a.lengths,
                                math=math)
    return y, h_n, GruSaved(x, w_ih, w_hh, hs, gates, a.squeeze, q, a.x, a.h0, a.lengths, math)


def gru_backward(dy, dh_n, saved, *, path="auto", math=None):
    """(dx, dh0, dw_ih, dw_hh, db_ih, db_hh) on numpy arrays, from gru_forward's `saved`
    (`path` and `math` checked, as gru_forward's)."""
    check_path(path)
    xp, dims = backward_args(dy, dh_n, saved)
    if math is not None:
        check_math(math, saved.x.dtype)
    if xp is not np:
        raise TypeError("cugru.oracle runs on numpy arrays; call cugru.gru_backward for cupy")
    return backward(dy, dh_n, saved)


def backward(dy, dh_n, saved):
    """The backward pass on checked arguments (numpy arrays)."""
    T, B, I, H, D = saved.dims
    data = dy.dtype
    dt = compute_dtype(data)              # (the history's dtype)
    dy = dy.astype(dt, copy=False)
    dh_n = None if dh_n is None else dh_n.astype(dt, copy=False)
    x, w_ih, w_hh = (v.astype(dt, copy=False) for v in (saved.x, saved.w_ih, saved.w_hh))
    q = saved.quant
    g_rz, g_n = _gate_grids(q) if q is not None else (None, None)
    dgi = np.empty((T, B, D, 3 * H), dt)      # time order: the rows of x
    dgh = np.empty((D, T, B, 3 * H), dt)      # step order: the rows of hs
    dh0 = np.zeros((D, B, H), dt) if dh_n is None else dh_n.copy()
    for d in range(D):
        dy_d = _step_order(dy[:, :, d * H:(d + 1) * H], d)
        dgi_d = _step_order(dgi[:, :, d], d)
        carry = dh0[d]
        runs = _runs(saved.lengths, T, B, d)
        for s in range(T - 1, -1, -1):
            g = saved.gates[d, s]
            r, z, n, hn = g[:, :H], g[:, H:2 * H], g[:, 2 * H:3 * H], g[:, 3 * H:]
            h = saved.hs[d, s]
            dh = dy_d[s] + carry
            if q is None:
                dn = dh * (1 - z) * (1 - n * n)
                dz = dh * (h - n) * z * (1 - z)
                dr = dn * hn * r * (1 - r)
                r_used, z_used = r, z
            else:   # the quantizers again, from the saved gates: their values and masks
                (rq, m_r), (zq, m_z), (nq, m_n) = _fq(r, g_rz), _fq(z, g_rz), _fq(n, g_n)
                if q.h_qparams is not None:
                    dh = dh * _fq((1 - zq) * nq + zq * h, q.h_qparams)[1]
                dn = dh * (1 - zq) * m_n * (1 - n * n)
                dz = dh * (h - nq) * m_z * z * (1 - z)
                dr = dn * hn * m_r * r * (1 - r)
                r_used, z_used = rq, zq
            direct = dh * z_used
            if runs is not None:      # (a step that did not run: no gate gradient, and the
                run = runs[s]         # carried gradient passes; dy there is not used)
                dr, dz, dn, r_used = (np.where(run, v, 0) for v in (dr, dz, dn, r_used))
                direct = np.where(run, direct, carry)
            dgi_d[s] = np.concatenate([dr, dz, dn], axis=1)
            dgh[d, s] = np.concatenate([dr, dz, dn * r_used], axis=1)
            carry = direct + dgh[d, s] @ w_hh[d]
        dh0[d] = carry
    rows_i = dgi.reshape(T * B, D, 3 * H)
    x2 = x.reshape(T * B, I)
    dw_ih = np.stack([rows_i[:, d].T @ x2 for d in range(D)])
    dw_hh = np.stack([dgh[d].reshape(T * B, 3 * H).T @ saved.hs[d, :T].reshape(T * B, H)
                      for d in range(D)])
    db_ih = rows_i.sum(axis=0)
    db_hh = dgh.sum(axis=(1, 2))
    dx = (dgi.reshape(T * B, D * 3 * H) @ w_ih.reshape(D * 3 * H, I)).reshape(T, B, I)
    if q is not None:
        dx = dx * _fq(saved.x_real, q.x_qparams)[1]
        if saved.h0_real is not None:
            dh0 = dh0 * _fq(saved.h0_real, q.h_qparams)[1]
    grads = tuple(g.astype(data, copy=False) for g in (dx, dh0, dw_ih, dw_hh, db_ih, db_hh))
    return grads[:2] + shaped_grads(saved, *grads[2:])
