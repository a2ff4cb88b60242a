"""CalcOutputGradient: the output layer's gradient (descent direction ``-dL/do``)."""
from __future__ import annotations

import numpy as np

from . import _launch, checks, oracle

_launch.register("losses.cu", lambda c: [f"calc_output_gradient<{c},{b}>" for b in _launch.BOOLS]
                 + [f"article_output_gradient<{c}>"])


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
    xp = checks.backend(target=target, outputs=outputs, out=out)
    checks.check_array("target", target, ndim=None)
    checks.check_same("target", target, outputs=outputs)
    checks.check_out(out, "target", target)
    code = checks.integer("loss_function", loss_function)
    variant = checks.variant_of(variant)
    eps = checks.real("eps", eps, target.dtype, min_value=0.0)
    if not -2**31 <= code < 2**31:
        code = 0  # the kernel's switch takes an int: every other code means t - o
    if xp is np:
        return oracle.calc_output_gradient(target, outputs, code, variant=variant, eps=eps,
                                           out=out)
    result = out if out is not None else xp.empty(target.shape, target.dtype)
    book = "true" if variant == "book" else "false"
    return _launch.launch_elementwise(
        "losses.cu", f"calc_output_gradient<{_launch.ctype(target.dtype)},{book}>",
        (target, outputs), result, a=eps, code=code)
