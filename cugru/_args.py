"""The GRU's argument checks, shared by both backends: each public call validates once here.

Shapes (D = 2 when bidirectional, else 1):
    x (T, B, I); h0 (D, B, H) or None; w_ih (D, 3H, I); w_hh (D, 3H, H); b_ih, b_hh (D, 3H).
For D = 1 the weights may also come without the direction axis: (3H, I), (3H, H), (3H,);
the gradients then come back in that shape too.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from cukernels import checks, runtime

from . import _device
from .quant import check_quant
from .saved import GruSaved

_INT_MAX = 2**31 - 1


def _half_dtypes():
    """float16, and bfloat16 where ml_dtypes (the package numpy and CuPy take it from) is
    installed."""
    out = [np.dtype(np.float16)]
    try:
        import ml_dtypes
        out.append(np.dtype(ml_dtypes.bfloat16))
    except ImportError:
        pass
    return tuple(out)


#: the half-precision data dtypes: on numpy the oracle computes them in float32, on the GPU
#: the float32 kernels do (cugru/_half.py), by one rule: the float32 pass on the given
#: values, each result rounded once
HALF_DTYPES = _half_dtypes()
#: every dtype the numpy path takes
NUMPY_DTYPES = checks.FLOAT_DTYPES + HALF_DTYPES


def compute_dtype(dtype):
    """The dtype a pass computes in (and its history holds) for data of `dtype`: float32
    for float16 and bfloat16 data, else the data's own."""
    return np.dtype(np.float32) if dtype in HALF_DTYPES else np.dtype(dtype)


def _data_dtype(x, xp, quant):
    """x's dtype, checked: float32, float64, float16 or bfloat16 (the last two not with
    quant)."""
    dtype = checks.check_array("x", x, ndim=(3,), floats=NUMPY_DTYPES)
    if quant is not None and dtype in HALF_DTYPES:
        raise TypeError(f"quant= takes float32 or float64 data, x is {dtype}")
    return dtype
#: the GPU paths: "auto" (the fastest plan for the shape), "fast" (a persistent plan, or an
#: error), "steps" (one launch per step), "small" (a whole pass in one launch, small shapes
#: only, or an error), "resident" (each recurrence, forward and backward, in one launch over
#: many SMs; float32 strict, or an error); numpy arrays run the oracle
#: whatever the path
PATHS = ("auto", "fast", "steps", "small", "resident")


class ForwardArgs(NamedTuple):
    """The checked arguments of a forward pass; the weights with their direction axis."""
    xp: object
    x: object
    h0: object
    w_ih: object
    w_hh: object
    b_ih: object
    b_hh: object
    dims: tuple            # (T, B, I, H, D)
    training: bool
    squeeze: bool          # the weights came without the direction axis
    quant: object = None   # a cugru.QuantSpec, or None
    lengths: object = None  # B ints in 1..T (int32 on the GPU), or None: every step runs


def check_path(path):
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return path


#: math= of gru_forward and gru_backward: "strict" (every product in the data's precision,
#: float32 for half-precision data) or "tf32" (float32, float16 and bfloat16 data: cuBLAS'
#: products may round their float32 inputs to TF32, 10 bits of significand, and sum in
#: float32; half-precision values are exact in TF32, the state is rounded)
MATHS = ("strict", "tf32")
_F32_DTYPE = np.dtype(np.float32)


def default_math(dtype) -> str:
    """math=None's meaning for data of `dtype`: "tf32" for float16 and bfloat16 (their
    values are exact in TF32; cuDNN multiplies them on tensor cores too), else "strict"."""
    return "tf32" if dtype in HALF_DTYPES else "strict"


def check_math(math, dtype):
    """`math` checked for data of `dtype` (the error names math=); None gives
    default_math(dtype)."""
    if math is None:
        return default_math(dtype)
    if math == "strict":
        return math
    if math not in MATHS:
        raise ValueError(f"math must be one of {MATHS}, got {math!r}")
    if dtype != _F32_DTYPE and dtype not in HALF_DTYPES:
        raise TypeError(f"math='tf32' takes float32, float16 or bfloat16 data, x is "
                        f"{np.dtype(dtype).name} (float64 data computes with math='strict')")
    return math


def _weight(name, a, D, rows, cols, cols_of):
    """A (D, rows[, cols]) weight, or (rows[, cols]) for D = 1; returned with the D axis."""
    base = (rows,) if cols is None else (rows, cols)
    if a.ndim == len(base):
        if D != 1:
            raise ValueError(f"{name} has shape {tuple(a.shape)} without a direction axis, but "
                             f"bidirectional=True needs shape {(2,) + base}")
        checks.check_array(name, a, ndim=None, shape=base, floats=NUMPY_DTYPES,
                           shape_of=f"3H = {rows}" + (f" and {cols_of} = {cols}" if cols else ""))
        return a.reshape((1,) + base), True
    if a.ndim == len(base) + 1 and a.shape[0] != D:
        raise ValueError(f"{name} has {a.shape[0]} direction(s) (shape {tuple(a.shape)}), but "
                         f"bidirectional={D == 2} needs {D}")
    checks.check_array(name, a, ndim=(len(base) + 1,), shape=(D,) + base, floats=NUMPY_DTYPES,
                       shape_of=f"3H = {rows}" + (f" and {cols_of} = {cols}" if cols else ""))
    return a, False


