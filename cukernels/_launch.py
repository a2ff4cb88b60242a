"""cukernels' launch layer: its sources' registration, grid sizes, the elementwise and update
launches, and the cuBLAS GEMM of the dense layer. The tuning constants of the shared
elementwise drivers live here (rendered into the sources as #defines); each op module keeps
its own."""
from __future__ import annotations

import pathlib

import numpy as np

from . import runtime

KERNEL_DIR = pathlib.Path(__file__).with_name("kernels")
#: element types every source is built for (one module per type)
CTYPES = ("float", "double")
BOOLS = ("false", "true")

#: 16-byte packs per thread per iteration of the elementwise and update drivers (CK_UNROLL)
UNROLL = 2
#: 1: streaming (evict-first) loads and stores in those drivers (CK_STREAM)
STREAM = 0
#: launch shape of the elementwise and update kernels: threads per block, and 16-byte packs
#: per thread (one pack per thread, uncapped grid, was fastest)
EW_THREADS = 256
EW_PACKS_PER_THREAD = 1
#: cap of the grid-stride grids of the flat dense kernels, in blocks of 256 threads per SM
GRID_BLOCKS_PER_SM = 32


def ctype(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"


runtime.register_header(KERNEL_DIR / "common.cuh",
                        lambda: {"CK_UNROLL": UNROLL, "CK_STREAM": STREAM})


def register(name, instances, defines=dict):
    """Register kernels/<name>: `instances(ctype)` lists its instances of that element type,
    `defines()` its own constants."""
    return runtime.register(runtime.Source(
        name, KERNEL_DIR, lambda: {c: tuple(instances(c)) for c in CTYPES}, defines=defines))


def aligned16(*arrays) -> bool:
    """Every array starts on a 16-byte boundary (the kernels then move 16-byte packs)."""
    bits = 0
    for a in arrays:
        bits |= a.data.ptr
    return not bits & 15


def sm_count() -> int:
    return runtime.device().sms


def grid_for(work: int, threads: int = 256, capped: bool = True) -> int:
    """Blocks for a grid-stride loop over `work` items: one item per thread, at most
    GRID_BLOCKS_PER_SM blocks per SM when capped (then threads loop)."""
    blocks = -(-work // threads)
    cap = sm_count() * GRID_BLOCKS_PER_SM if capped else 2**31 - 1
    return max(1, min(blocks, cap))


_EW_ITEMS = EW_PACKS_PER_THREAD * EW_THREADS


def _ew_grid(work):
    return max(1, min(-(-work // _EW_ITEMS), 2**31 - 1))


#: the parameters of activations.cu's and losses.cu's kernels, and of optim.cu's, in order:
#: those launches pass positional values, checked once against each kernel's declaration
EW_PARAMS = ("in0", "in1", "in2", "out", "n", "a", "b", "code", "vec")
UPDATE_PARAMS = ("D", "w", "s1", "s2", "n", "batch", "lr", "beta1", "beta2", "l1", "l2", "eps",
                 "c1", "c2", "vec")


def launch_elementwise(source, name, inputs, out, a=0.0, b=0.0, code=0):
    """Launch an elementwise kernel of activations/losses.cu (EW_PARAMS); unused inputs are
    passed as in0 (never read)."""
    p0 = inputs[0].data.ptr
    p1 = inputs[1].data.ptr if len(inputs) > 1 else p0
    p2 = inputs[2].data.ptr if len(inputs) > 2 else p0
    po = out.data.ptr
    vec = not (p0 | p1 | p2 | po) & 15          # every array on a 16-byte boundary
    n = out.size
    runtime.kernel(source, name, EW_PARAMS).launch_1d(
        _ew_grid(n // (16 // out.itemsize) if vec else n), EW_THREADS,
        (p0, p1, p2, po, n, a, b, code, vec))
    return out


def launch_unary(source, name, x, a, b):
    """launch_elementwise of one input into a new array: the common call, with the least
    host work."""
    out = runtime.empty(x.shape, x.dtype)
    p, po = x.data.ptr, out.data.ptr
    vec = not (p | po) & 15
    n = x.size
    runtime.kernel(source, name, EW_PARAMS).launch_1d(
        _ew_grid(n // (16 // x.itemsize) if vec else n), EW_THREADS,
        (p, p, p, po, n, a, b, 0, vec))
    return out


def launch_update(kernel_name, D, w, s1, s2, batch, lr, beta1, beta2, l1, l2, eps, c1, c2):
    """Launch one of optim.cu's update kernels (UPDATE_PARAMS), in place on D, w and the
    moments; unused moment arrays are passed as w (never touched)."""
    pd, pw = D.data.ptr, w.data.ptr
    p1 = s1.data.ptr if s1 is not None else pw
    p2 = s2.data.ptr if s2 is not None else pw
    vec = not (pd | pw | p1 | p2) & 15
    n = w.size
    runtime.kernel("optim.cu", kernel_name, UPDATE_PARAMS).launch_1d(
        _ew_grid(n // (16 // w.itemsize) if vec else n), EW_THREADS,
        (pd, pw, p1, p2, n, batch, lr, beta1, beta2, l1, l2, eps, c1, c2, vec))


def gemm(transa: bool, transb: bool, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
    """Column-major C = alpha*op(A) @ op(B) + beta*C through cuBLAS, on raw leading dims.

    CuPy's default math mode is kept: FP32 strict, no TF32 unless the user sets CUPY_TF32.
    """
    cp = runtime.cupy_module()
    from cupy_backends.cuda.libs import cublas

    func = cublas.sgemm if C.dtype == np.float32 else cublas.dgemm
    al = np.array(alpha, dtype=C.dtype)
    be = np.array(beta, dtype=C.dtype)
    handle = cp.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    try:
        func(handle, cublas.CUBLAS_OP_T if transa else cublas.CUBLAS_OP_N,
             cublas.CUBLAS_OP_T if transb else cublas.CUBLAS_OP_N, int(m), int(n), int(k),
             al.ctypes.data, A.data.ptr, int(lda), B.data.ptr, int(ldb), be.ctypes.data,
             C.data.ptr, int(ldc))
    finally:
        cublas.setPointerMode(handle, mode)
