"""The GPU plans checked without a GPU: every cuBLAS call, kernel argument and index.

CI has no GPU, so this runs cugru's GPU code path on the CPU, replacing its one seam to the
device, cugru._device, with stand-ins: device arrays are numpy arrays that expose
``.data.ptr``; ``Loop.gemm`` performs the column-major strided-batched GEMM it is given on
raw addresses (so a wrong leading dimension, stride, offset or transpose gives a wrong
result); and the kernels are line-by-line numpy transcriptions of cugru/kernels' index
arithmetic, called with the arguments by name, which must be exactly the parameters the
CUDA declaration has. The results must equal the oracle's. The real kernels are checked
against the oracle on the GPU (test_gru_gpu.py).
"""
import ctypes
import dataclasses
import types

import numpy as np
import pytest

from cugru import _args, _catalog, _device, _passes, oracle, plans
from cugru.saved import GruSaved
from cukernels import runtime
from gru_cases import pairwise, problem, weights


@pytest.fixture(autouse=True)
def _batched_pointers(monkeypatch):
    """The planner's stand-in GPUs have cuBLAS's batched GEMM of pointer arrays (the
    library CuPy loads: _device.has_batched_pointers), as a GPU machine does; a test that
    takes it away says so."""
    monkeypatch.setattr(_device, "has_batched_pointers", lambda: True)


class DevArray(np.ndarray):
    """A numpy array posing as a device array: .data.ptr is its address."""

    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    def copy(self):
        return np.array(self).view(DevArray)


def _matrix(address, rows, cols, ld, dtype):
    """The column-major (rows, cols) matrix with leading dimension ld at a raw address."""
    itemsize = np.dtype(dtype).itemsize
    n = (cols - 1) * ld + rows
    ctype = ctypes.c_float if itemsize == 4 else ctypes.c_double
    flat = np.ctypeslib.as_array((ctype * n).from_address(address))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (itemsize, ld * itemsize),
                                           writeable=True)


def tf32(a):
    """`a` with each value rounded to TF32's 11 significant bits (to nearest, ties to
    even), as tensor cores read their inputs with math="tf32"."""
    m, e = np.frexp(a)
    return np.ldexp(np.round(m * 2.0 ** 11) / 2.0 ** 11, e)


class HostLoop:
    """_device.Loop's interface, computed with numpy on raw addresses; with math="tf32" its
    products round their inputs to TF32 first. `made` lists the math of each loop made."""
    made: list = []
    keys: list = []     # (the keys of Loop.replay's calls)
    active: list = []   # (the KeyedLoops of the replays being issued, innermost last)
    products: list = []     # ((m, n, k, batch, math) of each product)
    wide: list = []     # ((m, n, k, batch) of each product in float64 on a float32 pass)

    def __init__(self, dtype, plain=False, math="strict"):
        self.dtype = np.dtype(dtype)
        self.math = math
        HostLoop.made.append(math)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def gemm(self, transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch=1,
             math=None, wide=False):
        dt = np.dtype(np.float64) if wide else self.dtype
        it = dt.itemsize
        HostLoop.products.append((m, n, k, batch, self.math if math is None else math))
        if wide:
            assert self.dtype == np.float32 and self.math == "strict" and math is None
            HostLoop.wide.append((m, n, k, batch))
        for i in range(batch):
            a = _matrix(A + i * sA * it, *((k, m) if transa else (m, k)), lda, dt)
            b = _matrix(B + i * sB * it, *((n, k) if transb else (k, n)), ldb, dt)
            c = _matrix(C + i * sC * it, m, n, ldc, dt)
            if (self.math if math is None else math) == "tf32":
                a, b = tf32(a), tf32(b)
            product = (a.T if transa else a) @ (b.T if transb else b)
            c[...] = product + beta * c if beta else product

    def has_gemm_pointers(self):
        return True

    def gemm_pointers(self, transa, transb, m, n, k, A, lda, B, ldb, beta, C, ldc, batch,
                      wide=False):
        """The batched GEMM of pointer arrays: each item's addresses read from the tables at
        A, B and C (device arrays of uint64), then gemm on each (`wide`: in float64)."""
        for a, b, c in zip(*(_table(t, batch) for t in (A, B, C))):
            self.gemm(transa, transb, m, n, k, int(a), lda, 0, int(b), ldb, 0, beta, int(c),
                      ldc, 0, wide=wide)

    def launch(self, kern, grid, block, args, *, shared_mem=0, cooperative=False):
        kern(grid, block, shared_mem, cooperative, **args)

    def launch_args(self, kern, grid, block, values, *, shared_mem=0):
        assert len(values) == len(kern.names), (kern.name, len(values))
        kern(grid, block, shared_mem, False, **dict(zip(kern.names, values)))

    def kernel(self, kern, grid, block, args, step_arg):
        args = dict(args)

        def launch(step):
            args[step_arg] = step
            kern(grid, block, 0, False, **args)
        return launch

    def bind(self):
        pass

    forks: list = []    # (one item a Loop.fork)

    def can_fork(self):
        return True

    def fork(self):
        HostLoop.forks.append(self.dtype)
        return ForkedLoop(self)

    def join(self, other):
        assert other.queue, "a fork that issued nothing"
        other.run()

    def replay(self, key, issue):
        """Issues the calls on a KeyedLoop: each must touch only buffers that `key` names
        (what Loop.replay's CUDA graph may be launched on)."""
        HostLoop.keys.append(key)
        keyed = KeyedLoop(self, key)
        HostLoop.active.append(keyed)
        try:
            issue(keyed)
        finally:
            HostLoop.active.pop()


def _bytes_named(address, nbytes):
    """A copy's or a memset's bytes, issued within a replay, must lie in a buffer its key
    (and every enclosing replay's) names."""
    if HostLoop.active:
        HostLoop.active[-1]._named(address, nbytes)


def _host_copy(dst, src, nbytes):
    _bytes_named(dst, nbytes)
    _bytes_named(src, nbytes)
    ctypes.memmove(dst, src, nbytes)


def _host_zero(dst, nbytes):
    _bytes_named(dst, nbytes)
    ctypes.memset(dst, 0, nbytes)


def _table(address, n):
    """The n uint64 addresses of a pointer table at a raw address."""
    return np.ctypeslib.as_array((ctypes.c_uint64 * n).from_address(address)).copy()


def _key_buffers(key):
    """The (address, bytes) of every buffer a graph_key names."""
    if isinstance(key, tuple):
        if len(key) == 3 and key[0] == "buffer":
            return [key[1:]]
        return [b for item in key for b in _key_buffers(item)]
    return []


class KeyedLoop(HostLoop):
    """A HostLoop whose products, launches, copies and memsets (the last two through the
    host_device fixture's copy_bytes and zero_bytes) fail on an address outside the
    buffers of a replay's key (the per-step recurrence's, and the inference passes' of the
    plans that capture: _passes.replayed_inference); a replay inside a replay (the per-step
    recurrence in an inference pass's capture) checks its calls against both keys."""

    def __init__(self, loop, key):
        self.dtype, self.math = loop.dtype, loop.math
        self.buffers = _key_buffers(key)
        self.within = loop if isinstance(loop, KeyedLoop) else None

    def _named(self, address, nbytes):
        assert any(a <= address and address + nbytes <= a + n for a, n in self.buffers), \
            (address, nbytes, self.buffers)
        if self.within is not None:
            self.within._named(address, nbytes)

    def gemm(self, transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch=1,
             math=None, wide=False):
        it = 8 if wide else self.dtype.itemsize
        for address, ld, cols, rows, stride in ((A, lda, *((m, k) if transa else (k, m)), sA),
                                                (B, ldb, *((k, n) if transb else (n, k)), sB),
                                                (C, ldc, n, m, sC)):
            # (column-major: `cols` columns of `rows` elements, ld apart; per batch item)
            self._named(address, ((batch - 1) * stride + (cols - 1) * ld + rows) * it)
        super().gemm(transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch,
                     math, wide)

    def gemm_pointers(self, transa, transb, m, n, k, A, lda, B, ldb, beta, C, ldc, batch,
                      wide=False):
        for table in (A, B, C):
            self._named(table, batch * 8)
        # (each item's operands are checked by gemm against the key's buffers)
        super().gemm_pointers(transa, transb, m, n, k, A, lda, B, ldb, beta, C, ldc, batch,
                              wide)

    def _arrays_named(self, values):
        for value in values:
            if isinstance(value, np.ndarray):
                self._named(value.ctypes.data, value.nbytes)

    def kernel(self, kern, grid, block, args, step_arg):
        self._arrays_named(args.values())
        return super().kernel(kern, grid, block, args, step_arg)

    def launch(self, kern, grid, block, args, *, shared_mem=0, cooperative=False):
        self._arrays_named(args.values())
        super().launch(kern, grid, block, args, shared_mem=shared_mem, cooperative=cooperative)

    def launch_args(self, kern, grid, block, values, *, shared_mem=0):
        self._arrays_named(values)
        super().launch_args(kern, grid, block, values, shared_mem=shared_mem)


class ForkedLoop:
    """HostLoop.fork's loop: its calls wait in a queue, each run `lag` calls of its own
    late (None: all at join, after every call of the loop it forked from), orders two
    streams allow. All at join, a chain that read what the other writes within a step
    would compute wrong results; one call late, each of its calls runs after the other
    chain's next calls, so a buffer both chains wrote (a shared temporary) would too."""
    lag = None

    def __init__(self, loop):
        self.loop, self.queue = loop, []
        self.dtype, self.math = loop.dtype, loop.math

    def run(self):
        queue, self.queue = self.queue, None
        for call in queue:
            call()

    def _add(self, call):
        self.queue.append(call)
        if self.lag is not None and len(self.queue) > self.lag:
            self.queue.pop(0)()

    def gemm(self, *args, **kw):
        self._add(lambda: self.loop.gemm(*args, **kw))

    def gemm_pointers(self, *args, **kw):
        self._add(lambda: self.loop.gemm_pointers(*args, **kw))

    def launch(self, *args, **kw):
        self._add(lambda: self.loop.launch(*args, **kw))

    def kernel(self, kern, grid, block, args, step_arg):
        launch = self.loop.kernel(kern, grid, block, args, step_arg)
        return lambda step: self._add(lambda: launch(step))


class HostKernel:
    """A kernel's numpy transcription, called as the launch layer would launch the kernel:
    the arguments must be exactly the parameters of the kernel's CUDA declaration."""

    def __init__(self, family, name, run):
        self.name, self.run = name, run
        self.names = [n for n, _ in runtime.signatures(family)[name.split("<")[0]]]

    def __call__(self, grid, block, smem, cooperative, **args):
        assert sorted(args) == sorted(self.names), (self.name, sorted(args))
        # (the transcriptions are of the plain instances: no quantizer runs; the
        # quantization-aware instances are checked against the oracle on the GPU)
        quant = {k: args.pop(k) for k in list(args) if k.startswith("q_")}
        flags = self.name.rstrip(">").split(",")
        while flags[-1] in ("float", "double"):
            flags = flags[:-1]      # (the products' and the projection's element types)
        if self.name.startswith("gru_tile"):
            # the tile instances' last flag is LEN: only those read lengths
            assert (flags[-1] == "true") == (args["lengths"] is not None), self.name
            flags = flags[:-1]
        assert quant.get("q_flags", 0) == 0 and (not quant or flags[-1] == "false"), self.name
        self.run(grid, block, smem, cooperative, **args)


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def forward_step(train, gi_type):
    """gru_forward_step<T, TRAIN, QAT, P, GI>, one direction d (of d0 .. d0 + grid[1] - 1)
    per loop turn, all (b, j) at
    once, the instance whose projection type GI is `gi_type`; with P = double (hw given)
    the projection and the product read are rounded to T first, and h after the step also
    goes widened into slot (s + 1) % 2 of hw."""
    def run(grid, block, smem, cooperative, gi, gh, b_ih, b_hh, hs, y, gates, hw, lengths,
            steps, B, H, S, D, d0, s):
        assert 0 <= d0 and d0 + grid[1] <= D
        assert gi.dtype == gi_type and (hw is None) == (gh.dtype == hs.dtype)
        b_ih, b_hh, hs, y, gates = (a.reshape(-1) for a in (b_ih, b_hh, hs, y, gates))
        gi, gh = (a.reshape(-1).astype(hs.dtype) for a in (gi, gh))
        BH, H3 = B * H, 3 * H
        for d in range(d0, d0 + grid[1]):
            i = np.arange(BH)
            b, j = i // H, i % H
            t = s if d == 0 else steps - 1 - s
            gi_row, gh_row, bias = (t * B + b) * D * H3 + d * H3, (d * B + b) * H3, d * H3
            h = hs[(d * S + s % S) * BH + i]
            r = _sigmoid((gi[gi_row + j] + b_ih[bias + j]) + (gh[gh_row + j] + b_hh[bias + j]))
            z = _sigmoid((gi[gi_row + H + j] + b_ih[bias + H + j])
                         + (gh[gh_row + H + j] + b_hh[bias + H + j]))
            hn = gh[gh_row + 2 * H + j] + b_hh[bias + 2 * H + j]
            n = np.tanh((gi[gi_row + 2 * H + j] + b_ih[bias + 2 * H + j]) + r * hn)
            h_new = (1 - z) * n + z * h
            on = t < _length(lengths, b, steps)
            hs[(d * S + (s + 1) % S) * BH + i] = np.where(on, h_new, h)
            if hw is not None:
                hw.reshape(-1)[(((s + 1) & 1) * D + d) * BH + i] = np.where(on, h_new, h)
            y[(t * B + b) * D * H + d * H + j] = np.where(on, h_new, 0)
            if train:
                g = ((d * steps + s) * B + b) * 4 * H
                gates[g + j], gates[g + H + j], gates[g + 2 * H + j], gates[g + 3 * H + j] = \
                    r, z, n, hn
    return run


def _length(lengths, b, steps):
    """gru_length: row b's length (lengths null: every step)."""
    return steps if lengths is None else lengths.reshape(-1)[b]


def gate_step(dy, gates, hs, dgi, dgh, carry, d, s, t, b, j, steps, B, H, D, lengths):
    """gru_common.cuh's gru_read_history, gru_cell_backward (gru_skip_backward where the
    step does not run) and gru_write_backward for the units (d, b, j) at step s (time t),
    from their carried gradient: returns dh * z, the direct part of the next carry (the
    carry itself where the step does not run; flat arrays)."""
    H3 = 3 * H
    g = ((d * steps + s) * B + b) * 4 * H
    r, z, n, hn = gates[g + j], gates[g + H + j], gates[g + 2 * H + j], gates[g + 3 * H + j]
    h = hs[((d * (steps + 1) + s) * B + b) * H + j]
    dh = dy[(t * B + b) * D * H + d * H + j] + carry
    dn = dh * (1 - z) * (1 - n * n)
    dz = dh * (h - n) * z * (1 - z)
    dr = dn * hn * r * (1 - r)
    on = t < _length(lengths, b, steps)
    dr, dz, dn, r = (np.where(on, v, 0) for v in (dr, dz, dn, r))
    row_i, row_h = (t * B + b) * D * H3 + d * H3, ((d * steps + s) * B + b) * H3
    dgi[row_i + j], dgi[row_i + H + j], dgi[row_i + 2 * H + j] = dr, dz, dn
    dgh[row_h + j], dgh[row_h + H + j], dgh[row_h + 2 * H + j] = dr, dz, dn * r
    return np.where(on, dh * z, carry)


def backward_step(grid, block, smem, cooperative, dy, gates, hs, dh, dgi, dgh, lengths,
                  steps, B, H, D, d0, s):
    """gru_backward_step<T, QAT, P> for directions d0 .. d0 + grid[1] - 1 of D; with P =
    double the carried gradient is double (read rounded to T, written widened), and the
    gate gradients (computed in T) are stored widened."""
    assert 0 <= d0 and d0 + grid[1] <= D
    assert dh.dtype == dgi.dtype == dgh.dtype
    dy, gates, hs, dh, dgi, dgh = (a.reshape(-1) for a in (dy, gates, hs, dh, dgi, dgh))
    BH = B * H
    for d in range(d0, d0 + grid[1]):
        i = np.arange(BH)
        b, j = i // H, i % H
        t = s if d == 0 else steps - 1 - s
        dh[d * BH + i] = gate_step(dy, gates, hs, dgi, dgh, dh[d * BH + i].astype(hs.dtype),
                                   d, s, t, b, j, steps, B, H, D, lengths)


def steps_convert(grid, block, shared_mem, cooperative, out, n, in_stride, **args):
    """gru_steps_convert<IN, OUT>: run r of n elements from in + r*in_stride, converted."""
    src, out = args["in"].reshape(-1), out.reshape(-1)
    assert src.dtype != out.dtype and {src.dtype, out.dtype} == {np.dtype(np.float32),
                                                                 np.dtype(np.float64)}
    for r in range(grid[1]):
        out[r * n:(r + 1) * n] = src[r * in_stride:r * in_stride + n]


