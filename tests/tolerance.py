"""The GPU tests' tolerance, element by element (tests/test_gpu.py; checked on the CPU in
tests/test_tolerance.py).

An element's error against the float64 oracle may be at most twice the float32 oracle's
error against it on that element (for outputs that are sums over a row: the largest such
error in the row), plus FLOOR_ULPS units of the dtype's epsilon times the largest |value| of
the output (of the row, for sums). float64 has no lower-precision oracle: the floor alone.
"""
import numpy as np

#: the floor of an element's error: this many units of the dtype's epsilon, times the largest
#: |value| of the output (or of the element's row)
FLOOR_ULPS = {np.dtype(np.float32): 4, np.dtype(np.float64): 512}


def elementwise_excess(got, ref, low, dtype, rows=False):
    """The largest of |got - ref| / bound over the elements (<= 1 passes), with the bound of
    the module's doc: 2 |low - ref| (float32 only) plus FLOOR_ULPS * eps * max |ref|, both
    taken per element, or per row (the last axis) for outputs that are sums over a row."""
    dtype = np.dtype(dtype)
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    if not np.isfinite(got).all():
        return np.inf
    err = np.abs(got - ref)
    own = np.abs(np.asarray(low, np.float64) - ref) if dtype == np.float32 else 0 * ref
    size = np.abs(ref)
    if rows and ref.ndim:
        own = own.max(axis=-1, keepdims=True)
        size = size.max(axis=-1, keepdims=True)
    else:
        size = np.full_like(ref, size.max())
    bound = 2 * own + FLOOR_ULPS[dtype] * np.finfo(dtype).eps * size
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > 0, err / np.where(bound > 0, bound, 1e-300), 0.0)
    return float(ratio.max())
