"""The per-step GPU path's plan checked without a GPU: every cuBLAS call and kernel index.

CI has no GPU, so this runs cugru's GPU code path on the CPU with three stand-ins:
device arrays are numpy arrays that expose ``.data.ptr``; ``StepLoop.gemm`` performs the
column-major strided-batched GEMM it is given on raw addresses (so a wrong leading dimension,
stride, offset or transpose gives a wrong result); and the two step kernels are line-by-line
numpy transcriptions of kernels/gru.cu's index arithmetic. The results must equal the
oracle's. The real kernels are checked against the oracle on the GPU (test_gru_gpu.py).
"""
import ctypes
import types

import numpy as np
import pytest

from cugru import gru as gru_module
from cugru import oracle
from cukernels import _rt
from gru_cases import problem, weights


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


class HostLoop:
    """StepLoop's interface, computed with numpy on raw addresses."""

    def __init__(self, dtype, plain=False):
        self.dtype = np.dtype(dtype)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def gemm(self, transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch=1):
        it = self.dtype.itemsize
        for i in range(batch):
            a = _matrix(A + i * sA * it, *((k, m) if transa else (m, k)), lda, self.dtype)
            b = _matrix(B + i * sB * it, *((n, k) if transb else (k, n)), ldb, self.dtype)
            c = _matrix(C + i * sC * it, m, n, ldc, self.dtype)
            product = (a.T if transa else a) @ (b.T if transb else b)
            c[...] = product + beta * c if beta else product

    def kernel(self, func, grid, block, args, step_arg):
        args = list(args)

        def launch(step):
            args[step_arg] = step
            func(grid[1], *args)
        return launch


def _sigmoid(v):
    return 1 / (1 + np.exp(-v))


def forward_step(train):
    """gru_forward_step<T, TRAIN>, one direction d per loop turn, all (b, j) at once."""
    def run(D, gi, gh, b_ih, b_hh, hs, y, gates, steps, B, H, S, s):
        gi, gh, b_ih, b_hh, hs, y, gates = (a.reshape(-1) for a in (gi, gh, b_ih, b_hh, hs,
                                                                     y, gates))
        BH, H3 = B * H, 3 * H
        for d in range(D):
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
            hs[(d * S + (s + 1) % S) * BH + i] = h_new
            y[(t * B + b) * D * H + d * H + j] = h_new
            if train:
                g = ((d * steps + s) * B + b) * 4 * H
                gates[g + j], gates[g + H + j], gates[g + 2 * H + j], gates[g + 3 * H + j] = \
                    r, z, n, hn
    return run


def backward_step(D, dy, gates, hs, dh, dgi, dgh, steps, B, H, s):
    """gru_backward_step<T>."""
    dy, gates, hs, dh, dgi, dgh = (a.reshape(-1) for a in (dy, gates, hs, dh, dgi, dgh))
    BH, H3 = B * H, 3 * H
    for d in range(D):
        i = np.arange(BH)
        b, j = i // H, i % H
        t = s if d == 0 else steps - 1 - s
        g = ((d * steps + s) * B + b) * 4 * H
        r, z, n, hn = gates[g + j], gates[g + H + j], gates[g + 2 * H + j], gates[g + 3 * H + j]
        h = hs[(d * (steps + 1) + s) * BH + i]
        dhv = dy[(t * B + b) * D * H + d * H + j] + dh[d * BH + i]
        dn = dhv * (1 - z) * (1 - n * n)
        dz = dhv * (h - n) * z * (1 - z)
        dr = dn * hn * r * (1 - r)
        row_i, row_h = (t * B + b) * D * H3 + d * H3, ((d * steps + s) * B + b) * H3
        dgi[row_i + j], dgi[row_i + H + j], dgi[row_i + 2 * H + j] = dr, dz, dn
        dgh[row_h + j], dgh[row_h + H + j], dgh[row_h + 2 * H + j] = dr, dz, dn * r
        dh[d * BH + i] = dhv * z