def resident_forward(split, train):
    """gru_resident_forward<ROWS, UNITS, KS, TRAIN>: block x of grid row d, every step, from
    its slice of W_hh as the kernel stages it (w_s[k][3 uu + g], zero beyond H) and its rows
    of h (zero beyond B and H); all blocks of a step at once (the barrier between steps),
    the cell as forward_step's. The kernel is float32 alone; its index arithmetic is
    checked here on float64 data."""
    rows, units, k_split = split

    def run(grid, block, smem, cooperative, gi, w_hh, b_ih, b_hh, hs, y, gates, barrier, steps,
            B, H, S):
        nblocks, D = grid
        UB = -(-H // units)
        assert cooperative and block == (_catalog.RESIDENT_THREADS,)
        assert nblocks == -(-B // rows) * UB and smem == _catalog.resident_smem(split, H)
        assert barrier.shape == (D,) and barrier.dtype == np.uint32 and not barrier.any()
        gi, w_hh, b_ih, b_hh, hs, y, gates = (a.reshape(-1) for a in (gi, w_hh, b_ih, b_hh, hs,
                                                                     y, gates))
        BH, H3, HK = B * H, 3 * H, -(-H // _catalog.RESIDENT_CHUNK) * _catalog.RESIDENT_CHUNK
        c, k = np.arange(3 * units), np.arange(HK)
        for s in range(steps):
            for d in range(D):
                t = s if d == 0 else steps - 1 - s
                hin = (d * S + s % S) * BH
                for x in range(nblocks):
                    r0, u0 = x // UB * rows, x % UB * units
                    unit, b = u0 + c // 3, r0 + np.arange(rows)
                    ok = (k[:, None] < H) & (unit[None, :] < H)
                    at = d * H3 * H + ((c % 3) * H + unit)[None, :] * H + k[:, None]
                    w_s = np.where(ok, w_hh[np.where(ok, at, 0)], 0)
                    ok = (b[:, None] < B) & (k[None, :] < H)
                    h_s = np.where(ok, hs[np.where(ok, hin + b[:, None] * H + k[None, :], 0)],
                                   0)
                    acc = h_s @ w_s                      # (rows, 3 * units): 3 uu + g
                    bb, jj = np.meshgrid(b[b < B], np.arange(units)[unit[::3] < H],
                                         indexing="ij")
                    j = u0 + jj
                    a = [acc[bb - r0, 3 * jj + g] for g in range(3)]
                    row = (t * B + bb) * D * H3 + d * H3
                    xg = [gi[row + g * H + j] + b_ih[d * H3 + g * H + j] for g in range(3)]
                    hh = [a[g] + b_hh[d * H3 + g * H + j] for g in range(3)]
                    r, z = _sigmoid(xg[0] + hh[0]), _sigmoid(xg[1] + hh[1])
                    n = np.tanh(xg[2] + r * hh[2])
                    h_new = (1 - z) * n + z * hs[hin + bb * H + j]
                    hs[(d * S + (s + 1) % S) * BH + bb * H + j] = h_new
                    y[(t * B + bb) * D * H + d * H + j] = h_new
                    if train:
                        g = ((d * steps + s) * B + bb) * 4 * H
                        gates[g + j], gates[g + H + j], gates[g + 2 * H + j], \
                            gates[g + 3 * H + j] = r, z, n, hh[2]
    return run


def resident_backward(split):
    """gru_resident_backward<ROWS, UNITS, KC>: block x of grid row d keeps its units' columns of
    W_hh as the kernel stages them (w_s[j][uu], zero beyond 3H and H) and its units' carried
    gradient (zero beyond B and H); every step, the product of dgh_{s+1}'s rows (zero beyond
    B and 3H) with w_s added to dh * z, then the cell (gate_step) on the units within B and
    H; after step 0 the carried gradient into dh. The blocks of a step in turn (the barrier
    between steps). Float32's kernel, its index arithmetic checked here on float64 data."""
    rows, units, _ = split

    def run(grid, block, smem, cooperative, dy, gates, hs, dh, dgi, dgh, w_hh, barrier, steps,
            B, H):
        nblocks, D = grid
        UB = -(-H // units)
        assert cooperative and block == (_catalog.RESIDENT_THREADS,)
        assert nblocks == -(-B // rows) * UB
        assert smem == _catalog.resident_smem(split, H, backward=True)
        assert barrier.shape == (D,) and barrier.dtype == np.uint32 and not barrier.any()
        dy, gates, hs, dh, dgi, dgh, w_hh = (a.reshape(-1) for a in (dy, gates, hs, dh, dgi,
                                                                     dgh, w_hh))
        BH, H3 = B * H, 3 * H
        chunk = _catalog.RESIDENT_BACKWARD_CHUNK[split]
        JK = -(-H3 // chunk) * chunk
        j = np.arange(JK)
        blocks = []
        for x in range(nblocks):
            r0, u0 = x // UB * rows, x % UB * units
            b, u = r0 + np.arange(rows), u0 + np.arange(units)
            blocks.append((b, u, (b[:, None] < B) & (u[None, :] < H)))
        for d in range(D):
            w_s, carry, dhz = [], [], []
            for b, u, inside in blocks:
                ok = (j[:, None] < H3) & (u[None, :] < H)
                w_s.append(np.where(ok, w_hh[np.where(ok, d * H3 * H + j[:, None] * H
                                                      + u[None, :], 0)], 0))
                at = np.where(inside, d * BH + b[:, None] * H + u[None, :], 0)
                carry.append(np.where(inside, dh[at], 0))
                dhz.append(np.zeros((rows, units)))
            for s in range(steps - 1, -2, -1):
                for x, (b, u, inside) in enumerate(blocks):
                    if s < steps - 1:
                        ok = (b[:, None] < B) & (j[None, :] < H3)
                        at = ((d * steps + s + 1) * B + b[:, None]) * H3 + j[None, :]
                        g_s = np.where(ok, dgh[np.where(ok, at, 0)], 0)
                        carry[x] = dhz[x] + g_s @ w_s[x]
                    if s >= 0:
                        bb, uu = np.nonzero(inside)
                        t = s if d == 0 else steps - 1 - s
                        dhz[x][bb, uu] = gate_step(dy, gates, hs, dgi, dgh, carry[x][bb, uu],
                                                   d, s, t, b[bb], u[uu], steps, B, H, D,
                                                   None)
            for x, (b, u, inside) in enumerate(blocks):
                bb, uu = np.nonzero(inside)
                dh[d * BH + b[bb] * H + u[uu]] = carry[x][bb, uu]
    return run


def small_forward(train):
    """gru_small_forward<T, TRAIN>: one block, all units (d, b, j) of a step at once."""
    def run(grid, block, smem, cooperative, x, h0, w_ih, w_hh, b_ih, b_hh, hs, y, gates, h_n,
            lengths, steps, B, I, H, D, L):
        assert grid == (1,) and smem == 2 * D * B * H * 8
        # L lanes per unit: a power of two up to 32 that divides the block (whole warps)
        assert L in (1, 2, 4, 8, 16, 32) and block[0] % 32 == 0
        units, S = D * B * H, steps + 1
        x, w_ih, w_hh, b_ih, b_hh, y, h_n = (a.reshape(-1) for a in (x, w_ih, w_hh, b_ih, b_hh,
                                                                    y, h_n))
        i = np.arange(units)
        d, b, j = i // (B * H), i % (B * H) // H, i % H
        h = h0.reshape(-1).copy() if h0 is not None else np.zeros(units)
        if train:
            hs, gates = hs.reshape(-1), gates.reshape(-1)
            hs[d * S * B * H + b * H + j] = h
        for s in range(steps):
            t = np.where(d == 0, s, steps - 1 - s)
            k_i, k_h = np.arange(I), np.arange(H)
            xt = x[(t * B + b)[:, None] * I + k_i]
            hv = h[(d * B + b)[:, None] * H + k_h]
            wrow = lambda w, n, g: w[(d * 3 * H + g * H + j)[:, None] * n + np.arange(n)]  # noqa
            gi = [(wrow(w_ih, I, g) * xt).sum(1) + b_ih[d * 3 * H + g * H + j] for g in range(3)]
            gh = [(wrow(w_hh, H, g) * hv).sum(1) + b_hh[d * 3 * H + g * H + j] for g in range(3)]
            r, z = _sigmoid(gi[0] + gh[0]), _sigmoid(gi[1] + gh[1])
            n = np.tanh(gi[2] + r * gh[2])
            on = t < _length(lengths, b, steps)
            h = np.where(on, (1 - z) * n + z * h, h)
            y[(t * B + b) * D * H + d * H + j] = np.where(on, h, 0)
            if train:
                hs[(d * S + s + 1) * B * H + b * H + j] = h
                g = ((d * steps + s) * B + b) * 4 * H
                gates[g + j], gates[g + H + j], gates[g + 2 * H + j], gates[g + 3 * H + j] = \
                    r, z, n, gh[2]
        h_n[:] = h
    return run


def small_backward(grid, block, smem, cooperative, dy, dh_n, x, w_ih, w_hh, gates, hs, dgi,
                   dgh, dx, dh0, dw_ih, dw_hh, db_ih, db_hh, lengths, steps, B, I, H, D):
    """gru_small_backward<T>: the reverse recurrence, then the tail's sums element by element."""
    assert grid == (1,) and smem == 4 * D * B * H * 8
    units, H3 = D * B * H, 3 * H
    dy, x, w_ih, w_hh, gates, hs, dgi, dgh = (a.reshape(-1) for a in (dy, x, w_ih, w_hh, gates,
                                                                      hs, dgi, dgh))
    i = np.arange(units)
    d, b, j = i // (B * H), i % (B * H) // H, i % H
    carry = dh_n.reshape(-1).copy() if dh_n is not None else np.zeros(units)
    for s in range(steps - 1, -1, -1):
        t = np.where(d == 0, s, steps - 1 - s)
        dhz = gate_step(dy, gates, hs, dgi, dgh, carry, d, s, t, b, j, steps, B, H, D,
                        lengths)
        k = np.arange(H3)
        step = dgh[(((d * steps + s) * B + b) * H3)[:, None] + k]
        carry = dhz + (step * w_hh[(d * H3)[:, None] * H + k * H + j[:, None]]).sum(1)
    dh0.reshape(-1)[:] = carry
    rows, DG = steps * B, D * H3
    gi_rows = dgi.reshape(rows, DG)
    x_rows = x.reshape(rows, I)
    dx.reshape(-1)[:] = (gi_rows @ w_ih.reshape(DG, I)).reshape(-1)
    dw_ih.reshape(-1)[:] = (gi_rows.T @ x_rows).reshape(-1)
    db_ih.reshape(-1)[:] = gi_rows.sum(0)
    for dd in range(D):
        gh_rows = dgh.reshape(D, rows, H3)[dd]
        h_rows = hs.reshape(D, steps + 1, B, H)[dd, :steps].reshape(rows, H)
        dw_hh.reshape(-1)[dd * H3 * H:(dd + 1) * H3 * H] = (gh_rows.T @ h_rows).reshape(-1)
        db_hh.reshape(-1)[dd * H3:(dd + 1) * H3] = gh_rows.sum(0)


class _Tile:
    """The thread roles of gru_tile_forward/backward in block c of a cluster of the tile
    kernels (cluster, Q packs, MR rows, NT threads, U units per thread), by slot = u*KS + ks
    of unit u and lane ks: product thread tid = (u // U)*KS + ks holds, for its unit u % U,
    the weights of the packs ks + q*KS (q < Q), zero past H; pointwise thread p < J*rows
    serves unit p % J of row p // J."""

    def __init__(self, c, H, J, KS, Q, NT, U, V):
        assert J % U == 0 and J // U * KS <= NT
        slot = np.arange(J * KS)
        self.u, self.ks = slot // KS, slot % KS
        tid = self.u // U * KS + self.ks
        assert len(set(zip(tid, self.u % U))) == J * KS and tid.max() < NT
        self.active = self.u < min(J, H - c * J)
        self.j = np.where(self.active, c * J + self.u, 0)
        q = np.arange(Q)
        # k[tid, q, e] = (ks + q*KS)*V + e: every lane runs all Q packs, the vector rows are
        # HS = KS*Q*V long (zero past H)
        self.k = ((self.ks[:, None, None] + q[None, :, None] * KS) * V
                  + np.arange(V)[None, None, :])
        self.HS = KS * Q * V
        assert self.k.max() < self.HS
        self.valid = self.active[:, None, None] & (self.k < H)
        self.c, self.J, self.KS, self.NT = c, J, KS, NT

    def weights(self, w, H, fwd):
        """w[tid, g, q, e] as gru_tile_weights loads it (zero outside H)."""
        k = np.minimum(self.k, H - 1)
        g = np.arange(3)[None, :, None, None]
        j = self.j[:, None, None, None]
        at = (g * H + j) * H + k[:, None] if fwd else (g * H + k[:, None]) * H + j
        return np.where(self.valid[:, None], w[at], 0.0)

    def product(self, wt, vec, gstride):
        """Phase 1 for every row of `vec` (MR rows: gate g's segment at g*gstride), then the
        lane sums of each unit added pairwise (gru_pairwise): sums[i][u, g]."""
        out = []
        for v in vec:
            vals = np.stack([v[g * gstride + self.k] for g in range(3)], axis=1)  # tid, g, q, e
            part = (wt * vals).sum(axis=(2, 3)).reshape(self.J, self.KS, 3)
            out.append(pairwise([part[:, ks] for ks in range(self.KS)]))
        return out

    def units(self, i, rows, H):
        """The units whose pointwise step row i has in this block (thread p = i*J + u)."""
        if i >= rows:
            return np.zeros(0, int)
        u = np.arange(self.J)
        assert (i + 1) * self.J <= self.NT
        return u[self.c * self.J + u < H]


def _clusters(grid, tile, R, B, H, J, KS, w_hh, fwd, counters, G, groups):
    """Every group of a tile launch: (d, b0, rows, the blocks' _Tile, their weights). Block
    and cluster scope: one group per cluster of the grid. Grid scope: G blocks per slot, slot
    k taking groups k, k + slots, ... (each group exactly once), with D x slots counters."""
    C, Q, MR, NT, U = tile
    H3 = 3 * H
    if C:
        assert G == C and grid[0] == groups * C and counters is None
        order = range(groups)
    else:
        slots = grid[0] // G
        assert grid[0] == slots * G and 1 <= slots <= groups
        assert counters.dtype == np.uint32 and counters.size == grid[1] * slots
        assert not counters.any()
        order = [g for k in range(slots) for g in range(k, groups, slots)]
        assert sorted(order) == list(range(groups))
    blocks = C or G
    # (a cluster's last blocks may own no units, where 16-byte packs of units leave none)
    assert H <= blocks * J and (C > 1 or (blocks - 1) * J < H)
    for d in range(grid[1]):
        for grp in order:
            tiles = [_Tile(c, H, J, KS, Q, NT, U, 2) for c in range(blocks)]
            wts = [tl.weights(w_hh[d * H3 * H:(d + 1) * H3 * H], H, fwd) for tl in tiles]
            yield d, grp * R, min(R, B - grp * R), tiles, wts


def _tile_smem(tile, R, J, KS, segs, ring, extra):
    """The dynamic shared memory of a tile kernel (double): mbarriers, vector (two buffers at
    block and cluster scope, one at grid scope), lane sums, the unused gap (none at grid
    scope), ring and `extra` more elements."""
    C, Q, MR, NT, U = tile
    nv, ng = (2, 2) if C else (1, 0)
    HS = KS * Q * 2
    return 16 + (nv * MR * segs * HS + MR * 3 * J * KS + ng * R * segs * J
                 + _catalog.TILE_AHEAD * R * ring * J + extra) * 8


def tile_forward(train, tile):
    """gru_tile_forward<double, C, Q, MR, NT, U, TRAIN> for every cluster, its blocks in lock
    step."""
    C, Q, MR, NT, U = tile

    def run(grid, block, smem, cooperative, gi, w_hh, b_ih, b_hh, hs, y, gates, h_n, lengths,
            steps, B, H, S, J, KS, R, counters, G, groups):
        gi, w_hh, b_ih, b_hh, hs, y, gates, h_n = (
            a.reshape(-1) for a in (gi, w_hh, b_ih, b_hh, hs, y, gates, h_n))
        D, V, H3, BH = grid[1], 2, 3 * H, B * H
        HS = KS * Q * V
        assert block[0] == NT and R <= MR and cooperative == (C == 0)
        assert smem == _tile_smem(tile, R, J, KS, 1, 3, 6 * J)
        assert C <= 1 or J % V == 0
        assert not train or S == steps + 1
        for d, b0, rows, tiles, wts in _clusters(grid, tile, R, B, H, J, KS, w_hh, True,
                                                 counters, G, groups):
            vec = np.zeros((2, MR, HS))            # the same in every block
            for i in range(rows):
                vec[0, i, :H] = hs[d * S * BH + (b0 + i) * H:d * S * BH + (b0 + i + 1) * H]
            for s in range(steps):
                t = s if d == 0 else steps - 1 - s
                cur, nxt = vec[s & 1], vec[(s + 1) & 1].copy()
                for tl, wt in zip(tiles, wts):
                    sums = tl.product(wt, cur, 0)
                    for i in range(rows):
                        u = tl.units(i, rows, H)
                        j, b = tl.c * J + u, b0 + i
                        g_row = (t * B + b) * D * H3 + d * H3
                        x = [gi[g_row + g * H + j] + b_ih[d * H3 + g * H + j]
                             for g in range(3)]
                        hb = [sums[i][u, g] + b_hh[d * H3 + g * H + j] for g in range(3)]
                        r = _sigmoid(x[0] + hb[0])
                        z = _sigmoid(x[1] + hb[1])
                        n = np.tanh(x[2] + r * hb[2])
                        on = t < _length(lengths, b, steps)
                        h_new = (1 - z) * n + z * cur[i, j] if on else cur[i, j]
                        if train or C == 0:   # (grid scope: the vector other blocks read)
                            hs[(d * S + (s + 1) % S) * BH + b * H + j] = h_new
                        y[(t * B + b) * D * H + d * H + j] = h_new if on else 0
                        if s == steps - 1:
                            h_n[d * BH + b * H + j] = h_new
                        if train:
                            g0 = ((d * steps + s) * B + b) * 4 * H
                            for gate, v in enumerate((r, z, n, hb[2])):
                                gates[g0 + gate * H + j] = v
                        nxt[i, j] = h_new
                vec[(s + 1) & 1] = nxt
    return run


def tile_backward(tile):
    """gru_tile_backward<double, C, Q, MR, NT, U> for every cluster, its blocks in lock step."""
    C, Q, MR, NT, U = tile

    def run(grid, block, smem, cooperative, dy, gates, hs, w_hh, dh_n, dgi, dgh, dh0, lengths,
            steps, B, H, J, KS, R, counters, G, groups):
        assert isinstance(dh_n, np.ndarray) or dh_n is None     # None: a null pointer, zeros
        dh_n = dh_n.reshape(-1) if isinstance(dh_n, np.ndarray) else None
        dy, gates, hs, w_hh, dgi, dgh, dh0 = (
            a.reshape(-1) for a in (dy, gates, hs, w_hh, dgi, dgh, dh0))
        D, V, H3, BH = grid[1], 2, 3 * H, B * H
        HS = KS * Q * V
        assert block[0] == NT and R <= MR and cooperative == (C == 0)
        assert smem == _tile_smem(tile, R, J, KS, 3, 6, 0)
        assert C <= 1 or J % V == 0
        for d, b0, rows, tiles, wts in _clusters(grid, tile, R, B, H, J, KS, w_hh, False,
                                                 counters, G, groups):
            vec = np.zeros((2, MR, 3 * HS))
            units = [[tl.units(i, rows, H) for i in range(rows)] for tl in tiles]
            carry = [[np.zeros(len(u)) if dh_n is None else
                      dh_n[d * BH + (b0 + i) * H + tl.c * J + u] for i, u in enumerate(us)]
                     for tl, us in zip(tiles, units)]
            dhz = [[np.zeros(len(u)) for u in us] for us in units]
            for s in range(steps - 1, -1, -1):
                t = s if d == 0 else steps - 1 - s
                nxt = vec[s & 1].copy()
                for c, (tl, wt) in enumerate(zip(tiles, wts)):
                    if s < steps - 1:
                        sums = tl.product(wt, vec[(s + 1) & 1], HS)
                    for i in range(rows):
                        u = units[c][i]
                        j, b = tl.c * J + u, b0 + i
                        if s < steps - 1:
                            a = sums[i][u]
                            carry[c][i] = dhz[c][i] + ((a[:, 0] + a[:, 1]) + a[:, 2])
                        g0 = ((d * steps + s) * B + b) * 4 * H
                        r, z, n, hn = (gates[g0 + gate * H + j] for gate in range(4))
                        h = hs[(d * (steps + 1) + s) * BH + b * H + j]
                        dhv = dy[(t * B + b) * D * H + d * H + j] + carry[c][i]
                        dn = dhv * (1 - z) * (1 - n * n)
                        dz = dhv * (h - n) * z * (1 - z)
                        dr = dn * hn * r * (1 - r)
                        dhz[c][i] = dhv * z
                        if t >= _length(lengths, b, steps):     # gru_skip_backward
                            dr = dz = dn = r = np.zeros(len(u))
                            dhz[c][i] = carry[c][i]
                        ri, rh = (t * B + b) * D * H3 + d * H3, ((d * steps + s) * B + b) * H3
                        dgi[ri + j], dgi[ri + H + j], dgi[ri + 2 * H + j] = dr, dz, dn
                        dgh[rh + j], dgh[rh + H + j], dgh[rh + 2 * H + j] = dr, dz, dn * r
                        nxt[i, j], nxt[i, HS + j], nxt[i, 2 * HS + j] = dr, dz, dn * r
                vec[s & 1] = nxt
            for c, (tl, wt) in enumerate(zip(tiles, wts)):
                sums = tl.product(wt, vec[0], HS)
                for i in range(rows):
                    u = units[c][i]
                    a = sums[i][u]
                    dh0[d * BH + (b0 + i) * H + tl.c * J + u] = \
                        dhz[c][i] + ((a[:, 0] + a[:, 1]) + a[:, 2])
    return run


def add_chunks(grid, block, shared_mem, cooperative, part, out, n, ld, chunks):
    """gru_add_chunks<T>: out plus the partials, added in chunk order."""
    part, out = part.reshape(-1), out.reshape(-1)
    acc = out[:n].copy()
    for c in range(chunks):
        acc += part[c * ld:c * ld + n]
    out[:n] = acc


def sum_chunks(grid, block, shared_mem, cooperative, part, out, n, ld, chunks):
    """gru_sum_chunks<T>: the partials added in chunk order."""
    part, out = part.reshape(-1), out.reshape(-1)
    acc = part[:n].copy()
    for c in range(1, chunks):
        acc += part[c * ld:c * ld + n]
    out[:n] = acc


def bias_sums(grid, block, shared_mem, cooperative, dgi, dgh, db, rows, DG, G):
    """gru_bias_sums<T>: each column of d_gate_i, then of d_gate_h, summed over the rows in
    the kernel's order (each lane's rows in turn, then the lanes in order) in float64."""
    assert block == (_catalog.BIAS_COLS, _catalog.BIAS_LANES)
    assert grid[0] * block[0] >= 2 * DG > (grid[0] - 1) * block[0]
    cols = np.concatenate([dgi.reshape(-1)[:rows * DG].reshape(rows, DG)]
                          + [dgh.reshape(-1)[d * rows * G:(d + 1) * rows * G].reshape(rows, G)
                             for d in range(DG // G)], axis=1).astype(np.float64)
    lanes = [np.zeros(2 * DG) for _ in range(block[1])]
    for r in range(rows):
        lanes[r % block[1]] += cols[r]
    acc = lanes[0]
    for lane in lanes[1:]:
        acc = acc + lane
    db.reshape(-1)[:2 * DG] = acc


@pytest.fixture
def host_device(monkeypatch):
    """cugru._device replaced by numpy stand-ins (the seam between the plans and the GPU)."""
    fake = types.SimpleNamespace(
        ndarray=DevArray,
        empty=lambda shape, dt: np.full(shape, np.nan, dt).view(DevArray),
        zeros=lambda shape, dt: np.zeros(shape, dt).view(DevArray),
        ones=lambda shape, dt: np.ones(shape, dt).view(DevArray))
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    runs = {("gru_steps.cu", _catalog.step_forward("double", True)): forward_step(True, f64),
            ("gru_steps.cu", _catalog.step_forward("double", False)): forward_step(False, f64),
            ("gru_steps.cu", _catalog.step_backward("double")): backward_step,
            ("gru_tail.cu", _catalog.sum_chunks("double")): sum_chunks,
            ("gru_tail.cu", _catalog.add_chunks("double")): add_chunks,
            ("gru_tail.cu", _catalog.bias_sums("double")): bias_sums,
            ("gru_small.cu", _catalog.small_forward("double", True)): small_forward(True),
            ("gru_small.cu", _catalog.small_forward("double", False)): small_forward(False),
            ("gru_small.cu", _catalog.small_backward("double")): small_backward}
    for split in _catalog.RESIDENT_SPLITS:
        for train in (True, False):
            runs["gru_resident.cu", _catalog.resident_forward(split, train)] = \
                resident_forward(split, train)
            # (the resident kernels are float32's alone: their tests run float32 data, and
            # the per-step path's on it where the plan falls back to it)
            runs["gru_steps.cu", _catalog.step_forward("float", train)] = \
                forward_step(train, f32)
        runs["gru_resident.cu", _catalog.resident_backward(split)] = resident_backward(split)
    for train in (True, False):
        for narrow_gi in (False, True):
            runs["gru_steps.cu", _catalog.step_forward("float", train, wide=True,
                                                       narrow_gi=narrow_gi)] = \
                forward_step(train, f32 if narrow_gi else f64)
    runs.update({("gru_steps.cu", _catalog.step_backward("float", wide=True)): backward_step,
                 ("gru_steps.cu", _catalog.step_convert("float", "double")): steps_convert,
                 ("gru_steps.cu", _catalog.step_convert("double", "float")): steps_convert})
    runs.update({("gru_steps.cu", _catalog.step_backward("float")): backward_step,
                 ("gru_tail.cu", _catalog.sum_chunks("float")): sum_chunks,
                 ("gru_tail.cu", _catalog.add_chunks("float")): add_chunks,
                 ("gru_tail.cu", _catalog.bias_sums("float")): bias_sums})
    for tile in _catalog.TILES[8]:
        for lengths in (False, True):     # (the instances for variable lengths: LEN)
            runs["gru_tile.cu", _catalog.tile_backward("double", tile, False, lengths)] = \
                tile_backward(tile)
            for train in (True, False):
                runs["gru_tile.cu", _catalog.tile_forward("double", tile, train, False,
                                                          lengths)] = tile_forward(train, tile)
    kernels = {key: HostKernel(*key, run) for key, run in runs.items()}
    monkeypatch.setattr(_device, "cupy", lambda: fake)

    def kernel(family, name, params=None):
        kern = kernels[family, name]
        # (a positional caller's order is the CUDA declaration's, as runtime.kernel checks)
        assert params is None or tuple(params) == tuple(kern.names), (name, params)
        return kern
    monkeypatch.setattr(_device, "kernel", kernel)
    monkeypatch.setattr(_device, "shared", lambda kern, nbytes: kern)
    monkeypatch.setattr(_device, "ones", fake.ones)
    monkeypatch.setattr(_device, "scratch",
                        lambda name, dt, *shapes: tuple(fake.empty(s, dt) for s in shapes))
    monkeypatch.setattr(_device, "outputs", lambda dt, *shapes: tuple(fake.empty(s, dt)
                                                                       for s in shapes))
    monkeypatch.setattr(_device, "capturing", lambda cp, stream=None: False)
    monkeypatch.setattr(_device, "pointer_table", lambda key, build: np.ascontiguousarray(
        build(), dtype=np.uint64).view(DevArray))
    monkeypatch.setattr(_device, "copy_bytes", _host_copy)
    monkeypatch.setattr(_device, "zero_bytes", _host_zero)
    monkeypatch.setattr(_device, "Loop", HostLoop)
    monkeypatch.setattr(_device, "fork_made", lambda: False)
    HostLoop.products.clear()
    HostLoop.forks.clear()
    HostLoop.wide.clear()
    # (the lengths a device array too, as on the GPU, where the calls name them by address)
    check_lengths = _args.check_lengths
    monkeypatch.setattr(_args, "check_lengths", lambda *a: None if (got := check_lengths(*a))
                        is None else got.view(DevArray))
    # min chunk of 64 rows, so that the chunked weight-gradient sums run here too
    monkeypatch.setattr(_passes, "MIN_CHUNK_ROWS", 64)
    return lambda a: None if a is None else np.ascontiguousarray(a).view(DevArray)


def steps_forwards(dev, p, bi):
    """Problem p's forward passes on path "steps" (its arrays through `dev`), inference then
    training: ([(y, h_n) of each], the training pass's saved history)."""
    outs = []
    for training in (False, True):
        y, hn, saved = plans.forward(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)),
                                     plans.STEPS, bidirectional=bi, training=training,
                                     lengths=p.get("lengths"))
        outs.append((np.array(y), np.array(hn)))
    return outs, saved


@pytest.mark.parametrize("T,B,I,H,bi,h0,lengths,projection,slices",
                         [(3, 2, 4, 5, False, True, False, True, 1),
                          (4, 3, 2, 3, True, True, True, True, 1),
                          (5, 1, 3, 2, True, False, False, False, 1),
                          (3, 2, 4, 5, False, True, False, True, 3),
                          (4, 3, 2, 4, True, True, True, False, 4)])
def test_wide_products_compute_the_oracle(host_device, monkeypatch, rng, T, B, I, H, bi, h0,
                                          lengths, projection, slices):
    """The per-step path on float32 data with its recurrent products in float64
    (wide_products, its limits lowered to these shapes, on a stand-in sm_90): W_hh, h0 and
    the carried gradient widened and rounded back, the steps reading and writing their
    widened halves (every buffer in the replay's key) give the oracle's results within
    float32's tolerance, inference the training pass's; the projection, every recurrent
    product of both passes and the tail's products (dW_ih, dW_hh, the bias sums, dx) ran
    in float64 (the projection where wide_projection holds: `projection`, its limit set
    each side of I), and no other product. The backward product splits into `slices`
    slices of k (wide_split; 1: one product a step): D * slices float64 products of k/slices
    terms a step, added into the widened carried gradient. Off (WIDE = False) they run in
    float32."""
    from types import SimpleNamespace

    from cugru import _plan
    for name in ("WIDE_MIN_H", "WIDE_MIN_ROWS", "WIDE_BACKWARD_MIN_ROWS"):
        monkeypatch.setattr(_plan, name, 1)
    monkeypatch.setattr(_plan, "WIDE_SPLIT_SLICES", slices)
    monkeypatch.setattr(_plan, "WIDE_SPLIT_MIN_TERMS", 1)
    assert _plan.wide_split(H) == slices
    monkeypatch.setattr(_plan, "WIDE_MIN_INPUTS", I if projection else I + 1)
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(cc=90, id=0))
    p = problem(rng, T, B, I, H, bi, with_h0=h0, lengths=lengths)
    D = 2 if bi else 1
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi,
                                              lengths=p.get("lengths"))
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dev = lambda a: None if a is None else host_device(a.astype(np.float32))  # noqa: E731
    G = 3 * H
    forward = [(D * G, T * B, I, 1)] * projection + [(G, B, H, D)] * T
    # (db_hh's r and z parts copied from db_ih's: of dgh the n gate's columns alone summed)
    tail = [(I, D * G, T * B, 1), (H, G, T * B, D), (D * G, 1, T * B, 1), (H, 1, T * B, D),
            (I, T * B, D * G, 1)]
    for wide in (True, False):
        monkeypatch.setattr(_plan, "WIDE", wide)
        HostLoop.wide.clear()
        outs, saved_dev = steps_forwards(dev, p, bi)
        HostLoop.products.clear()
        got = outs[1] + plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plans.STEPS)
        for g, r in zip(got, (ref_y, ref_hn) + tuple(ref)):
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1, np.abs(r).max()))
        for a, b in zip(*outs):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        # (two forward passes, then the backward pass's products: a batched call of
        # pointer tables runs here as one product per item)
        steps = [(H, B, G, D)] if slices == 1 else [(H, B, G // slices, 1)] * (D * slices)
        assert HostLoop.wide == (forward * 2 + steps * T + tail if wide else [])
        backward = [q[:4] for q in HostLoop.products]
        steps = steps if wide else [(H, B, G, D)]       # (float32: backward_split's 1 here)
        assert backward.count(steps[0]) == len(steps) * T


def test_wide_products_take_float32_strict_shapes_on_the_measured_side_of_their_limits(
        monkeypatch):
    """wide_products on a stand-in sm_90: S10's two passes (B = 256, H = 512), S9's, O16's
    and O3's forward pass (B = 16-64, H = 700-1024); not O5 (B = 3), not S9's and O16's
    backward pass (their float32 split product was faster), not H below WIDE_MIN_H or
    above WIDE_MAX_H (O6, H = 2048), float64 data, math="tf32", quantization-aware passes,
    WIDE off or another GPU (sm_80)."""
    from types import SimpleNamespace

    from cugru import _plan
    cc = [90]
    monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(cc=cc[0], id=0))
    wide = _plan.wide_products
    assert wide(256, 512, 4, "strict") and wide(256, 512, 4, "strict", backward=True)
    for B, H in ((64, 1024), (16, 1000), (20, 700)):
        assert wide(B, H, 4, "strict") and not wide(B, H, 4, "strict", backward=True)
    assert not wide(3, 1024, 4, "strict") and not wide(256, 256, 4, "strict")
    assert not wide(32, 2048, 4, "strict") and not wide(32, 1025, 4, "strict")
    assert not wide(256, 512, 8, "strict") and not wide(256, 512, 4, "tf32")
    assert not wide(256, 512, 4, "strict", qat=True)
    # (the projection of a wide forward pass: float64 from WIDE_MIN_INPUTS inputs)
    assert _plan.wide_projection(256) and _plan.wide_projection(1024)
    assert not _plan.wide_projection(255) and not _plan.wide_projection(80)
    monkeypatch.setattr(_plan, "WIDE", False)
    assert not wide(256, 512, 4, "strict")
    monkeypatch.setattr(_plan, "WIDE", True)
    cc[0] = 80
    assert not wide(256, 512, 4, "strict")


def _gpu_path_matches(dev, p, dims, plan, ref_y, ref_hn, saved, ref):
    """The GPU passes (inference, then training, then backward) with `plan` give the
    oracle's results; returns the device history for further backward runs."""
    bi = dims[4] == 2
    for training in (False, True):   # the history of the last (training) run is used below
        y, hn, saved_dev = plans.forward(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)),
                                         plan, bidirectional=bi, training=training,
                                         lengths=p.get("lengths"))
        np.testing.assert_allclose(y, ref_y, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(hn, ref_hn, rtol=1e-12, atol=1e-13)
    got = plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plan)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))
    return saved_dev


