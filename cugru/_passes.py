"""The GPU passes around a plan's recurrence, shared by every plan: the buffers of a pass,
the input projection before the forward recurrence, and the backward pass's tail after its
recurrence (the input gradient and the weight and bias gradients).

forward   one GEMM projects every step's input, x (T*B, I) by W_ih of both directions, into
          gi; then the plan's recurrence writes hs, y, the history and h_n
backward  the plan's recurrence writes d_gate_i by time (dgi), d_gate_h by step (dgh) and
          dh0; then dx is one GEMM over all T*B rows with both directions summed in K, and
          dW_ih, dW_hh are GEMMs over all rows in chunks, db_ih, db_hh one kernel's sums
          in double over few rows, else GEMMs in those chunks too (``weight_grads``).
          No atomics: the same bits every run.
wide      a float32 pass on the per-step path whose recurrent products run in float64
          (wide_pass) runs these products in float64 too: the projection into a float64
          gi (from _plan.WIDE_MIN_INPUTS inputs); the gate gradients stored as float64,
          then dx, dW_ih, dW_hh and the bias gradients each one product over all rows
          (``wide_tail``).
(The patent behind cugru names the backward steps S1 to S4: the gate gradients of a step,
the weight gradients, the bias gradients and the input gradient. Here they are called by
what they compute, apart from the benchmark's shapes S1 to S10.)
"""
from __future__ import annotations

import numpy as np

from . import _catalog as cat
from . import _device as dev
from . import _plan, _quantize
from ._args import shaped_grads
from .quant import NO_QUANT_ARGS
from .saved import GruSaved

#: the weight and bias gradients sum over all T*B rows; they do it in up to WGRAD_CHUNKS
#: chunks of at least MIN_CHUNK_ROWS rows, each one GEMM that adds into the result
#: (beta = 1). A float32 sum's rounding error grows with the rows summed in one pass, so this
#: cuts it about WGRAD_CHUNKS-fold, with no extra memory and the same bits every run.
WGRAD_CHUNKS = 8
MIN_CHUNK_ROWS = 256
#: the chunks run batched (see weight_grads) while all chunks' partial results take at most
#: WGRAD_PARTIAL_BYTES, or at most WGRAD_PARTIAL_DGI times the bytes of d_gate_i (the backward
#: pass's largest buffer: its peak memory then grows by at most that much). Measured on S8-S10
#: (docs/performance.md): batched, the tail took 12-25% less time.
WGRAD_PARTIAL_BYTES = 32 << 20
WGRAD_PARTIAL_DGI = 1
#: under math="tf32", a weight gradient (dW_ih, or one direction's dW_hh, over all T*B rows)
#: of at most this many multiply-adds is summed in float32: such a product takes
#: microseconds either way (S6's, 2e7 multiply-adds: about 2 µs), and TF32's rounding of each
#: term (1 in 2^11) is the error its sum keeps (S6's dW_hh: 3.3x cuDNN's error in TF32)
WGRAD_STRICT_MACS = 1 << 27
#: a pass of at most this many T*B rows sums its bias gradients in one launch of
#: gru_bias_sums, in double (for float32 data: within a float32 unit of the exact sum); more
#: rows take float32 GEMMs with a vector of ones, in the weight gradients' chunks
BIAS_KERNEL_ROWS = 2048


def wide_pass(plan, B, H, dtype, math, qat=False, backward=False) -> bool:
    """Whether a pass on `plan` is wide: the per-step path with its recurrent products in
    float64 on float32 data (_plan.wide_products). Such a forward pass projects the input
    in float64 into a float64 gi (where _plan.wide_projection says so); such a backward pass
    stores its gate gradients as float64 and runs its tail in float64 (wide_tail)."""
    return isinstance(plan, _plan.StepsPlan) and _plan.wide_products(
        B, H, np.dtype(dtype).itemsize, math, qat, backward)