@pytest.fixture
def host_device(monkeypatch):
    fake = types.SimpleNamespace(
        ndarray=DevArray,
        empty=lambda shape, dt: np.full(shape, np.nan, dt).view(DevArray),
        zeros=lambda shape, dt: np.zeros(shape, dt).view(DevArray),
        ones=lambda shape, dt: np.ones(shape, dt).view(DevArray))
    kernels = {"gru_forward_step<double,true>": forward_step(True),
               "gru_forward_step<double,false>": forward_step(False),
               "gru_backward_step<double>": backward_step}
    monkeypatch.setattr(_rt, "cupy_module", lambda: fake)
    monkeypatch.setattr(_rt, "kernel", lambda filename, name: kernels[name])
    monkeypatch.setattr(_rt, "StepLoop", HostLoop)
    # min chunk of 64 rows, so that the chunked weight-gradient sums run here too
    monkeypatch.setattr(gru_module, "MIN_CHUNK_ROWS", 64)
    return lambda a: None if a is None else np.ascontiguousarray(a).view(DevArray)


@pytest.mark.parametrize("T,B,I,H,bi,h0", [(3, 2, 4, 5, False, True), (4, 3, 2, 3, True, True),
                                           (5, 1, 3, 2, True, False), (130, 17, 2, 3, True, True),
                                           (33, 130, 1, 2, False, False)])
def test_gpu_path_plan_computes_the_oracle(host_device, rng, T, B, I, H, bi, h0):
    p = problem(rng, T, B, I, H, bi, with_h0=h0)
    dev = host_device
    ref_y, ref_hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=bi)
    ref = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    dims = (T, B, I, H, 2 if bi else 1)
    for training in (False, True):   # the history of the last (training) run is used below
        y, hn, hs, gates = gru_module._forward_gpu(dev(p["x"]), dev(p["h0"]),
                                                   *map(dev, weights(p)), dims, training, None)
        np.testing.assert_allclose(y, ref_y, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(hn, ref_hn, rtol=1e-12, atol=1e-13)
    saved_dev = type(saved)(dev(p["x"]), dev(p["w_ih"]), dev(p["w_hh"]), hs, gates, False)
    got = gru_module._backward_gpu(dev(p["dy"]), dev(p["dh_n"]), saved_dev, dims, None)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-11 * max(1, np.abs(r).max()))


@pytest.mark.parametrize("itemsize", [4, 8])
@pytest.mark.parametrize("B,H,D", [(1, 1, 1), (64, 64, 1), (64, 1024, 2), (256, 512, 2),
                                   (3, 130, 2)])
def test_fast_path_splits_respect_the_kernels_limits(B, H, D, itemsize):
    """Every split cugru.gru._split offers fits a block: units <= threads, the batch rows
    per thread a built instance, shared memory within the limit, every unit owned once."""
    limit = 227 * 1024
    ctype = "float" if itemsize == 4 else "double"
    seen = 0
    for blocks in range(1, H + 1):
        plan = gru_module._split(B, H, D, blocks, itemsize, limit)
        if plan is None:
            continue
        seen += 1
        assert plan.units <= gru_module.FAST_THREADS
        assert plan.rows_per_thread in _rt.GRU_MAXP[ctype]
        assert plan.rows_per_thread * (gru_module.FAST_THREADS // plan.units) >= B
        assert (plan.blocks - 1) * plan.units < H <= plan.blocks * plan.units
        assert max(plan.smem_fwd, plan.smem_bwd) <= limit
        assert plan.kc_fwd % (16 // itemsize) == 0 and plan.kc_bwd % (16 // itemsize) == 0
        assert plan.kc_fwd <= -(-H // 4) * 4 and plan.kc_bwd <= -(-3 * H // 4) * 4
        assert gru_module._cost(plan, B, H, D, itemsize) > 0
    assert seen > 0
