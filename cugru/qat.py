"""Helpers for quantization-aware training with cugru.QuantSpec: observers that set the
activation grids, the states a quantization-aware pass had before its state quantizer, and
an int8 export with its integer inference.

    obs_x, obs_h = qat.Observer(), qat.Observer()
    obs_x.observe(x)                               # every batch, while observing
    spec = QuantSpec(8, obs_x.qparams(), obs_h.qparams(), gates=True)
    y, h_n, saved = cugru.gru_forward(x, None, *w, quant=spec)
    obs_h.observe(qat.states_before_quant(saved))  # what the state quantizer saw

The observer is torch.ao's moving-average min/max observer (the first batch sets the range,
then each batch moves it by `averaging_constant` towards its own) with its affine qparams:
the range always holds 0, scale = (max - min) / (qmax - qmin), floored at float32's eps,
zero_point = qmin - round(min / scale), clamped to [qmin, qmax]; all in float32, as torch
computes it, so the qparams are torch's to the bit.
"""
from __future__ import annotations

import numbers

import numpy as np

from .quant import GATE_N, GATE_RZ, QuantSpec, fake_quant, inverse, quant_rows, row_scales

_EPS32 = float(np.finfo(np.float32).eps)


class Observer:
    """A moving-average min/max observer of one activation (numpy or cupy arrays), computed
    in float32 as torch's is, so its qparams are torch's to the bit."""

    def __init__(self, qmin=-128, qmax=127, averaging_constant=0.01):
        ints = all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (qmin, qmax))
        if not (ints and qmin < 0 < qmax):
            raise ValueError(f"qmin < 0 < qmax (integers) are needed, got {qmin}, {qmax}")
        if not 0 < averaging_constant <= 1:
            raise ValueError(f"averaging_constant must lie in (0, 1], got {averaging_constant}")
        self.qmin, self.qmax = int(qmin), int(qmax)
        self.c = np.float32(averaging_constant)
        self.min = self.max = None

    def observe(self, v):
        """Move the range towards this batch's min and max."""
        lo, hi = np.float32(float(v.min())), np.float32(float(v.max()))   # (numpy or cupy)
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise ValueError("the observed values are not finite")
        if self.min is None:
            self.min, self.max = lo, hi
        else:
            self.min = self.min + self.c * (lo - self.min)
            self.max = self.max + self.c * (hi - self.max)

    def qparams(self):
        """(scale, zero_point, qmin, qmax) of the range seen so far."""
        if self.min is None:
            raise ValueError("the observer has seen nothing yet")
        f32 = np.float32
        lo, hi = min(self.min, f32(0)), max(self.max, f32(0))
        scale = max((hi - lo) / f32(self.qmax - self.qmin), f32(_EPS32))
        zp = self.qmin - int(np.round(lo / scale))
        return float(scale), min(max(zp, self.qmin), self.qmax), self.qmin, self.qmax


def states_before_quant(saved):
    """The new states (D, T, B, H) of a quantization-aware forward pass before its state
    quantizer, (1 - z) n + z h with its gates as quantized: what an observer of h sees."""
    q = saved.quant
    if q is None:
        raise ValueError("saved comes from a pass without quant (its states are not quantized)")
    H = saved.hs.shape[-1]
    g = saved.gates
    z, n = g[..., H:2 * H], g[..., 2 * H:3 * H]
    if q.gates:
        z, n = fake_quant(z, GATE_RZ)[0], fake_quant(n, GATE_N)[0]
    return (1 - z) * n + z * saved.hs[:, :-1]


