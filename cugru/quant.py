"""Quantization-aware training of the GRU: ``QuantSpec`` and the fake quantizer.

    spec = cugru.QuantSpec(weight_bits=8, x_qparams=(0.05, 0, -128, 127),
                           h_qparams=(1 / 128, 0, -128, 127), gates=True)
    y, h_n, saved = cugru.gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, quant=spec)
    grads = cugru.gru_backward(dy, None, saved)        # the straight-through estimator

The fake quantizer, torch.fake_quantize_per_tensor_affine's formula (and per channel):

    fq(v; s, zp, qmin, qmax) = (clamp(round_half_even(v * (1/s)) + zp, qmin, qmax) - zp) * s

Every scale is a float32 value (torch keeps scales in float32) and 1/s is worked out in
float32; the products and the rounding are in the compute dtype. So float32 results are
torch's to the bit, and float64 results are torch's float64 kernel's.

What is quantized, with ``quant=spec`` (``quant=None`` is the plain GRU, bit for bit):
- the weights W_ih and W_hh, per output row (each of the 3H rows of each direction), on
  a symmetric narrow grid of ``weight_bits`` bits: qmax = 2^(bits-1) - 1, qmin = -qmax,
  zp = 0, s_row = float32(max(max|W_row| / qmax, 2^-23)), from the weights at every call,
  so that no weight is clipped; the biases stay real;
- x before the input projection (``x_qparams``);
- the state (``h_qparams``): h0 on entry and every new state, which is what the next step
  uses and what y and h_n hold;
- with ``gates``, r and z after the sigmoid on (1/256, 0, 0, 255) and n after the tanh on
  (2/256, 128, 0, 255).

Backward is the straight-through estimator with clipping: a gradient passes a quantizer
where round(v/s) + zp fell inside [qmin, qmax] and is 0 where it was clipped. The weight
gradients are those of the quantized weights (nothing of a weight is clipped).
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass

import numpy as np

#: weight grids: bits -> qmax (symmetric, narrow: qmin = -qmax)
WEIGHT_BITS = (4, 8)
#: the smallest per-row weight scale (an all-zero row still has a scale)
MIN_WEIGHT_SCALE = 2.0 ** -23
#: the fixed grids of the gates (torch.ao's for a sigmoid's and a tanh's outputs)
GATE_RZ = (1 / 256, 0, 0, 255)
GATE_N = (2 / 256, 128, 0, 255)
#: integer levels stay exact in float32 within this bound
_LEVEL_LIMIT = 2 ** 24
#: the smallest scale (float32's smallest normal number: 1/scale stays finite)
_MIN_SCALE = 2.0 ** -126


def _qparams(field, v):
    """A checked (scale, zero_point, qmin, qmax), the scale rounded to float32."""
    if v is None:
        return None
    if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or len(v) != 4:
        raise TypeError(f"{field} must be (scale, zero_point, qmin, qmax) or None, got {v!r}")
    scale, zp, lo, hi = v
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{field}: scale must be a real number, got {scale!r}")
    s = float(scale)
    s32 = float(np.float32(s)) if math.isfinite(s) and abs(s) < 3.4e38 else math.inf
    if not (math.isfinite(s) and s > 0 and _MIN_SCALE <= s32 < math.inf):
        raise ValueError(f"{field}: scale must be finite and at least 2**-126 (float32's "
                         f"smallest normal number, so that 1/scale is finite), got {scale!r}")
    out = [s32]
    for name, n in (("zero_point", zp), ("qmin", lo), ("qmax", hi)):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{field}: {name} must be an integer, got {n!r}")
        if not -_LEVEL_LIMIT <= int(n) <= _LEVEL_LIMIT:
            raise ValueError(f"{field}: {name} = {n} is outside [-2**24, 2**24]")
        out.append(int(n))
    _, zp, lo, hi = out
    if lo >= hi:
        raise ValueError(f"{field}: qmin ({lo}) must be < qmax ({hi})")
    if not lo <= zp <= hi:
        raise ValueError(f"{field}: zero_point ({zp}) must lie in [qmin, qmax] = [{lo}, {hi}]")
    if max(zp - lo, hi - zp) > _LEVEL_LIMIT:
        raise ValueError(f"{field}: qmin - zero_point and qmax - zero_point must lie within "
                         f"2**24 (the levels are exact in float32), got {lo - zp} and {hi - zp}")
    if s32 * max(zp - lo, hi - zp) > float(np.finfo(np.float32).max):
        raise ValueError(f"{field}: scale {s32:g} times the levels' span overflows float32")
    return tuple(out)


@dataclass(frozen=True)
class QuantSpec:
    """What a quantization-aware GRU call fake-quantizes (see the module's doc).

    weight_bits  4 or 8: W_ih and W_hh per output row, symmetric narrow range
    x_qparams    (scale, zero_point, qmin, qmax) of x, or None (x stays real)
    h_qparams    (scale, zero_point, qmin, qmax) of the state, or None
    gates        fake-quantize r, z (after the sigmoid) and n (after the tanh)

    Scales are kept as float32 values (torch's observers give float32 scales).
    """
    weight_bits: int = 8
    x_qparams: tuple | None = None
    h_qparams: tuple | None = None
    gates: bool = False

    def __post_init__(self):
        bits = self.weight_bits
        if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) \
                or int(bits) not in WEIGHT_BITS:
            raise ValueError(f"weight_bits must be one of {WEIGHT_BITS}, got {bits!r}")
        object.__setattr__(self, "weight_bits", int(bits))
        object.__setattr__(self, "x_qparams", _qparams("x_qparams", self.x_qparams))
        object.__setattr__(self, "h_qparams", _qparams("h_qparams", self.h_qparams))
        if not isinstance(self.gates, (bool, np.bool_)):
            raise TypeError(f"gates must be True or False, got {self.gates!r}")
        object.__setattr__(self, "gates", bool(self.gates))

    @property
    def weight_qmax(self) -> int:
        return 2 ** (self.weight_bits - 1) - 1


def check_quant(quant):
    """quant: a QuantSpec or None."""
    if quant is not None and not isinstance(quant, QuantSpec):
        raise TypeError(f"quant must be a cugru.QuantSpec or None, got {type(quant).__name__}")
    return quant


def inverse(scale) -> np.float32:
    """1/s as the quantizer uses it: in float32, from the float32 scale."""
    return np.float32(1) / np.float32(scale)


# ------------------------------------------------------------------- the numpy quantizer
def _array_module(v):
    if isinstance(v, np.ndarray):
        return np
    from cukernels import runtime
    return runtime.cupy_module()


def fake_quant(v, qparams):
    """(fq(v), inside): the fake-quantized array in v's dtype, and where nothing was
    clipped (the straight-through estimator's mask). numpy or cupy arrays."""
    xp = _array_module(v)
    dt = v.dtype.type
    s, zp, lo, hi = qparams
    q = xp.rint(v * dt(inverse(s))) + dt(zp)
    inside = (q >= lo) & (q <= hi)
    return (xp.clip(q, dt(lo), dt(hi)) - dt(zp)) * dt(np.float32(s)), inside


def shifted_grid(qparams):
    """(scale, 1/scale, qmin - zp, qmax - zp): a grid as the kernels take it. On the bounds
    shifted by the zero point they compute fq's values with one parameter fewer
    (cugru/kernels/gru_common.cuh); QuantSpec keeps the shifted bounds exact in float32."""
    s, zp, lo, hi = qparams
    return s, float(inverse(s)), float(lo - zp), float(hi - zp)


def row_scales(w, bits):
    """The per-row scales of the weights w (..., rows, cols), float32."""
    qmax = 2 ** (bits - 1) - 1
    dt = w.dtype.type
    amax = np.abs(w).max(axis=-1)
    return np.maximum(amax / dt(qmax), dt(MIN_WEIGHT_SCALE)).astype(np.float32)


def quant_rows(w, bits):
    """(the fake-quantized weights, their per-row float32 scales) of w (..., rows, cols)."""
    dt = w.dtype.type
    qmax = 2 ** (bits - 1) - 1
    s = row_scales(w, bits)
    inv = (np.float32(1) / s).astype(w.dtype)[..., None]
    q = np.clip(np.rint(w * inv), dt(-qmax), dt(qmax))
    return q * s.astype(w.dtype)[..., None], s


@functools.lru_cache(maxsize=256)
def kernel_args(quant) -> dict:
    """The recurrent kernels' quantization parameters: the state's grid (q_scale, q_inv and
    the bounds shifted by the zero point, q_lo = qmin - zp and q_hi = qmax - zp, on which
    the kernels compute the same bits: cugru/kernels/gru_common.cuh) and q_flags (1: the
    state is quantized, 2: the gates are). Cached per spec: callers must not change it."""
    hq = quant.h_qparams if quant is not None else None
    flags = 0
    if quant is not None:
        flags = (1 if hq is not None else 0) | (2 if quant.gates else 0)
    grid = (1.0, 1.0, 0.0, 0.0) if hq is None else shifted_grid(hq)
    return dict(zip(QUANT_PARAMS, grid + (flags,)))


#: the recurrent kernels' quantization parameters, in the order they declare them
QUANT_PARAMS = ("q_scale", "q_inv", "q_lo", "q_hi", "q_flags")


NO_QUANT_ARGS = kernel_args(None)