def check_lengths(lengths, T, B, xp):
    """The sequences' lengths, checked (errors name `lengths`): a numpy or cupy array, list
    or tuple of B integers in 1..T. Returns a copy (numpy int64 for numpy calls, a cupy int32
    array for GPU calls; a cupy one is read back to the host once to be checked), or None
    where every length is T: then the call is the same as without lengths."""
    if lengths is None:
        return None
    if xp is not np and _device.capturing(xp):
        raise ValueError("lengths cannot be taken while the stream is captured into a CUDA "
                         "graph (they are checked on the host, and uploaded); capture calls "
                         "without lengths")
    nd = checks._cupy_ndarray()
    on_gpu = nd is not None and isinstance(lengths, nd)
    if on_gpu and xp is np:
        raise TypeError("lengths is a cupy array but x is a numpy array; pass lengths as a "
                        "numpy array, list or tuple")
    if isinstance(lengths, (list, tuple)):
        try:
            host = np.asarray(lengths)
        except ValueError:          # (ragged nesting)
            host = None
        if host is None or host.dtype == object or host.ndim != 1:
            raise TypeError("lengths must be a sequence of B integers")
    elif on_gpu:
        host = lengths.get()
    elif isinstance(lengths, np.ndarray):
        host = lengths
    else:
        raise TypeError(f"lengths must be a numpy or cupy array, list or tuple of B integers, "
                        f"got {type(lengths).__name__}")
    if host.dtype.kind not in "iu":
        raise TypeError(f"lengths must hold integers, got dtype {host.dtype}")
    if host.shape != (B,):
        raise ValueError(f"lengths must have shape (B,) = ({B},), one length per sequence of "
                         f"x, got shape {tuple(host.shape)}")
    bad = np.flatnonzero((host < 1) | (host > T))
    if bad.size:
        raise ValueError(f"lengths must lie in 1..T = 1..{T} (the steps of x); lengths[{bad[0]}]"
                         f" = {host[bad[0]]}")
    if (host == T).all():
        return None
    if xp is np:
        return host.astype(np.int64)
    return xp.asarray(host.astype(np.int32))


_F32, _F64 = checks.FLOAT_DTYPES
_PLAIN_DTYPES = (_F32, _F64) + HALF_DTYPES


def _plain_gpu_forward(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training):
    """The common GPU call's arguments with the least host work, or None for any other call
    (the general checks below then decide, errors included): C-contiguous cupy arrays of one
    dtype (float32, float64, float16 or bfloat16), the weights with their direction axis,
    plain True/False flags, no quantization, no lengths."""
    nd = checks.gpu_flat_type()
    if nd is None or type(x) is not nd or not x._c_contiguous:
        return None
    if (bidirectional is not True and bidirectional is not False) or \
            (training is not True and training is not False):
        return None
    dt = x.dtype
    if dt not in _PLAIN_DTYPES or len(x.shape) != 3:
        return None
    D = 2 if bidirectional else 1
    T, B, I = x.shape
    shape = w_hh.shape
    if type(w_hh) is not nd or len(shape) != 3:
        return None
    H = shape[2]
    G = 3 * H
    if not (T and B and I and H and shape[0] == D and shape[1] == G and w_hh.dtype is dt
            and w_hh._c_contiguous and type(w_ih) is nd and w_ih.shape == (D, G, I)
            and w_ih.dtype is dt and w_ih._c_contiguous and type(b_ih) is nd
            and b_ih.shape == (D, G) and b_ih.dtype is dt and b_ih._c_contiguous
            and type(b_hh) is nd and b_hh.shape == (D, G) and b_hh.dtype is dt
            and b_hh._c_contiguous and T * B <= _INT_MAX and D * G <= _INT_MAX
            and I <= _INT_MAX):
        return None
    if h0 is not None and not (type(h0) is nd and h0.shape == (D, B, H) and h0.dtype is dt
                               and h0._c_contiguous):
        return None
    return ForwardArgs(runtime.cupy_module(), x, h0, w_ih, w_hh, b_ih, b_hh, (T, B, I, H, D),
                       training, False)


