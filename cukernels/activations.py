"""Activations, their derivatives, SoftMax and MaskMult (the book's elementwise kernels).

Every function takes numpy arrays (computed by the numpy oracle, the CPU fallback) or cupy
arrays (computed by the CUDA kernels of kernels/activations.cu and kernels/softmax.cu), of
float32 or float64, any shape, C-contiguous. The result is a new array, or `out` when given;
`out` may be one of the inputs (the in-place calls of the book's host code).
"""
from __future__ import annotations

import numpy as np

from . import _rt, oracle

_ANY = None  # any number of dimensions


def _elementwise(name, arrays, scalars, out):
    """Validate and run one elementwise function; `arrays` is an ordered name -> array dict."""
    (ref_name, ref), *rest = arrays.items()
    xp = _rt.backend(**arrays, out=out)
    _rt.check_array(ref_name, ref, ndim=_ANY)
    _rt.check_same(ref_name, ref, **dict(rest))
    _rt.check_out(out, ref_name, ref, xp)
    wrapped = {k: _rt.real(k, v, ref.dtype) for k, v in scalars.items()}
    if xp is not _rt.cupy_module():
        return getattr(oracle, name)(*arrays.values(), *wrapped.values(), out=out)
    result = out if out is not None else xp.empty_like(ref)
    return _rt.launch_elementwise("activations.cu", f"{name}<{_rt.ctype(ref.dtype)}>",
                                  list(arrays.values()), result, a=wrapped.get("a", 0.0),
                                  b=wrapped.get("b", 0.0))


def line_activation(inputs, a=1.0, b=0.0, *, out=None):
    """LineActivation: ``y = a*x + b``. With ``b = 0`` it is the linear derivative ``a*g``."""
    return _elementwise("line_activation", {"inputs": inputs}, {"a": a, "b": b}, out)


def sigmoid_activation(inputs, a=1.0, b=0.0, *, out=None):
    """SigmoidActivation: ``y = a/(1 + exp(-x)) - b``."""
    return _elementwise("sigmoid_activation", {"inputs": inputs}, {"a": a, "b": b}, out)


def sigmoid_derivative(outputs, output_gr, a=1.0, b=0.0, *, out=None):
    """SigmoidDerivative: ``0`` if ``a == 0``, else ``z*(1 - z/a)*g`` with ``z = clamp(y + b, 0, a)``."""
    return _elementwise("sigmoid_derivative", {"outputs": outputs, "output_gr": output_gr},
                        {"a": a, "b": b}, out)


def tanh_activation(inputs, *, out=None):
    """TanhActivation: ``y = tanh(x)``."""
    return _elementwise("tanh_activation", {"inputs": inputs}, {}, out)


def tanh_derivative(outputs, output_gr, *, out=None):
    """TanhDerivative: ``(1 - y*y)*g``."""
    return _elementwise("tanh_derivative", {"outputs": outputs, "output_gr": output_gr}, {}, out)


def lrelu_activation(inputs, a=0.3, *, out=None):
    """LReLUActivation: ``y = x if x > 0 else a*x``."""
    return _elementwise("lrelu_activation", {"inputs": inputs}, {"a": a}, out)


def lrelu_derivative(outputs, output_gr, a=0.3, *, out=None):
    """LReLUDerivative: ``(1 if y > 0 else a)*g``."""
    return _elementwise("lrelu_derivative", {"outputs": outputs, "output_gr": output_gr},
                        {"a": a}, out)


def swish_activation(inputs, b=1.0, *, out=None):
    """SwishActivation: ``y = x/(1 + exp(-b*x))``."""
    return _elementwise("swish_activation", {"inputs": inputs}, {"b": b}, out)


