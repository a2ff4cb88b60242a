"""Argument checks shared by cukernels and cugru, for numpy and cupy arrays alike.

Each check raises a TypeError or ValueError whose message names the argument and says what
was expected. They run once per public call, on both backends, and are written to cost
microseconds: a call on tiny arrays is bound by its host time. So each check first tests
the common case cheaply (a cupy array's contiguity and size are attributes, not computed)
and works out the message only on the way to an error.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import runtime

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_NDARRAY = np.ndarray


_CP_ND = False      # cupy's ndarray type once looked up (None where cupy is missing)
_CP_FLAT = None     # that type when it keeps its C-contiguity as an attribute, else None


def _cupy_ndarray():
    global _CP_ND, _CP_FLAT
    if _CP_ND is False:
        cp = runtime.cupy_module()
        _CP_ND = cp.ndarray if cp is not None else None
        _CP_FLAT = _CP_ND if hasattr(_CP_ND, "_c_contiguous") else None
    return _CP_ND


def backend(**arrays):
    """numpy or cupy, from the arrays given (None entries are skipped); mixed is a TypeError."""
    nd = _CP_ND if _CP_ND is not False else _cupy_ndarray()
    on_cpu = on_gpu = None
    for name, a in arrays.items():
        t = type(a)
        if t is nd:
            on_gpu = on_gpu or name
        elif a is None:
            continue
        elif t is _NDARRAY or isinstance(a, _NDARRAY):
            on_cpu = on_cpu or name
        elif nd is not None and isinstance(a, nd):
            on_gpu = on_gpu or name
        else:
            raise TypeError(f"{name} must be a numpy or cupy array, got {type(a).__name__}")
    if on_gpu and not on_cpu:
        return runtime.cupy_module()
    if on_cpu and not on_gpu:
        return np
    if on_cpu and on_gpu:
        raise TypeError(f"numpy and cupy arrays are mixed: {on_cpu} is a numpy array, "
                        f"{on_gpu} is a cupy array; move them to one device")
    raise TypeError("no array arguments were given")


def contiguous(a) -> bool:
    """C-contiguity (a cupy array keeps it as an attribute; else its flags are made)."""
    if type(a) is _CP_FLAT:
        return a._c_contiguous
    return a.flags.c_contiguous


def gpu_flat_type():
    """cupy's ndarray type where it keeps its C-contiguity as the attribute ``_c_contiguous``
    (the arrays the calls' fast paths take), else None."""
    if _CP_ND is False:
        _cupy_ndarray()
    return _CP_FLAT


def check_array(name, a, *, ndim=(1, 2), dtype=None, dtype_of=None, shape=None, shape_of=None,
                floats=FLOAT_DTYPES):
    """Validate one array argument; returns its dtype. Errors name the argument. `floats`:
    the dtypes taken (float32 and float64 unless a caller takes more)."""
    dt = a.dtype
    if dt not in floats:
        names = [f.name for f in floats]
        raise TypeError(f"{name} must be {', '.join(names[:-1])} or {names[-1]}, got {dt}")
    if dtype is not None and dt != dtype:
        raise TypeError(f"{name} has dtype {dt}, expected {np.dtype(dtype)} "
                        f"(the dtype of {dtype_of})")
    if ndim is None:
        if a.ndim < 1:
            raise ValueError(f"{name} must have at least 1 dimension, got a 0-d array")
    elif a.ndim not in ndim:
        want = " or ".join(str(d) for d in ndim)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(a.shape)}")
    if shape is not None and a.shape != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {tuple(shape)}"
                         + (f" (to match {shape_of})" if shape_of else ""))
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {tuple(a.shape)}); sizes must be > 0")
    if not contiguous(a):
        raise ValueError(f"{name} must be C-contiguous; pass xp.ascontiguousarray({name})")
    return dt


def check_same(ref_name, ref, **others):
    """Each of `others` must have the dtype and shape of `ref` (a checked array; None
    entries are skipped)."""
    dt, shape, nd = ref.dtype, ref.shape, _CP_FLAT
    for name, a in others.items():
        if a is None or (a.dtype is dt and a.shape == shape
                         and (a._c_contiguous if type(a) is nd else a.flags.c_contiguous)):
            continue      # (the common case, cheaply: ref's checks hold for a too)
        check_array(name, a, ndim=None, dtype=dt, dtype_of=ref_name, shape=shape,
                    shape_of=ref_name)


def check_out(out, ref_name, ref):
    """An optional output buffer: same backend, dtype and shape as `ref`; may alias inputs."""
    if out is None:
        return None
    backend(**{ref_name: ref, "out": out})
    check_array("out", out, ndim=None, dtype=ref.dtype, dtype_of=ref_name,
                shape=ref.shape, shape_of=ref_name)
    return out


_PLAIN_REALS = (float, int, np.float32, np.float64)
#: the smallest magnitude that rounds to infinity in float32 (half an ulp above its largest)
F32_OVERFLOW = 3.4028235677973366e38


def real(name, x, dtype, *, min_value=None, max_value=None, below_max=False):
    """A real scalar, checked: finite in `dtype` (a value that float32 rounds to infinity is
    refused where dtype is float32), and within [min_value, max_value] (or [min_value,
    max_value) with `below_max`) where given. Returned as a Python float: the oracle and
    the kernels' argument packing each round it to the arrays' dtype (the same rounding
    numpy's float32() does), so a bare Python float never reaches a kernel as a double."""
    if type(x) is float:
        v = x
    elif type(x) in _PLAIN_REALS or (isinstance(x, numbers.Real)
                                     and not isinstance(x, (bool, np.bool_))):
        v = float(x)
    else:
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    if not (math.isfinite(v) and (abs(v) < F32_OVERFLOW or dtype is None
                                   or np.dtype(dtype).itemsize == 8)):
        where = "" if not math.isfinite(v) else f" in {np.dtype(dtype)}"
        raise ValueError(f"{name} must be finite{where}, got {x}")
    if min_value is not None and v < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {x}")
    if max_value is not None and (v >= max_value if below_max else v > max_value):
        raise ValueError(f"{name} must be {'<' if below_max else '<='} {max_value}, got {x}")
    return v


def integer(name, x, *, min_value=None, max_value=None):
    """An integer (not a bool), within [min_value, max_value] where given; returned as int."""
    if type(x) is not int and (isinstance(x, (bool, np.bool_))
                               or not isinstance(x, numbers.Integral)):
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}")
    if min_value is not None and x < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {x}")
    if max_value is not None and x > max_value:
        raise ValueError(f"{name} must be <= {max_value}, got {x}")
    return int(x)


def flag(name, v):
    """True or False (numpy's bool too); anything else is a TypeError."""
    if v is True or v is False or isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"{name} must be True or False, got {v!r}")


def variant_of(variant):
    if variant != "standard" and variant != "book":
        raise ValueError(f"variant must be 'standard' or 'book', got {variant!r}")
    return variant


def check_distinct(**arrays):
    """Arrays that a kernel updates in place must not overlap each other or its inputs."""
    spans = []
    for i, (name, a) in enumerate(arrays.items()):
        if a is not None:
            start = a.__array_interface__["data"][0] if isinstance(a, _NDARRAY) else a.data.ptr
            spans.append((start, start + a.nbytes, i, name))
    spans.sort()
    for (_, a1, i, name_a), (b0, _, j, name_b) in zip(spans, spans[1:]):
        if b0 < a1:          # (sorted by start: any overlap shows between neighbours)
            first, second = (name_a, name_b) if i < j else (name_b, name_a)
            raise ValueError(f"{first} and {second} share memory; they must be separate "
                             "arrays")