class ForwardPass:
    """The buffers of a forward pass (gru_common.cuh has their layouts). S = T + 1 slots of
    hs when training (every state kept for backward), else 2 (ping-pong); gates is None
    without training. For a plan that runs the whole pass (`whole`) there is no gi, and no
    hs without training (the plan keeps the states itself). `kept` (inference only): y and
    h_n are temporaries too, kept with gi and hs (dev.scratch), for a caller that copies
    them into results of its own (replayed_inference's callers); with `steps` (the per-step
    plan) the step's product gh (D, B, 3H) is kept with them, else gh is None."""
    __slots__ = ("T", "B", "I", "H", "D", "S", "dtype", "ctype", "training", "x", "h0", "w_ih",
                 "w_hh", "b_ih", "b_hh", "gi", "hs", "y", "h_n", "gates", "qat", "qargs",
                 "lengths", "math", "wide", "gh")

    def __init__(self, a, whole=False, math="strict", kept=False, wide=False, steps=False):
        self.T, self.B, self.I, self.H, self.D = T, B, I, H, D = a.dims
        self.dtype = dt = a.x.dtype
        self.ctype = cat.CTYPE[dt.itemsize]
        self.training = a.training
        # the recurrent kernels' quantization arguments (their QAT instances with a.quant)
        self.qat = a.quant is not None
        self.qargs = _quantize.kernel_args(a.quant) if self.qat else NO_QUANT_ARGS
        self.x, self.h0, self.w_ih, self.w_hh = a.x, a.h0, a.w_ih, a.w_hh
        self.b_ih, self.b_hh = a.b_ih, a.b_hh
        self.lengths = a.lengths
        self.math = math
        self.wide = wide
        self.S = S = T + 1 if a.training else 2
        self.gi = self.hs = self.gates = self.gh = None
        # (wide: gi in float64 where the projection is, wide_pass)
        gi_dt = np.float64 if wide and _plan.wide_projection(I) else dt
        # (training: hs and gates are the saved history; else hs is a temporary)
        if a.training:
            if not whole:
                self.gi, = dev.scratch("forward", gi_dt, (T, B, D, 3 * H))
            self.y, self.h_n, self.hs, self.gates = dev.outputs(
                dt, (T, B, D * H), (D, B, H), (D, S, B, H), (D, T, B, 4 * H))
        else:
            results = (T, B, D * H), (D, B, H)
            if kept:
                assert not wide, "a wide pass keeps no temporaries"
                temps = ((T, B, D, 3 * H), (D, S, B, H)) if not whole else ()
                temps += ((D, B, 3 * H),) if steps else ()
                *kept_temps, self.y, self.h_n = dev.scratch("inference kept", dt, *temps,
                                                            *results)
                if steps:
                    self.gh = kept_temps.pop()
                if kept_temps:
                    self.gi, self.hs = kept_temps
                return
            if not whole and gi_dt == dt:
                self.gi, self.hs = dev.scratch("inference", dt, (T, B, D, 3 * H), (D, S, B, H))
            elif not whole:
                self.hs, = dev.scratch("inference", dt, (D, S, B, H))
                self.gi, = dev.scratch("inference gi", gi_dt, (T, B, D, 3 * H))
            self.y, self.h_n = dev.outputs(dt, *results)


