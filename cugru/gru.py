"""gru_forward and gru_backward: numpy arrays run the oracle, cupy arrays the kernels.

Two GPU paths share the input projection before the recurrence and the weight-gradient GEMMs
after it, and the layouts of every buffer (kernels/gru.cu has them):

fast      (kernels/gru.cu) the whole recurrence in one launch per pass. fast_plan() picks
          the scope: a block or a thread-block cluster per group of batch rows, W_hh in
          registers and the state exchanged in (distributed) shared memory, for H up to 256
          (float32) or 128 (float64); beyond, the blocks of a direction keep W_hh slices in
          shared memory and meet at a grid-wide barrier every step. path="auto" takes it
          where fast_plan() finds a split and the work per step is at most
          FAST_AUTO_MAX_WORK; path="fast" requires only the split.
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

import dataclasses
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
#: the chunks run batched (see _weight_grads) while all chunks' partial results take at most
#: WGRAD_PARTIAL_BYTES, or at most WGRAD_PARTIAL_DGI times the bytes of d_gate_i (the backward
#: pass's largest buffer: its peak memory then grows by at most that much). Measured on S8-S10
#: (docs/performance.md): batched, the tail took 12-25% less time.
WGRAD_PARTIAL_BYTES = 32 << 20
WGRAD_PARTIAL_DGI = 1
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


@dataclass(frozen=True)
class TilePlan:
    """How the tile kernels (W_hh in registers) split the work: groups of `cluster` blocks
    (1: a single block, scope "block"; more: a thread-block cluster, scope "cluster",
    distributed shared memory and mbarriers; 0: scope "grid", `group_blocks` blocks that
    exchange through global memory and meet at a counter) of `threads` threads, each group
    one direction and `rows` batch rows (`groups` groups per direction), each block `units`
    hidden units with `lanes` threads per `per_thread` units in the product, each thread
    `packs` 16-byte packs of each gate's weights of each of its units; the kernels are built
    for at most `max_rows` rows (and compute that many). Then the dynamic shared memory per
    block of each kernel. At grid scope `slots` groups per direction run at once (set by
    fast_plan from the GPU's occupancy; all resident, a cooperative launch), each slot's
    blocks taking its groups in turn."""
    cluster: int
    groups: int
    rows: int
    units: int
    lanes: int
    packs: int
    max_rows: int
    threads: int
    per_thread: int
    smem_fwd: int
    smem_bwd: int
    group_blocks: int = 0
    slots: int = 0

    @property
    def scope(self):
        return {0: "grid", 1: "block"}.get(self.cluster, "cluster")

    @property
    def per_group(self):
        """blocks per group"""
        return self.cluster or self.group_blocks

    @property
    def blocks(self):
        """blocks per direction launched"""
        return (self.groups if self.cluster else self.slots) * self.per_group

    @property
    def tile(self):
        """the tile kernels' TILES entry"""
        return (self.cluster, self.packs, self.max_rows, self.threads, self.per_thread)

    def forward_kernel(self, ctype, train):
        """the registered name of the forward kernel for element type `ctype`"""
        return _rt.gru_tile_kernel(ctype, self.tile, bool(train))

    def backward_kernel(self, ctype):
        return _rt.gru_tile_kernel(ctype, self.tile)

    def launch_args(self, cp, D):
        """the kernels' last arguments: the grid scope's counters (D x slots zeros; else a
        null pointer), blocks per group and groups per direction"""
        counters = (np.int64(0) if self.cluster else cp.zeros(D * self.slots, np.uint32))
        return (counters, np.int32(self.per_group), np.int32(self.groups))


#: the tile kernels built (cukernels._rt.GRU_TILES): per element size, (cluster, packs per
#: thread, gate and unit, most rows, threads, units per thread), cluster 0 for grid scope;
#: the most lanes per unit (GRU_TILE_MAX_LANES and GRU_GRID_MAX_LANES in kernels/gru.cu); the
#: inputs of TILE_AHEAD steps are in flight
TILES = {4: _rt.GRU_TILES["float"], 8: _rt.GRU_TILES["double"]}
TILE_MAX_LANES = 8
GRID_MAX_LANES = 64
TILE_AHEAD = 8
#: path="auto" takes a grid-scope tile plan up to this many waves of groups (each wave runs
#: the whole recurrence), the per-step path beyond (see docs/performance.md)
GRID_AUTO_MAX_WAVES = 2


def _tile_split(B, H, D, tile, rows, itemsize):
    """The TilePlan of the tile kernels `tile` (a TILES entry) for `rows` rows per group, or
    None where they cannot hold it. At grid scope `slots` is left 0 (fast_plan sets it)."""
    cluster, packs, max_rows, threads, per_thread = tile
    v = 16 // itemsize
    if B * D * 4 * H >= 2 ** 31 or rows > max_rows:
        return None       # (the kernels address a step's rows with 32-bit offsets)
    lanes = 1             # the fewest lanes whose packs cover H
    while lanes * packs * v < H:
        lanes *= 2
    if cluster == 0:
        # as few blocks per group as hold H, each the most units its threads take
        if H % v or lanes > GRID_MAX_LANES or threads // lanes == 0:
            return None   # (the vector moves in 16-byte packs)
        blocks = -(-H // (threads // lanes * per_thread))
        units = -(-H // blocks)                      # then whole units per thread
        units = -(-units // per_thread) * per_thread
        if (blocks - 1) * units >= H or units * rows > threads:
            return None
    else:
        units = -(-H // cluster)
        if cluster > 1:
            units = -(-units // v) * v      # the exchange moves 16-byte packs of units
        if (cluster - 1) * units >= H or units * rows > threads:
            return None   # a block without units, or more pointwise steps than threads
        if lanes > TILE_MAX_LANES:
            return None
        blocks = cluster
    if units % per_thread or units // per_thread * lanes > threads:
        return None
    hs = lanes * packs * v                  # a vector row in shared memory, zero past H
    part = max_rows * 3 * units * lanes     # the lanes' sums
    # vector buffers and the unused gap before the ring (kernels/gru.cu, GruTile): two each,
    # grid scope one and none
    nv, ng = (2, 2) if cluster else (1, 0)
    return TilePlan(cluster, -(-B // rows), rows, units, lanes, packs, max_rows, threads,
                    per_thread,
                    16 + (nv * max_rows * hs + part + ng * rows * units
                          + TILE_AHEAD * rows * 3 * units + 6 * units) * itemsize,
                    16 + (3 * nv * max_rows * hs + part + 3 * ng * rows * units
                          + TILE_AHEAD * rows * 6 * units) * itemsize,
                    0 if cluster else blocks)


def _tile_rank(plan, D, clusters_at_once):
    """The order in which fast_plan prefers tile splits, from the measurements in
    docs/performance.md (`python -m bench.gru --sweep`): fewest waves of groups (groups run
    at once only as far as the GPU holds their blocks), then the fewest rows the kernel
    computes per group (a step's time grows with them), then the scope: one block of 256
    threads (no exchange), then a cluster, then one block of 512 threads (a cluster of two
    was faster in both passes on S2 and S7: half the product per SM for an exchange through
    st.async), then grid scope. Then most weights per thread (fewer lanes: fewer warps in
    the product and fewer lane sums to add), then two units per thread before one or four (a
    pack loaded from shared memory serves two units; the sweeps put 4 packs x 2 units ahead
    of 2 x 4 on S1 in both passes, and ahead of 8 x 1 in S2's and S7's backward), then fewer
    threads, then the cluster size: 4 blocks first, then the smaller (on S7 the 4-block
    kernels beat the 2- and 8-block ones forward, by 6-9%, and, since the warps with
    pointwise steps leave the product to the others, backward too: 0.71-0.76 against
    0.79-0.82 µs a step); then the most rows per group (fewer groups busy)."""
    waves = -(-(plan.groups * D) // max(1, clusters_at_once))
    scope = {0: 3, 1: 0 if plan.threads <= 256 else 2}.get(plan.cluster, 1)
    size = (abs(plan.cluster - 4), plan.cluster)
    return (waves, plan.max_rows, scope, -plan.packs * plan.per_thread,
            abs(plan.per_thread - 2), plan.threads, size, -plan.rows)


def fast_plan(B, H, D, dtype, backward=False):
    """The fast path's split for batch B, hidden size H and D directions on the current GPU,
    for the forward pass (or with `backward` the backward pass; both passes share every
    buffer's layout, so they may take different splits): a TilePlan where the tile kernels
    hold the shape, else a FastPlan (the earlier grid-scope kernels), or None where neither
    fits (then path="auto" takes the per-step path)."""
    cp = _rt.cupy_module()
    return _fast_plan(int(B), int(H), int(D), np.dtype(dtype).str,
                      cp.cuda.runtime.getDevice(), bool(backward))


@functools.lru_cache(maxsize=256)
def _fast_plan(B, H, D, dtype, device_id, backward=False):
    cp = _rt.cupy_module()
    itemsize = np.dtype(dtype).itemsize
    dev = cp.cuda.Device(device_id)
    attrs = dev.attributes
    smem_limit, sms = attrs["MaxSharedMemoryPerBlockOptin"], attrs["MultiProcessorCount"]
    cc = int(dev.compute_capability)
    splits = [p for p in (_tile_split(B, H, D, tile, r, itemsize)
                          for tile in TILES[itemsize] if _rt.gru_tile_runs_on(tile, cc)
                          for r in range(1, tile[2] + 1))
              if p is not None and max(p.smem_fwd, p.smem_bwd) <= smem_limit]
    # forward: block and cluster scope first, grid scope where neither holds the shape;
    # backward: all ranked together
    for scoped in ([splits] if backward else
                   ([p for p in splits if p.cluster], [p for p in splits if not p.cluster])):
        ranked = [(_resident(p, D, n), n)
                  for p, n in ((p, _clusters_at_once(p, dtype, device_id)) for p in scoped)]
        ranked = [(p, n) for p, n in ranked if p is not None]
        if ranked:
            return min(ranked, key=lambda pn: _tile_rank(pn[0], D, pn[1]))[0]
    plans = {p for p in (_split(B, H, D, n, itemsize, smem_limit) for n in range(1, H + 1))
             if p is not None}
    for plan in sorted(plans, key=lambda p: (_cost(p, B, H, D, itemsize), p.blocks)):
        if plan.blocks * D <= _resident_blocks(plan, dtype, device_id) * sms:
            return plan
    return None


def _resident(plan, D, at_once):
    """`plan` ready to launch when the GPU runs `at_once` of its groups together (over all D
    directions): at grid scope with its slots per direction, or None where not even one
    group per direction fits (a cooperative launch would be refused); other scopes as given."""
    if plan.cluster:
        return plan
    slots = min(plan.groups, at_once // D)
    return dataclasses.replace(plan, slots=slots) if slots >= 1 else None


@functools.lru_cache(maxsize=256)
def _clusters_at_once(plan, dtype, device_id):
    """How many groups of the plan's tile kernels the GPU runs at once (over all
    directions): for clusters the driver's occupancy query, or SMs // cluster where it has
    none; else the blocks resident at once // blocks per group."""
    cp = _rt.cupy_module()
    c = _rt.ctype(dtype)
    sms = cp.cuda.Device(device_id).attributes["MultiProcessorCount"]
    least = None
    for name, smem in ((plan.forward_kernel(c, True), plan.smem_fwd),
                       (plan.forward_kernel(c, False), plan.smem_fwd),
                       (plan.backward_kernel(c), plan.smem_bwd)):
        fn = _persist_kernel(name, smem)
        if plan.cluster <= 1:
            n = sms * cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                fn.kernel.ptr, plan.threads, smem) // plan.per_group
        else:
            n = _rt.max_active_clusters(fn.kernel.ptr, plan.cluster, plan.threads, smem)
            if n is None:
                n = sms // plan.cluster
        least = n if least is None else min(least, n)
    return least


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
    """The kernel, allowed `shared_mem` bytes of dynamic shared memory (set once per size)."""
    fn = _rt.kernel("gru.cu", name)
    done = _SMEM_SET.get(name)
    if done is None or done[0] is not fn or done[1] < shared_mem:
        if shared_mem > fn.max_dynamic_shared_size_bytes:
            fn.max_dynamic_shared_size_bytes = shared_mem
        _SMEM_SET[name] = (fn, shared_mem)      # (a rebuilt module gives a new kernel object)
    return fn


_SMEM_SET = {}


def _choose(path, B, H, D, dtype, backward=False):
    """The plan to run (forward, or the backward pass), or None for the per-step path."""
    oracle.check_path(path)
    if path == "steps":
        return None
    plan = fast_plan(B, H, D, dtype, backward)
    if path == "auto":
        if isinstance(plan, FastPlan) and B * 3 * H * H > FAST_AUTO_MAX_WORK:
            return None
        if isinstance(plan, TilePlan) and not plan.cluster and \
                -(-plan.groups // plan.slots) > GRID_AUTO_MAX_WAVES:
            return None
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
    return _backward_gpu(dy, dh_n, saved, dims, _choose(path, B, H, D, dy.dtype, True))


def _row_chunks(rows):
    """(first row, row count) of each chunk of the weight-gradient sums."""
    per = max(MIN_CHUNK_ROWS, -(-rows // WGRAD_CHUNKS))
    return [(r0, min(per, rows - r0)) for r0 in range(0, rows, per)]


def _weight_grads(loop, x, dgi, hs, dgh, dims):
    """S2 and S3: dW_ih, dW_hh, db_ih and db_hh, flat in one buffer in that order.

    Summed over the T*B rows in chunks (_row_chunks), each chunk summed on its own and the
    chunk sums added in chunk order. When all chunks' results fit in WGRAD_PARTIAL_BYTES (or
    WGRAD_PARTIAL_DGI times dgi's bytes), each piece is one GEMM batched over the chunks (two
    when the last chunk is shorter) and gru_sum_chunks adds them up: few host calls. Beyond,
    each chunk's GEMMs add into the result (beta = 1), with no extra memory. The bias sums
    are GEMMs with a vector of ones.
    """
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G, TB = dgi.dtype, 3 * H, T * B
    it = dt.itemsize
    ptr = lambda a: a.data.ptr  # noqa: E731
    total = D * G * (I + H + 2)
    o_hh, o_bih = D * G * I, D * G * (I + H)
    o_bhh = o_bih + D * G
    grads = cp.empty(total, dt)
    chunks = _row_chunks(TB)
    ones = _ones(chunks[0][1], dt)
    batched = len(chunks) * total * it <= max(WGRAD_PARTIAL_BYTES,
                                              WGRAD_PARTIAL_DGI * dgi.nbytes)
    if batched:
        per = chunks[0][1]
        nfull = len(chunks) if chunks[-1][1] == per else len(chunks) - 1
        # (first chunk, rows per chunk, chunks): the full chunks, then a shorter last one
        runs = [(0, per, nfull)] + ([(nfull, chunks[-1][1], 1)] if nfull < len(chunks) else [])
        part = grads if len(chunks) == 1 else cp.empty((len(chunks), total), dt)
    else:
        runs = [(k, n, 1) for k, (r0, n) in enumerate(chunks)]
        part = grads
    for k0, n, count in runs:
        r0 = chunks[k0][0]
        beta, out = (0.0, ptr(part) + k0 * total * it) if batched else \
            (0.0 if k0 == 0 else 1.0, ptr(grads))
        # dW_ih' (I, D*3H) = x' (I, n) @ dgi[rows] (n, D*3H): both directions at once
        loop.gemm(False, True, I, D * G, n, ptr(x) + r0 * I * it, I, n * I,
                  ptr(dgi) + r0 * D * G * it, D * G, n * D * G, beta, out, I, total, count)
        # db_ih (D*3H) = dgi[rows]' @ ones
        loop.gemm(False, False, D * G, 1, n, ptr(dgi) + r0 * D * G * it, D * G, n * D * G,
                  ptr(ones), n, 0, beta, out + o_bih * it, D * G, total, count)
        for d in range(D):
            # dW_hh[d]' (H, 3H) = hs[d, rows]' (H, n) @ dgh[d, rows] (n, 3H)
            loop.gemm(False, True, H, G, n, ptr(hs) + (d * (T + 1) * B + r0) * H * it, H,
                      n * H, ptr(dgh) + (d * TB + r0) * G * it, G, n * G, beta,
                      out + (o_hh + d * G * H) * it, H, total, count)
            # db_hh[d] (3H) = dgh[d, rows]' @ ones
            loop.gemm(False, False, G, 1, n, ptr(dgh) + (d * TB + r0) * G * it, G, n * G,
                      ptr(ones), n, 0, beta, out + (o_bhh + d * G) * it, G, total, count)
    if batched and len(chunks) > 1:
        loop.launch(_rt.kernel("gru.cu", f"gru_sum_chunks<{_rt.ctype(dt)}>"),
                    (min(-(-total // THREADS), 4096),), (THREADS,),
                    (part, grads, np.int64(total), np.int64(total), np.int32(len(chunks))))
    return grads


def _ones(n, dtype):
    """A device vector of n ones, kept per (n, dtype, device) for the bias GEMMs."""
    cp = _rt.cupy_module()
    key = (n, np.dtype(dtype).str, cp.cuda.runtime.getDevice())
    vec = _ONES.get(key)
    if vec is None:
        vec = _ONES[key] = cp.ones(n, dtype)
    return vec


_ONES = {}


def _grid(B, H, D):
    return ((B * H + THREADS - 1) // THREADS, D)


def _forward_gpu(x, h0, w_ih, w_hh, b_ih, b_hh, dims, training, plan):
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G = x.dtype, 3 * H
    S = T + 1 if training else 2          # slots of hs: all states, or ping-pong
    gi = cp.empty((T, B, D, G), dt)
    hs = cp.empty((D, S, B, H), dt)
    it, BH = dt.itemsize, B * H
    for d in range(D):                    # slot 0 of each direction: h0 (or zeros)
        if h0 is None:
            _rt.zero_bytes(hs.data.ptr + d * S * BH * it, BH * it)
        else:
            _rt.copy_bytes(hs.data.ptr + d * S * BH * it, h0.data.ptr + d * BH * it, BH * it)
    h_n = cp.empty((D, B, H), dt)
    y = cp.empty((T, B, D * H), dt)
    gates = cp.empty((D, T, B, 4 * H), dt) if training else None
    c, train = _rt.ctype(dt), "true" if training else "false"
    i32 = np.int32
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        # gi' (D*3H, T*B) = W_ih' of both directions (D*3H, I) @ x' (I, T*B), column-major
        loop.gemm(True, False, D * G, T * B, I, w_ih.data.ptr, I, 0, x.data.ptr, I, 0,
                  0.0, gi.data.ptr, D * G, 0)
        if isinstance(plan, TilePlan):
            fn = _persist_kernel(plan.forward_kernel(c, training), plan.smem_fwd)
            loop.launch(fn, (plan.blocks, D), (plan.threads,),
                        (gi, w_hh, b_ih, b_hh, hs, y, y if gates is None else gates, h_n,
                         i32(T), i32(B), i32(H), i32(S), i32(plan.units), i32(plan.lanes),
                         i32(plan.rows)) + plan.launch_args(cp, D),
                        shared_mem=plan.smem_fwd, cooperative=not plan.cluster)
        elif plan is not None:
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
    if not isinstance(plan, TilePlan):   # (the tile kernels write h_n themselves)
        for d in range(D):
            _rt.copy_bytes(h_n.data.ptr + d * BH * it, hs.data.ptr + (d * S + T % S) * BH * it,
                           BH * it)
    return y, h_n, (hs if training else None), gates


def _backward_gpu(dy, dh_n, saved, dims, plan):
    dgi, dgh, dh = _backward_recurrence(dy, dh_n, saved, dims, plan)
    dx, dw_ih, dw_hh, db_ih, db_hh = _backward_tail(saved, dgi, dgh, dims)
    return (dx, dh) + unsqueeze_grads(saved, dw_ih, dw_hh, db_ih, db_hh)


def _backward_recurrence(dy, dh_n, saved, dims, plan):
    """The reverse recurrence: d_gate_i by time (dgi), d_gate_h by step (dgh) and dh0."""
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G, TB = dy.dtype, 3 * H, T * B
    w_hh, hs = saved.w_hh, saved.hs
    dgi = cp.empty((T, B, D, G), dt)
    dgh = cp.empty((D, T, B, G), dt)
    c = _rt.ctype(dt)
    i32, it = np.int32, dt.itemsize
    ptr = lambda a: a.data.ptr  # noqa: E731
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        if isinstance(plan, TilePlan):
            dh = cp.empty((D, B, H), dt)
            fn = _persist_kernel(plan.backward_kernel(c), plan.smem_bwd)
            loop.launch(fn, (plan.blocks, D), (plan.threads,),
                        (dy, saved.gates, hs, w_hh,
                         np.int64(0) if dh_n is None else dh_n, dgi, dgh, dh,   # 0: null
                         i32(T), i32(B), i32(H), i32(plan.units), i32(plan.lanes),
                         i32(plan.rows)) + plan.launch_args(cp, D),
                        shared_mem=plan.smem_bwd, cooperative=not plan.cluster)
        elif plan is not None:
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
    return dgi, dgh, dh


def _backward_tail(saved, dgi, dgh, dims):
    """S4 (dx) and S2, S3 (the weight and bias gradients) from the gate gradients."""
    cp = _rt.cupy_module()
    T, B, I, H, D = dims
    dt, G, TB = dgi.dtype, 3 * H, T * B
    dx = cp.empty((T, B, I), dt)
    ptr = lambda a: a.data.ptr  # noqa: E731
    with _rt.StepLoop(dt, plain=PLAIN_LAUNCH) as loop:
        # S4: dx' (I, T*B) = W_ih'' (I, D*3H) @ dgi' (D*3H, T*B): both directions summed in K
        loop.gemm(False, False, I, TB, D * G, ptr(saved.w_ih), I, 0, ptr(dgi), D * G, 0,
                  0.0, ptr(dx), I, 0)
        grads = _weight_grads(loop, saved.x, dgi, saved.hs, dgh, dims)
    n_ih, n_hh = D * G * I, D * G * H
    return (dx, grads[:n_ih].reshape(D, G, I), grads[n_ih:n_ih + n_hh].reshape(D, G, H),
            grads[n_ih + n_hh:n_ih + n_hh + D * G].reshape(D, G),
            grads[n_ih + n_hh + D * G:].reshape(D, G))


