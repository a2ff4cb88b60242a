"""Activations, their derivatives, SoftMax and MaskMult (the book's elementwise kernels).

Every function takes numpy arrays (computed by the numpy oracle, the CPU fallback) or cupy
arrays (computed by the CUDA kernels of kernels/activations.cu and kernels/softmax.cu), of
float32 or float64, any shape, C-contiguous. The result is a new array, or `out` when given;
`out` may be one of the inputs (the in-place calls of the book's host code).
"""
from __future__ import annotations

import numpy as np

from . import _launch, checks, oracle, runtime

_ANY = None  # any number of dimensions

ELEMENTWISE_KERNELS = ("line_activation", "sigmoid_activation", "sigmoid_derivative",
                       "tanh_activation", "tanh_derivative", "lrelu_activation",
                       "lrelu_derivative", "swish_activation", "swish_derivative", "mask_mult")
#: softmax "cached" shapes, tried in order: (threads per row G, units per thread PT); a row
#: of up to G*PT*V elements fits, V elements a unit (V = 16/itemsize when the row allows, else 1)
SOFTMAX_SHAPES = ((8, 1), (8, 2), (8, 4), (32, 2), (32, 4), (32, 8), (128, 8), (256, 8), (512, 8))
#: threads per block of the softmax kernels for rows longer than every cached shape
LONG_ROW_THREADS = 1024
#: threads per block of the softmax kernels whose rows take G <= 32 threads
SOFTMAX_GROUP_THREADS = 256


def _softmax_instances(c):
    pack = 16 // (4 if c == "float" else 8)
    out = []
    for g, pt in SOFTMAX_SHAPES:
        for v in (1, pack):
            out += [f"softmax_activation<{c},{g},{pt},{v}>", f"softmax_derivative<{c},{g},{pt},{v}>"]
    return out + [f"softmax_activation_long<{c}>", f"softmax_derivative_long<{c}>"]


_launch.register("activations.cu", lambda c: [f"{k}<{c}>" for k in ELEMENTWISE_KERNELS])
_launch.register("softmax.cu", _softmax_instances)
_NAMES = {(k, c): f"{k}<{c}>" for k in ELEMENTWISE_KERNELS for c in _launch.CTYPES}


_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
#: the magnitude a plain float scalar stays below to skip checks.real (float32's overflow
#: bound; checks.real decides every other case, float64's larger values included)
_PLAIN_LIMIT = checks.F32_OVERFLOW


def _plain_unary(name, x, a=0.0, b=0.0):
    """The common call of a one-input function, with the least host work: one C-contiguous
    cupy array of float32 or float64, no `out`, plain float scalars that need no rounding
    check. Returns the result, or None for any other call (then _elementwise decides)."""
    nd = checks.gpu_flat_type()
    if nd is not None and type(x) is nd and x._c_contiguous and x.ndim and x.size:
        ct = _CTYPE.get(x.dtype)
        if (ct is not None and type(a) is float and type(b) is float
                and -_PLAIN_LIMIT < a < _PLAIN_LIMIT and -_PLAIN_LIMIT < b < _PLAIN_LIMIT):
            return _launch.launch_unary("activations.cu", _NAMES[name, ct], x, a, b)
    return None


def _unary(name, inputs, out, **scalars):
    """A one-input function: its plain call first (_plain_unary), else _elementwise."""
    if out is None:
        y = _plain_unary(name, inputs, scalars.get("a", 0.0), scalars.get("b", 0.0))
        if y is not None:
            return y
    return _elementwise(name, {"inputs": inputs}, scalars, out)


def _elementwise(name, arrays, scalars, out):
    """Validate and run one elementwise function; `arrays` is an ordered name -> array dict."""
    (ref_name, ref), *rest = arrays.items()
    xp = checks.backend(**arrays, out=out)
    dt = checks.check_array(ref_name, ref, ndim=_ANY)
    if rest:
        checks.check_same(ref_name, ref, **dict(rest))
    if out is not None:
        checks.check_out(out, ref_name, ref)
    a = checks.real("a", scalars["a"], dt) if "a" in scalars else 0.0
    b = checks.real("b", scalars["b"], dt) if "b" in scalars else 0.0
    if xp is np:
        return getattr(oracle, name)(*arrays.values(), *([a] if "a" in scalars else []),
                                     *([b] if "b" in scalars else []), out=out)
    result = out if out is not None else xp.empty(ref.shape, dt)
    return _launch.launch_elementwise("activations.cu", _NAMES[name, _CTYPE[dt]],
                                      tuple(arrays.values()), result, a=a, b=b)


def line_activation(inputs, a=1.0, b=0.0, *, out=None):
    """LineActivation: ``y = a*x + b``. With ``b = 0`` it is the linear derivative ``a*g``."""
    return _unary("line_activation", inputs, out, a=a, b=b)


def sigmoid_activation(inputs, a=1.0, b=0.0, *, out=None):
    """SigmoidActivation: ``y = a/(1 + exp(-x)) - b``."""
    return _unary("sigmoid_activation", inputs, out, a=a, b=b)


def sigmoid_derivative(outputs, output_gr, a=1.0, b=0.0, *, out=None):
    """SigmoidDerivative: ``0`` if ``a == 0``, else ``z*(1 - z/a)*g`` with ``z = clamp(y + b, 0, a)``."""
    return _elementwise("sigmoid_derivative", {"outputs": outputs, "output_gr": output_gr},
                        {"a": a, "b": b}, out)