class BackwardPass:
    """The buffers of a backward pass: the history, the gate gradients (temporaries), and
    the results: dx, dh0 and the weight gradients, in one flat buffer (grads) that the tail
    fills, or for a plan that runs the whole pass (`whole`) four arrays of the weights'
    shapes as given (dw: dw_ih, dw_hh, db_ih, db_hh; no views to make)."""
    __slots__ = ("T", "B", "I", "H", "D", "dtype", "ctype", "dy", "dh_n", "x", "w_ih", "w_hh",
                 "hs", "gates", "dgi", "dgh", "dx", "dh0", "grads", "dw", "qat", "qargs",
                 "lengths", "math", "wide")

    def __init__(self, dy, dh_n, saved, whole=False, math="strict", wide=False):
        self.T, self.B, self.I, self.H, self.D = T, B, I, H, D = saved.dims
        self.dtype = dt = dy.dtype
        self.ctype = cat.CTYPE[dt.itemsize]
        self.qat = saved.quant is not None
        self.qargs = _quantize.kernel_args(saved.quant) if self.qat else NO_QUANT_ARGS
        self.dy, self.dh_n = dy, dh_n
        self.x, self.w_ih, self.w_hh = saved.x, saved.w_ih, saved.w_hh
        self.hs, self.gates = saved.hs, saved.gates
        self.lengths = saved.lengths
        self.math = math
        self.wide = wide
        G = 3 * H
        # (wide: the gate gradients in float64, wide_pass)
        self.dgi, self.dgh = dev.scratch("backward", np.float64 if wide else dt,
                                         (T, B, D, G), (D, T, B, G))
        if whole:
            lead = () if saved.squeeze else (D,)
            self.dx, self.dh0, *dw = dev.outputs(dt, (T, B, I), (D, B, H), lead + (G, I),
                                                 lead + (G, H), lead + (G,), lead + (G,))
            self.dw, self.grads = tuple(dw), None
        else:
            self.dx, self.dh0, self.grads = dev.outputs(dt, (T, B, I), (D, B, H),
                                                        (D * G * (I + H + 2),))
            self.dw = None


def forward(a, plan, math="strict"):
    """The forward pass of checked arguments `a` (cugru._args.ForwardArgs) on `plan`:
    (y, h_n, GruSaved or None). With a.quant, the quantized operands first (a
    quantization-aware pass: cugru/_quantize.py). `math`: "strict", or "tf32" (cuBLAS'
    products with TF32 inputs, the plan's own recurrence as it is)."""
    given = a
    if a.quant is not None:
        a = _quantize.operands(a)
    elif not a.training and replays(a, plan, math):
        p = replayed_inference(a, plan, math)
        # (the results: new arrays, copied from the kept ones the graph wrote)
        y, h_n = dev.outputs(p.dtype, p.y.shape, p.h_n.shape)
        dev.copy_bytes(y.data.ptr, p.y.data.ptr, y.nbytes)
        dev.copy_bytes(h_n.data.ptr, p.h_n.data.ptr, h_n.nbytes)
        return y, h_n, None
    B, H = a.dims[1], a.dims[3]
    p = ForwardPass(a, plan.whole_pass, math,
                    wide=wide_pass(plan, B, H, a.x.dtype, math, a.quant is not None))
    run_forward(p, a.h0, plan)
    if not a.training:
        return p.y, p.h_n, None
    if a.quant is None:
        return p.y, p.h_n, GruSaved(a.x, a.w_ih, a.w_hh, p.hs, p.gates, a.squeeze,
                                    lengths=a.lengths, math=math)
    return p.y, p.h_n, GruSaved(a.x, a.w_ih, a.w_hh, p.hs, p.gates, a.squeeze, a.quant,
                                given.x, given.h0, a.lengths, math)


def replays(a, plan, math, itemsize=None, widened=0):
    """Whether an inference pass of `a` (no quantization) under `math` on `plan` goes
    through replayed_inference: the plan's forward pass `captures` (on the per-step plan,
    a pass whose products are not wide: a wide pass converts into float64 temporaries of
    its own), and the pass's temporaries (of `itemsize` bytes an element, the data's where
    None; with `widened` bytes of float32 copies of half-precision inputs) are kept between
    calls (dev.SCRATCH_BYTES): else no key would repeat."""
    if not plan.captures:
        return False
    T, B, I, H, D = a.dims
    itemsize = itemsize or a.x.dtype.itemsize
    steps = isinstance(plan, _plan.StepsPlan)
    if steps and _plan.wide_products(B, H, itemsize, math):
        return False
    S = 2
    units = (0 if plan.whole_pass else T * B * D * 3 * H + D * S * B * H) + T * B * D * H \
        + D * B * H + (D * B * 3 * H if steps else 0)
    return units * itemsize + widened <= dev.SCRATCH_BYTES


