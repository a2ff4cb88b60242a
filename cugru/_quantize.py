"""The GPU side of a quantization-aware call (cugru.QuantSpec): one launch before the
forward pass for its quantized operands (the weights per row, x and h0), the recurrent
kernels' quantization arguments, and one launch after the backward pass for the
straight-through estimator's masks of dx and dh0 (gru_quant.cu). The cell's quantizers run
inside the recurrent kernels (their QAT instances); cugru/quant.py is the numpy side and
the definition.
"""
from __future__ import annotations

import functools

from . import _catalog as cat
from . import _device as dev
from .quant import kernel_args, shifted_grid

#: blocks of the elementwise quantizers' grid-stride loops (at most)
FQ_MAX_BLOCKS = 1024
_GRID_KEYS = ("scale", "inv", "lo", "hi")


def _grid(prefix, qparams, keys=_GRID_KEYS):
    """A grid's kernel arguments: scale, 1/scale and the bounds shifted by the zero point."""
    grid = (1.0, 1.0, 0.0, 0.0) if qparams is None else shifted_grid(qparams)
    values = dict(zip(_GRID_KEYS, grid))
    return {f"{prefix}_{k}": values[k] for k in keys}


def _blocks(n):
    return min(-(-n // cat.QUANT_THREADS), FQ_MAX_BLOCKS) if n else 0


@functools.lru_cache(maxsize=256)
def _operand_scalars(quant, w_ih_shape, w_hh_shape, nx, nh):
    """What the operands' launch takes besides the arrays, worked out once per spec and
    shape (the host's work per call is the point on small shapes): the grid and the
    scalar arguments."""
    rows_ih, I = w_ih_shape[0] * w_ih_shape[1], w_ih_shape[2]
    rows_hh, H = w_hh_shape[0] * w_hh_shape[1], w_hh_shape[2]
    return (rows_ih + rows_hh + _blocks(nx + nh),), {
        "rows_ih": rows_ih, "I": I, "rows_hh": rows_hh, "H": H, "qmax": quant.weight_qmax,
        "nx": nx, **_grid("x", quant.x_qparams), "nh": nh, **_grid("h", quant.h_qparams)}


def operands(a):
    """The forward arguments `a` with the quantized operands of a.quant in place of x, h0,
    w_ih and w_hh (the weights once per call), made by one launch."""
    q = a.quant
    dt = a.x.dtype
    with_x, with_h0 = q.x_qparams is not None, a.h0 is not None and q.h_qparams is not None
    shapes = (a.w_ih.shape, a.w_hh.shape) + ((a.x.shape,) if with_x else ()) + \
        ((a.h0.shape,) if with_h0 else ())
    wq_ih, wq_hh, *rest = dev.outputs(dt, *shapes)
    xq = rest.pop(0) if with_x else None
    hq = rest.pop(0) if with_h0 else None
    grid, scalars = _operand_scalars(q, a.w_ih.shape, a.w_hh.shape,
                                     a.x.size if with_x else 0, a.h0.size if with_h0 else 0)
    dev.kernel("gru_quant.cu", cat.quant_operands(cat.CTYPE[dt.itemsize])).launch(
        grid, (cat.QUANT_THREADS,),
        {"w_ih": a.w_ih, "wq_ih": wq_ih, "w_hh": a.w_hh, "wq_hh": wq_hh, "x": a.x, "xq": xq,
         "h0": a.h0, "h0q": hq, **scalars})
    return a._replace(x=a.x if xq is None else xq, h0=a.h0 if hq is None else hq,
                      w_ih=wq_ih, w_hh=wq_hh)


@functools.lru_cache(maxsize=256)
def _mask_scalars(quant, nx, nh):
    keys = ("inv", "lo", "hi")
    return (_blocks(nx + nh),), {"nx": nx, **_grid("x", quant.x_qparams, keys), "nh": nh,
                                 **_grid("h", quant.h_qparams, keys)}


def grad_masks(saved, dx, dh0):
    """The straight-through estimator at x and h0: dx and dh0 zeroed in place where their
    quantizers clipped (one launch; none where neither is quantized)."""
    q = saved.quant
    nx = dx.size if q.x_qparams is not None else 0
    nh = dh0.size if (q.h_qparams is not None and saved.h0_real is not None) else 0
    if nx + nh == 0:
        return
    grid, scalars = _mask_scalars(q, nx, nh)
    dev.kernel("gru_quant.cu", cat.quant_masks(cat.CTYPE[dx.dtype.itemsize])).launch(
        grid, (cat.QUANT_THREADS,),
        {"x": saved.x_real, "dx": dx, "h0": saved.h0_real, "dh0": dh0, **scalars})


__all__ = ["operands", "grad_masks", "kernel_args"]
