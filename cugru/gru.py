"""gru_forward and gru_backward: numpy arrays run the oracle, cupy arrays the kernels.

The GPU path is the per-step structure (kernels/gru.cu has the maths and the layouts):

forward   one GEMM projects every step's input, x (T*B, I) by W_ih of both directions;
          then per step one strided-batched GEMM h W_hh^T (one batch entry per direction)
          and one pointwise launch (grid axis y = direction) that writes h, y and the history
backward  per step, in reverse, one pointwise launch (S1: the gate gradients and dh z) and
          one strided-batched GEMM adding d_gate_h W_hh to the carried gradient; after the
          loop one GEMM each for dx (S4), dW_ih and dW_hh (S2), db_ih and db_hh (S3: products
          with a vector of ones), each over all T*B rows. No atomics: the same bits every run.

Per step the host does one kernel launch with pre-packed arguments and one cuBLAS call
(cukernels._rt.StepLoop); bench/gru.py measures that host time.
"""
from __future__ import annotations

import numpy as np

from cukernels import _rt

from . import oracle
from ._args import GruSaved, backward_args, forward_args, unsqueeze_grads

#: threads per block of the pointwise step kernels
THREADS = 256
#: launch the step kernels through CuPy's RawKernel call instead of the pre-packed launch
#: (slower on the host; kept for the host-time benchmark)
PLAIN_LAUNCH = False
#: the weight and bias gradients sum over all T*B rows; they do it in up to WGRAD_CHUNKS
#: chunks of at least MIN_CHUNK_ROWS rows, each one GEMM that adds into the result
#: (beta = 1). A float32 sum's rounding error grows with the rows summed in one pass, so this
#: cuts it about WGRAD_CHUNKS-fold, with no extra memory and the same bits every run.
WGRAD_CHUNKS = 8
MIN_CHUNK_ROWS = 256


def gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, *, bidirectional=False, training=True):
    """Run a GRU layer over a sequence; torch.nn.GRU's maths and weight layout.

    x (T, B, I); h0 (D, B, H) or None (zeros); w_ih (D, 3H, I); w_hh (D, 3H, H);
    b_ih, b_hh (D, 3H), gate blocks r | z | n; D = 2 if bidirectional else 1, and for D = 1
    the weights may drop the direction axis. Direction 1 reads the sequence from t = T - 1
    down to 0 (torch's *_reverse weights).

    Returns y (T, B, D*H) (direction 0 in the first H columns), h_n (D, B, H) and `saved`
    (a GruSaved for gru_backward; None when training=False, which keeps no history).
    """
    xp, training, dims, weights, squeeze = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh,
                                                        bidirectional, training)
    if xp is np:
        return oracle.gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional=bidirectional,
                                  training=training)
    y, h_n, hs, gates = _forward_gpu(x, h0, *weights, dims, training)
    saved = GruSaved(x, weights[0], weights[1], hs, gates, squeeze) if training else None
    return y, h_n, saved


def gru_backward(dy, dh_n, saved):
    """Gradients of a GRU layer from the history its forward pass saved.

    dy (T, B, D*H): gradient of y; dh_n (D, B, H) or None: gradient of h_n.
    Returns dx (T, B, I), dh0 (D, B, H), dw_ih, dw_hh, db_ih, db_hh (the weights' shapes).
    Nothing of the forward pass is recomputed.
    """
    xp, dims = backward_args(dy, dh_n, saved)
    if xp is np:
        return oracle.gru_backward(dy, dh_n, saved)
    return _backward_gpu(dy, dh_n, saved, dims)


