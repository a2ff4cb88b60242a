"""float16 and bfloat16 data on the GPU, by the numpy path's rule (cugru.oracle): the pass
computes in float32 from the given values (widening them is exact), keeps its history in
float32, and rounds each result once to the data's dtype, the weight gradients after their
sum over every step and row. So a half-precision call gives, bit for bit, the float32 call
on the same values with its results rounded once, on whichever plan runs it.

What it costs beside the float32 pass: in each pass one launch that widens its inputs into
one float32 allocation (the backward pass widens x and the weights again: the history keeps
them as given) and one that rounds its results into one allocation of the data's dtype
(gru_cast.cu; up to CAST_ARRAYS arrays a launch), and the float32 copies for the length of
the call.
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
CAST_MAX_BLOCKS = 1024
#: each array's place in a conversion's one allocation starts on this many bytes (the
#: alignment CuPy gives its own arrays; the kernels' 16-byte loads need at least 16)
CAST_ALIGN = 256
#: gru_cast.cu's parameters, in order (checked against the CUDA declaration)
CAST_PARAMS = tuple(f"{k}{i}" for k in ("in", "out", "n") for i in range(cat.CAST_ARRAYS))


def _format(dtype):
    name = np.dtype(dtype).name
    if name not in cat.HALF_FORMATS:
        raise TypeError(f"cugru's GPU conversions take {cat.HALF_FORMATS}, got {name}")
    return name


def convert(kernel_name, arrays, dtype):
    """Each of `arrays` (C-contiguous cupy arrays, or None) converted to `dtype` by the
    gru_cast.cu kernel `kernel_name`: new arrays (None stays None), views of one
    allocation, each on a CAST_ALIGN boundary; up to CAST_ARRAYS arrays per launch."""
    it = np.dtype(dtype).itemsize
    step = CAST_ALIGN // it
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        if a is not None:
            total += -(-a.size // step) * step
    flat = dev.outputs(dtype, (max(total, 1),))[0]
    outs = [None if a is None else flat[o:o + a.size].reshape(a.shape)
            for a, o in zip(arrays, offsets)]
    kern = dev.kernel("gru_cast.cu", kernel_name, CAST_PARAMS)
    n = cat.CAST_ARRAYS
    pairs = [(a, b) for a, b in zip(arrays, outs) if a is not None and a.size]
    for first in range(0, len(pairs), n):
        part = pairs[first:first + n]
        part += [(None, None)] * (n - len(part))
        most = max(0 if a is None else a.size for a, _ in part)
        kern.launch_args((min(-(-most // CAST_THREADS), CAST_MAX_BLOCKS),), (CAST_THREADS,),
                         [a for a, _ in part] + [b for _, b in part]
                         + [0 if a is None else a.size for a, _ in part])
    return outs


def widen(*arrays):
    """float32 copies of float16 or bfloat16 cupy arrays (one dtype; None stays None)."""
    fmt = _format(next(a for a in arrays if a is not None).dtype)
    return convert(cat.widen(fmt), arrays, _F32)


def narrow(dtype, *arrays):
    """float32 cupy arrays rounded to `dtype` (float16 or bfloat16): to nearest, ties to
    even (None stays None)."""
    return convert(cat.narrow(_format(dtype)), arrays, np.dtype(dtype))


def forward(a, plan, math):
    """The forward pass of checked half-precision arguments `a` on `plan` (chosen for
    float32): (y, h_n, GruSaved or None). The history is float32; x and the weights are kept
    as given."""
    x, h0, w_ih, w_hh, b_ih, b_hh = widen(a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh)
    wide = a._replace(x=x, h0=h0, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    y, h_n, saved = _passes.forward(wide, plan, math)
    if saved is not None:
        saved = dataclasses.replace(saved, x=a.x, w_ih=a.w_ih, w_hh=a.w_hh)
    y, h_n = narrow(a.x.dtype, y, h_n)
    return y, h_n, saved


def backward(dy, dh_n, saved, plan, math):
    """The backward pass of a half-precision forward pass's `saved` on `plan`: dx, dh0 and
    the weight gradients, in the data's dtype."""
    dy32, dh_n32, x, w_ih, w_hh = widen(dy, dh_n, saved.x, saved.w_ih, saved.w_hh)
    wide = dataclasses.replace(saved, x=x, w_ih=w_ih, w_hh=w_hh)
    return tuple(narrow(saved.x.dtype, *_passes.backward(dy32, dh_n32, wide, plan, math)))
