"""CalcOutputGradient: the output layer's gradient (descent direction ``-dL/do``)."""
from __future__ import annotations

from . import _rt, oracle


def calc_output_gradient(target, outputs, loss_function, *, variant="standard", eps=1e-7,
                         out=None):
    """Gradient of the loss w.r.t. the outputs, as the descent direction ``-dL/do``.

    loss_function: 0 ``t - o`` (half squared error), 1 ``2*(t - o)`` (squared error),
    2 cross-entropy ``t/(o + eps)`` (through softmax_derivative this gives ``t - y``),
    3 binary cross-entropy ``(t - o)/(o*(1 - o) + eps)``; any other code ``t - o``.
    variant="book" keeps the book's formulas: 2 is ``-t/(o + 1e-37)*log(o + 1e-37)`` and 3 is
    ``(t - o)/(o*(o - 1) + 1e-37)`` (the opposite sign). ``eps`` applies to the standard form.
    target and outputs: same shape and dtype; `out` may alias either.
    """
    xp = _rt.backend(target=target, outputs=outputs, out=out)
    _rt.check_array("target", target, ndim=None)
    _rt.check_same("target", target, outputs=outputs)
    _rt.check_out(out, "target", target, xp)
    code = _rt.integer("loss_function", loss_function)
    variant = _rt.variant_of(variant)
    eps = _rt.real("eps", eps, target.dtype, min_value=0.0)
    if not -2**31 <= code < 2**31:
        code = 0  # the kernel's switch takes an int: every other code means t - o
    if xp is not _rt.cupy_module():
        return oracle.calc_output_gradient(target, outputs, code, variant=variant, eps=eps,
                                           out=out)
    result = out if out is not None else xp.empty_like(target)
    book = "true" if variant == "book" else "false"
    return _rt.launch_elementwise("losses.cu", f"calc_output_gradient<{_rt.ctype(target.dtype)},{book}>",
                                  [target, outputs], result, a=eps, code=code)