# ((130, 5, ...): 650 rows, the bias sums' kernel beside several weight-gradient chunks;
# (130, 17, ...) and (33, 130, ...): rows beyond it, the bias sums in the chunks' GEMMs)
@pytest.mark.parametrize("T,B,I,H,bi,h0", [(3, 2, 4, 5, False, True), (4, 3, 2, 3, True, True),
                                           (5, 1, 3, 2, True, False), (130, 5, 3, 4, True, True),
                                           (130, 17, 2, 3, True, True),
                                           (33, 130, 1, 2, False, False)])
@pytest.mark.parametrize("batched", [True, False], ids=["batched-chunks", "chunks-add-up"])
@pytest.mark.parametrize("lengths", [False, True], ids=["T", "lengths"])
def test_gpu_path_plan_computes_the_oracle(host_device, monkeypatch, rng, T, B, I, H, bi, h0,
                                           batched, lengths):
    if not batched:
        monkeypatch.setattr(_passes, "WGRAD_PARTIAL_BYTES", 0)
        monkeypatch.setattr(_passes, "WGRAD_PARTIAL_DGI", 0)
    p = problem(rng, T, B, I, H, bi, with_h0=h0, lengths=lengths)
    dev = host_device
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi,
                                              lengths=p.get("lengths"))
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dims = (T, B, I, H, 2 if bi else 1)
    _gpu_path_matches(dev, p, dims, plans.STEPS, ref_y, ref_hn, saved, ref)


@pytest.mark.parametrize("T,B,I,H,bi,h0", [(1, 1, 1, 1, False, True), (3, 2, 4, 5, False, True),
                                           (4, 3, 2, 3, True, True), (5, 1, 3, 2, True, False),
                                           (2, 4, 3, 128, True, True)])
@pytest.mark.parametrize("lengths", [False, True], ids=["T", "lengths"])
def test_small_plan_computes_the_oracle(host_device, rng, T, B, I, H, bi, h0, lengths):
    """The small path's kernels (the whole pass in one block), transcribed in numpy: their
    arguments, the history they leave, the tail's sums and the gradients in the weights'
    shapes (with and without the direction axis) give the oracle's results; a backward pass
    of another plan runs on the history the small forward pass leaves, and the other way."""
    D = 2 if bi else 1
    p = problem(rng, T, B, I, H, bi, with_h0=h0, lengths=lengths)
    dev = host_device
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi,
                                              lengths=p.get("lengths"))
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    saved_dev = _gpu_path_matches(dev, p, (T, B, I, H, D), plans.SMALL, ref_y, ref_hn, saved,
                                  ref)
    for g, r in zip(plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plans.STEPS), ref):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))
    _, _, steps_saved = plans.forward(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)),
                                      plans.STEPS, bidirectional=bi, lengths=p.get("lengths"))
    no_dh_n = oracle.gru_backward(p["dy"], None, saved)
    for g, r in zip(plans.backward(dev(p["dy"]), None, steps_saved, plans.SMALL), no_dh_n):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))
    if not bi:       # weights without the direction axis: gradients come back that way
        flat = [dev(w[0]) for w in weights(p)]
        _, _, s1 = plans.forward(dev(p["x"]), dev(p["h0"]), *flat, plans.SMALL,
                                 lengths=p.get("lengths"))
        got = plans.backward(dev(p["dy"]), None, s1, plans.SMALL)
        assert [g.shape for g in got[2:]] == [w.shape for w in flat]
        for g, r in zip(got[2:], no_dh_n[2:]):
            np.testing.assert_allclose(g, r[0], rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))


