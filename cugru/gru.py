"""gru_forward and gru_backward: validate once, pick a plan, run it.

numpy arrays run the oracle (cugru.oracle, the CPU fallback); cupy arrays run a GPU plan
(cugru/_plan.py) through the passes of cugru/_passes.py. docs/gru-design.md tells how the
pieces fit.
"""
from __future__ import annotations

import numpy as np

from . import _half, _passes, _plan, oracle
from ._args import HALF_DTYPES, backward_args, check_math, check_path, compute_dtype, forward_args


def gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, *, bidirectional=False, training=True,
                path="auto", quant=None, lengths=None, math=None):
    """Run a GRU layer over a sequence; torch.nn.GRU's maths and weight layout.

    x (T, B, I); h0 (D, B, H) or None (zeros); w_ih (D, 3H, I); w_hh (D, 3H, H);
    b_ih, b_hh (D, 3H), gate blocks r | z | n; D = 2 if bidirectional else 1, and for D = 1
    the weights may drop the direction axis. Direction 1 reads the sequence from t = T - 1
    down to 0 (torch's *_reverse weights).

    Returns y (T, B, D*H) (direction 0 in the first H columns), h_n (D, B, H) and `saved`
    (a GruSaved for gru_backward; None when training=False, which keeps no history).
    path (GPU): "auto" (the fastest plan for the shape), "fast" (a persistent plan, or a
    ValueError where none fits), "steps" (one launch per step), "small" (the whole pass in
    one launch of one block; a ValueError where D*B*H > 1024), "resident" (each
    recurrence, forward and backward, in one launch over many SMs; float32 or half data
    under math="strict" without quant or lengths, else a ValueError).
    quant: a cugru.QuantSpec for quantization-aware training (fake-quantized weights, and
    x, the state and the gates as it says; gru_backward then runs the straight-through
    estimator), or None for the plain GRU.
    lengths: B integers in 1..T (numpy or cupy array, list or tuple), the length of each
    sequence of a padded batch (torch's PackedSequence semantics): row b runs its first
    lengths[b] steps (direction 1 from step lengths[b] - 1 down); y is 0 beyond, h_n holds
    each row's state after its last step, and gru_backward gives zero gradients there. The
    padding must be finite (its gradients are zeros multiplied into it). None: every
    sequence has T steps.
    dtypes: float32, float64, float16 or bfloat16 (x, h0 and the weights alike). float16
    and bfloat16 compute in float32 from the given values, keep the history in float32 and
    round each result once.
    math: "strict" (every product in float32, or float64 for float64 data: a half call
    then gives the float32 call's results, rounded; on sm_90 the per-step path may run a
    float32 pass's products in float64, the recurrent ones, the projection, dx and the
    weight gradients, each rounded once to float32: cugru.plans.wide_products), or "tf32"
    (float32, float16 and bfloat16 data: cuBLAS' products, the input projection, the
    per-step path's recurrent products and the backward pass's dx and weight gradients,
    may round their float32 inputs to TF32 on tensor cores, as cuDNN does with TF32
    allowed or half data; half
    values are exact in TF32, the state is rounded; the persistent kernels' recurrence
    stays in float32). None (the default): "tf32" for float16 and bfloat16 data, "strict"
    for float32 and float64. numpy arrays compute strict whatever math says.
    """
    a = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training, quant, lengths)
    check_path(path)
    math = check_math(math, a.x.dtype)
    if a.xp is np:
        return oracle.forward(a, math)
    T, B, I, H, D = a.dims
    dt = a.x.dtype
    half = dt in HALF_DTYPES
    plan = _plan.choose(path, B, H, D, compute_dtype(dt) if half else dt, False, T, I,
                        a.quant is not None, a.lengths is not None, math)
    if half:
        return _half.forward(a, plan, math)
    return _passes.forward(a, plan, math)


def gru_backward(dy, dh_n, saved, *, path="auto", math=None):
    """Gradients of a GRU layer from the history its forward pass saved.

    dy (T, B, D*H): gradient of y; dh_n (D, B, H) or None: gradient of h_n.
    Returns dx (T, B, I), dh0 (D, B, H), dw_ih, dw_hh, db_ih, db_hh (the weights' shapes).
    Nothing of the forward pass is recomputed. path: as for gru_forward; the backward pass
    may run another plan than its forward pass did (they share every buffer's layout).
    math: as for gru_forward; None (the default) takes the forward pass's.
    """
    check_path(path)
    xp, (T, B, I, H, D) = backward_args(dy, dh_n, saved)
    math = saved.math if math is None else check_math(math, saved.x.dtype)
    if xp is np:
        return oracle.backward(dy, dh_n, saved)
    dt = dy.dtype
    half = dt in HALF_DTYPES
    plan = _plan.choose(path, B, H, D, compute_dtype(dt) if half else dt, True, T, I,
                        saved.quant is not None, saved.lengths is not None, math)
    if half:
        return _half.backward(dy, dh_n, saved, plan, math)
    return _passes.backward(dy, dh_n, saved, plan, math)
