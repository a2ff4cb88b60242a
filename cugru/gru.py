"""gru_forward and gru_backward: numpy arrays run the oracle, cupy arrays the kernels.

Two GPU paths share the input projection before the recurrence and the weight-gradient GEMMs
after it, and the layouts of every buffer (kernels/gru.cu has them):

fast      (kernels/gru.cu) the whole recurrence in one launch per pass: each block
          keeps its slice of W_hh in shared memory for all steps, and the blocks of a
          direction wait for each other at a barrier every step. path="auto" takes it where
          fast_plan() finds a split that fits the device and the work per step is at most
          FAST_AUTO_MAX_WORK; path="fast" requires only the fit.
steps     the per-step structure, for every shape (path="steps"):

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

import functools
from dataclasses import dataclass

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
#: threads per block of the persistent kernels (GRU_NT of kernels/gru.cu)
FAST_THREADS = 256
#: shared memory a block of the persistent kernels may use for staging the step's vector
#: (h forward, d_gate_h backward): the whole vector when it fits, else chunks of this size
FAST_STAGE_BYTES = 96 * 1024
#: cost model of the block split, in SM clock cycles per forward step. A block's product
#: is bound by its shared-memory loads (a 16-byte load per warp every FAST_LDS_CYCLES), its
#: FMAs (4 warps' instructions per cycle) or the dependent chain of H FMAs per accumulator
#: (FAST_FMA_LATENCY each); every block stages its direction's whole vector from L2, at about
#: FAST_L2_BYTES_PER_CYCLE for the whole chip; a barrier across blocks costs about
#: FAST_BARRIER_CYCLES.
FAST_LDS_CYCLES = 4
FAST_FMA_LATENCY = 4
FAST_L2_BYTES_PER_CYCLE = 3000
FAST_BARRIER_CYCLES = 2000
#: path="auto" takes the fast path up to this much recurrent work per step and direction
#: (B * 3H * H multiply-adds), the per-step path beyond: measured on an H100 (see
#: docs/performance.md), the fast path won up to S5/S6 and tied on S3 (12.6 M), and the
#: per-step path's cuBLAS products won from S8 (50 M) on
FAST_AUTO_MAX_WORK = 1 << 24


@dataclass(frozen=True)
class FastPlan:
    """How the persistent kernels split a direction: `blocks` blocks of `units` hidden units
    each, `rows_per_thread` batch rows per thread, the staging chunk (`kc_fwd`, `kc_bwd`
    elements of a vector row) and the shared memory per block of each kernel (the W_hh slice
    and the staging buffer). Scope "block" (one block per direction: __syncthreads) or "grid"
    (a barrier across the direction's blocks; cooperative launch)."""
    blocks: int
    units: int
    rows_per_thread: int
    kc_fwd: int
    kc_bwd: int
    smem_fwd: int
    smem_bwd: int

    @property
    def scope(self):
        return "block" if self.blocks == 1 else "grid"


def _split(B, H, D, blocks, itemsize, smem_limit):
    """The FastPlan for `blocks` blocks per direction, or None when a block cannot hold it."""
    units = -(-H // blocks)
    blocks = -(-H // units)                      # no block without units
    if units > FAST_THREADS:
        return None
    rows = -(-B // (FAST_THREADS // units))
    maxp = next((p for p in _rt.GRU_MAXP["float" if itemsize == 4 else "double"] if p >= rows),
                None)
    if maxp is None:
        return None
    v = 16 // itemsize
    up = lambda n: -(-n // v) * v  # noqa: E731
    w_fwd, w_bwd = 3 * units * (up(H) + v), units * (up(3 * H) + v)
    kcs = []
    for w, length in ((w_fwd, H), (w_bwd, 3 * H)):
        room = min(smem_limit, FAST_STAGE_BYTES + w * itemsize) // itemsize - w
        kc = min(up(length), (room // B - v) // v * v)
        if kc < v:
            return None
        kcs.append(kc)
    smem = [(w + B * (kc + v)) * itemsize for w, kc in ((w_fwd, kcs[0]), (w_bwd, kcs[1]))]
    return FastPlan(blocks, units, maxp, kcs[0], kcs[1], smem[0], smem[1])


def _cost(plan, B, H, D, itemsize=4):
    """Estimated cycles per forward step of a split (see FAST_LDS_CYCLES)."""
    v = 16 // itemsize
    packs = -(-H // v)
    rows = min(FAST_THREADS // plan.units, B)
    warps = -(-plan.units * rows // 32)
    p = plan.rows_per_thread
    product = max(warps * packs * (3 + p) * FAST_LDS_CYCLES,    # shared-memory loads
                  warps * packs * 3 * v * p / 4,                 # FMA instructions
                  FAST_FMA_LATENCY * H)                          # one accumulator's chain
    stage = plan.blocks * D * B * H * itemsize / FAST_L2_BYTES_PER_CYCLE
    return product + stage + (FAST_BARRIER_CYCLES if plan.blocks > 1 else 0)


def fast_plan(B, H, D, dtype):
    """The fast path's split for batch B, hidden size H and D directions on the current GPU,
    or None where the shape does not fit it (then path="auto" takes the per-step path)."""
    cp = _rt.cupy_module()
    return _fast_plan(int(B), int(H), int(D), np.dtype(dtype).str,
                      cp.cuda.runtime.getDevice())


@functools.lru_cache(maxsize=256)
def _fast_plan(B, H, D, dtype, device_id):
    cp = _rt.cupy_module()
    itemsize = np.dtype(dtype).itemsize
    attrs = cp.cuda.Device(device_id).attributes
    smem_limit, sms = attrs["MaxSharedMemoryPerBlockOptin"], attrs["MultiProcessorCount"]
    plans = {p for p in (_split(B, H, D, n, itemsize, smem_limit) for n in range(1, H + 1))
             if p is not None}
    for plan in sorted(plans, key=lambda p: (_cost(p, B, H, D, itemsize), p.blocks)):
        if plan.blocks * D <= _resident_blocks(plan, dtype, device_id) * sms:
            return plan
    return None


def _resident_blocks(plan, dtype, device_id):
    """Blocks of the persistent kernels (the least of both) that fit on one SM."""
    cp = _rt.cupy_module()
    c = _rt.ctype(dtype)
    least = None
    for name, smem in ((f"gru_persist_forward<{c},{plan.rows_per_thread},true>", plan.smem_fwd),
                       (f"gru_persist_forward<{c},{plan.rows_per_thread},false>", plan.smem_fwd),
                       (f"gru_persist_backward<{c},{plan.rows_per_thread}>", plan.smem_bwd)):
        fn = _persist_kernel(name, smem)
        n = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.kernel.ptr,
                                                                     FAST_THREADS, smem)
        least = n if least is None else min(least, n)
    return least


def _persist_kernel(name, shared_mem):
    fn = _rt.kernel("gru.cu", name)
    if shared_mem > fn.max_dynamic_shared_size_bytes:
        fn.max_dynamic_shared_size_bytes = shared_mem
    return fn


def _choose(path, B, H, D, dtype):
    """The FastPlan to run, or None for the per-step path."""
    oracle.check_path(path)
    if path == "steps" or (path == "auto" and B * 3 * H * H > FAST_AUTO_MAX_WORK):
        return None
    plan = fast_plan(B, H, D, dtype)
    if plan is None and path == "fast":
        raise ValueError(f"path='fast': B = {B}, H = {H}, {D} direction(s) in {np.dtype(dtype)} "
                         "do not fit the fast path on this GPU (docs/api.md lists its limits); "
                         "use path='auto' or 'steps'")
    return plan


def gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, *, bidirectional=False, training=True,
                path="auto"):
    """Run a GRU layer over a sequence; torch.nn.GRU's maths and weight layout.

    x (T, B, I); h0 (D, B, H) or None (zeros); w_ih (D, 3H, I); w_hh (D, 3H, H);
    b_ih, b_hh (D, 3H), gate blocks r | z | n; D = 2 if bidirectional else 1, and for D = 1
    the weights may drop the direction axis. Direction 1 reads the sequence from t = T - 1
    down to 0 (torch's *_reverse weights).

    Returns y (T, B, D*H) (direction 0 in the first H columns), h_n (D, B, H) and `saved`
    (a GruSaved for gru_backward; None when training=False, which keeps no history).
    path (GPU): "auto" (the fast path where the shape fits, else per step), "fast", "steps".
    """
    xp, training, dims, weights, squeeze = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh,
                                                        bidirectional, training)
    oracle.check_path(path)
    if xp is np:
        return oracle.gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional=bidirectional,
                                  training=training)
    T, B, I, H, D = dims
    plan = _choose(path, B, H, D, x.dtype)
    y, h_n, hs, gates = _forward_gpu(x, h0, *weights, dims, training, plan)
    saved = GruSaved(x, weights[0], weights[1], hs, gates, squeeze) if training else None
    return y, h_n, saved


def gru_backward(dy, dh_n, saved, *, path="auto"):
    """Gradients of a GRU layer from the history its forward pass saved.

    dy (T, B, D*H): gradient of y; dh_n (D, B, H) or None: gradient of h_n.
    Returns dx (T, B, I), dh0 (D, B, H), dw_ih, dw_hh, db_ih, db_hh (the weights' shapes).
    Nothing of the forward pass is recomputed. path: as for gru_forward.
    """
    oracle.check_path(path)
    xp, dims = backward_args(dy, dh_n, saved)
    if xp is np:
        return oracle.gru_backward(dy, dh_n, saved)
    T, B, I, H, D = dims
    return _backward_gpu(dy, dh_n, saved, dims, _choose(path, B, H, D, dy.dtype))


def _row_chunks(rows):
    """(first row, row count) of each chunk of the weight-gradient sums."""
    per = max(MIN_CHUNK_ROWS, -(-rows // WGRAD_CHUNKS))
    return [(r0, min(per, rows - r0)) for r0 in range(0, rows, per)]


def _grid(B, H, D):
    return ((B * H + THREADS - 1) // THREADS, D)


def _forward_gpu(x, h0, w_ih, w_hh, b_ih, b_hh, dims, training, plan):
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G = x.dtype, 3 * H
    S = T + 1 if training else 2          # slots of hs: all states, or ping-pong
    gi = cp.empty((T, B, D, G), dt)
    hs = cp.empty((D, S, B, H), dt)
    hs[:, 0] = 0 if h0 is None else h0
    y = cp.empty((T, B, D * H), dt)
    gates = cp.empty((D, T, B, 4 * H), dt) if training else None
    c, train = _rt.ctype(dt), "true" if training else "false"
    i32, it = np.int32, dt.itemsize
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        # gi' (D*3H, T*B) = W_ih' of both directions (D*3H, I) @ x' (I, T*B), column-major
        loop.gemm(True, False, D * G, T * B, I, w_ih.data.ptr, I, 0, x.data.ptr, I, 0,
                  0.0, gi.data.ptr, D * G, 0)
        if plan is not None:
            fn = _persist_kernel(f"gru_persist_forward<{c},{plan.rows_per_thread},{train}>",
                                 plan.smem_fwd)
            loop.launch(fn, (plan.blocks, D), (FAST_THREADS,),
                        (gi, w_hh, b_ih, b_hh, hs, y, y if gates is None else gates,
                         cp.zeros(D, np.uint32), i32(T), i32(B), i32(H), i32(S),
                         i32(plan.units), i32(plan.kc_fwd)),
                        shared_mem=plan.smem_fwd, cooperative=plan.blocks > 1)
        else:
            gh = cp.empty((D, B, G), dt)
            step = loop.kernel(_rt.kernel("gru.cu", f"gru_forward_step<{c},{train}>"),
                               _grid(B, H, D), (THREADS,),
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


def _backward_gpu(dy, dh_n, saved, dims, plan):
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G, TB = dy.dtype, 3 * H, T * B
    x, w_ih, w_hh, hs = saved.x, saved.w_ih, saved.w_hh, saved.hs
    dgi = cp.empty((T, B, D, G), dt)
    dgh = cp.empty((D, T, B, G), dt)
    dx = cp.empty((T, B, I), dt)
    dw_ih, dw_hh = cp.empty((D, G, I), dt), cp.empty((D, G, H), dt)
    db_ih, db_hh = cp.empty((D, G), dt), cp.empty((D, G), dt)
    chunks = _row_chunks(TB)
    ones = cp.ones(chunks[0][1], dt)
    c = _rt.ctype(dt)
    i32, it = np.int32, dt.itemsize
    ptr = lambda a: a.data.ptr  # noqa: E731
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        if plan is not None:
            dh = cp.empty((D, B, H), dt)
            fn = _persist_kernel(f"gru_persist_backward<{c},{plan.rows_per_thread}>",
                                 plan.smem_bwd)
            loop.launch(fn, (plan.blocks, D), (FAST_THREADS,),
                        (dy, saved.gates, hs, w_hh,
                         cp.zeros((D, B, H), dt) if dh_n is None else dh_n, dgi, dgh, dh,
                         cp.zeros(D, np.uint32), i32(T), i32(B), i32(H), i32(plan.units),
                         i32(plan.kc_bwd)),
                        shared_mem=plan.smem_bwd, cooperative=plan.blocks > 1)
        else:
            dh = cp.zeros((D, B, H), dt) if dh_n is None else dh_n.copy()
            step = loop.kernel(_rt.kernel("gru.cu", f"gru_backward_step<{c}>"),
                               _grid(B, H, D), (THREADS,),
                               (dy, saved.gates, hs, dh, dgi, dgh, i32(T), i32(B), i32(H),
                                i32(0)), step_arg=9)
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