# (each split at B and H beyond its blocks' edges, one block, T = 1, and H not a multiple
# of 4, where the kernel reads rows one element at a time)
@pytest.mark.parametrize("split", _catalog.RESIDENT_SPLITS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("T,B,I,H,bi,h0", [(3, 70, 4, 37, True, True), (1, 2, 3, 5, False, True),
                                           (4, 33, 2, 16, False, False),
                                           (2, 3, 3, 34, True, True)])
def test_resident_plan_computes_the_oracle(host_device, rng, monkeypatch, split, T, B, I, H,
                                           bi, h0):
    """The resident kernels, transcribed in numpy: their arguments, their blocks' rows and
    units, the history the forward kernel leaves and the gate gradients the backward kernel
    leaves (which the shared tail reads) give the oracle's results on float32 data;
    inference gives the training pass's. Neither pass runs per step. (The transcriptions
    sum each block's product in one numpy product: the kernels' chunks, groups and their
    sums are checked against the oracle on the GPU.)"""
    def per_step(*args):
        raise AssertionError("the resident plan ran a pass per step")
    monkeypatch.setattr(plans.StepsPlan, "forward", per_step)
    monkeypatch.setattr(plans.StepsPlan, "backward", per_step)
    D = 2 if bi else 1
    rows, units, k_split = split
    plan = plans.ResidentPlan(rows, units, k_split, -(-B // rows) * -(-H // units),
                              _catalog.resident_smem(split, H))
    p = problem(rng, T, B, I, H, bi, with_h0=h0)
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dev = lambda a: None if a is None else host_device(a.astype(np.float32))  # noqa: E731
    outs = []
    for training in (False, True):
        y, hn, saved_dev = plans.forward(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)),
                                         plan, bidirectional=bi, training=training)
        outs.append((np.array(y), np.array(hn)))
    assert all(np.array_equal(a, b) for a, b in zip(*outs))
    got = outs[1] + plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plan)
    for g, r in zip(got, (ref_y, ref_hn) + tuple(ref)):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1, np.abs(r).max()))


def test_the_resident_plan_refuses_data_it_does_not_run_and_runs_views_off_16_bytes_per_step(
        host_device, rng, monkeypatch):
    """plans.forward on a resident plan: float64 data, quant or lengths are a ValueError
    naming them (the kernel is float32's, without either); a W_hh off 16-byte boundaries
    (a view into a larger array: the kernel reads its rows 16 bytes at a time) runs the
    per-step recurrence on the same buffers, with the oracle's results."""
    plan = plans.resident_split(3, 8, 1, 132, 232448)
    p = problem(rng, 2, 3, 4, 8, False)
    w = weights(p)
    f32 = lambda a: host_device(a.astype(np.float32))  # noqa: E731
    with pytest.raises(ValueError, match="runs float32 data without quant or lengths; this "
                                         "forward pass has float64"):
        plans.forward(host_device(p["x"]), None, *map(host_device, w), plan)
    with pytest.raises(ValueError, match="this forward pass has float32 with lengths"):
        plans.forward(f32(p["x"]), None, *map(f32, w), plan, lengths=[1, 2, 2])
    from cugru import QuantSpec, _quantize
    # (the quantizers' launches before the recurrence: theirs, not the plan's, left out)
    monkeypatch.setattr(_quantize, "operands", lambda a: a)
    with pytest.raises(ValueError, match="this forward pass has float32 with quant"):
        plans.forward(f32(p["x"]), None, *map(f32, w), plan, quant=QuantSpec())
    # W_hh one float into a larger buffer: 4 bytes off 16-byte boundaries
    flat = np.zeros(w[1].size + 1, np.float32)
    flat[1:] = w[1].reshape(-1)
    w_hh = flat[1:].reshape(w[1].shape).view(type(f32(w[1])))
    assert w_hh.data.ptr % 16
    launched = []
    monkeypatch.setattr(plans.ResidentPlan, "kernel",
                        lambda self, training: launched.append(training))
    y, hn, _ = plans.forward(f32(p["x"]), f32(p["h0"]), f32(w[0]), w_hh, f32(w[2]),
                             f32(w[3]), plan, training=False)
    ref_y, ref_hn, _ = oracle.gru_forward(p["x"], p["h0"], *w, training=False)
    assert not launched
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(hn, ref_hn, rtol=1e-4, atol=1e-5)


def test_backward_split_slices_the_long_sums_of_float32_strict():
    """backward_split: float32 under math="strict", one direction or two, k = 3H of at
    least SPLIT_MIN_K; the divisor of k up to SPLIT_MAX_SLICES whose slice is nearest
    SPLIT_SLICE terms by ratio (the slice counts measured on S8-S10, O3, O5, O6, O14 and
    O16); one product otherwise."""
    split = plans.backward_split
    assert plans.SPLIT_MIN_K == 1024 and plans.SPLIT_SLICE == 192
    assert plans.SPLIT_MAX_SLICES == 24
    for H, D, want in ((1024, 1, 16),    # S9: slices of 192
                       (512, 2, 8),      # S10: 192
                       (512, 1, 8),      # S8
                       (1024, 2, 16),    # O5
                       (650, 2, 10),     # O14: 195 (6 slices of 325 farther)
                       (700, 1, 10),     # O3: 210 (12 of 175 a little farther)
                       (1000, 1, 15),    # O16: 200
                       (2048, 1, 24),    # O6: 256, the most slices (32 of 192 not taken)
                       (342, 2, 6)):     # k = 1026: 171 (3 of 342 and 9 of 114 farther)
        assert split(H, D, 4, "strict") == want, (H, D)
    assert split(341, 2, 4, "strict") == split(341, 1, 4, "strict") == 1   # k = 1023
    for args in ((650, 2, 8, "strict"), (650, 1, 8, "strict"), (650, 2, 4, "tf32")):
        assert split(*args) == 1, args
    for H in range(342, 2049):
        S = split(H, 1, 4, "strict")
        assert S == split(H, 2, 4, "strict")
        assert 3 * H % S == 0 and 3 * H // S >= 64 and 1 < S <= plans.SPLIT_MAX_SLICES, H


@pytest.mark.parametrize("bi", [True, False], ids=["two directions", "one direction"])
def test_steps_plan_splits_the_backward_product_and_computes_the_oracle(host_device, rng, bi):
    """The per-step backward pass of one or two directions at k = 3H >= SPLIT_MIN_K (float32):
    each step's product runs as D*S slice products on the tables' addresses (inside the
    replay, whose key must name the tables and the parts), gru_add_chunks adds them into dh,
    and the gradients are the oracle's. Under a caller's CUDA graph capture, and where
    cuBLAS's batched GEMM of pointer arrays is missing, each step runs one product."""
    T, B, I, H = 3, 3, 2, 342
    D = 2 if bi else 1
    S = plans.backward_split(H, D, 4, "strict")
    assert S == 6
    p = problem(rng, T, B, I, H, bi)
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dev = lambda a: None if a is None else host_device(a.astype(np.float32))  # noqa: E731
    _, _, saved_dev = plans.forward(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)),
                                    plans.STEPS, bidirectional=bi)
    HostLoop.products.clear()
    got = plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plans.STEPS)
    slices = [q for q in HostLoop.products if q[:4] == (H, B, 3 * H // S, 1)]
    assert len(slices) == T * D * S
    assert not [q for q in HostLoop.products if q[:3] == (H, B, 3 * H)]   # (no whole product)
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1, np.abs(r).max()))
    for patch in ((_device, "capturing", lambda cp, stream=None: True),
                  (HostLoop, "has_gemm_pointers", lambda self: False)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(*patch)
            HostLoop.products.clear()
            again = plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plans.STEPS)
            whole = [q for q in HostLoop.products if q[:4] == (H, B, 3 * H, D)]
            assert len(whole) == T and not [q for q in HostLoop.products if q[2] == 3 * H // S]
            for g, r in zip(again, ref):
                np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1, np.abs(r).max()))


@pytest.mark.parametrize("dtype,wide,lengths,h0", [
    (np.float64, False, False, True), (np.float64, False, True, False),
    (np.float32, True, False, True), (np.float32, True, True, True),
    (np.float32, False, False, False)], ids=["f64", "f64 lengths", "f32 wide",
                                             "f32 wide lengths", "f32 split"])
@pytest.mark.parametrize("lag", [None, 1], ids=["fork at join", "fork one call late"])
def test_steps_plan_runs_the_directions_apart_with_the_batched_chain_s_results(
        host_device, monkeypatch, rng, dtype, wide, lengths, h0, lag):
    """DIRECTION_STREAMS: a bidirectional per-step pass runs each direction as its own
    chain (direction 1's in a fork, whose calls run here at the join or one call late,
    ForkedLoop: a chain reading the other's results, or sharing a temporary with it,
    would go wrong). Forward (training and inference) and backward give the batched chain's
    results bit for bit, every product of one direction (batch 1), wide or not; a pass whose
    backward product is split (float32, k >= SPLIT_MIN_K) keeps the batched chain there, as
    does a unidirectional pass; off, nothing forks."""
    from types import SimpleNamespace

    from cugru import _plan
    if wide:
        for name in ("WIDE_MIN_H", "WIDE_MIN_ROWS", "WIDE_BACKWARD_MIN_ROWS"):
            monkeypatch.setattr(_plan, name, 1)
        monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(cc=90, id=0))
    else:
        monkeypatch.setattr(_plan, "WIDE", False)
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(ForkedLoop, "lag", lag)
    monkeypatch.setattr(_plan, "DIRECTION_STREAMS_MIN_ROWS", 1)
    split = dtype == np.float32 and not wide
    T, B, I, H = (3, 2, 3, 342) if split else (4, 3, 2, 5)
    p = problem(rng, T, B, I, H, True, with_h0=h0, lengths=lengths)
    dev = lambda a: None if a is None else host_device(a.astype(dtype))  # noqa: E731
    G = 3 * H
    runs = {}
    for apart in (False, True):
        monkeypatch.setattr(_plan, "DIRECTION_STREAMS", apart)
        HostLoop.forks.clear()
        HostLoop.products.clear()
        pairs, saved = steps_forwards(dev, p, True)
        outs = [a for pair in pairs for a in pair]
        forward = [q[:4] for q in HostLoop.products if q[:3] == (G, B, H)]
        assert forward == [(G, B, H, 1 if apart else 2)] * (2 * T * (2 if apart else 1))
        assert len(HostLoop.forks) == (2 if apart else 0)
        HostLoop.products.clear()
        outs += list(plans.backward(dev(p["dy"]), dev(p["dh_n"]), saved, plans.STEPS))
        recurrent = [q[:4] for q in HostLoop.products if q[:2] == (H, B) and q[2] <= G]
        if split:
            assert len(HostLoop.forks) == (2 if apart else 0) and (H, B, G, 1) not in recurrent
        else:
            assert len(HostLoop.forks) == (3 if apart else 0)
            assert recurrent == [(H, B, G, 1 if apart else 2)] * (T * (2 if apart else 1))
        runs[apart] = outs
    for a, b in zip(runs[False], runs[True]):
        assert a.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(a, b)
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                              lengths=p.get("lengths"))
    ref = (ref_y, ref_hn) + tuple(oracle.gru_backward(p["dy"], p["dh_n"], saved))
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for g, r in zip(runs[True][2:], ref):
        np.testing.assert_allclose(g, r, rtol=tol, atol=tol * max(1, np.abs(r).max()))
    HostLoop.forks.clear()
    plans.forward(dev(p["x"]), None, *(dev(w[:1]) for w in weights(p)), plans.STEPS)
    assert not HostLoop.forks


def test_directions_run_apart_from_the_measured_rows_where_a_fork_serves(monkeypatch):
    """StepsPlan.streams: two directions of DIRECTION_STREAMS_MIN_ROWS rows or more (S10's
    256 gained on an H100, 48 and 3 lost), one product a step, on a loop that can fork;
    under a caller's capture only once the fork's stream and handle exist."""
    from types import SimpleNamespace

    from cugru import _plan
    streams = _plan.StepsPlan.streams
    fork = SimpleNamespace(can_fork=lambda: True)
    capture, made = [False], [False]
    monkeypatch.setattr(_device, "cupy", lambda: None)
    monkeypatch.setattr(_device, "capturing", lambda cp, stream=None: capture[0])
    monkeypatch.setattr(_device, "fork_made", lambda: made[0])
    assert _plan.DIRECTION_STREAMS and _plan.DIRECTION_STREAMS_MIN_ROWS == 128
    p = lambda B, D=2: SimpleNamespace(B=B, D=D)  # noqa: E731
    assert streams(fork, p(128)) and streams(fork, p(256)) and not streams(fork, p(127))
    assert not streams(fork, p(256, 1)) and not streams(fork, p(256), split=(2, None, None))
    assert not streams(SimpleNamespace(can_fork=lambda: False), p(256))
    capture[0] = True
    assert not streams(fork, p(256))
    made[0] = True
    assert streams(fork, p(256))
    monkeypatch.setattr(_plan, "DIRECTION_STREAMS", False)
    assert not streams(fork, p(256))


def test_pointer_tables_are_kept_per_key_and_device_the_least_recently_asked_dropped(
        monkeypatch):
    """_device.pointer_table: a table is built once per key and device and kept; asking
    for it again makes it the most recent; beyond POINTER_TABLES tables or
    POINTER_TABLE_BYTES bytes the least recently asked for are dropped."""
    device = [0]
    fake = types.SimpleNamespace(asarray=np.asarray, cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: device[0])))
    monkeypatch.setattr(runtime, "cupy_module", lambda: fake)
    monkeypatch.setattr(_device, "_TABLES", type(_device._TABLES)())
    monkeypatch.setattr(_device, "POINTER_TABLES", 3)
    monkeypatch.setattr(_device, "POINTER_TABLE_BYTES", 10 * 8)
    built = []

    def table(key, n=2):
        def build():
            built.append(key)
            return np.arange(n) + 100 * len(built)
        return _device.pointer_table(key, build)
    a = table("a")
    assert a.dtype == np.uint64 and table("a") is a and built == ["a"]
    device[0] = 1
    assert table("a") is not a and built == ["a", "a"]        # (another device)
    device[0] = 0
    table("b"), table("a")              # a asked for last: b, then a on device 1, are older
    table("c")                          # 4 tables > 3: the least recent, a on device 1, goes
    assert [k for k, _ in _device._TABLES] == ["b", "a", "c"]
    table("d", n=5)                     # 2 + 2 + 2 + 5 = 11 > 10 slots: b goes
    assert [k for k, _ in _device._TABLES] == ["a", "c", "d"] and table("a") is a


def test_the_resident_backward_pass_refuses_float64_and_runs_w_hh_off_16_bytes_per_step(
        host_device, rng, monkeypatch):
    """plans.backward on a resident plan: float64 data is a ValueError naming the pass and
    the dtype; a W_hh off 16-byte boundaries (a view into a larger array) runs the per-step
    recurrence (the kernel reads W_hh 16 bytes at a time), with the oracle's gradients."""
    plan = plans.resident_split(3, 8, 1, 132, 232448)
    p = problem(rng, 2, 3, 4, 8, False)
    w = weights(p)
    _, _, saved64 = plans.forward(host_device(p["x"]), host_device(p["h0"]),
                                  *map(host_device, w), plans.STEPS)
    with pytest.raises(ValueError, match="runs float32 data without quant or lengths; this "
                                         "backward pass has float64"):
        plans.backward(host_device(p["dy"]), None, saved64, plan)
    f32 = lambda a: host_device(a.astype(np.float32))  # noqa: E731
    flat = np.zeros(w[1].size + 1, np.float32)       # W_hh 4 bytes into a larger buffer
    flat[1:] = w[1].reshape(-1)
    w_hh = flat[1:].reshape(w[1].shape).view(type(f32(w[1])))
    assert w_hh.data.ptr % 16
    _, _, saved = plans.forward(f32(p["x"]), f32(p["h0"]), f32(w[0]), w_hh, f32(w[2]),
                                f32(w[3]), plan)
    per_step, steps_backward = [], plans.StepsPlan.backward

    def counted(self, loop, q):
        per_step.append(q)
        return steps_backward(self, loop, q)
    monkeypatch.setattr(plans.StepsPlan, "backward", counted)
    monkeypatch.setattr(_catalog, "resident_backward",
                        lambda split: pytest.fail("the resident backward kernel was asked for"))
    got = plans.backward(f32(p["dy"]), f32(p["dh_n"]), saved, plan)
    assert len(per_step) == 1
    _, _, ref_saved = oracle.gru_forward(p["x"], p["h0"], *w)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], ref_saved)
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5 * max(1, np.abs(r).max()))


