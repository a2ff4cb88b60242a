"""float16 and bfloat16 data on the GPU, by the numpy path's rule (cugru.oracle): the pass
computes in float32 from the given values (widening them is exact), keeps its history in
float32, and rounds each result once to the data's dtype, the weight gradients after their
sum over every step and row. So a half-precision call gives, bit for bit, the float32 call
on the same values with its results rounded once, on whichever plan runs it.

What it costs beside the float32 pass: one widening launch per input (and, in the backward
pass, for x and the weights again, which the history keeps as given, not widened), one
rounding launch per result, and the float32 copies of the inputs for the length of the call.
The conversions are gru_cast.cu's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from . import _catalog as cat
from . import _device as dev
from . import _passes

_F32 = np.dtype(np.float32)
#: threads per block of the conversions, and the most blocks (they loop over the rest)
CAST_THREADS = 256
CAST_MAX_BLOCKS = 4096


def _format(dtype):
    name = np.dtype(dtype).name
    if name not in cat.HALF_FORMATS:
        raise TypeError(f"cugru's GPU conversions take {cat.HALF_FORMATS}, got {name}")
    return name


def _cast(name, src, dst):
    n = src.size
    if n:
        dev.kernel("gru_cast.cu", name).launch(
            (min(-(-n // CAST_THREADS), CAST_MAX_BLOCKS),), (CAST_THREADS,),
            {"in": src, "out": dst, "n": n})
    return dst


def widen(a):
    """A float32 copy of the float16 or bfloat16 cupy array `a` (C-contiguous); None stays
    None."""
    if a is None:
        return None
    return _cast(cat.widen(_format(a.dtype)), a, dev.outputs(_F32, a.shape)[0])


def narrow(a, dtype):
    """The float32 cupy array `a` (C-contiguous) rounded to `dtype` (float16 or bfloat16):
    to nearest, ties to even."""
    if a is None:
        return None
    return _cast(cat.narrow(_format(dtype)), a, dev.outputs(dtype, a.shape)[0])


def forward(a, plan, math):
    """The forward pass of checked half-precision arguments `a` on `plan` (chosen for
    float32): (y, h_n, GruSaved or None). The history is float32; x and the weights are kept
    as given."""
    dt = a.x.dtype
    wide = a._replace(x=widen(a.x), h0=widen(a.h0), w_ih=widen(a.w_ih), w_hh=widen(a.w_hh),
                      b_ih=widen(a.b_ih), b_hh=widen(a.b_hh))
    y, h_n, saved = _passes.forward(wide, plan, math)
    if saved is not None:
        saved = dataclasses.replace(saved, x=a.x, w_ih=a.w_ih, w_hh=a.w_hh)
    return narrow(y, dt), narrow(h_n, dt), saved


def backward(dy, dh_n, saved, plan, math):
    """The backward pass of a half-precision forward pass's `saved` on `plan`: dx, dh0 and
    the weight gradients, in the data's dtype."""
    dt = saved.x.dtype
    wide = dataclasses.replace(saved, x=widen(saved.x), w_ih=widen(saved.w_ih),
                               w_hh=widen(saved.w_hh))
    grads = _passes.backward(widen(dy), widen(dh_n), wide, plan, math)
    return tuple(narrow(g, dt) for g in grads)