def replayed_inference(a, plan, math, tag="inference", prologue=None, read=()):
    """An inference pass of `a` (no quantization; replays(a, plan, math)) with every buffer it
    writes kept between calls (ForwardPass(..., kept=True): y and h_n too), issued through
    Loop.replay keyed by the address and size of every buffer its calls touch and by what
    they bake in (`tag`, the dims, the plan; Loop.replay adds the dtype, the math, the
    device, the stream and the thread): a call that repeats an earlier call's arrays (their
    contents may differ: a graph reads them when it runs) costs the host one graph launch.
    `prologue()`: calls issued first, reading `read` (the widening of half-precision data
    into a's arrays). Returns the ForwardPass, whose y and h_n the caller copies out before
    the next call on this stream writes them again."""
    p = ForwardPass(a, plan.whole_pass, math, kept=True,
                    steps=isinstance(plan, _plan.StepsPlan))

    def issue(loop):
        if prologue is not None:
            prologue()
        run_forward(p, a.h0, plan, loop)
    # (graph_key's form of each buffer, built here with less host work; None keeps its
    # place)
    key = (tag, a.dims, plan) + tuple(
        None if v is None else ("buffer", v.data.ptr, v.nbytes)
        for v in (*read, a.x, a.h0, a.w_ih, a.w_hh, a.b_ih, a.b_hh, a.lengths, p.gi, p.hs, p.y,
                  p.h_n, p.gh))
    with dev.Loop(p.dtype, math=math) as loop:
        loop.replay(key, issue)
    return p


def run_forward(p, h0, plan, loop=None):
    """Slot 0 of hs from h0 (or zeros), the input projection, the plan's recurrence, h_n
    (or all of it in the plan, for a plan that runs the whole pass); in `loop` where given
    (its stream the current one), else in a Loop of its own."""
    if loop is None:
        with dev.Loop(p.dtype, math=p.math) as loop:
            return run_forward(p, h0, plan, loop)
    if plan.whole_pass:
        plan.forward(loop, p)
        return
    T, B, I, D, S = p.T, p.B, p.I, p.D, p.S
    it, BH, G = p.dtype.itemsize, p.B * p.H, 3 * p.H
    hs = p.hs.data.ptr
    for d in range(D):
        if h0 is None:
            dev.zero_bytes(hs + d * S * BH * it, BH * it)
        else:
            dev.copy_bytes(hs + d * S * BH * it, h0.data.ptr + d * BH * it, BH * it)
    # gi' (D*3H, T*B) = W_ih' of both directions (D*3H, I) @ x' (I, T*B), column-major
    if p.gi.dtype != p.dtype:
        # (x and W_ih widened exactly: the sums in float64, gi kept in float64)
        x64, w64 = dev.scratch("projection wide", np.float64, (T * B * I,), (D * G * I,))
        _plan.convert(loop, p.x, x64, T * B * I)
        _plan.convert(loop, p.w_ih, w64, D * G * I)
        loop.gemm(True, False, D * G, T * B, I, w64.data.ptr, I, 0, x64.data.ptr, I, 0, 0.0,
                  p.gi.data.ptr, D * G, 0, wide=True)
    else:
        loop.gemm(True, False, D * G, T * B, I, p.w_ih.data.ptr, I, 0, p.x.data.ptr, I, 0,
                  0.0, p.gi.data.ptr, D * G, 0)
    plan.forward(loop, p)
    if not plan.writes_h_n:
        for d in range(D):
            dev.copy_bytes(p.h_n.data.ptr + d * BH * it, hs + (d * S + T % S) * BH * it,
                           BH * it)