def test_the_resident_splits_fill_their_blocks_and_fit_a_block_s_shared_memory():
    """Each RESIDENT_SPLITS entry fills RESIDENT_THREADS threads (groups of rows / 4 x units
    / 2 threads, one a k slice of a chunk); resident_smem counts the W_hh columns (k
    rounded up to a chunk), two chunks of h and groups 1..'s sums; the backward kernel's
    groups of 4 rows x 4 units fill the block too."""
    for rows, units, k_split in _catalog.RESIDENT_SPLITS:
        assert _catalog.resident_backward_split((rows, units, k_split)) * \
            (rows // _catalog.RESIDENT_THREAD_ROWS) * (units // 4) == _catalog.RESIDENT_THREADS
        group = rows // _catalog.RESIDENT_THREAD_ROWS * units // 2
        assert k_split * group == _catalog.RESIDENT_THREADS
        assert _catalog.RESIDENT_CHUNK % (4 * k_split) == 0
    assert _catalog.resident_smem((64, 32, 1), 512) == (512 * 96 + 2 * 32 * 68) * 4
    # backward: W_hh's columns over 3H rounded up to a chunk, then the larger of two chunks
    # of d_gate_h and every group's sums (every split: two chunks take more than the sums)
    assert _catalog.resident_backward_split((64, 32, 1)) == 2
    assert _catalog.resident_backward_split((32, 16, 4)) == 8
    assert _catalog.resident_smem((64, 32, 1), 512, backward=True) == \
        (1536 * 32 + 2 * 32 * 68) * 4
    assert _catalog.resident_smem((32, 16, 4), 1000, backward=True) == \
        (3008 * 16 + 2 * 64 * 36) * 4
    assert sorted(_catalog.RESIDENT_BACKWARD_CHUNK) == sorted(_catalog.RESIDENT_SPLITS)
    for split, chunk in _catalog.RESIDENT_BACKWARD_CHUNK.items():     # (4 j a group at least)
        assert chunk % (4 * _catalog.resident_backward_split(split)) == 0
    # a backward block never takes more than a forward one: it fits wherever the plan does
    for split in _catalog.RESIDENT_SPLITS:
        for H in range(1, 2049):
            assert _catalog.resident_smem(split, H, backward=True) <= \
                _catalog.resident_smem(split, H), (split, H)
    assert _catalog.resident_smem((32, 16, 4), 1000) == \
        (1024 * 48 + 2 * 32 * 36 + 3 * 24 * 64) * 4


H200 = dict(sms=132, smem_limit=232448)


def test_resident_split_takes_the_least_work_a_thread_that_fits_the_sms():
    """resident_split on an H200 (132 SMs, 227 KiB a block): S10 on blocks of 64 rows x 32
    units (128 blocks), S9 with k split four ways (128 blocks of 32 rows x 16 units), O14
    (H = 650) split two ways where four would need 164 blocks; none where the blocks or
    W_hh's columns do not fit (H = 2048, B = 256 at H = 1024)."""
    def split(B, H, D):
        plan = plans.resident_split(B, H, D, **H200)
        return plan and (plan.split, plan.blocks)
    assert split(256, 512, 2) == ((64, 32, 1), 64)
    assert split(64, 1024, 1) == ((32, 16, 4), 128)
    assert split(48, 650, 2) == ((64, 16, 2), 41)
    assert split(3, 1024, 2) == ((32, 16, 4), 64)
    assert split(32, 2048, 1) is None and split(256, 1024, 1) is None
    assert split(256, 545, 1) is None              # (64 x 32 holds H up to 544)
    assert split(256, 544, 1) == ((64, 32, 1), 68)
    plan = plans.resident_split(256, 512, 2, **H200)
    assert plan.smem == _catalog.resident_smem(plan.split, 512) <= H200["smem_limit"]


def test_among_the_benchmark_s_shapes_auto_runs_the_wide_products_per_step_where_measured(
        monkeypatch):
    """On an H200 stand-in (its SMs, its shared memory, the tile kernels' groups at once
    as measured) path="auto" runs float32 passes whose products widen (wide_products) per
    step: of bench.paths' tables (S1-S10, O1-O16, A1-A6) that moves the forward passes of S9
    and S10 off the resident kernel and of S8 and O16 off their grid plans (each measured,
    WIDE's note), and nothing else. With WIDE off: S9's and S10's forward passes run on the
    resident kernel, and no other pass; the backward passes of S10, O14 and O5 run per step
    (their products split), O5's no longer on the persist kernels, and so do S8's and O16's,
    whose grid plans have more than one group (their forward passes keep them); O4 (one
    group) and A5 and A6 (k = 3H below SPLIT_MIN_K) keep their grid plans."""
    from bench.paths import ALL
    from cugru import _plan
    monkeypatch.setattr(_plan, "groups_at_once", _h200_at_once())
    monkeypatch.setattr(_plan, "_persist_resident_blocks", lambda *a: 1)
    monkeypatch.setattr(_device, "device", lambda: types.SimpleNamespace(
        cc=90, smem_optin=H200["smem_limit"], sms=H200["sms"], id=0))
    f32 = np.dtype(np.float32)

    monkeypatch.setattr(_plan, "_CHOSEN", {})

    def every_choice(wide):      # (the plan cache is kept: its key names WIDE)
        monkeypatch.setattr(_plan, "WIDE", wide)
        _plan._fast_plan.cache_clear()
        return {(sid, backward): plans.choose("auto", B, H, 2 if bi else 1, f32, backward, T,
                                              I)
                for sid, ((T, B, I, H, bi), _) in ALL.items() for backward in (False, True)}
    try:
        chosen, wide = every_choice(False), every_choice(True)
    finally:
        _plan._fast_plan.cache_clear()
    resident = {k for k, plan in chosen.items() if isinstance(plan, plans.ResidentPlan)}
    assert resident == {("S9", False), ("S10", False)}
    for sid in ("S10", "O14", "O5", "S8", "O16"):
        assert chosen[sid, True] is plans.STEPS, sid
    for sid in ("S8", "O16", "O4", "A5", "A6"):
        grid, H = chosen[sid, False], ALL[sid][0][3]
        assert isinstance(grid, plans.TilePlan) and grid.cluster == 0, sid
        splits = plans.backward_split(H, 1, 4, "strict") > 1
        assert (splits and grid.groups > plans.GRID_AUTO_SPLIT_MAX_GROUPS) == \
            (sid in ("S8", "O16")), sid
    for sid in ("O4", "A5", "A6"):
        back = chosen[sid, True]
        assert isinstance(back, plans.TilePlan) and back.cluster == 0, sid
    moved = {k for k in chosen if wide[k] != chosen[k]}
    assert moved == {("S8", False), ("S9", False), ("S10", False), ("O16", False)}
    assert all(wide[k] is plans.STEPS for k in moved)


def test_auto_runs_float64_per_step_beyond_one_wave_of_grid_groups(monkeypatch):
    """On an H200 stand-in, float64: path="auto" runs a pass per step where fast_plan's
    grid plan needs more than F64_GRID_AUTO_MAX_WAVES waves of groups (S3, S5, O1, A1, O2:
    both passes) or its cluster plan more than F64_CLUSTER_AUTO_MAX_WAVES (O7's and O13's
    forward pass), in a pass of more than one step; O9's shape keeps its grid plan at T = 1
    and not at T = 2; no other pass of bench.paths' tables moves, and no float32 pass. Block
    plans stay under any limit (O8's: two waves here)."""
    from bench.paths import ALL
    from cugru import _plan
    monkeypatch.setattr(_plan, "groups_at_once", _h200_at_once())
    monkeypatch.setattr(_plan, "_persist_resident_blocks", lambda *a: 1)
    monkeypatch.setattr(_device, "device", lambda: types.SimpleNamespace(
        cc=90, smem_optin=H200["smem_limit"], sms=H200["sms"], id=0))

    def every_choice(limits):
        monkeypatch.setattr(_plan, "_CHOSEN", {})
        monkeypatch.setattr(_plan, "F64_GRID_AUTO_MAX_WAVES", limits[0])
        monkeypatch.setattr(_plan, "F64_CLUSTER_AUTO_MAX_WAVES", limits[1])
        _plan._fast_plan.cache_clear()
        got = {(sid, dtype.char, backward): plans.choose("auto", B, H, 2 if bi else 1, dtype,
                                                         backward, T, I)
               for dtype in (np.dtype(np.float32), np.dtype(np.float64))
               for sid, ((T, B, I, H, bi), _) in ALL.items() for backward in (False, True)}
        o9 = [plans.choose("auto", 64, 256, 1, np.dtype(np.float64), False, T, 128)
              for T in (1, 2)]
        return got, o9
    try:
        without, _ = every_choice((10 ** 9, 10 ** 9))
        rule = (plans.F64_GRID_AUTO_MAX_WAVES, plans.F64_CLUSTER_AUTO_MAX_WAVES)
        assert rule == (1, 2)
        got, o9 = every_choice(rule)
    finally:
        _plan._fast_plan.cache_clear()
    moved = {k for k in got if got[k] != without[k]}
    assert all(isinstance(without[k], plans.TilePlan) and got[k] is plans.STEPS for k in moved)
    assert moved == {(sid, "d", b) for sid in ("S3", "S5", "O1", "A1", "O2")
                     for b in (False, True)} | {("O7", "d", False), ("O13", "d", False)}
    assert isinstance(o9[0], plans.TilePlan) and o9[1] is plans.STEPS
    # with every limit at one wave, S4's float64 cluster plan (two waves) moves, and O8's
    # block plan (two waves too) stays
    try:
        tight, _ = every_choice((1, 1))
    finally:
        _plan._fast_plan.cache_clear()
    o8 = got["O8", "d", False]
    assert o8.cluster == 1 and plans.waves(o8, 2, _h200_at_once()(o8, None, 0)) == 2
    assert tight["O8", "d", False] == o8
    assert without["S4", "d", False].cluster > 1 and tight["S4", "d", False] is plans.STEPS


def test_auto_runs_the_resident_kernels_where_it_would_run_the_per_step_path(monkeypatch):
    """path="auto" takes the resident kernels for a pass that would run per step (float32
    or half data computing in float32, math="strict", no quant, no lengths, a split that
    fits; forward alone, B filling its blocks' rows: RESIDENT_AUTO_MAX_EMPTY; a backward
    pass runs per step, its product split); path="resident" takes them wherever they fit
    or is a ValueError naming what does not. (With the products in float32: where they
    run in float64, path="auto" takes the per-step path first, wide_auto_takes.)"""
    from cugru import _plan
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(_plan, "WIDE", False)
    monkeypatch.setattr(_plan, "fast_plan", lambda *a: None)     # (no GPU to plan on)
    monkeypatch.setattr(_plan.dev, "device", lambda: types.SimpleNamespace(
        id=0, sms=H200["sms"], smem_optin=H200["smem_limit"]))
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    want = plans.resident_split(256, 512, 2, **H200)
    assert plans.choose("auto", 256, 512, 2, f32, False, 50, 512) == want
    assert plans.choose("resident", 256, 512, 2, f32, False, 50, 512) == want
    assert plans.choose("auto", 256, 512, 2, f32, True, 50, 512) is plans.STEPS
    assert plans.choose("auto", 256, 512, 1, f32, True, 50, 512) is plans.STEPS
    assert plans.resident_split(256, 511, 2, **H200) is not None
    assert plans.choose("auto", 256, 511, 2, f32, True, 50, 512) is plans.STEPS
    assert plans.choose("resident", 256, 512, 2, f32, True, 50, 512) == want
    for kw in ({"math": "tf32"}, {"qat": True}, {"lengths": True}):
        for backward in (False, True):
            assert plans.choose("auto", 256, 512, 2, f32, backward, 50, 512, **kw) \
                is plans.STEPS
            with pytest.raises(ValueError, match="path='resident': B = 256, H = 512, 2 dir"):
                plans.choose("resident", 256, 512, 2, f32, backward, 50, 512, **kw)
    assert plans.choose("auto", 256, 512, 2, f64, False, 50, 512) is plans.STEPS
    assert plans.choose("auto", 256, 512, 2, f64, True, 50, 512) is plans.STEPS
    o14 = plans.resident_split(48, 650, 2, **H200)          # (16 of its 64 rows empty)
    assert plans.resident_empty(o14, 48) == 0.25 > plans.RESIDENT_AUTO_MAX_EMPTY
    assert plans.choose("auto", 48, 650, 2, f32, False, 100, 90) is plans.STEPS
    assert plans.choose("auto", 48, 650, 2, f32, True, 100, 90) is plans.STEPS
    s9 = plans.choose("auto", 64, 1024, 1, f32, False, 100, 1024)
    assert s9.split == (32, 16, 4) and plans.resident_empty(s9, 64) == 0
    assert plans.choose("auto", 64, 1024, 1, f32, True, 100, 1024) is plans.STEPS
    for backward in (False, True):
        assert plans.choose("resident", 48, 650, 2, f32, backward, 100, 90) == o14
        assert plans.choose("auto", 32, 2048, 1, f32, backward, 50, 256) is plans.STEPS
    with pytest.raises(ValueError, match="in float64 under math='strict' do not fit"):
        plans.choose("resident", 256, 512, 2, f64, False, 50, 512)
    assert plans.choose("steps", 256, 512, 2, f32, False, 50, 512) is plans.STEPS
    # a GPU whose SMs hold S9's shape on 64 x 16 alone (114 SMs: 32 x 16 needs 128
    # blocks): that split lost wherever it ran, so auto runs per step there
    monkeypatch.setattr(_plan.dev, "device", lambda: types.SimpleNamespace(
        id=1, sms=114, smem_optin=H200["smem_limit"]))
    s9 = plans.choose("resident", 64, 1024, 1, f32, False, 100, 1024)
    assert s9.split == (64, 16, 2) and s9.split not in plans.RESIDENT_AUTO_SPLITS
    assert plans.choose("auto", 64, 1024, 1, f32, False, 100, 1024) is plans.STEPS
    # a fast plan that auto takes keeps its place
    tile = types.SimpleNamespace(cluster=2)
    monkeypatch.setattr(_plan, "fast_plan", lambda *a: tile)
    assert plans.choose("auto", 64, 1000, 1, f32, False, 50, 64) is tile


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("B,H,D", [(1, 1, 1), (64, 64, 1), (64, 1024, 2), (256, 512, 2),
                                   (3, 130, 2)])
def test_fast_path_splits_respect_the_kernels_limits(B, H, D, itemsize):
    """Every split plans.persist_split offers fits a block: units <= threads, the batch rows
    per thread a built instance, shared memory within the limit, every unit owned once."""
    limit = 227 * 1024
    seen = 0
    for blocks in range(1, H + 1):
        plan = plans.persist_split(B, H, D, blocks, itemsize, limit)
        if plan is None:
            continue
        seen += 1
        assert plan.units <= _catalog.PERSIST_THREADS
        assert plan.rows_per_thread in _catalog.PERSIST_ROWS[itemsize]
        assert plan.rows_per_thread * (_catalog.PERSIST_THREADS // plan.units) >= B
        assert (plan.blocks - 1) * plan.units < H <= plan.blocks * plan.units
        assert max(plan.smem_fwd, plan.smem_bwd) <= limit
        assert plan.kc_fwd % (16 // itemsize) == 0 and plan.kc_bwd % (16 // itemsize) == 0
        assert plan.kc_fwd <= -(-H // 4) * 4 and plan.kc_bwd <= -(-3 * H // 4) * 4
        assert plans.persist_cost(plan, B, H, D, itemsize) > 0
    assert seen > 0


@pytest.mark.parametrize("T,B,I,H,bi,h0", [(3, 2, 4, 5, False, True), (4, 7, 2, 3, True, True),
                                           (5, 1, 3, 17, True, False), (3, 9, 2, 33, False, True),
                                           (2, 3, 2, 1, True, True), (3, 9, 2, 34, True, True),
                                           (2, 5, 3, 130, True, False),
                                           (2, 3, 2, 98, False, True)])
@pytest.mark.parametrize("tile", _catalog.TILES[8], ids=str)
@pytest.mark.parametrize("lengths", [False, True], ids=["T", "lengths"])
def test_tile_kernels_plan_computes_the_oracle(host_device, monkeypatch, rng, T, B, I, H, bi,
                                               h0, tile, lengths):
    """The tile kernels' layout (weights per thread, lanes per unit, the shared buffers, rows
    per group, the pointwise threads; at grid scope the blocks of a group and the slots
    taking groups in turn), transcribed in numpy, for every built tile kernel and row count
    it takes, computes the oracle's results."""
    D = 2 if bi else 1
    if plans.tile_split(B, H, D, tile, 1, 8) is None:
        pytest.skip("the tile kernel does not hold this H")
    p = problem(rng, T, B, I, H, bi, with_h0=h0, lengths=lengths)
    dev = host_device
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi,
                                              lengths=p.get("lengths"))
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dims = (T, B, I, H, D)
    for rows in range(1, tile[2] + 1):
        split = plans.tile_split(B, H, D, tile, rows, 8)
        # grid scope: one slot (every group in turn), two, and one per group
        for slots in ([0] if tile[0] else sorted({1, min(2, split.groups), split.groups})):
            plan = dataclasses.replace(split, slots=slots)
            saved_dev = _gpu_path_matches(dev, p, dims, plan, ref_y, ref_hn, saved, ref)
    no_dh_n = oracle.gru_backward(p["dy"], None, saved)
    got = plans.backward(dev(p["dy"]), None, saved_dev, plan)
    for g, r in zip(got, no_dh_n):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))


def _all_tiles():
    return [(it, tile) for it in (4, 8) for tile in _catalog.TILES[it]]


def _splits(B, H, tile, itemsize):
    """(rows, plan) for each number of rows per group the tile kernels hold at batch B,
    one direction"""
    for rows in range(1, tile[2] + 1):
        plan = plans.tile_split(B, H, 1, tile, rows, itemsize)
        if plan is not None:
            yield rows, plan


def test_tile_rank_takes_the_fewest_rows_per_group_that_the_fewest_waves_hold():
    """Of one tile kernel's splits, fast_plan's ranking takes the fewest waves of groups, and
    among those the fewest rows per group: S3 (B = 64) on clusters of 8 with 13 groups at
    once runs 13 groups of 5 rows (4 rows would need 16 groups, two waves), not 8 of 8."""
    tile = (8, 8, 8, 256, 1)
    ranked = sorted((plans.tile_rank(plan, 1, 13), rows)
                    for rows, plan in _splits(64, 256, tile, 4))
    assert [rows for _, rows in ranked][:4] == [5, 6, 7, 8]
    assert ranked[0][0][0] == 1 and ranked[4][0][0] == 2       # (waves: one, then two)


def test_a_forward_pass_at_cluster_scope_ranks_one_unit_per_thread_first():
    """Among splits alike up to the units per thread, the forward pass at cluster scope takes
    8 packs x 1 unit (S7: B = 1, H = 128, clusters of 4), the backward pass 4 x 2; at block
    scope both passes keep 4 x 2 (S4's shape on 512-thread blocks)."""
    one = plans.tile_split(1, 128, 1, (4, 8, 1, 256, 1), 1, 4)
    two = plans.tile_split(1, 128, 1, (4, 4, 1, 256, 2), 1, 4)
    assert one.packs * one.per_thread == two.packs * two.per_thread
    assert plans.tile_rank(one, 1, 33) < plans.tile_rank(two, 1, 33)
    assert plans.tile_rank(two, 1, 33, backward=True) < plans.tile_rank(one, 1, 33,
                                                                         backward=True)
    one = plans.tile_split(64, 128, 2, (1, 8, 1, 512, 1), 1, 4)
    two = plans.tile_split(64, 128, 2, (1, 4, 1, 512, 2), 1, 4)
    for backward in (False, True):
        assert plans.tile_rank(two, 2, 132, backward) < plans.tile_rank(one, 2, 132, backward)


def test_fast_plan_ranks_each_pass_with_its_own_rule(monkeypatch):
    """_fast_plan hands the pass to tile_rank: on an sm_90 stand-in where every cluster of
    four holds 33 groups at once, S7's shape (B = 1, H = 128) plans its forward pass on 8
    packs x 1 unit a thread and its backward pass on 4 x 2."""
    from types import SimpleNamespace

    from cugru import _device, _plan
    monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(
        cc=90, smem_optin=227 * 1024, sms=132, id=0))
    monkeypatch.setattr(_plan, "groups_at_once",
                        lambda plan, dtype, device_id, qat=False, lengths=False: 33)
    _plan._fast_plan.cache_clear()
    try:
        fwd = _plan._fast_plan(1, 128, 1, "<f4", 0, False)
        bwd = _plan._fast_plan(1, 128, 1, "<f4", 0, True)
    finally:
        _plan._fast_plan.cache_clear()
    assert (fwd.tile, bwd.tile) == ((4, 8, 1, 256, 1), (4, 4, 1, 256, 2))


