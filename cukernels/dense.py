"""The dense layer: PerceptronFeedForward, CalcHiddenGradient, CalcDeltaWeights.

Layout (the book's): weights ``W`` of shape (N, I + 1), row-major, the bias in the last
column. ``inputs`` is one vector (I,) or a batch (B, I); ``gradients`` one vector (N,) or a
batch (B, N). A batch behaves as B single-vector calls in a row.

GPU paths: batches below ``GEMM_MIN_BATCH`` run our kernels of kernels/dense.cu, which
read W once per four vectors (feed-forward, hidden gradient) or once (delta weights) and
give, for every vector, the same bits as a single call;
larger batches run one cuBLAS GEMM (FP32 strict) on the strided view of W plus one of our
kernels for the bias column, which agrees with the single calls to rounding.
"""
from __future__ import annotations

import numpy as np

from . import _launch, checks, oracle, runtime

_INT_MAX = 2**31 - 1
#: batches at least this large go through cuBLAS; smaller ones through our own kernels
GEMM_MIN_BATCH = 8
#: blocks per SM aimed at by the hidden-gradient grid (a single vector must fill the GPU)
DENSE_BLOCKS_PER_SM = 16
#: 16-byte packs per thread in the one-block-per-row feed-forward (sets its block size)
FF_PACKS_PER_THREAD = 4
#: 16-byte packs of a row in flight per thread in the feed-forward (CK_GEMV_UNROLL)
GEMV_UNROLL = 4
#: rows of W in flight per thread in hidden_gradient_partial (CK_COL_UNROLL); slices are cut
#: to multiples of it
COL_UNROLL = 32
KERNELS = ("perceptron_feed_forward", "dense_bias_act", "hidden_gradient_partial",
           "hidden_gradient_finish", "calc_delta_weights", "delta_bias", "article_update_weights")

_launch.register("dense.cu", lambda c: [f"{k}<{c}>" for k in KERNELS],
                 lambda: {"CK_GEMV_UNROLL": GEMV_UNROLL, "CK_COL_UNROLL": COL_UNROLL})


def _layer(weights_name, weights, vec_name, vec, vec_len, vec_len_of):
    """Validate W and a vector/batch argument whose last axis must be `vec_len`."""
    checks.check_array(weights_name, weights, ndim=(2,))
    n, cols = weights.shape
    if cols < 2:
        raise ValueError(f"{weights_name} must have shape (N, I + 1) with I >= 1, "
                         f"got {tuple(weights.shape)}")
    checks.check_array(vec_name, vec, ndim=(1, 2), dtype=weights.dtype, dtype_of=weights_name)
    want = vec_len(n, cols - 1)
    if vec.shape[-1] != want:
        raise ValueError(f"{vec_name} has {vec.shape[-1]} elements per vector, expected {want} "
                         f"({vec_len_of} of {weights_name} with shape {tuple(weights.shape)})")
    if max(n, cols, vec.shape[0]) > _INT_MAX:
        raise ValueError(f"{weights_name} or {vec_name} has a dimension above 2**31 - 1")
    return n, cols - 1


def _batch(a, length):
    return a.reshape(-1, length)


def _unbatch(result, like):
    return result.reshape(result.shape[-1]) if like.ndim == 1 else result


