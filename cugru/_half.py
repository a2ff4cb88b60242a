"""float16 and bfloat16 data on the GPU, by the numpy path's rule (cugru.oracle): the pass
computes in float32 from the given values (widening them is exact), keeps its history in
float32, and rounds each result once to the data's dtype, the weight gradients after their
sum over every step and row. So a half-precision call gives, bit for bit, the float32 call
on the same values with its results rounded once, on whichever plan runs it.

What it costs beside the float32 pass: in each pass one launch that widens its inputs into
float32 arrays (the backward pass widens x and the weights again: the history keeps them as
given) and one that rounds its results into arrays of the data's dtype (gru_cast.cu; up to
CAST_ARRAYS arrays a launch), and the float32 copies for the length of the call. The host's
part is kept short (a half-precision call on a small shape waits on the host): the float32
copies are the pass's temporaries (dev.scratch: kept between calls on small shapes, one
allocation each otherwise), the rounded results new arrays (dev.outputs), and the launch's
values packed as addresses. An inference pass on a plan that `captures` goes further
(_inference): its widening and float32 pass replay one CUDA graph when a call repeats the
arrays (by address) of an earlier one: a benchmark, a loop that refills its input arrays, or
a batch that CuPy's pool gave an earlier batch's memory.
"""
from __future__ import annotations

import numpy as np

from cukernels.checks import contiguous

from . import _catalog as cat
from . import _device as dev
from . import _passes

_F32 = np.dtype(np.float32)
#: threads per block of the conversions, and the most blocks (they loop over the rest)
CAST_THREADS = 256
CAST_MAX_BLOCKS = 1024
#: gru_cast.cu's parameters, in order (checked against the CUDA declaration)
CAST_PARAMS = tuple(f"{k}{i}" for k in ("in", "out", "n") for i in range(cat.CAST_ARRAYS))


#: the conversions' format of each half-precision dtype (filled on first use)
_FORMATS: dict = {}


def _format(dtype):
    """The HALF_FORMATS name of `dtype` (a dtype, or a type such as numpy.float16: each
    kept under the key it came as)."""
    fmt = _FORMATS.get(dtype)
    if fmt is None:
        name = np.dtype(dtype).name
        if name not in cat.HALF_FORMATS:
            raise TypeError(f"cugru's GPU conversions take {cat.HALF_FORMATS}, got {name}")
        fmt = _FORMATS[dtype] = name
    return fmt


def convert(kernel_name, arrays, source, dtype, temporaries=None):
    """Each of `arrays` (C-contiguous cupy arrays of dtype `source`, or None) converted to
    `dtype` by the gru_cast.cu kernel `kernel_name`: new arrays (None stays None), or with
    `temporaries` (a name for dev.scratch) a pass's temporaries, kept for the next call on
    small shapes; up to CAST_ARRAYS arrays per launch."""
    for a in arrays:
        if a is not None and (a.dtype != source or not contiguous(a)):
            raise TypeError(f"cugru's conversions take C-contiguous {np.dtype(source).name} "
                            f"arrays, got a {'' if contiguous(a) else 'strided '}"
                            f"{a.dtype} array")
    shapes = [a.shape for a in arrays if a is not None]
    made = iter(dev.scratch(temporaries, dtype, *shapes) if temporaries
                else dev.outputs(dtype, *shapes))
    outs = [None if a is None else next(made) for a in arrays]
    _convert_into(kernel_name, arrays, outs)
    return outs


def _convert_into(kernel_name, arrays, outs):
    """The launches of gru_cast.cu's `kernel_name` that convert each of `arrays` into the
    array at its place in `outs` (checked arrays of the same shapes; None skipped), on the
    current stream."""
    kern = dev.kernel("gru_cast.cu", kernel_name, CAST_PARAMS)
    n = cat.CAST_ARRAYS
    pairs = [(a, b) for a, b in zip(arrays, outs) if a is not None and a.size]
    for first in range(0, len(pairs), n):
        part = pairs[first:first + n]
        pad = [0] * (n - len(part))
        most = max(a.size for a, _ in part)
        kern.launch_1d(min(-(-most // CAST_THREADS), CAST_MAX_BLOCKS), CAST_THREADS,
                       [a.data.ptr for a, _ in part] + pad + [b.data.ptr for _, b in part]
                       + pad + [a.size for a, _ in part] + pad)


def widen(*arrays, temporaries=None):
    """float32 copies of float16 or bfloat16 cupy arrays (one dtype; None stays None); a
    pass's temporaries where `temporaries` names them (convert)."""
    source = next(a for a in arrays if a is not None).dtype
    return convert(cat.widen(_format(source)), arrays, source, _F32, temporaries)


def narrow(dtype, *arrays):
    """float32 cupy arrays rounded to `dtype` (float16 or bfloat16): to nearest, ties to
    even (None stays None)."""
    return convert(cat.narrow(_format(dtype)), arrays, _F32, np.dtype(dtype))


def forward(a, plan, math):
    """The forward pass of checked half-precision arguments `a` on `plan` (chosen for
    float32): (y, h_n, GruSaved or None). The history is float32; x and the weights are kept
    as given."""
    if not a.training and _passes.replays(
            a, plan, math, 4, 2 * sum(v.nbytes for v in (a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh)
                                if v is not None)):
        return _inference(a, plan, math)
    # (the float32 copies are the pass's temporaries: neither returned nor kept in `saved`)
    x, h0, w_ih, w_hh, b_ih, b_hh = widen(a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh,
                                          temporaries="half forward")
    wide = a._replace(x=x, h0=h0, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    y, h_n, saved = _passes.forward(wide, plan, math)
    if saved is not None:
        saved = saved.with_inputs(a.x, a.w_ih, a.w_hh)
    y, h_n = narrow(a.x.dtype, y, h_n)
    return y, h_n, saved


def _inference(a, plan, math):
    """An inference pass through _passes.replayed_inference: the widening of the inputs into
    float32 temporaries kept between calls comes first in it, so that a repeated call on the
    same arrays costs the host one graph launch; then one launch rounds y and h_n into new
    arrays. A small call waits on the host, and this is most of what the host did for it."""
    given = (a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh)
    made = iter(dev.scratch("half forward", _F32, *(v.shape for v in given if v is not None)))
    wide = [None if v is None else next(made) for v in given]
    x, h0, w_ih, w_hh, b_ih, b_hh = wide
    fmt = _format(a.x.dtype)
    name = cat.widen(fmt)
    p = _passes.replayed_inference(
        a._replace(x=x, h0=h0, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh), plan, math,
        ("half inference", fmt), lambda: _convert_into(name, given, wide), given)
    # (narrow's checks left out: y and h_n are the pass's own)
    y, h_n = dev.outputs(a.x.dtype, p.y.shape, p.h_n.shape)
    _convert_into(cat.narrow(fmt), (p.y, p.h_n), (y, h_n))
    return y, h_n, None


def backward(dy, dh_n, saved, plan, math):
    """The backward pass of a half-precision forward pass's `saved` on `plan`: dx, dh0 and
    the weight gradients, in the data's dtype."""
    dy32, dh_n32, x, w_ih, w_hh = widen(dy, dh_n, saved.x, saved.w_ih, saved.w_hh,
                                        temporaries="half backward")
    wide = saved.with_inputs(x, w_ih, w_hh)
    return tuple(narrow(saved.x.dtype, *_passes.backward(dy32, dh_n32, wide, plan, math)))