def test_tile_splits_are_the_runnable_splits(monkeypatch):
    """tile_splits (what fast_plan ranks and the sweeps time): every split of the dtype's
    tiles that runs on the device's compute capability, has the pass's instance, fits its
    shared memory and has a group per direction resident, with its groups at once; in
    cat.TILES order, then by rows. Checked against the rule restated on stand-in devices:
    sm_80 (no cluster tiles), a small shared memory, a grid scope holding no group, and a
    pass with lengths (the tiles without such instances left out)."""
    from types import SimpleNamespace

    from cugru import _catalog as cat
    from cugru import _device, _plan

    def at_once(plan, dtype, device_id, qat=False, lengths=False):
        return 0 if plan.cluster == 0 else 7

    monkeypatch.setattr(_plan, "groups_at_once", at_once)
    B, H, D = 24, 64, 2
    counts = []
    for cc, smem, lengths in ((90, 227 * 1024, False), (80, 163 * 1024, False),
                              (90, 40 * 1024, False), (90, 227 * 1024, True)):
        monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(
            cc=cc, smem_optin=smem, sms=132, id=0))
        got = _plan.tile_splits(B, H, D, np.float32, lengths=lengths)
        want = []
        for tile in cat.TILES[4]:
            if not cat.tile_runs_on(tile, cc) or not cat.tile_has("float", tile, "train",
                                                                   False, lengths):
                continue
            for r in range(1, tile[2] + 1):
                p = _plan.tile_split(B, H, D, tile, r, 4)
                if p is not None and max(p.smem_fwd, p.smem_bwd) <= smem and tile[0]:
                    want.append((p, 7))
        assert got == want and want
        assert all(p.cluster <= 1 for p, _ in got) or cc >= 90
        counts.append(len(got))
    # (each stand-in leaves out some of what sm_90 with 227 KiB runs)
    assert all(n < counts[0] for n in counts[1:])


def _h200_at_once(four_factor=1):
    """A stand-in for _plan.groups_at_once on an H200 (132 SMs; clusters of 2, 4 and 8 at
    once as 9b917ce's probe found them), the 4-row tiles given `four_factor` times their
    siblings' groups."""
    def at_once(plan, dtype, device_id, qat=False, lengths=False):
        if plan.cluster == 0:
            return 132 // plan.group_blocks
        if plan.cluster == 1:
            return 264 if plan.threads == 256 else 132
        n = {2: 66, 4: 30, 8: 15}[plan.cluster]
        return n * four_factor if plan.tile in _catalog.FOUR_ROW_TILES else n
    return at_once


def test_the_4_row_tiles_take_only_their_8_row_siblings_places(monkeypatch):
    """The float32 tiles of 4 rows (FOUR_ROW_TILES, each an 8-row tile's sibling: the same
    cluster, packs, threads and units per thread) change a plan only where the planner
    runs the sibling at 4 rows or fewer, and there take its split at the same rows (they
    compute 4 of the sibling's 8 rows: the same bits, less product). Checked for both
    passes over a grid of shapes on stand-in sm_90 devices: the H200's clusters at once
    with 227 KiB of shared memory, the same with 99 KiB (where the 8-row sibling's split
    of 4 rows may not fit and the 4-row tile's does), and the 4-row tiles given twice the
    groups at once (fewer waves than their siblings); O13's shape (B = 512, H = 128) is
    one such place on the first."""
    from types import SimpleNamespace

    from cugru import _plan
    cat = _catalog
    assert set(cat.FOUR_ROW_TILES) <= set(cat.TILES[4])
    assert set(cat.FOUR_ROW_OF) <= set(cat.TILES[4])       # (the siblings are built)
    assert sorted(cat.FOUR_ROW_OF.values()) == sorted(cat.FOUR_ROW_TILES)
    assert not set(cat.FOUR_ROW_TILES) & set(cat.MMA_TILES)
    # (cluster scope: TilePlan.mma_fits, asked for their siblings while planning, then
    # reads the shared memory alone and compiles nothing)
    assert all(t[0] > 0 for t in cat.FOUR_ROW_TILES)
    full = cat.TILES[4]
    without = tuple(t for t in full if t not in cat.FOUR_ROW_TILES)

    def moves(smem_kib, four_factor):
        monkeypatch.setattr(_plan, "groups_at_once", _h200_at_once(four_factor))
        monkeypatch.setattr(_device, "device", lambda: SimpleNamespace(
            cc=90, smem_optin=smem_kib * 1024, sms=132, id=0))

        def plan(tiles, B, H, D, backward):
            monkeypatch.setitem(cat.TILES, 4, tiles)
            _plan._fast_plan.cache_clear()
            return _plan.fast_plan(B, H, D, np.float32, backward)
        moved = []
        try:
            for B in (1, 5, 32, 64, 96, 128, 160, 256, 512, 1024):
                for H in (32, 64, 96, 121, 128, 130, 256):
                    for D in (1, 2):
                        for backward in (False, True):
                            new = plan(full, B, H, D, backward)
                            old = plan(without, B, H, D, backward)
                            if new == old:
                                continue
                            assert cat.FOUR_ROW_OF[old.tile] == new.tile
                            assert new.rows == old.rows <= 4 and new.units == old.units
                            assert new.groups == old.groups and new.lanes == old.lanes
                            moved.append((B, H, D, backward))
        finally:
            monkeypatch.setitem(cat.TILES, 4, full)
            _plan._fast_plan.cache_clear()
        return moved
    first = moves(227, 1)
    assert (512, 128, 1, False) in first and (512, 128, 1, True) in first
    # (with 99 KiB the 8-row kernel's split of 4 rows at H = 128 does not fit, the 4-row
    # tile's does: the planner runs another split, not the 4-row tile in its place)
    small = moves(99, 1)
    assert (512, 128, 1, False) not in small and (512, 128, 1, True) not in small
    assert moves(227, 2)


def test_under_tf32_the_8_row_siblings_keep_their_mma(monkeypatch):
    """A pass that runs the MMA kernels (math="tf32" on float32 data: mma_applies) keeps
    the 8-row sibling where it would have taken a 4-row tile (the 4-row tiles have no MMA
    instances; under TF32 the sibling was 3-7% faster on O7 and O13, tools/tiles_ab.py
    --math tf32). Strict passes, TF32 with the MMA kernels off (plans.use_mma(False)) and
    float64 take the 4-row tile as before. O13's shape (B = 512, H = 128) on an H200
    stand-in, both passes, through fast_plan and choose."""
    from cugru import _plan
    cat = _catalog
    monkeypatch.setattr(_device, "device", lambda: runtime.Device(0, 132, 227 * 1024, 90))
    monkeypatch.setattr(_plan, "groups_at_once", _h200_at_once())
    monkeypatch.setattr(_plan, "_MMA_RUNS", {})
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    f32 = np.dtype(np.float32)
    assert _plan.mma_applies("tf32", "float") and not _plan.mma_applies("strict", "float")
    assert not _plan.mma_applies("tf32", "double")
    assert not _plan.mma_applies("tf32", "float", qat=True)
    assert not _plan.mma_applies("tf32", "float", lengths=True)
    _plan._fast_plan.cache_clear()
    try:
        for backward in (False, True):
            strict = plans.fast_plan(512, 128, 1, f32, backward)
            tf32 = plans.fast_plan(512, 128, 1, f32, backward, math="tf32")
            assert strict.tile in cat.FOUR_ROW_TILES and strict.rows == 4
            assert cat.FOUR_ROW_OF[tf32.tile] == strict.tile and tf32.rows == strict.rows
            assert tf32.mma_fits("float", 1)
            assert plans.choose("auto", 512, 128, 1, f32, backward, 256, 64) == strict
            assert plans.choose("auto", 512, 128, 1, f32, backward, 256, 64,
                                math="tf32") == tf32
            was = plans.use_mma(False)
            try:
                assert plans.fast_plan(512, 128, 1, f32, backward, math="tf32") == strict
                assert plans.choose("auto", 512, 128, 1, f32, backward, 256, 64,
                                    math="tf32") == strict
            finally:
                plans.use_mma(was)
            f64 = plans.fast_plan(512, 128, 1, np.float64, backward, math="tf32")
            assert f64 == plans.fast_plan(512, 128, 1, np.float64, backward)
    finally:
        _plan._fast_plan.cache_clear()