def feed_forward_gpu(x, W, act):
    """y = act(x @ W[:, :I].T + W[:, I]) on the GPU; act -1/2 none, 0 tanh, 1 sigmoid."""
    cp = runtime.cupy_module()
    n, i = W.shape[0], W.shape[1] - 1
    x2 = _batch(x, i)
    b = x2.shape[0]
    y = cp.empty((b, n), dtype=W.dtype)
    c = _launch.ctype(W.dtype)
    dims = {"B": b, "N": n, "I": i, "act": act}
    if b >= GEMM_MIN_BATCH:
        # column-major view: Y'(N, B) = W_I'(N, I) @ X'(I, B), W stored as (I + 1, N)
        _launch.gemm(True, False, n, b, i, 1.0, W, i + 1, x2, i, 0.0, y, n)
        runtime.launch("dense.cu", f"dense_bias_act<{c}>", (_launch.grid_for(b * n),), (256,),
                       {"W": W, "y": y, **dims})
    else:
        packs = (i + 1) // (16 // W.itemsize)
        per = FF_PACKS_PER_THREAD
        threads = min(1024 // per, max(32, 32 * -(-packs // (per * 32))))
        runtime.launch("dense.cu", f"perceptron_feed_forward<{c}>", (n,), (threads,),
                       {"x": x2, "W": W, "y": y, **dims, "vec": _launch.aligned16(W)})
    return _unbatch(y, x)


def hidden_gradient_gpu(W, g, outs, act):
    """gi = g @ W[:, :I], then the article's epilogue when act >= 0 (outs: the layer's outputs)."""
    cp = runtime.cupy_module()
    n, i = W.shape[0], W.shape[1] - 1
    g2 = _batch(g, n)
    b = g2.shape[0]
    gi = cp.empty((b, i), dtype=W.dtype)
    c = _launch.ctype(W.dtype)
    outs = gi if outs is None else outs
    finish = runtime.kernel("dense.cu", f"hidden_gradient_finish<{c}>")
    if b >= GEMM_MIN_BATCH:
        # column-major view: GI'(I, B) = W_I(I, N) @ G'(N, B), W stored as (I + 1, N)
        _launch.gemm(False, False, i, b, n, 1.0, W, i + 1, g2, n, 0.0, gi, i)
        if act >= 0:
            finish.launch((_launch.grid_for(b * i),), (256,),
                          {"part": gi, "outs": outs, "gi": gi, "B": b, "I": i, "slices": 1,
                           "act": act})
        return _unbatch(gi, g)
    col_blocks = -(-i // 256)
    slices = max(1, min(-(-n // 32), -(-DENSE_BLOCKS_PER_SM * _launch.sm_count() // col_blocks)))
    per_slice = -(-n // slices)
    rows = -(-per_slice // COL_UNROLL) * COL_UNROLL   # a multiple of the kernel's unroll
    slices = -(-n // rows)
    part = gi if slices == 1 else cp.empty((slices, b, i), dtype=W.dtype)
    runtime.launch("dense.cu", f"hidden_gradient_partial<{c}>", (col_blocks, slices), (256,),
                   {"W": W, "g": g2, "part": part, "B": b, "N": n, "I": i,
                    "rows_per_slice": rows})
    if slices > 1 or act >= 0:
        finish.launch((_launch.grid_for(b * i),), (256,),
                      {"part": part, "outs": outs, "gi": gi, "B": b, "I": i, "slices": slices,
                       "act": act})
    return _unbatch(gi, g)


def flat_launch(W, *arrays):
    """(grid, vec, 1/(I + 1)) of a flat pass over the N*(I + 1) elements of W-shaped arrays."""
    vec = _launch.aligned16(W, *arrays)
    work = W.size // (16 // W.itemsize) if vec else W.size
    return (_launch.grid_for(work),), vec, 1.0 / W.shape[1]


def perceptron_feed_forward(inputs, weights):
    """PerceptronFeedForward: ``y = W[:, :I] @ x + W[:, I]`` (no activation).

    inputs (I,) or (B, I); weights (N, I + 1). Returns (N,) or (B, N).
    """
    xp = checks.backend(inputs=inputs, weights=weights)
    _layer("weights", weights, "inputs", inputs, lambda n, i: i, "I = columns - 1")
    if xp is np:
        return oracle.perceptron_feed_forward(inputs, weights)
    return feed_forward_gpu(inputs, weights, -1)


def calc_hidden_gradient(weights, gradients):
    """CalcHiddenGradient: ``gi[i] = sum_o g[o]*W[o, i]`` for i < I (the bias column excluded).

    weights (N, I + 1); gradients (N,) or (B, N). Returns (I,) or (B, I). No activation
    derivative is applied here (the book applies it in a separate derivative kernel).
    """
    xp = checks.backend(weights=weights, gradients=gradients)
    _layer("weights", weights, "gradients", gradients, lambda n, i: n, "N = rows")
    if xp is np:
        return oracle.calc_hidden_gradient(weights, gradients)
    return hidden_gradient_gpu(weights, gradients, None, -1)


def calc_delta_weights(inputs, delta_weights, gradients):
    """CalcDeltaWeights: ``dW[n, i] += x[i]*g[n]``, ``dW[n, I] += g[n]``, summed over a batch.

    inputs (I,) or (B, I); delta_weights (N, I + 1), updated in place and returned;
    gradients (N,) or (B, N) with the same batch size as inputs.
    """
    xp = checks.backend(inputs=inputs, delta_weights=delta_weights, gradients=gradients)
    n, i = _layer("delta_weights", delta_weights, "inputs", inputs, lambda n, i: i,
                  "I = columns - 1")
    _layer("delta_weights", delta_weights, "gradients", gradients, lambda n, i: n, "N = rows")
    if inputs.ndim != gradients.ndim or (inputs.ndim == 2 and inputs.shape[0] != gradients.shape[0]):
        raise ValueError(f"inputs {tuple(inputs.shape)} and gradients {tuple(gradients.shape)} "
                         "must both be single vectors or batches of the same size")
    checks.check_distinct(delta_weights=delta_weights, inputs=inputs, gradients=gradients)
    if xp is np:
        return oracle.calc_delta_weights(inputs, delta_weights, gradients)
    x2, g2 = _batch(inputs, i), _batch(gradients, n)
    b = x2.shape[0]
    c = _launch.ctype(delta_weights.dtype)
    if b >= GEMM_MIN_BATCH:
        # column-major view: dW_I(I, N) += X'(I, B) @ G'(N, B)^T, dW stored as (I + 1, N)
        _launch.gemm(False, True, i, n, b, 1.0, x2, i, g2, n, 1.0, delta_weights, i + 1)
        runtime.launch("dense.cu", f"delta_bias<{c}>", (_launch.grid_for(n),), (256,),
                       {"dW": delta_weights, "g": g2, "B": b, "N": n, "I": i})
    else:
        grid, vec, inv_l = flat_launch(delta_weights)
        runtime.launch("dense.cu", f"calc_delta_weights<{c}>", grid, (256,),
                       {"x": x2, "dW": delta_weights, "g": g2, "B": b, "N": n, "I": i,
                        "inv_L": inv_l, "vec": vec})
    return delta_weights
