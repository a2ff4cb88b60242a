"""The GPU tests' tolerance, element by element (tests/test_gpu.py; checked on the CPU in
tests/test_tolerance.py).

An element's error against the float64 oracle may be at most twice the float32 oracle's
error against it, plus FLOOR_ULPS units of the dtype's epsilon times the largest |value| of
the output; float64 has no lower-precision oracle: the floor alone. Where the float32
oracle's error is taken depends on how the output is computed (`scope`):
  "element"  elementwise outputs: on the element itself;
  "row"      each element its own sum over a row (a dense layer's products): the largest
             error in the element's row (and the largest value of the row for the floor);
  "array"    elements that share one sum per row (softmax's derivative, y (g - sum y g)):
             the largest error of the output.
"""
import numpy as np

#: the floor of an element's error: this many units of the dtype's epsilon, times the largest
#: |value| of the output (or of the element's row)
FLOOR_ULPS = {np.dtype(np.float32): 4, np.dtype(np.float64): 512}


def elementwise_excess(got, ref, low, dtype, scope="element"):
    """The largest of |got - ref| / bound over the elements (<= 1 passes), with the bound of
    the module's doc: 2 |low - ref| (float32 only) plus FLOOR_ULPS * eps * max |ref|, taken
    per `scope`."""
    dtype = np.dtype(dtype)
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape
    if not np.isfinite(got).all():
        return np.inf
    err = np.abs(got - ref)
    own = np.abs(np.asarray(low, np.float64) - ref) if dtype == np.float32 else 0 * ref
    size = np.abs(ref)
    if scope == "row" and ref.ndim:
        own = own.max(axis=-1, keepdims=True)
        size = size.max(axis=-1, keepdims=True)
    else:
        size = np.full_like(ref, size.max())
        if scope == "array":
            own = np.full_like(ref, np.max(own))
    bound = 2 * own + FLOOR_ULPS[dtype] * np.finfo(dtype).eps * size
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err > 0, err / np.where(bound > 0, bound, 1e-300), 0.0)
    return float(ratio.max())