def test_grid_scope_waves_count_each_direction_s_slots():
    """At grid scope a direction's groups run in its slots (at_once // D, as resident gives
    them), so the waves the ranking counts are the waves that run: B = 32, H = 257, both
    directions, 7 groups at once (3 slots a direction) takes 6 rows (6 groups, 2 waves), not
    5 (7 groups: 3 waves, though 14 groups over 7 at once would read as 2)."""
    tile = (0, 4, 8, 256, 2)
    splits = {r: plans.tile_split(32, 257, 2, tile, r, 4) for r in range(1, 9)}
    assert all(s is not None for s in splits.values())
    assert plans.waves(splits[5], 2, 7) == 3 == -(-splits[5].groups
                                                   // plans.resident(splits[5], 2, 7).slots)
    assert plans.waves(splits[6], 2, 7) == 2
    best = min(splits.values(), key=lambda s: plans.tile_rank(s, 2, 7))
    assert best.rows == 6
    # block and cluster scope: all directions' groups share the GPU
    cluster = plans.tile_split(64, 256, 1, (8, 8, 8, 256, 1), 5, 4)
    assert plans.waves(cluster, 2, 13) == 2 and plans.waves(cluster, 1, 13) == 1


@pytest.mark.parametrize("H", [1, 2, 17, 33, 64, 65, 128, 129, 130, 256, 257, 512, 1024,
                               1028, 2048])
@pytest.mark.parametrize("itemsize,tile", _all_tiles(), ids=str)
def test_tile_splits_respect_the_kernels_limits(H, itemsize, tile):
    """Every tile split fits its kernels: every block owns units (a cluster's last blocks
    none where packs of units leave none), a unit's lanes (a power of
    two up to TILE_MAX_LANES, GRID_MAX_LANES at grid scope) cover H with the kernel's packs,
    the product's and the pointwise step's threads fit the block, grid scope takes the
    fewest blocks per group that hold H, and the rank counts
    waves of groups."""
    cluster, packs, max_rows, threads, per_thread = tile
    v = 16 // itemsize
    for rows, plan in _splits(37, H, tile, itemsize):
        blocks = plan.per_group
        assert plan.tile == tile and plan.scope == {0: "grid", 1: "block"}.get(cluster,
                                                                                "cluster")
        assert plan.rows == rows and plan.groups * rows >= 37 > (plan.groups - 1) * rows
        assert H <= blocks * plan.units
        if cluster > 1:     # packs of units, as few as cover H / cluster
            assert plan.units == -(-(-(-H // cluster)) // v) * v
        else:               # every block owns units
            assert (blocks - 1) * plan.units < H
        assert plan.lanes & (plan.lanes - 1) == 0
        assert plan.lanes <= (_catalog.GRID_MAX_LANES if cluster == 0
                              else _catalog.TILE_MAX_LANES)
        assert cluster <= 1 or plan.units % v == 0
        assert plan.units % per_thread == 0
        assert plan.units // per_thread * plan.lanes <= threads and plan.units * rows <= threads
        assert plan.lanes * packs * v >= H > plan.lanes // 2 * packs * v
        if cluster == 0:
            assert plan.group_blocks >= 1 and plan.slots == 0
            held = threads // plan.lanes * per_thread      # the most units a block takes
            assert plan.units <= held and (plan.group_blocks - 1) * held < H
        assert plans.tile_rank(plan, 1, 16)[0] == -(-plan.groups // 16)


def _pointwise_and_sends(plan, H, rows, rank, segs, itemsize):
    """A transcription of GruTile's roles in kernels/gru_tile.cu (the pointwise threads: p0, pi,
    pu, mine; pack_slot) and of gru_values_written's loop over a lane's sends, for block
    `rank` of a cluster with `rows` rows: ({(row, unit): threads with that pointwise step},
    p0, [(target block, offset of the pack in an exchange buffer)])."""
    C, Q, MR, NT, U = plan.tile
    J, KS, R, V = plan.units, plan.lanes, plan.rows, 16 // itemsize
    HS, HP, NP, j0 = KS * Q * V, -(-H // V) * V, 32 // V, rank * J
    pw = -(-J * rows // 32) * 32
    p0 = NT - pw if C > 1 and -(-J // U) * KS + pw <= NT else 0
    steps, sends = {}, []
    for tid in range(NT):
        pt = max(tid - p0, 0)
        pi, pu = (R if tid < p0 else pt // J), pt % J
        if pi < rows and pu < H - j0:
            steps.setdefault((pi, j0 + pu), []).append(tid)
        if C > 1 and p0 <= tid < p0 + pw:
            lane = tid & 31
            first = tid - p0 - lane + lane % NP * V
            xi, xu = first // J, first % J
            if xi < rows and j0 + xu < HP:
                off = xi * segs * HS + j0 + xu
                for idx in range(lane, NP * segs * (C - 1), 32):
                    rest = idx // NP
                    sends.append(((rank + 1 + rest // segs) % C, off + rest % segs * HS))
    return steps, p0, sends


@pytest.mark.parametrize("H", [4, 17, 33, 64, 98, 100, 128, 130, 132, 196, 200, 256])
@pytest.mark.parametrize("itemsize,tile", [(it, t) for it, t in _all_tiles() if t[0] > 0],
                         ids=str)
def test_each_pointwise_step_and_pack_has_one_thread(H, itemsize, tile):
    """Block and cluster scope: every (row, unit) of a block has exactly one thread with its
    pointwise step; where the warps with pointwise steps move past the product's threads,
    none of them has a part in the product; and at cluster scope each block sends every
    16-byte pack of its units (rows, segments) to every other block of the cluster exactly
    once, and nothing else: as many bytes as gru_exchange_bytes tells each block's
    mbarrier to expect (a shortfall would hang the kernel)."""
    C, Q, MR, NT, U = tile
    V = 16 // itemsize
    for R, plan in _splits(5, H, tile, itemsize):
        J, KS = plan.units, plan.lanes
        HS = KS * Q * V
        HP = -(-H // V) * V
        for rows in sorted({1, R, 5 % R or R}):
            for segs in (1, 3):
                received = [0] * C
                for rank in range(C):
                    steps, p0, sends = _pointwise_and_sends(plan, H, rows, rank, segs, itemsize)
                    for target, _ in sends:
                        received[target] += 16
                    owned = [(i, rank * J + u) for i in range(rows)
                             for u in range(min(J, H - rank * J))]
                    assert sorted(steps) == owned and all(len(t) == 1 for t in steps.values())
                    assert p0 == 0 or -(-J // U) * KS <= p0
                    expected = [(other, i * segs * HS + g * HS + k) for other in range(C)
                                if other != rank for i in range(rows) for g in range(segs)
                                for k in range(rank * J, min(rank * J + J, -(-H // V) * V), V)]
                    assert sorted(sends) == sorted(expected), (R, rows, segs, rank)
                if C > 1:   # gru_exchange_bytes, for block c (j0 = c*J)
                    assert received == [rows * segs * (HP - max(0, min(J, HP - c * J)))
                                        * itemsize for c in range(C)]


def _mma_part(tile, H, J, KS, j0, w, vec, fwd):
    """GruTileMma<float, Q, MR, U, true> of kernels/gru_tile.cu (the product on tensor
    cores) for one block at column j0, transcribed: each warp's jobs, each lane's A and B
    fragments as its load() and product() fill them, each mma.m16n8k8 as the matrices those
    fragments make (A at rows g, g + 8 and columns t, t + 4; B at rows t, t + 4 and column g;
    D at rows g, g + 8 and columns 2t, 2t + 1, lane 4g + t) and its D fragment stored as
    product() stores it, into the lane sums' MMA layout (row i of the batch at i*RS, RS =
    mma_part_row(J*KS); then gate, lane, unit). `w`: one direction's W_hh (3H, H); `vec`:
    the 8 rows of the vector (forward h, HS long; backward d_gate_h, three segments of HS).
    Returns the lane sums as sums[i, gate, unit, lane] (NaN where nothing was stored), how
    many times each was stored, and whether every store instruction's lanes met distinct
    shared-memory banks."""
    C, Q, MR, NT, U = tile
    NJ, NB, L, NC = 2 * U, Q // 4, 4 * Q, -(-J // 16)
    HS, JK = KS * L, J * KS
    RS = _catalog.mma_part_row(JK)
    CW = 1
    while CW < NJ and CW < NC:
        CW *= 2
    SW, NGC = NJ // CW, -(-NC // CW)
    NGS = -(-KS // SW)
    assert NGC * NGS == _catalog.mma_warps(J, KS, U) <= NT // 32

    def weight(gg, u, k):
        if not (u < J and j0 + u < H and k < H):
            return 0.0
        return w[gg * H + j0 + u, k] if fwd else w[gg * H + k, j0 + u]
    flat = np.full(MR * RS, np.nan)
    stores = np.zeros(MR * RS, int)
    apart = True
    for warp in range(NT // 32):
        for jb in range(NJ):
            # load(): the job, its offsets, its use bits, each lane's weight registers
            c, ks = (warp % NGC) * CW + jb % CW, (warp // NGC) * SW + jb // CW
            ok = warp < NGC * NGS and c < NC and ks < KS
            if not ok:                  # (use = 0 for every lane: the warp skips the job)
                continue
            lanes = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                u0 = 16 * c + g
                a = np.zeros((3, NB, 2, 4))
                for gg in range(3):
                    for b in range(NB):
                        for h in range(2):
                            for e in range(4):
                                a[gg, b, h, e] = weight(gg, u0 + 8 * (e & 1),
                                                        ks * L + 16 * b + 4 * t + 2 * h
                                                        + (e >> 1))
                lanes.append(dict(g=g, t=t, a=a, koff=ks * L + 4 * t, poff=ks * J + u0,
                                  use=4 + (u0 < J) + 2 * (u0 + 8 < J)))
            # product(): per gate the accumulators of each lane, the mmas on its registers
            for gg in range(3):
                acc = np.zeros((16, 8))         # D as the mma's matrix
                for b in range(NB):
                    for h in range(2):
                        A, Bm = np.full((16, 8), np.nan), np.full((8, 8), np.nan)
                        for ln in lanes:
                            g, t = ln["g"], ln["t"]
                            at = g * (HS if fwd else 3 * HS) + ln["koff"] \
                                + (0 if fwd else gg * HS) + 16 * b
                            y = vec.reshape(-1)[at:at + 4]          # the float4, x[gg][0..3]
                            r = ln["a"][gg, b, h]                   # a[jb][gg][b][h][0..3]
                            # (the PTX fragments: a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
                            # a3 (g + 8, t + 4); b0 (t, g), b1 (t + 4, g))
                            A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = r
                            Bm[t, g], Bm[t + 4, g] = y[2 * h], y[2 * h + 1]
                        acc += tf32(A) @ tf32(Bm)
                # the stores of acc[0..3] (D: c0 (g, 2t), c1 (g, 2t + 1), c2 (g + 8, 2t),
                # c3 (g + 8, 2t + 1)) at p = part + 2t*RS + poff, as product() writes them
                for e, (off, bit) in enumerate(((0, 1), (RS, 1), (8, 2), (RS + 8, 2))):
                    banks = []
                    for ln in lanes:
                        g, t = ln["g"], ln["t"]
                        if ln["use"] & bit:
                            at = 2 * t * RS + ln["poff"] + gg * JK + off
                            flat[at] = acc[g + 8 * (e >> 1), 2 * t + (e & 1)]
                            stores[at] += 1
                            banks.append(at % 32)
                    apart &= len(set(banks)) == len(banks)
    # the places unit_sums reads: row i, gate, lane ks, unit u
    i, gg, u, ks = np.meshgrid(range(MR), range(3), range(J), range(KS), indexing="ij")
    at = i * RS + gg * JK + ks * J + u
    assert (stores[np.setdiff1d(np.arange(MR * RS), at)] == 0).all()    # nothing elsewhere
    return flat[at], stores[at], apart


@pytest.mark.parametrize("tile", _catalog.MMA_TILES, ids=str)
@pytest.mark.parametrize("fwd", [True, False], ids=["forward", "backward"])
def test_the_mma_product_computes_each_lane_s_sums(rng, tile, fwd):
    """The product on tensor cores, transcribed (_mma_part), at the smallest and largest H
    each MMA tile holds and at H off the 16-unit chunks: every lane sum that the pointwise
    step adds is stored exactly once per step, with the sum over its slice of k (consecutive
    k, ks*L up), and the slices add up to the whole product; the lanes of each store meet
    distinct banks. Integer weights and vector, so every sum is exact and must be equal.
    The splits the MMA kernels do not hold (TilePlan.mma_holds: more warps than the block
    has) are left out; each tile has one they hold."""
    C, Q, MR, NT, U = tile
    holds = [H for H in range(1, 300 if C else 2100) if plans.tile_split(1, H, 1, tile, 1, 4)]
    seen = 0
    for H in sorted({min(holds), max(holds), *[h for h in (24, 40, 72, 96, 130, 250, 520)
                                               if h in holds]}):
        plan = plans.tile_split(1, H, 1, tile, 1, 4)
        if not plan.mma_holds("float"):
            continue
        seen += 1
        J, KS = plan.units, plan.lanes
        HS, L = KS * Q * 4, Q * 4
        w = rng.integers(-4, 5, (3 * H, H)).astype(np.float64)
        vec = np.zeros((MR, (1 if fwd else 3) * HS))
        for g in range(1 if fwd else 3):
            vec[:, g * HS:g * HS + H] = rng.integers(-4, 5, (MR, H))
        for c in range(plan.per_group):
            j0 = c * J
            sums, stores, apart = _mma_part(tile, H, J, KS, j0, w, vec, fwd)
            assert (stores == 1).all() and apart, (H, c)
            units = np.arange(J)
            for gg in range(3):
                seg = vec[:, (0 if fwd else gg * HS):][:, :HS]
                mat = np.zeros((J, HS))         # the block's weights of gate gg, zero outside
                live = units[j0 + units < H]
                mat[live, :H] = (w[gg * H + j0 + live, :] if fwd
                                 else w[gg * H:gg * H + H, j0 + live].T)
                for ks in range(KS):
                    want = seg[:, ks * L:(ks + 1) * L] @ mat[:, ks * L:(ks + 1) * L].T
                    np.testing.assert_array_equal(sums[:, gg, :, ks], want)
                np.testing.assert_array_equal(sums[:, gg].sum(axis=2), seg @ mat.T)
    assert seen, "no H of this tile runs the MMA kernels"


def test_a_pass_runs_the_mma_kernels_only_where_they_hold_it(monkeypatch):
    """TilePlan.runs_mma on a stand-in H100: a float32 pass under math="tf32" on an 8-row
    tile the MMA kernels hold runs them; not with math="strict", quantization, lengths,
    float64, a one-row tile, plans.use_mma(False), shared memory that holds the FMA kernels
    but not the MMA ones' padded lane sums, or at grid scope where the MMA kernels' blocks
    do not hold the plan's slots."""
    import types

    from cugru import _plan
    from cukernels import runtime
    smem = {"optin": 232448}
    monkeypatch.setattr(_plan.dev, "device", lambda: runtime.Device(0, 132, smem["optin"], 90))
    monkeypatch.setattr(_plan, "_MMA_RUNS", {})
    p = types.SimpleNamespace(math="tf32", qat=False, lengths=None, ctype="float", D=1)
    plan = plans.tile_split(64, 64, 1, (1, 8, 8, 256, 1), 2, 4)
    assert plan.runs_mma(p)
    for change in ({"math": "strict"}, {"qat": True}, {"lengths": np.ones(64, np.int32)},
                   {"ctype": "double"}):
        assert not plan.runs_mma(types.SimpleNamespace(**{**vars(p), **change})), change
    assert not plans.tile_split(64, 64, 1, (1, 8, 1, 512, 1), 1, 4).runs_mma(p)
    was = plans.use_mma(False)
    try:
        assert not plan.runs_mma(p)
    finally:
        plans.use_mma(was)
    smem["optin"] = plan.smem(True, True) - 4          # (the FMA kernels' fits)
    assert max(plan.smem_fwd, plan.smem_bwd) <= smem["optin"]
    monkeypatch.setattr(_plan, "_MMA_RUNS", {})
    assert not plan.runs_mma(p)
    # grid scope: as many groups resident as its slots, per the MMA kernels' occupancy
    smem["optin"] = 232448
    grid = plans.tile_split(8, 512, 1, (0, 4, 8, 256, 2), 8, 4)
    assert grid.mma_holds("float") and grid.group_blocks == 32
    monkeypatch.setattr(_plan.TilePlan, "kernel", lambda self, *a, **k: None)
    for per_sm, slots, runs in ((1, 4, True), (1, 5, False), (2, 8, True)):
        monkeypatch.setattr(_plan, "_MMA_RUNS", {})
        monkeypatch.setattr(_plan.dev, "blocks_per_sm", lambda k, t, s, n=per_sm: n)
        assert dataclasses.replace(grid, slots=slots).runs_mma(p) == runs, (per_sm, slots)


def test_use_mma_takes_a_bool_and_drops_the_graphs_when_it_changes(monkeypatch):
    from cugru import _plan
    cleared = []
    monkeypatch.setattr(_device, "clear_graphs", lambda: cleared.append(1))
    monkeypatch.setattr(_plan, "MMA", True)
    with pytest.raises(TypeError, match="on must be True or False"):
        plans.use_mma(1)
    assert plans.use_mma(True) is True and not cleared
    assert plans.use_mma(False) is True and cleared == [1] and _plan.MMA is False
    assert plans.use_mma(True) is False and cleared == [1, 1]


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("cluster", _catalog.CLUSTERS)
def test_largest_hidden_size_at_each_cluster_size(cluster, itemsize):
    """The largest H some tile kernel of each cluster size holds (docs/api.md's limits);
    below it, every H (a cluster's last blocks own no units where packs of units leave
    none: H = 130 in float32 in a cluster of 8)."""
    fits = {1: (128, 64), 2: (128, 64), 4: (128, 128), 8: (256, 128)}[cluster][itemsize // 8]
    tiles = [t for t in _catalog.TILES[itemsize] if t[0] == cluster]
    for H in range(1, 300):
        held = any(plans.tile_split(1, H, 1, t, 1, itemsize) for t in tiles)
        assert held == (H <= fits), H


def test_grid_scope_slots_fit_the_groups_the_gpu_holds():
    """_resident: a grid-scope plan gets as many slots per direction as groups fit at once
    (at most one per group), none where not one group per direction fits; block and cluster
    plans are left as they are."""
    grid = plans.tile_split(64, 512, 2, (0, 4, 8, 256, 2), 8, 4)   # 8 groups of 32 blocks
    assert grid.groups == 8 and grid.group_blocks == 32 and grid.slots == 0
    assert plans.resident(grid, 2, 4).slots == 2
    assert plans.resident(grid, 2, 100).slots == 8
    assert plans.resident(grid, 2, 1) is None
    assert plans.resident(grid, 2, 4).blocks == 2 * 32
    block = plans.tile_split(64, 64, 1, (1, 4, 1, 256, 1), 1, 4)
    assert plans.resident(block, 1, 0) is block


def test_clear_scratch_drops_every_kept_temporary(monkeypatch):
    """_device.clear_scratch empties the set of kept temporaries (their memory goes back)."""
    monkeypatch.setattr(_device, "_SCRATCH", {("gi", (1,), "f", 0, 0, 1): (np.zeros(1),)})
    _device.clear_scratch()
    assert _device._SCRATCH == {}


def test_the_per_step_recurrence_replays_touch_only_the_buffers_their_keys_name(
        host_device, rng):
    """The per-step path runs each pass's recurrence through Loop.replay, whose CUDA graph
    is launched again on any call with an equal key, and an inference pass whole
    (_passes.replayed_inference: its recurrence's replay inside it): every product,
    launch, copy and memset of those calls lies inside a buffer the key names (KeyedLoop
    fails otherwise), and the keys differ. A key without W_hh fails that check."""
    p = problem(rng, 6, 3, 4, 5, True, lengths=True)
    dev = host_device
    HostLoop.keys.clear()
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                              lengths=p["lengths"])
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    _gpu_path_matches(dev, p, (6, 3, 4, 5, 2), plans.STEPS, ref_y, ref_hn, saved, ref)
    # (the inference pass's, its recurrence's, the training pass's and the backward pass's)
    assert len(HostLoop.keys) == 4 and len(set(HostLoop.keys)) == 4
    assert HostLoop.keys[0][0] == "inference"
    graph_key = _device.graph_key

    def without_w_hh(*items):     # (the passes' keys end with W_hh)
        return graph_key(*items[:-1])
    _device.graph_key = without_w_hh
    try:
        with pytest.raises(AssertionError):
            _gpu_path_matches(dev, p, (6, 3, 4, 5, 2), plans.STEPS, ref_y, ref_hn, saved, ref)
    finally:
        _device.graph_key = graph_key


def test_graph_key_names_buffers_by_address_and_size():
    a = np.zeros((2, 3), np.float32).view(DevArray)
    key = _device.graph_key("pass", a, {"b": 2, "a": a[1]}, [None, np.float32(0.5)], True)
    assert key == ("pass", ("buffer", a.data.ptr, 24),
                   (("a", ("buffer", a.data.ptr + 12, 12)), ("b", 2)), (None, 0.5), True)
    assert _device.graph_key(a) != _device.graph_key(a[:1])
    with pytest.raises(TypeError, match="graph_key takes"):
        _device.graph_key(np.zeros(2))      # (a host array: no device address)


def test_graph_cache_runs_eager_then_captures_then_replays_and_forgets_the_oldest(
        monkeypatch):
    monkeypatch.setattr(_device, "GRAPH_ENTRIES", 2)
    monkeypatch.setattr(_device, "GRAPH_SEEN", 3)
    cache = _device.GraphCache()
    E, C = _device.EAGER, _device.CAPTURE
    assert cache.get("a") == E and cache.get("a") == C
    cache.put("a", "graph a")
    assert cache.get("a") == "graph a" and cache.get("a") == "graph a"
    for k in "bc":
        assert cache.get(k) == E and cache.get(k) == C
        cache.put(k, f"graph {k}")
    assert cache.get("a") == E               # (the oldest graph went when c's came)
    assert cache.get("b") == "graph b" and cache.get("c") == "graph c"
    for k in "defg":                         # (the keys seen once: at most GRAPH_SEEN)
        assert cache.get(k) == E
    assert cache.get("a") == E and cache.get("g") == C
    cache.clear()
    assert cache.get("b") == E


def test_auto_takes_the_small_path_within_its_limits(monkeypatch):
    """path="auto" runs the small path on tiny shapes and while small_chain stays within
    SMALL_AUTO_MAX_CHAIN, each pass on its own; path="small" beyond SMALL_MAX_UNITS is a
    ValueError naming the
    path and the units; without T and I (the planner's callers in tools), auto leaves it out."""
    f32 = np.dtype(np.float32)
    assert plans.choose("auto", 1, 1, 1, f32, False, 1, 1) is plans.SMALL
    assert plans.choose("small", 1, 1, 1, f32, True, 1000, 64) is plans.SMALL
    chain = plans.small_chain(1000, 1, 64, 64, 1)
    assert chain["forward"] > plans.SMALL_AUTO_MAX_CHAIN["forward"]
    assert chain["backward"] > plans.SMALL_AUTO_MAX_CHAIN["backward"]
    assert not plans.small_takes(1000, 1, 64, 64, 1)
    assert not plans.small_takes(1000, 1, 64, 64, 1, True)
    assert plans.small_takes(8, 4, 8, 8, 2) and not plans.small_takes(8, 4, 8, 129, 2)
    # a shape whose forward pass is too long for the small path, its backward pass not
    T, B, I, H = 100, 1, 16, 16
    chain = plans.small_chain(T, B, I, H, 1)
    assert chain["forward"] > plans.SMALL_AUTO_MAX_CHAIN["forward"]
    assert chain["backward"] <= plans.SMALL_AUTO_MAX_CHAIN["backward"]
    assert plans.choose("auto", B, H, 1, f32, True, T, I) is plans.SMALL
    assert not plans.small_takes(T, B, I, H, 1)
    assert plans.SMALL.fits(4, 128, 2) and not plans.SMALL.fits(4, 129, 2)
    with pytest.raises(ValueError, match=r"path='small': D\*B\*H = 1032 units"):
        plans.choose("small", 4, 129, 2, f32, False, 8, 8)
    with pytest.raises(ValueError, match="use plans.backward"):
        plans.backward_recurrence(None, None, None, plans.SMALL)
    from cugru import _plan
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(_plan, "fast_plan", lambda *a: None)     # (no GPU to plan on)
    monkeypatch.setattr(_plan.dev, "device", lambda: types.SimpleNamespace(
        id=0, sms=H200["sms"], smem_optin=H200["smem_limit"]))
    assert plans.choose("auto", 1, 1, 1, f32) is plans.STEPS


def test_auto_takes_the_persist_kernels_for_a_two_direction_backward_pass_alone(monkeypatch):
    """path="auto" runs a persist split (fast_plan's choice where no tile split holds the
    shape) for the backward pass of two directions with at least PERSIST_AUTO_MIN_ROWS rows
    and at most PERSIST_AUTO_MAX_WORK work per step, where the per-step product would not
    be split (float64 at O5's H = 1024; float32 below k = SPLIT_MIN_K); where it would be
    (float32 at H = 1024), the per-step path. One direction takes the per-step path, and
    so does the forward pass. path="fast" keeps the persist split."""
    from cugru import _plan
    persist = plans.PersistPlan(57, 18, 4, 1024, 1024, 100_000, 100_000)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(_plan, "fast_plan", lambda *a: persist)   # (no GPU to plan on)
    monkeypatch.setattr(_plan.dev, "device", lambda: types.SimpleNamespace(
        id=0, sms=H200["sms"], smem_optin=H200["smem_limit"]))
    B, H = 3, 1024                                                  # O5
    assert B * 3 * H * H <= plans.PERSIST_AUTO_MAX_WORK
    assert plans.backward_split(H, 2, 4, "strict") > 1
    assert plans.choose("auto", B, H, 2, f32, backward=True) is plans.STEPS
    assert plans.choose("auto", B, H, 2, f64, backward=True) is persist
    assert plans.choose("auto", B, 341, 2, f32, backward=True) is persist     # (k = 1023)
    assert plans.choose("auto", B, 342, 2, f32, backward=True) is plans.STEPS
    assert plans.choose("auto", B, H, 2, f64, backward=False) is plans.STEPS
    assert plans.choose("fast", B, H, 2, f32, backward=True) is persist
    assert plans.choose("fast", B, H, 2, f64, backward=False) is persist
    assert plans.choose("auto", B, H, 1, f64, backward=True) is plans.STEPS
    big = 16                     # 16 x 3 x 1024^2 passes the work bound
    assert big * 3 * H * H > plans.PERSIST_AUTO_MAX_WORK
    assert plans.choose("auto", big, H, 2, f64, backward=True) is plans.STEPS
    assert plans.auto_takes(persist, 2, 768, 2, backward=True)
    assert not plans.auto_takes(persist, 2, 768, 2, backward=True, split=9)
    assert not plans.auto_takes(persist, 2, 768, 2)
    assert not plans.auto_takes(None, 2, 768, 2, backward=True)
    # without cuBLAS's batched GEMM of pointer arrays the per-step product is not split:
    # the persist kernels again
    monkeypatch.setattr(_plan, "_CHOSEN", {})
    monkeypatch.setattr(_device, "has_batched_pointers", lambda: False)
    assert plans.choose("auto", B, H, 2, f32, backward=True) is persist


def test_small_path_on_numpy_runs_the_oracle(rng):
    p = problem(rng, 3, 2, 4, 5, True)
    ref = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    import cugru
    got = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True, path="small")
    for a, b in zip(got[:2], ref[:2]):
        np.testing.assert_array_equal(a, b)


def test_the_cublas_file_is_picked_by_cublas_major_version():
    """_device.pick_cublas: the mapped libcublas of cuBLAS' major version (the only one
    mapped where no name carries a major); none where two files could be CuPy's."""
    pick = _device.pick_cublas
    lt = "/x/libcublasLt.so.13"
    assert pick({"/a/nvidia/cu13/lib/libcublas.so.13", "/b/libcublas.so.12", lt}, 13) == \
        "/a/nvidia/cu13/lib/libcublas.so.13"
    assert pick({"/b/libcublas.so.12.9.1.4"}, 12) == "/b/libcublas.so.12.9.1.4"
    assert pick({"/usr/lib/libcublas.so"}, 13) == "/usr/lib/libcublas.so"
    assert pick({"/a/libcublas.so.13", "/b/libcublas.so.13.1.0.3"}, 13) is None
    assert pick({"/a/libcublas.so.12", "/b/libcublas.so.11"}, 13) is None
    assert pick({"/a/libcublas.so.1"}, 13) is None      # (a major 1 is not 13's prefix)
    assert pick(set(), 13) is None


class _FlatGpu(np.ndarray):
    """A numpy array posing as the cupy type the calls' short checks take: its C-contiguity
    as the attribute ``_c_contiguous``."""

    @property
    def _c_contiguous(self):
        return self.flags.c_contiguous


@pytest.mark.parametrize("D", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_plain_gpu_call_s_short_checks_take_only_what_the_general_ones_pass(
        monkeypatch, rng, D, dtype):
    """gru_forward's and gru_backward's short checks (the common GPU call: C-contiguous
    cupy arrays of one dtype, the weights with their direction axis, plain flags) give what
    the general checks give, and hand every other call to them: each deviation below is
    either an error there or a call the general checks take."""
    from cugru import _args
    from cukernels import checks
    monkeypatch.setattr(checks, "gpu_flat_type", lambda: _FlatGpu)
    monkeypatch.setattr(_args, "runtime", types.SimpleNamespace(
        cupy_module=lambda: "the GPU's module"))
    T, B, I, H = 3, 2, 4, 5
    gpu = lambda *s, dt=dtype: rng.standard_normal(s).astype(dt).view(_FlatGpu)  # noqa: E731
    args = dict(x=gpu(T, B, I), h0=gpu(D, B, H), w_ih=gpu(D, 3 * H, I), w_hh=gpu(D, 3 * H, H),
                b_ih=gpu(D, 3 * H), b_hh=gpu(D, 3 * H))

    def short(**change):
        a = {**args, **change}
        return _args._plain_gpu_forward(a["x"], a["h0"], a["w_ih"], a["w_hh"], a["b_ih"],
                                        a["b_hh"], change.get("bi", D == 2),
                                        change.get("training", True))

    got = short()
    want = _args.forward_args(*args.values(), np.bool_(D == 2), True)   # (general checks)
    assert got.xp == "the GPU's module" and got.dims == want.dims == (T, B, I, H, D)
    assert all(g is w for g, w in zip(got[1:7], want[1:7]))
    assert got[7:] == want[7:]
    assert short(h0=None) is not None and short(training=False).training is False
    deviations = {
        "x float16": dict(x=gpu(T, B, I, dt=np.float16)),
        "w_hh of the other dtype": dict(w_hh=gpu(D, 3 * H, H, dt=np.float16)),
        "bidirectional 1": dict(bi=1), "training numpy's bool": dict(training=np.True_),
        "x a numpy array": dict(x=np.asarray(args["x"])),
        "x not contiguous": dict(x=gpu(B, T, I).transpose(1, 0, 2)),
        "x of the other dtype": dict(x=gpu(T, B, I, dt=np.float64 if dtype == np.float32
                                            else np.float32)),
        "w_ih not contiguous": dict(w_ih=gpu(D, 3 * H, 2 * I)[:, :, ::2]),
        "b_hh of another shape": dict(b_hh=gpu(D, 3 * H + 1)),
        "h0 of another shape": dict(h0=gpu(D, B + 1, H)),
        "h0 not contiguous": dict(h0=gpu(D, B, 2 * H)[:, :, ::2]),
        "T = 0": dict(x=gpu(0, B, I)),
        "the weights without their direction axis": dict(
            w_ih=args["w_ih"][0], w_hh=args["w_hh"][0], b_ih=args["b_ih"][0],
            b_hh=args["b_hh"][0]),
    }
    for what, change in deviations.items():
        assert short(**change) is None, what
        # the general checks decide it: an error naming the argument, or the same call
        a = {**args, **{k: v for k, v in change.items() if k not in ("bi", "training")}}
        flags = (change.get("bi", D == 2), change.get("training", True))
        try:
            general = _args.forward_args(*(np.asarray(v) for v in a.values()), *flags)
        except (TypeError, ValueError):
            continue
        assert general.dims == (a["x"].shape + (H, D)), what

    saved = GruSaved(args["x"], args["w_ih"], args["w_hh"], None, None, False)
    dy, dh_n = gpu(T, B, D * H), gpu(D, B, H)
    assert _args.backward_args(dy, dh_n, saved) == ("the GPU's module", (T, B, I, H, D))
    assert _args.backward_args(dy, None, saved)[0] == "the GPU's module"
    for bad, error in ((dict(dy=gpu(T, B, D * H + 1)), r"dy has shape"),
                       (dict(dy=gpu(T, B, 2 * D * H)[:, :, ::2]), r"dy must be C-contiguous"),
                       (dict(dh_n=gpu(D, B, H, dt=np.float16)), r"dh_n has dtype float16"),
                       (dict(dh_n=gpu(D, B, H + 1)), r"dh_n has shape")):
        a = {"dy": dy, "dh_n": dh_n, **bad}
        with pytest.raises((TypeError, ValueError), match=error):
            _args.backward_args(a["dy"], a["dh_n"], saved)


@pytest.mark.parametrize("H,itemsize", [(8, 4), (10, 4), (13, 4), (6, 8), (7, 8)])
@pytest.mark.parametrize("lead", [0, 1, 2, 3])
def test_grid_scope_staging_writes_each_vector_element_once(H, itemsize, lead):
    """gru_tile_stage (grid scope), transcribed, for a group of 2 rows and then, in the same
    vector, a group of 1: where H is a multiple of the pack its 16-byte copies write each
    element of the MR rows of `segs` segments of HS once; else (the group's rows one span
    from src, `lead` elements into a 16-byte pack) its pack loads, four per thread at a time
    (two in double), read nothing outside the span and store each of its elements once, into
    the vector gru_tile_zero zeroed at the group's start. Either way: the group's rows of the
    source below H, zeros past H and past the group's rows."""
    V, MR, NT = 16 // itemsize, 3, 2      # (few threads: each takes several rounds of packs)
    if lead >= V or (H % V == 0 and lead):
        pytest.skip("(a row starts within a pack; on 16-byte boundaries, at one)")
    HS = -(-H // (2 * V)) * 2 * V            # (KS*Q*V >= H)
    for segs, ld in ((1, H), (3, 3 * H)):
        vec = np.full(MR * segs * HS, np.nan)
        for rows, first in ((2, 1.0), (1, 1000.0)):      # two groups in turn
            n = rows * segs * H
            memory = np.arange(first, first + lead + n + 2 * V)     # src = memory[lead:]
            writes = np.zeros(vec.size, int)
            read = set()

            def load(at):
                assert lead <= at < lead + n      # (only the span: no byte past the arrays)
                read.add(at)
                return memory[at]

            def put(at, value):
                vec[at] = value
                writes[at] += 1
            if H % V == 0:
                nr = HS // V
                for tid in range(NT):
                    for idx in range(tid, MR * segs * nr, NT):
                        rg, k = idx // nr, idx % nr * V
                        i, g = rg // segs, rg % segs
                        on = i < rows and k < H
                        for e in range(V):
                            put(rg * HS + k + e,
                                load(lead + i * ld + g * H + k + e) if on else 0.0)
            else:
                vec[:] = 0.0                       # gru_tile_zero
                np_, L = -(-(lead + n) // V), 4 if V == 4 else 2     # (packs in flight)
                for tid in range(NT):
                    for p0 in range(tid, np_, L * NT):
                        for u in range(L):
                            p = p0 + u * NT
                            f0 = p * V - lead
                            if p < np_ and f0 >= 0 and f0 + V <= n:     # a whole pack
                                v = [load(p * V + e) for e in range(V)]
                            else:
                                v = [load(lead + f0 + e) if p < np_ and 0 <= f0 + e < n
                                     else 0.0 for e in range(V)]
                            rg = f0 // H if f0 > 0 else 0     # (one division a pack)
                            col = f0 - rg * H
                            for e in range(V):
                                if 0 <= f0 + e < n:
                                    put(rg * HS + col, v[e])
                                col += 1
                                if col == H:
                                    col, rg = 0, rg + 1
                assert read == set(range(lead, lead + n))
            want = np.zeros((MR, segs, HS))
            for i in range(rows):
                for g in range(segs):
                    at = lead + i * ld + g * H
                    want[i, g, :H] = memory[at:at + H]
            np.testing.assert_array_equal(vec, want.reshape(-1))
            assert (writes == (1 if H % V == 0 else want.reshape(-1).astype(bool))).all()


@pytest.mark.parametrize("training", [True, False, None], ids=["train", "infer", "backward"])
def test_the_small_path_passes_each_value_as_the_parameter_of_its_name(monkeypatch, training):
    """SmallPlan's positional launches: every pointer argument is the pass's array of the
    parameter's name (each a distinct marker here), the shape values are T, B, I, H, D (and
    the forward kernel's lanes) in the declared order, and the quantization values follow
    QUANT_PARAMS; the order is the CUDA declaration's."""
    from cugru import _plan
    from cugru.quant import QUANT_PARAMS
    T, B, I, H, D = 3, 2, 5, 7, 2       # (all different: a swap shows)
    got = {}

    class Loop:
        def launch_args(self, kern, grid, block, values, *, shared_mem=0):
            got.update(zip(kern, values))

    monkeypatch.setattr(_plan.dev, "kernel", lambda family, name, params: params)
    names = _plan.SMALL_FORWARD_PARAMS if training is not None else _plan.SMALL_BACKWARD_PARAMS
    quant = dict(zip(QUANT_PARAMS, (0.5, 2.0, -3.0, 4.0, 3)))
    p = types.SimpleNamespace(T=T, B=B, I=I, H=H, D=D, ctype="double", training=training,
                              qat=True, qargs=quant, dtype=np.dtype(np.float64))
    pointers = [n for n in names if n not in ("steps", "B", "I", "H", "D", "L")
                and n not in QUANT_PARAMS]
    for n in pointers:
        setattr(p, n, f"array {n}")
    if training is None:
        p.dw = tuple(f"array {n}" for n in ("dw_ih", "dw_hh", "db_ih", "db_hh"))
        _plan.SMALL.backward(Loop(), p)
    else:
        _plan.SMALL.forward(Loop(), p)
    assert list(got) == list(names)
    kernel = "gru_small_backward" if training is None else "gru_small_forward"
    assert list(names) == [n for n, _ in runtime.signatures("gru_small.cu")[kernel]]
    assert all(got[n] == f"array {n}" for n in pointers)
    assert [got[n] for n in ("steps", "B", "I", "H", "D")] == [T, B, I, H, D]
    assert [got[n] for n in QUANT_PARAMS] == [quant[n] for n in QUANT_PARAMS]
    if training is not None:
        assert got["L"] == _plan.small_lanes(I, H, D * B * H)


@pytest.mark.parametrize("plan", ["steps", "tile"])
def test_math_reaches_every_product_of_a_pass(host_device, rng, plan):
    """math="tf32" reaches every cuBLAS product of both passes (the stand-in rounds their
    inputs to TF32): every loop of the passes gets it, the results move off the strict ones
    by about TF32's rounding (and stay within it of the oracle), and the backward pass takes
    the forward pass's math from the history by default."""
    T, B, I, H = 6, 4, 40, 24
    p = problem(rng, T, B, I, H, True)
    plan = plans.STEPS if plan == "steps" else \
        plans.tile_split(B, H, 2, _catalog.TILES[8][0], 1, 8)
    assert plan is not None
    ref_y, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dev = host_device
    HostLoop.made.clear()
    y, hn, saved_dev = _passes.forward(plans_args(dev, p), plan, "tf32")
    assert saved_dev.math == "tf32"
    got = _passes.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plan, saved_dev.math)
    assert HostLoop.made and set(HostLoop.made) == {"tf32"}
    for g, r in zip((y,) + tuple(got), (ref_y,) + tuple(ref)):
        scale = max(1.0, np.abs(r).max())
        err = np.abs(np.asarray(g) - r).max()
        assert 1e-9 * scale < err < 64 * 2.0 ** -11 * scale


@pytest.mark.parametrize("strict_macs", [0, 50_000, 10 ** 9], ids=["tf32", "dw_hh", "both"])
@pytest.mark.parametrize("bias_rows", [0, 24], ids=["bias-gemms", "bias-kernel"])
def test_tf32_tail_sums_few_rows_and_biases_in_float32(host_device, monkeypatch, rng,
                                                      strict_macs, bias_rows):
    """Under math="tf32" the tail's products take the pass's math, but a weight gradient of
    at most _passes.WGRAD_STRICT_MACS multiply-adds is summed in float32, and so is every
    bias sum: GEMMs with a vector of ones beyond _passes.BIAS_KERNEL_ROWS rows, else
    gru_bias_sums (no GEMM). The results stay within TF32's reach of the oracle."""
    T, B, I, H, D = 6, 4, 40, 24, 2
    G, TB = 3 * H, T * B
    monkeypatch.setattr(_passes, "WGRAD_STRICT_MACS", strict_macs)
    monkeypatch.setattr(_passes, "BIAS_KERNEL_ROWS", bias_rows)
    p = problem(rng, T, B, I, H, True)
    _, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dev = host_device
    _, _, saved_dev = _passes.forward(plans_args(dev, p), plans.STEPS, "tf32")
    HostLoop.products.clear()
    got = _passes.backward(dev(p["dy"]), dev(p["dh_n"]), saved_dev, plans.STEPS, "tf32")
    kinds = {}
    for m, n, k, batch, math in HostLoop.products:
        kind = {(I, TB): "dx", (I, D * G): "dw_ih", (H, G): "dw_hh", (D * G, 1): "db_ih",
                (G, 1): "db_hh", (H, B): "step"}[m, n]
        kinds.setdefault(kind, set()).add(math)
    kernel = TB <= bias_rows
    assert kinds == {"dx": {"tf32"}, "step": {"tf32"},
                     "dw_ih": {"strict" if I * D * G * TB <= strict_macs else "tf32"},
                     "dw_hh": {"strict" if H * G * TB <= strict_macs else "tf32"},
                     **({} if kernel else {"db_ih": {"strict"}, "db_hh": {"strict"}})}
    for name, g, r in zip(("dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh"), got, ref):
        scale = max(1.0, np.abs(r).max())
        assert np.abs(np.asarray(g) - r).max() < 64 * 2.0 ** -11 * scale, name


def plans_args(dev, p):
    from cugru._args import forward_args
    return forward_args(dev(p["x"]), dev(p["h0"]), *map(dev, weights(p)), True, True)


def test_scratch_keeps_sets_within_the_byte_and_entry_bounds(monkeypatch):
    """_device.scratch hands a set back to the next call of its key, and keeps at most
    SCRATCH_KEPT_BYTES (and SCRATCH_ENTRIES sets) in all, the least recently used going
    first; a set above SCRATCH_BYTES is never kept."""
    stream = types.SimpleNamespace(ptr=5)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: stream,
        runtime=types.SimpleNamespace(getDevice=lambda: 0, streamIsCapturing=lambda s: 0,
                                      CUDARuntimeError=RuntimeError)))
    from cukernels import runtime
    monkeypatch.setattr(runtime, "cupy_module", lambda: fake)
    monkeypatch.setattr(_device, "outputs",
                        lambda dt, *shapes: tuple(np.zeros(s, dt) for s in shapes))
    fake.empty = lambda s, dt: np.zeros(s, dt)
    monkeypatch.setattr(_device, "_SCRATCH", {})
    monkeypatch.setattr(_device, "SCRATCH_BYTES", 60)
    monkeypatch.setattr(_device, "SCRATCH_KEPT_BYTES", 100)
    monkeypatch.setattr(_device, "SCRATCH_ENTRIES", 64)
    f4 = np.float32
    a = _device.scratch("a", f4, (10,))            # 40 bytes each
    assert _device.scratch("a", f4, (10,))[0] is a[0]
    b = _device.scratch("b", f4, (10,))
    c = _device.scratch("c", f4, (5,), (5,))       # 40 more: "a" (least recent) goes
    assert [k[0] for k in _device._SCRATCH] == ["b", "c"]
    assert _device.scratch("b", f4, (10,))[0] is b[0]
    assert _device.scratch("c", f4, (5,), (5,))[1] is c[1]
    assert _device.scratch("a", f4, (10,))[0] is not a[0]
    big = _device.scratch("big", f4, (16,))        # 64 bytes > SCRATCH_BYTES: not kept
    assert "big" not in [k[0] for k in _device._SCRATCH] and big[0].shape == (16,)
    monkeypatch.setattr(_device, "SCRATCH_ENTRIES", 1)
    _device.scratch("d", f4, (1,))
    assert [k[0] for k in _device._SCRATCH] == ["d"]