def tanh_activation(inputs, *, out=None):
    """TanhActivation: ``y = tanh(x)``."""
    return _unary("tanh_activation", inputs, out)


def tanh_derivative(outputs, output_gr, *, out=None):
    """TanhDerivative: ``(1 - y*y)*g``."""
    return _elementwise("tanh_derivative", {"outputs": outputs, "output_gr": output_gr}, {}, out)


def lrelu_activation(inputs, a=0.3, *, out=None):
    """LReLUActivation: ``y = x if x > 0 else a*x``."""
    return _unary("lrelu_activation", inputs, out, a=a)


def lrelu_derivative(outputs, output_gr, a=0.3, *, out=None):
    """LReLUDerivative: ``(1 if y > 0 else a)*g``."""
    return _elementwise("lrelu_derivative", {"outputs": outputs, "output_gr": output_gr},
                        {"a": a}, out)


def swish_activation(inputs, b=1.0, *, out=None):
    """SwishActivation: ``y = x/(1 + exp(-b*x))``."""
    return _unary("swish_activation", inputs, out, b=b)


def swish_derivative(outputs, output_gr, b, inputs, *, out=None):
    """SwishDerivative: ``(b*y + (1 - b*y)*sigmoid(b*x))*g``; needs the pre-activation ``inputs``."""
    arrays = {"outputs": outputs, "output_gr": output_gr, "inputs": inputs}
    xp = checks.backend(**arrays, out=out)
    checks.check_array("outputs", outputs, ndim=_ANY)
    checks.check_same("outputs", outputs, output_gr=output_gr, inputs=inputs)
    checks.check_out(out, "outputs", outputs)
    bb = checks.real("b", b, outputs.dtype)
    if xp is np:
        return oracle.swish_derivative(outputs, output_gr, bb, inputs, out=out)
    result = out if out is not None else xp.empty(outputs.shape, outputs.dtype)
    return _launch.launch_elementwise("activations.cu",
                                      f"swish_derivative<{_launch.ctype(outputs.dtype)}>",
                                      (outputs, output_gr, inputs), result, b=bb)


def mask_mult(inputs, mask, *, out=None):
    """MaskMult (dropout): ``out = inputs*mask``; the mask holds 0 or 1/(1 - p), made by the caller."""
    return _elementwise("mask_mult", {"inputs": inputs, "mask": mask}, {}, out)


# ------------------------------------------------------------------------------ softmax
def _softmax_launch(kind, arrays, out):
    (ref_name, ref), *_ = arrays.items()
    cp = runtime.cupy_module()
    cols = ref.shape[-1]
    rows = ref.size // cols
    if cols > 2**31 - 1:
        raise ValueError(f"{ref_name} rows longer than 2**31 - 1 elements are not supported")
    result = out if out is not None else cp.empty_like(ref)
    c = _launch.ctype(ref.dtype)
    pack = 16 // ref.itemsize
    v = pack if cols % pack == 0 and _launch.aligned16(*arrays.values(), result) else 1
    shape = next(((g, pt) for g, pt in SOFTMAX_SHAPES if cols <= g * pt * v), None)
    # (softmax_activation: x, y; softmax_derivative: y, g, out)
    names = ("x", "y") if kind == "softmax_activation" else ("y", "g", "out")
    args = dict(zip(names, (*arrays.values(), result)), rows=rows, cols=cols)
    if shape is None:
        runtime.launch("softmax.cu", f"{kind}_long<{c}>", (rows,), (LONG_ROW_THREADS,), args)
    else:
        g, pt = shape
        k = runtime.kernel("softmax.cu", f"{kind}<{c},{g},{pt},{v}>")
        if g <= 32:   # SOFTMAX_GROUP_THREADS threads: that many/g rows a block
            nt = SOFTMAX_GROUP_THREADS
            k.launch((-(-rows * g // nt),), (nt,), args)
        else:         # one block of g threads a row
            k.launch((rows,), (g,), args)
    return result


def softmax_activation(inputs, *, out=None):
    """SoftMaxActivation, row-wise over the last axis: ``y = exp(x - max x)/sum(exp(x - max x))``.

    A 1-D input is one row (the book's layer); an (R, C) input is R rows of C.
    """
    xp = checks.backend(inputs=inputs, out=out)
    checks.check_array("inputs", inputs, ndim=_ANY)
    checks.check_out(out, "inputs", inputs)
    if xp is np:
        return oracle.softmax_activation(inputs, out=out)
    return _softmax_launch("softmax_activation", {"inputs": inputs}, out)


def softmax_derivative(outputs, output_gr, *, out=None):
    """SoftMaxDerivative, row-wise: ``input_gr = y*(g - sum(y*g))`` (the book's sum over j)."""
    xp = checks.backend(outputs=outputs, output_gr=output_gr, out=out)
    checks.check_array("outputs", outputs, ndim=_ANY)
    checks.check_same("outputs", outputs, output_gr=output_gr)
    checks.check_out(out, "outputs", outputs)
    if xp is np:
        return oracle.softmax_derivative(outputs, output_gr, out=out)
    return _softmax_launch("softmax_derivative", {"outputs": outputs, "output_gr": output_gr},
                           out)