def _row_chunks(rows):
    """(first row, row count) of each chunk of the weight-gradient sums."""
    per = max(MIN_CHUNK_ROWS, -(-rows // WGRAD_CHUNKS))
    return [(r0, min(per, rows - r0)) for r0 in range(0, rows, per)]


def _grid(B, H, D):
    return ((B * H + THREADS - 1) // THREADS, D)


def _forward_gpu(x, h0, w_ih, w_hh, b_ih, b_hh, dims, training):
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G = x.dtype, 3 * H
    S = T + 1 if training else 2          # slots of hs: all states, or ping-pong
    gi = cp.empty((T, B, D, G), dt)
    gh = cp.empty((D, B, G), dt)
    hs = cp.empty((D, S, B, H), dt)
    hs[:, 0] = 0 if h0 is None else h0
    y = cp.empty((T, B, D * H), dt)
    gates = cp.empty((D, T, B, 4 * H), dt) if training else None
    fn = _rt.kernel("gru.cu", f"gru_forward_step<{_rt.ctype(dt)},{'true' if training else 'false'}>")
    i32, it = np.int32, dt.itemsize
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        # gi' (D*3H, T*B) = W_ih' of both directions (D*3H, I) @ x' (I, T*B), column-major
        loop.gemm(True, False, D * G, T * B, I, w_ih.data.ptr, I, 0, x.data.ptr, I, 0,
                  0.0, gi.data.ptr, D * G, 0)
        step = loop.kernel(fn, _grid(B, H, D), (THREADS,),
                           (gi, gh, b_ih, b_hh, hs, y, y if gates is None else gates,
                            i32(T), i32(B), i32(H), i32(S), i32(0)), step_arg=11)
        for s in range(T):
            # per direction d: gh[d]' (3H, B) = W_hh[d]' (3H, H) @ hs[d, s]' (H, B)
            loop.gemm(True, False, G, B, H, w_hh.data.ptr, H, G * H,
                      hs.data.ptr + (s % S) * B * H * it, H, S * B * H,
                      0.0, gh.data.ptr, G, B * G, D)
            step(s)
    h_n = hs[:, T % S].copy()
    return y, h_n, (hs if training else None), gates


def _backward_gpu(dy, dh_n, saved, dims):
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G, TB = dy.dtype, 3 * H, T * B
    x, w_ih, w_hh, hs = saved.x, saved.w_ih, saved.w_hh, saved.hs
    dgi = cp.empty((T, B, D, G), dt)
    dgh = cp.empty((D, T, B, G), dt)
    dh = cp.zeros((D, B, H), dt) if dh_n is None else dh_n.copy()
    dx = cp.empty((T, B, I), dt)
    dw_ih, dw_hh = cp.empty((D, G, I), dt), cp.empty((D, G, H), dt)
    db_ih, db_hh = cp.empty((D, G), dt), cp.empty((D, G), dt)
    chunks = _row_chunks(TB)
    ones = cp.ones(chunks[0][1], dt)
    fn = _rt.kernel("gru.cu", f"gru_backward_step<{_rt.ctype(dt)}>")
    i32, it = np.int32, dt.itemsize
    ptr = lambda a: a.data.ptr  # noqa: E731
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        step = loop.kernel(fn, _grid(B, H, D), (THREADS,),
                           (dy, saved.gates, hs, dh, dgi, dgh, i32(T), i32(B), i32(H), i32(0)),
                           step_arg=9)
        for s in range(T - 1, -1, -1):
            step(s)
            # per direction d: dh[d]' (H, B) += W_hh[d]'' (H, 3H) @ dgh[d, s]' (3H, B)
            loop.gemm(False, False, H, B, G, ptr(w_hh), H, G * H,
                      ptr(dgh) + s * B * G * it, G, TB * G, 1.0, ptr(dh), H, B * H, D)
        # S4: dx' (I, T*B) = W_ih'' (I, D*3H) @ dgi' (D*3H, T*B): both directions summed in K
        loop.gemm(False, False, I, TB, D * G, ptr(w_ih), I, 0, ptr(dgi), D * G, 0,
                  0.0, ptr(dx), I, 0)
        # S2 and S3, over chunks of the T*B rows, each chunk adding into the result:
        #   dW_ih[d]' (I, 3H) += x' (I, rows) @ dgi[rows, d] (rows, 3H)
        #   dW_hh[d]' (H, 3H) += hs[d, :T]' (H, rows) @ dgh[d, rows] (rows, 3H)
        #   db_ih (D*3H) += dgi[rows]' @ ones;  db_hh[d] (3H) += dgh[d, rows]' @ ones
        for k, (r0, n) in enumerate(chunks):
            beta = 0.0 if k == 0 else 1.0
            loop.gemm(False, True, I, G, n, ptr(x) + r0 * I * it, I, 0,
                      ptr(dgi) + r0 * D * G * it, D * G, G, beta, ptr(dw_ih), I, G * I, D)
            loop.gemm(False, True, H, G, n, ptr(hs) + r0 * H * it, H, (T + 1) * B * H,
                      ptr(dgh) + r0 * G * it, G, TB * G, beta, ptr(dw_hh), H, G * H, D)
            loop.gemm(False, False, D * G, 1, n, ptr(dgi) + r0 * D * G * it, D * G, 0,
                      ptr(ones), n, 0, beta, ptr(db_ih), D * G, 0)
            loop.gemm(False, False, G, 1, n, ptr(dgh) + r0 * G * it, G, TB * G, ptr(ones), n, 0,
                      beta, ptr(db_hh), G, G, D)
    return (dx, dh) + unsqueeze_grads(saved, dw_ih, dw_hh, db_ih, db_hh)