# ----------------------------------------------------------------------------- int8 export
def export(spec, w_ih, w_hh, b_ih, b_hh, **extra):
    """The int8 form of a quantization-aware GRU layer (numpy arrays; weights (D, 3H, ...), or
    (3H, ...) for one direction, kept with the D axis):
    the weights as int8 levels with their float32 per-row scales, the biases, the grids of
    x and h and the gate flag; `extra` arrays are kept as they are (the layers around it)."""
    if not isinstance(spec, QuantSpec) or spec.x_qparams is None or spec.h_qparams is None:
        raise ValueError("the export needs a QuantSpec with x_qparams and h_qparams")
    for name, (s, zp, lo, hi) in (("x_qparams", spec.x_qparams), ("h_qparams", spec.h_qparams)):
        if lo < -128 or hi > 127:
            raise ValueError(f"{name}: levels [{lo}, {hi}] do not fit int8")
    out = {}
    for name, w in (("w_ih", w_ih), ("w_hh", w_hh)):
        w = np.asarray(w)
        w = w[None] if w.ndim == 2 else w            # (the D axis of a one-direction layer)
        s = row_scales(w, spec.weight_bits)
        wq = quant_rows(w, spec.weight_bits)[0]
        out[name + "_int8"] = np.rint(wq / s[..., None].astype(w.dtype)).astype(np.int8)
        out[name + "_scale"] = s
    b_ih, b_hh = (np.asarray(b, np.float32) for b in (b_ih, b_hh))
    out.update(b_ih=b_ih[None] if b_ih.ndim == 1 else b_ih,
               b_hh=b_hh[None] if b_hh.ndim == 1 else b_hh,
               x_qparams=np.array(spec.x_qparams, np.float64),
               h_qparams=np.array(spec.h_qparams, np.float64),
               gates=np.array(spec.gates), weight_bits=np.array(spec.weight_bits))
    out.update({k: np.asarray(v) for k, v in extra.items()})
    return out


def _levels(v, qparams):
    """round(v / s) + zp clamped to [qmin, qmax], as int32."""
    s, zp, lo, hi = qparams
    q = np.rint(v * np.float64(inverse(s))) + zp
    return np.clip(q, lo, hi).astype(np.int32)


def _int8_product(w8, v8, zp):
    """W (rows, K) int8 times (v - zp) for v (N, K) int8 levels: int32 accumulation of int8
    operands, the zero point's term subtracted once per row."""
    acc = v8.astype(np.int32) @ w8.T.astype(np.int32)
    return acc - np.int32(zp) * w8.astype(np.int32).sum(axis=1)


def integer_gru(exported, x):
    """The GRU layer of `exported` on x (T, B, I) with int8 operands and int32 accumulation:
    x and every state as int8 levels of their grids, each product rescaled to float by
    (row scale x input scale), the gates' sigmoid and tanh in float (on their fixed grids
    when the export says so), the new state requantized to its grid. Returns the last
    states (D, B, H) as float (from their levels), and the levels (T, D, B, H)."""
    e = exported
    xq, hq = tuple(e["x_qparams"]), tuple(e["h_qparams"])
    xq = (float(xq[0]),) + tuple(int(v) for v in xq[1:])
    hq = (float(hq[0]),) + tuple(int(v) for v in hq[1:])
    wi8, wh8 = e["w_ih_int8"], e["w_hh_int8"]
    si, sh = e["w_ih_scale"].astype(np.float64), e["w_hh_scale"].astype(np.float64)
    gates = bool(e["gates"])
    D, H3, I = wi8.shape
    H = H3 // 3
    T, B, _ = x.shape
    sx, sh_ = np.float64(np.float32(xq[0])), np.float64(np.float32(hq[0]))
    x8 = _levels(np.asarray(x, np.float64), xq)
    last = np.empty((D, B, H))
    levels = np.empty((T, D, B, H), np.int32)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    gq = lambda v, qp: fake_quant(v, qp)[0] if gates else v  # noqa: E731
    for d in range(D):
        h8 = np.full((B, H), hq[1], np.int32)            # h0 = 0: the zero point
        for s in range(T):
            t = s if d == 0 else T - 1 - s
            gi = _int8_product(wi8[d], x8[t], xq[1]) * (si[d] * sx) + e["b_ih"][d]
            gh = _int8_product(wh8[d], h8, hq[1]) * (sh[d] * sh_) + e["b_hh"][d]
            r = gq(sig(gi[:, :H] + gh[:, :H]), GATE_RZ)
            z = gq(sig(gi[:, H:2 * H] + gh[:, H:2 * H]), GATE_RZ)
            n = gq(np.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:]), GATE_N)
            h = (h8 - hq[1]) * sh_
            h8 = _levels((1 - z) * n + z * h, hq)
            levels[t, d] = h8
        last[d] = (h8 - hq[1]) * sh_
    return last, levels