def forward_args(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training,
                 quant=None, lengths=None) -> ForwardArgs:
    """Validate the forward arguments (errors name the argument)."""
    if quant is None and lengths is None:
        a = _plain_gpu_forward(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training)
        if a is not None:
            return a
    check_quant(quant)
    bidirectional = checks.flag("bidirectional", bidirectional)
    training = checks.flag("training", training)
    xp = checks.backend(x=x, h0=h0, w_ih=w_ih, w_hh=w_hh, b_ih=b_ih, b_hh=b_hh)
    D = 2 if bidirectional else 1
    if x.ndim != 3:
        raise ValueError(f"x must have shape (T, B, I), got shape {tuple(x.shape)}")
    T, B, I = x.shape
    for n, size in (("T", T), ("B", B), ("I", I)):
        if size == 0:
            raise ValueError(f"x has shape {tuple(x.shape)}: {n} = 0; T, B and I must be > 0")
    dtype = _data_dtype(x, xp, quant)
    for name, a in (("w_hh", w_hh), ("w_ih", w_ih), ("b_ih", b_ih), ("b_hh", b_hh)):
        if a.dtype != dtype:
            raise TypeError(f"{name} has dtype {a.dtype}, expected {dtype} (the dtype of x)")
    if w_hh.ndim not in (2, 3):
        raise ValueError(f"w_hh must have shape (D, 3H, H) or (3H, H), got {tuple(w_hh.shape)}")
    H = w_hh.shape[-1]
    if H == 0:
        raise ValueError(f"w_hh has shape {tuple(w_hh.shape)}: hidden size H = 0; H must be > 0")
    if w_hh.shape[-2] != 3 * H:
        raise ValueError(f"w_hh has shape {tuple(w_hh.shape)}: its rows must be 3H = {3 * H} "
                         f"(gates r | z | n) for H = {H}, the last dimension")
    G = 3 * H
    contiguous = checks.contiguous
    if (w_hh.shape == (D, G, H) and w_ih.shape == (D, G, I) and b_ih.shape == (D, G)
            and b_hh.shape == (D, G) and contiguous(w_hh) and contiguous(w_ih)
            and contiguous(b_ih) and contiguous(b_hh)):
        w_hh3, w_ih3, b_ih2, b_hh2, squeeze = w_hh, w_ih, b_ih, b_hh, False   # (all good)
    else:
        w_hh3, squeeze = _weight("w_hh", w_hh, D, G, H, "H")
        w_ih3, _ = _weight("w_ih", w_ih, D, G, I, "I (from x)")
        b_ih2, _ = _weight("b_ih", b_ih, D, G, None, None)
        b_hh2, _ = _weight("b_hh", b_hh, D, G, None, None)
    if h0 is not None and not (h0.dtype == dtype and h0.shape == (D, B, H)
                               and contiguous(h0)):
        checks.check_array("h0", h0, ndim=(3,), dtype=dtype, dtype_of="x", shape=(D, B, H),
                           shape_of="(D, B, H) from bidirectional, x and w_hh",
                           floats=NUMPY_DTYPES)
    if max(T * B, G * D, I) > _INT_MAX:
        raise ValueError("x or the weights have a dimension above 2**31 - 1 (T*B, D*3H or I)")
    if lengths is not None:
        lengths = check_lengths(lengths, T, B, xp)
    return ForwardArgs(xp, x, h0, w_ih3, w_hh3, b_ih2, b_hh2, (T, B, I, H, D), training, squeeze,
                       quant, lengths)


def backward_args(dy, dh_n, saved):
    """Validate the backward arguments: (xp, (T, B, I, H, D))."""
    nd = checks.gpu_flat_type()
    if nd is not None and type(dy) is nd and type(saved) is GruSaved and type(saved.x) is nd:
        # (the common GPU call, with the least host work; any other goes on to the checks)
        T, B, I, H, D = dims = saved.dims
        dt = saved.x.dtype
        if dy.dtype is dt and dy.shape == (T, B, D * H) and dy._c_contiguous and (
                dh_n is None or (type(dh_n) is nd and dh_n.dtype is dt
                                 and dh_n.shape == (D, B, H) and dh_n._c_contiguous)):
            return runtime.cupy_module(), dims
    if not isinstance(saved, GruSaved):
        raise TypeError("saved must be the third result of gru_forward(..., training=True), got "
                        + ("None (was the forward pass run with training=False?)" if saved is None
                           else type(saved).__name__))
    T, B, I, H, D = dims = saved.dims
    xp = checks.backend(x=saved.x, dy=dy, dh_n=dh_n)
    dtype = saved.x.dtype
    checks.check_array("dy", dy, ndim=(3,), dtype=dtype, dtype_of="the forward input x",
                       shape=(T, B, D * H), shape_of="y of the forward pass",
                       floats=NUMPY_DTYPES)
    if dh_n is not None:
        checks.check_array("dh_n", dh_n, ndim=(3,), dtype=dtype, dtype_of="the forward input x",
                           shape=(D, B, H), shape_of="h_n of the forward pass",
                           floats=NUMPY_DTYPES)
    return xp, dims


def shaped_grads(saved, dw_ih, dw_hh, db_ih, db_hh):
    """The weight gradients in the shape the weights were given in."""
    if saved.squeeze:
        return dw_ih[0], dw_hh[0], db_ih[0], db_hh[0]
    return dw_ih, dw_hh, db_ih, db_hh