def swish_derivative(outputs, output_gr, b, inputs, *, out=None):
    """SwishDerivative: ``(b*y + (1 - b*y)*sigmoid(b*x))*g``; needs the pre-activation ``inputs``."""
    arrays = {"outputs": outputs, "output_gr": output_gr, "inputs": inputs}
    xp = _rt.backend(**arrays, out=out)
    _rt.check_array("outputs", outputs, ndim=_ANY)
    _rt.check_same("outputs", outputs, output_gr=output_gr, inputs=inputs)
    _rt.check_out(out, "outputs", outputs, xp)
    bb = _rt.real("b", b, outputs.dtype)
    if xp is not _rt.cupy_module():
        return oracle.swish_derivative(outputs, output_gr, bb, inputs, out=out)
    result = out if out is not None else xp.empty_like(outputs)
    return _rt.launch_elementwise("activations.cu",
                                  f"swish_derivative<{_rt.ctype(outputs.dtype)}>",
                                  [outputs, output_gr, inputs], result, b=bb)


def mask_mult(inputs, mask, *, out=None):
    """MaskMult (dropout): ``out = inputs*mask``; the mask holds 0 or 1/(1 - p), made by the caller."""
    return _elementwise("mask_mult", {"inputs": inputs, "mask": mask}, {}, out)


# ------------------------------------------------------------------------------ softmax
def _softmax_launch(kind, arrays, out):
    (ref_name, ref), *_ = arrays.items()
    cp = _rt.cupy_module()
    cols = ref.shape[-1]
    rows = ref.size // cols
    if cols > 2**31 - 1:
        raise ValueError(f"{ref_name} rows longer than 2**31 - 1 elements are not supported")
    result = out if out is not None else cp.empty_like(ref)
    c = _rt.ctype(ref.dtype)
    pack = 16 // ref.itemsize
    v = pack if cols % pack == 0 and _rt.aligned16(*arrays.values(), result) else 1
    shape = next(((g, pt) for g, pt in _rt.SOFTMAX_SHAPES if cols <= g * pt * v), None)
    args = (*arrays.values(), result, np.int64(rows), np.int32(cols))
    if shape is None:
        _rt.kernel("softmax.cu", f"{kind}_long<{c}>")((rows,), (_rt.LONG_ROW_THREADS,), args)
    else:
        g, pt = shape
        k = _rt.kernel("softmax.cu", f"{kind}<{c},{g},{pt},{v}>")
        if g <= 32:   # SOFTMAX_GROUP_THREADS threads: that many/g rows a block
            nt = _rt.SOFTMAX_GROUP_THREADS
            k((-(-rows * g // nt),), (nt,), args)
        else:         # one block of g threads a row
            k((rows,), (g,), args)
    return result


def softmax_activation(inputs, *, out=None):
    """SoftMaxActivation, row-wise over the last axis: ``y = exp(x - max x)/sum(exp(x - max x))``.

    A 1-D input is one row (the book's layer); an (R, C) input is R rows of C.
    """
    xp = _rt.backend(inputs=inputs, out=out)
    _rt.check_array("inputs", inputs, ndim=_ANY)
    _rt.check_out(out, "inputs", inputs, xp)
    if xp is not _rt.cupy_module():
        return oracle.softmax_activation(inputs, out=out)
    return _softmax_launch("softmax_activation", {"inputs": inputs}, out)


def softmax_derivative(outputs, output_gr, *, out=None):
    """SoftMaxDerivative, row-wise: ``input_gr = y*(g - sum(y*g))`` (the book's sum over j)."""
    xp = _rt.backend(outputs=outputs, output_gr=output_gr, out=out)
    _rt.check_array("outputs", outputs, ndim=_ANY)
    _rt.check_same("outputs", outputs, output_gr=output_gr)
    _rt.check_out(out, "outputs", outputs, xp)
    if xp is not _rt.cupy_module():
        return oracle.softmax_derivative(outputs, output_gr, out=out)
    return _softmax_launch("softmax_derivative", {"outputs": outputs, "output_gr": output_gr},
                           out)