def backward(dy, dh_n, saved, plan, math="strict"):
    """The backward pass (checked arguments) on `plan`: dx, dh0, dw_ih, dw_hh, db_ih, db_hh
    (`math` as for forward)."""
    p = BackwardPass(dy, dh_n, saved, plan.whole_pass, math,
                     wide=wide_pass(plan, saved.dims[1], saved.dims[3], dy.dtype, math,
                                    saved.quant is not None, backward=True))
    with dev.Loop(p.dtype, math=p.math) as loop:
        plan.backward(loop, p)
        if plan.whole_pass:
            dx, grads = p.dx, p.dw
        else:
            dx, *dw = tail(p, loop)
            grads = shaped_grads(saved, *dw)
    if p.qat:
        _quantize.grad_masks(saved, dx, p.dh0)
    return (dx, p.dh0) + tuple(grads)


def run_recurrence(p, plan):
    """The plan's reverse recurrence: fills p.dgi, p.dgh and p.dh0; returns dh0."""
    with dev.Loop(p.dtype, math=p.math) as loop:
        plan.backward(loop, p)
    return p.dh0


def tail(p, loop=None):
    """dx and the weight and bias gradients, from the gate gradients (in `loop`, or a Loop
    of its own)."""
    if loop is None:
        with dev.Loop(p.dtype, math=p.math) as loop:
            return tail(p, loop)
    if p.wide:
        return wide_tail(p, loop)
    T, B, I, H, D = p.T, p.B, p.I, p.H, p.D
    G, TB = 3 * H, T * B
    dx = p.dx
    # dx' (I, T*B) = W_ih'' (I, D*3H) @ dgi' (D*3H, T*B): both directions summed in K
    loop.gemm(False, False, I, TB, D * G, p.w_ih.data.ptr, I, 0, p.dgi.data.ptr, D * G, 0,
              0.0, dx.data.ptr, I, 0)
    return (dx,) + weight_grads(loop, p)


def wide_tail(p, loop):
    """tail for a wide pass (wide_pass: float64 gate gradients): every product in float64
    over all T*B rows at once, on x, hs and W_ih widened exactly, into a float64 twin of
    p.grads (and dx into x's widened copy, once dW_ih has read it); each result rounded
    once to float32. The bias gradients are float64 sums too (products with a vector of
    ones); db_hh's r and z parts are db_ih's (the gate gradients of r and z are the same
    values in dgi and dgh), so of dgh only the n gate's columns are summed."""
    T, B, I, H, D = p.T, p.B, p.I, p.H, p.D
    G, TB, DG = 3 * H, T * B, D * 3 * H
    n_ih, n_hh = DG * I, DG * H
    total = n_ih + n_hh + 2 * DG
    xw, hw, w, gw = dev.scratch("tail wide", np.float64, (TB * I,), (D * (T + 1) * B * H,),
                                (n_ih,), (total,))
    ones = dev.ones(TB, np.float64)      # (kept alive while its address is used)
    _plan.convert(loop, p.x, xw, TB * I)
    _plan.convert(loop, p.hs, hw, D * (T + 1) * B * H)
    _plan.convert(loop, p.w_ih, w, n_ih)
    dgi, dgh, out = p.dgi.data.ptr, p.dgh.data.ptr, gw.data.ptr
    # dW_ih' (I, D*3H) = x' (I, T*B) @ dgi (T*B, D*3H): both directions at once
    loop.gemm(False, True, I, DG, TB, xw.data.ptr, I, 0, dgi, DG, 0, 0.0, out, I, 0, wide=True)
    # per direction d: dW_hh[d]' (H, 3H) = hs[d, :T]' (H, T*B) @ dgh[d] (T*B, 3H)
    loop.gemm(False, True, H, G, TB, hw.data.ptr, H, (T + 1) * B * H, dgh, G, TB * G, 0.0,
              out + n_ih * 8, H, G * H, D, wide=True)
    # db_ih (D*3H) = dgi' @ ones; per direction d: db_hh[d] (3H) = db_ih[d]'s r and z,
    # then dgh[d]'s n columns' @ ones
    o_bih, o_bhh = n_ih + n_hh, n_ih + n_hh + DG
    loop.gemm(False, False, DG, 1, TB, dgi, DG, 0, ones.data.ptr, TB, 0, 0.0,
              out + o_bih * 8, DG, 0, wide=True)
    for d in range(D):
        dev.copy_bytes(out + (o_bhh + d * G) * 8, out + (o_bih + d * G) * 8, 2 * H * 8)
    loop.gemm(False, False, H, 1, TB, dgh + 2 * H * 8, G, TB * G, ones.data.ptr, TB, 0, 0.0,
              out + (o_bhh + 2 * H) * 8, G, G, D, wide=True)
    # dx' (I, T*B) = W_ih'' (I, D*3H) @ dgi' (D*3H, T*B), into xw
    loop.gemm(False, False, I, TB, DG, w.data.ptr, I, 0, dgi, DG, 0, 0.0, xw.data.ptr, I, 0,
              wide=True)
    _plan.convert(loop, xw, p.dx, TB * I)
    grads = p.grads
    _plan.convert(loop, gw, grads, total)
    return (p.dx, grads[:n_ih].reshape(D, G, I), grads[n_ih:o_bih].reshape(D, G, H),
            grads[o_bih:o_bih + DG].reshape(D, G), grads[o_bih + DG:].reshape(D, G))


def wgrad_math(math, macs):
    """The math of a weight gradient of `macs` multiply-adds in a pass of `math`:
    "strict" under "tf32" where it takes at most WGRAD_STRICT_MACS, else the pass's."""
    return "strict" if math == "tf32" and macs <= WGRAD_STRICT_MACS else math


def row_chunks(rows):
    """(first row, row count) of each chunk of the weight-gradient sums."""
    per = max(MIN_CHUNK_ROWS, -(-rows // WGRAD_CHUNKS))
    return [(r0, min(per, rows - r0)) for r0 in range(0, rows, per)]


def weight_grads(loop, p):
    """dW_ih (D, 3H, I), dW_hh (D, 3H, H), db_ih (D, 3H) and db_hh (D, 3H): views of the
    pass's flat buffer p.grads, in that order.

    Summed over the T*B rows in chunks (row_chunks), each chunk summed on its own and the
    chunk sums added in chunk order. When all chunks' results fit in WGRAD_PARTIAL_BYTES (or
    WGRAD_PARTIAL_DGI times dgi's bytes), each piece is one GEMM batched over the chunks (two
    when the last chunk is shorter) and gru_sum_chunks adds them up: few host calls. Beyond,
    each chunk's GEMMs add into the result (beta = 1), with no extra memory. Under
    math="tf32" a weight gradient of at most WGRAD_STRICT_MACS multiply-adds is summed in
    float32. The bias sums take gru_bias_sums (at most BIAS_KERNEL_ROWS rows), else GEMMs
    with a vector of ones in float32 (tensor cores gain nothing on a sum of rows).
    """
    assert not p.wide, "a wide pass's gate gradients are float64: wide_tail sums them"
    T, B, I, H, D = p.T, p.B, p.I, p.H, p.D
    dt, G, TB = p.dtype, 3 * H, T * B
    it = dt.itemsize
    x, dgi, hs, dgh = p.x.data.ptr, p.dgi.data.ptr, p.hs.data.ptr, p.dgh.data.ptr
    n_ih, n_hh = D * G * I, D * G * H
    total = n_ih + n_hh + 2 * D * G
    o_hh, o_bih = n_ih, n_ih + n_hh
    o_bhh = o_bih + D * G
    grads = p.grads
    chunks = row_chunks(TB)
    bias_in_kernel = TB <= BIAS_KERNEL_ROWS     # (else GEMMs with a vector of ones)
    if not bias_in_kernel:
        ones_vec = dev.ones(chunks[0][1], dt)   # (kept alive while its address is used)
        ones = ones_vec.data.ptr
    math_ih, math_hh = (wgrad_math(p.math, macs) for macs in (I * D * G * TB, H * G * TB))
    batched = len(chunks) * total * it <= max(WGRAD_PARTIAL_BYTES,
                                              WGRAD_PARTIAL_DGI * TB * D * G * it)
    if batched:
        per = chunks[0][1]
        nfull = len(chunks) if chunks[-1][1] == per else len(chunks) - 1
        # (first chunk, rows per chunk, chunks): the full chunks, then a shorter last one
        runs = [(0, per, nfull)] + ([(nfull, chunks[-1][1], 1)] if nfull < len(chunks) else [])
        part = grads if len(chunks) == 1 else dev.scratch("chunks", dt, (len(chunks), total))[0]
    else:
        runs = [(k, n, 1) for k, (r0, n) in enumerate(chunks)]
        part = grads
    for k0, n, count in runs:
        r0 = chunks[k0][0]
        beta, out = (0.0, part.data.ptr + k0 * total * it) if batched else \
            (0.0 if k0 == 0 else 1.0, grads.data.ptr)
        # dW_ih' (I, D*3H) = x' (I, n) @ dgi[rows] (n, D*3H): both directions at once
        loop.gemm(False, True, I, D * G, n, x + r0 * I * it, I, n * I,
                  dgi + r0 * D * G * it, D * G, n * D * G, beta, out, I, total, count,
                  math=math_ih)
        if not bias_in_kernel:
            # db_ih (D*3H) = dgi[rows]' @ ones
            loop.gemm(False, False, D * G, 1, n, dgi + r0 * D * G * it, D * G, n * D * G,
                      ones, n, 0, beta, out + o_bih * it, D * G, total, count, math="strict")
        for d in range(D):
            # dW_hh[d]' (H, 3H) = hs[d, rows]' (H, n) @ dgh[d, rows] (n, 3H)
            loop.gemm(False, True, H, G, n, hs + (d * (T + 1) * B + r0) * H * it, H,
                      n * H, dgh + (d * TB + r0) * G * it, G, n * G, beta,
                      out + (o_hh + d * G * H) * it, H, total, count, math=math_hh)
            if not bias_in_kernel:
                # db_hh[d] (3H) = dgh[d, rows]' @ ones
                loop.gemm(False, False, G, 1, n, dgh + (d * TB + r0) * G * it, G, n * G,
                          ones, n, 0, beta, out + (o_bhh + d * G) * it, G, total, count,
                          math="strict")
    if batched and len(chunks) > 1:
        n = o_bih if bias_in_kernel else total      # (the weights' part alone)
        loop.launch(dev.kernel("gru_tail.cu", cat.sum_chunks(p.ctype)),
                    (min(-(-n // cat.STEP_THREADS), 4096),), (cat.STEP_THREADS,),
                    {"part": part, "out": grads, "n": n, "ld": total,
                     "chunks": len(chunks)})
    if bias_in_kernel:
        loop.launch(dev.kernel("gru_tail.cu", cat.bias_sums(p.ctype)),
                    (-(-2 * D * G // cat.BIAS_COLS),), (cat.BIAS_COLS, cat.BIAS_LANES),
                    {"dgi": p.dgi, "dgh": p.dgh, "db": grads[o_bih:], "rows": TB,
                     "DG": D * G, "G": G})
    return (grads[:n_ih].reshape(D, G, I), grads[o_hh:o_bih].reshape(D, G, H),
            grads[o_bih:o_bhh].reshape(D, G), grads[o_bhh:].reshape(D, G))
