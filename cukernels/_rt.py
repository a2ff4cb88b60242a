"""Runtime: the only module that touches CuPy.

It holds the kernel registry (every source file and every template instance the package
launches: the CI compile check reads the same list), loads the sources, launches kernels
with correctly typed scalars, calls cuBLAS, and checks arguments for both backends.
CuPy is imported lazily, so ``import cukernels`` works on machines without it.
"""
from __future__ import annotations

import ctypes
import functools
import math
import numbers
import os
import pathlib
import re
import threading

import numpy as np

KERNEL_DIR = pathlib.Path(__file__).with_name("kernels")
#: cugru's sources live in its own package (cugru uses this runtime; nothing imports upwards)
GRU_KERNEL_DIR = pathlib.Path(__file__).parents[1] / "cugru" / "kernels"
HEADER = "common.cuh"
COMPILE_OPTIONS = ("--std=c++17",)  # CuPy adds -ftz=true and the -arch of the device itself
#: CK_LINEINFO=1 compiles with source line numbers, for compute-sanitizer's and ncu's reports
if os.environ.get("CK_LINEINFO") == "1":
    COMPILE_OPTIONS += ("-lineinfo",)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_CTYPES = ("float", "double")
_BOOL = ("false", "true")

#: softmax "cached" shapes, tried in order: (threads per row G, units per thread PT); a row
#: of up to G*PT*V elements fits, V elements a unit (V = 16/itemsize when the row allows, else 1)
SOFTMAX_SHAPES = ((8, 1), (8, 2), (8, 4), (32, 2), (32, 4), (32, 8), (128, 8), (256, 8), (512, 8))
LONG_ROW_THREADS = 1024
ELEMENTWISE_KERNELS = ("line_activation", "sigmoid_activation", "sigmoid_derivative",
                       "tanh_activation", "tanh_derivative", "lrelu_activation",
                       "lrelu_derivative", "swish_activation", "swish_derivative", "mask_mult")
UPDATE_KERNELS = ("sgd_update", "momentum_update", "adagrad_update", "rmsprop_update",
                  "adadelta_update", "adam_update")
DENSE_KERNELS = ("perceptron_feed_forward", "dense_bias_act", "hidden_gradient_partial",
                 "hidden_gradient_finish", "calc_delta_weights", "delta_bias",
                 "article_update_weights")
#: batches at least this large go through cuBLAS; smaller ones through our own kernels
GEMM_MIN_BATCH = 8
#: blocks per SM aimed at by the hidden-gradient grid (a single vector must fill the GPU)
DENSE_BLOCKS_PER_SM = 16
#: cap of the grid-stride grids of the flat dense kernels, in blocks of 256 threads per SM
#: (the elementwise and update kernels run uncapped: one 16-byte pack per thread was fastest)
GRID_BLOCKS_PER_SM = 32
#: launch shape of the elementwise and update kernels: threads per block, and 16-byte packs
#: per thread (<= CK_UNROLL packs are in flight per thread)
EW_THREADS = 256
EW_PACKS_PER_THREAD = 1
#: 16-byte packs per thread in the one-block-per-row feed-forward (sets its block size)
FF_PACKS_PER_THREAD = 4
#: rows of W in flight per thread in hidden_gradient_partial: the -DCK_COL_UNROLL it is built
#: with (slices are cut to multiples of it)
COL_UNROLL = 32
#: threads per block of the softmax kernels whose rows take G <= 32 threads
SOFTMAX_GROUP_THREADS = 256
#: batch rows per thread that the persistent GRU kernels are built for, per element type
#: (double with 8 rows spills registers)
GRU_MAXP = {"float": (1, 2, 4, 8), "double": (1, 2, 4)}
#: cluster sizes (blocks per cluster; 1: one block) of the GRU's block- and cluster-scope
#: kernels; 8 is the largest every cluster-capable GPU runs
GRU_CLUSTERS = (1, 2, 4, 8)
#: the GRU's tile kernels built (weights in registers), per element type: (cluster size, 16-byte
#: packs of each gate's weights per thread, most batch rows per group, threads per block,
#: units per thread). Cluster size 1 is one block, 0 grid scope (a group of blocks that meet
#: at a counter in global memory, as many as H needs). A thread holds 3 x packs x units packs
#: of weights: 96 registers in float, so 512 threads hold H = 128 in one block; double with 8
#: rows, or 4 units per thread with 8 rows, run out of registers, and so would 512 threads
#: with 8 rows.
GRU_TILES = {
    "float": tuple((c, q, r, 256, u) for c in GRU_CLUSTERS
                   for (q, u), rows in (((4, 1), (1, 8)), ((8, 1), (1, 8)), ((4, 2), (1, 8)),
                                      ((2, 4), (1,)))
                   for r in rows)
             + ((1, 8, 1, 512, 1), (1, 4, 1, 512, 2), (0, 4, 8, 256, 2)),
    "double": tuple((c, 8, r, 256, 1) for c in GRU_CLUSTERS for r in (1, 4))
              + ((0, 8, 4, 256, 1),),
}


def gru_tile_runs_on(tile, cc: int) -> bool:
    """Whether cugru launches the tile kernels `tile` (a GRU_TILES entry) on a GPU of compute
    capability `cc` (90 for sm_90): clusters, and 512 threads (whose registers the sm_90
    compiler fits without spilling), and grid scope (sm_80's compiler spills its backward), from
    sm_90 on; one block of 256 threads everywhere."""
    cluster, packs, rows, threads, units = tile
    return cc >= 90 or (cluster == 1 and threads <= 256)


def gru_tile_kernel(ctype: str, tile, train=None) -> str:
    """The name of the GRU's tile kernel for `tile` (a GRU_TILES entry): the forward with
    `train` True or False, else the backward. Grid scope (cluster 0) has kernels of its own."""
    cluster, rest = tile[0], ",".join(map(str, tile[1:]))
    kind = "forward" if train is not None else "backward"
    flag = "" if train is None else ("," + ("true" if train else "false"))
    if cluster == 0:
        return f"gru_grid_{kind}<{ctype},{rest}{flag}>"
    return f"gru_tile_{kind}<{ctype},{cluster},{rest}{flag}>"


def launched_on(filename: str, name: str, cc: int) -> bool:
    """Whether the registered instance `name` of `filename` is ever launched on compute
    capability `cc` (every instance is compiled for every GPU)."""
    m = re.fullmatch(r"gru_(tile|grid)_(?:forward|backward)<\w+,((?:\d+,){3,4}\d+).*>", name)
    if filename != "gru.cu" or not m:
        return True
    tile = tuple(map(int, m.group(2).split(",")))
    return gru_tile_runs_on(tile if m.group(1) == "tile" else (0,) + tile, cc)


def _registry() -> dict[str, tuple[str, ...]]:
    t = _CTYPES
    softmax = []
    for c, pack in zip(t, (4, 2)):
        for g, pt in SOFTMAX_SHAPES:
            for v in (1, pack):
                softmax += [f"softmax_activation<{c},{g},{pt},{v}>",
                            f"softmax_derivative<{c},{g},{pt},{v}>"]
        softmax += [f"softmax_activation_long<{c}>", f"softmax_derivative_long<{c}>"]
    return {
        "activations.cu": tuple(f"{k}<{c}>" for k in ELEMENTWISE_KERNELS for c in t),
        "losses.cu": tuple([f"calc_output_gradient<{c},{b}>" for c in t for b in _BOOL]
                           + [f"article_output_gradient<{c}>" for c in t]),
        "optim.cu": tuple(f"{k}<{c},{b}>" for k in UPDATE_KERNELS for c in t for b in _BOOL),
        "softmax.cu": tuple(softmax),
        "dense.cu": tuple(f"{k}<{c}>" for k in DENSE_KERNELS for c in t),
        "gru.cu": tuple(
            [f"gru_forward_step<{c},{b}>" for c in t for b in _BOOL]
            + [f"gru_backward_step<{c}>" for c in t]
            + [f"gru_persist_forward<{c},{p},{b}>" for c in t for p in GRU_MAXP[c] for b in _BOOL]
            + [f"gru_persist_backward<{c},{p}>" for c in t for p in GRU_MAXP[c]]
            + [gru_tile_kernel(c, tile, b) for c in t for tile in GRU_TILES[c]
               for b in (False, True)]
            + [gru_tile_kernel(c, tile) for c in t for tile in GRU_TILES[c]]
            + [f"gru_sum_chunks<{c}>" for c in t]
            + [f"gru_barrier_probe<{n}>" for n in GRU_CLUSTERS] + ["gru_grid_barrier_probe"]),
    }


REGISTRY = _registry()
#: the folder of each registered source (cukernels' own unless listed)
SOURCE_DIRS = {"gru.cu": GRU_KERNEL_DIR}


def ctype(dtype) -> str:
    return "float" if np.dtype(dtype) == np.float32 else "double"


def load_source(filename: str) -> str:
    """The source text with the common header pasted in place of its #include line."""
    text = (SOURCE_DIRS.get(filename, KERNEL_DIR) / filename).read_text()
    header = (KERNEL_DIR / HEADER).read_text()
    include = f'#include "{HEADER}"'
    if include not in text:
        raise RuntimeError(f"{filename} does not include {HEADER}")
    return text.replace(include, header, 1)


# ----------------------------------------------------------------------------- CuPy side
def cupy_module():
    """The cupy module, or None where it is not installed (looked up once: the fast path
    asks for it several times per call)."""
    global _CUPY
    if _CUPY is None:
        try:
            import cupy
        except ImportError:
            return None
        _CUPY = cupy
    return _CUPY


_CUPY = None


def gpu_available() -> bool:
    cp = cupy_module()
    if cp is None:
        return False
    try:
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, or no device
        return False


@functools.lru_cache(maxsize=None)
def _module(filename: str, device_id: int):
    cp = cupy_module()
    return cp.RawModule(code=load_source(filename), options=COMPILE_OPTIONS,
                        name_expressions=REGISTRY[filename])


@functools.lru_cache(maxsize=None)
def _function(filename: str, name: str, device_id: int):
    if name not in REGISTRY[filename]:
        raise KeyError(f"{name} is not registered for {filename}")
    return _module(filename, device_id).get_function(name)


def kernel(filename: str, name: str):
    """The compiled kernel `name` (a registered instance) on the current device."""
    return _function(filename, name, cupy_module().cuda.runtime.getDevice())


@functools.lru_cache(maxsize=None)
def _sm_count(device_id: int) -> int:
    cp = cupy_module()
    return cp.cuda.runtime.getDeviceProperties(device_id)["multiProcessorCount"]


def sm_count() -> int:
    return _sm_count(cupy_module().cuda.runtime.getDevice())


def aligned16(*arrays) -> bool:
    return all(a.data.ptr % 16 == 0 for a in arrays)


def rebuild_registry():
    """Recompute REGISTRY after a tuning script changed SOFTMAX_SHAPES, and drop compiled modules."""
    global REGISTRY
    REGISTRY = _registry()
    _module.cache_clear()
    _function.cache_clear()


def grid_for(work: int, threads: int = 256, capped: bool = True) -> int:
    """Blocks for a grid-stride loop over `work` items: one item per thread, at most
    GRID_BLOCKS_PER_SM blocks per SM when capped (then threads loop)."""
    blocks = -(-work // threads)
    cap = sm_count() * GRID_BLOCKS_PER_SM if capped else 2**31 - 1
    return max(1, min(blocks, cap))


def _ew_grid(work):
    return grid_for(-(-work // EW_PACKS_PER_THREAD), EW_THREADS, capped=False)


def launch_elementwise(filename, name, inputs, out, a=0.0, b=0.0, code=0):
    """Launch an (in0, in1, in2, out, n, a, b, code, vec) kernel of activations/losses.cu."""
    t = out.dtype.type
    ins = list(inputs) + [inputs[0]] * (3 - len(inputs))
    vec = aligned16(*inputs, out)
    n = out.size
    work = n // (16 // out.itemsize) if vec else n
    kernel(filename, name)((_ew_grid(work),), (EW_THREADS,),
                           (*ins, out, np.int64(n), t(a), t(b), np.int32(code), np.int32(vec)))
    return out


def launch_update(name, variant, D, w, s1, s2, batch, lr, beta1, beta2, l1, l2, eps, c1, c2):
    """Launch one of optim.cu's update kernels (in place on D, w and the moments)."""
    t = w.dtype.type
    states = [s for s in (s1, s2) if s is not None]
    s1 = s1 if s1 is not None else w
    s2 = s2 if s2 is not None else w
    vec = aligned16(D, w, *states)
    n = w.size
    work = n // (16 // w.itemsize) if vec else n
    k = kernel("optim.cu", f"{name}<{ctype(w.dtype)},{_BOOL[variant == 'book']}>")
    k((_ew_grid(work),), (EW_THREADS,),
      (D, w, s1, s2, np.int64(n), t(batch), t(lr), t(beta1), t(beta2), t(l1), t(l2), t(eps),
       t(c1), t(c2), np.int32(vec)))


def gemm(transa: bool, transb: bool, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc):
    """Column-major C = alpha*op(A) @ op(B) + beta*C through cuBLAS, on raw leading dims.

    CuPy's default math mode is kept: FP32 strict, no TF32 unless the user sets CUPY_TF32.
    """
    cp = cupy_module()
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


def max_active_clusters(func_ptr: int, cluster: int, threads: int, shared_mem: int):
    """cuOccupancyMaxActiveClusters for a kernel with compile-time cluster dimensions: how
    many of its clusters the GPU runs at once; None where the driver has no such query."""
    import ctypes
    global _CU_DRIVER
    try:
        if _CU_DRIVER is None:
            _CU_DRIVER = ctypes.CDLL("libcuda.so.1")
        query = _CU_DRIVER.cuOccupancyMaxActiveClusters
    except (OSError, AttributeError):
        return None

    class LaunchConfig(ctypes.Structure):       # CUlaunchConfig
        _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                    ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                    ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                    ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                    ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]

    config = LaunchConfig(cluster, 1, 1, threads, 1, 1, shared_mem, None, None, 0)
    count = ctypes.c_int(0)
    rc = query(ctypes.byref(count), ctypes.c_void_p(func_ptr), ctypes.byref(config))
    return count.value if rc == 0 and count.value > 0 else None


_CU_DRIVER = None


def copy_bytes(dst: int, src: int, nbytes: int) -> None:
    """Device-to-device copy of nbytes between raw addresses, on the current stream."""
    cp = cupy_module()
    cp.cuda.runtime.memcpyAsync(dst, src, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                cp.cuda.get_current_stream().ptr)


def zero_bytes(dst: int, nbytes: int) -> None:
    """Zero nbytes at a raw device address, on the current stream."""
    cp = cupy_module()
    cp.cuda.runtime.memsetAsync(dst, 0, nbytes, cp.cuda.get_current_stream().ptr)


#: how each scalar kernel argument type fills an 8-byte parameter slot (its bits, low bytes)
_SLOT_BITS = {
    np.int32: lambda v: int(v) & 0xFFFFFFFF,
    np.int64: lambda v: int(v) & 0xFFFFFFFFFFFFFFFF,
    np.float32: lambda v: int(v.view(np.uint32)),
    np.float64: lambda v: int(v.view(np.uint64)),
}


def _host_scalars(dtype):
    """{0.0: address, 1.0: address} of host scalars of `dtype` for cuBLAS' alpha and beta,
    made once and kept (reading an array's .ctypes.data costs microseconds per call)."""
    got = _HOST_SCALARS.get(dtype)
    if got is None:
        arrays = [np.array(v, dtype=dtype) for v in (0.0, 1.0)]
        got = _HOST_SCALARS[dtype] = {float(a): a.ctypes.data for a in arrays}
        _HOST_SCALARS_KEPT.extend(arrays)
    return got


_HOST_SCALARS = {}
_HOST_SCALARS_KEPT = []


def _slot_values(args):
    """The 8-byte parameter slot of each kernel argument, as an int (see _SLOT_BITS)."""
    nd = cupy_module().ndarray
    values = []
    for a in args:
        bits = _SLOT_BITS.get(type(a))
        if bits is not None:
            values.append(bits(a))
        elif isinstance(a, nd):
            values.append(a.data.ptr)
        else:
            raise TypeError(f"kernel argument of type {type(a).__name__} is not supported")
    return values


#: per thread, one pair of parameter arrays of _PACKED_SLOTS slots (StepLoop._pack_shared)
_PACKED = threading.local()
_PACKED_SLOTS = 64


class StepLoop:
    """Cheap repeated calls for a per-step loop: strided-batched cuBLAS GEMMs and launches
    of one kernel whose arguments change only in one int (the step).

    Use as a context manager around the loop: it sets cuBLAS' pointer mode to host once (and
    restores it after), keeps alpha and beta in host arrays, and packs each kernel's
    arguments once, so a step costs one cuLaunchKernel and one cuBLAS call, with none of
    CuPy's per-call argument processing. Pointers are plain ints (array.data.ptr plus byte
    offsets); the caller keeps the arrays alive for the loop. ``plain=True`` launches through
    CuPy's RawKernel call instead (a reference for the host-time benchmark).
    """

    def __init__(self, dtype, *, plain=False):
        cp = cupy_module()
        from cupy_backends.cuda.libs import cublas
        self._ctypes = ctypes
        self._cublas = cublas
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.plain = plain
        self._gemm = (cublas.sgemmStridedBatched if self.dtype == np.float32
                      else cublas.dgemmStridedBatched)
        self._scalars = _host_scalars(self.dtype)
        self.handle = None    # (cuBLAS' handle and pointer mode: at the first gemm)
        self.stream = cp.cuda.get_current_stream().ptr
        self._launch_kernel = cp.cuda.driver.launchKernel
        self._mode = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            self._cublas.setPointerMode(self.handle, self._mode)
            self._mode = None
        return False

    def gemm(self, transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch=1):
        """Column-major C_i = op(A_i) @ op(B_i) + beta*C_i for i < batch; A, B, C are device
        addresses (ints), strides in elements."""
        cb = self._cublas
        if self._mode is None:
            self.handle = cupy_module().cuda.device.get_cublas_handle()
            self._mode = cb.getPointerMode(self.handle)
            cb.setPointerMode(self.handle, cb.CUBLAS_POINTER_MODE_HOST)
        self._gemm(self.handle, cb.CUBLAS_OP_T if transa else cb.CUBLAS_OP_N,
                   cb.CUBLAS_OP_T if transb else cb.CUBLAS_OP_N, m, n, k,
                   self._scalars[1.0], A, lda, sA, B, ldb, sB,
                   self._scalars[float(beta)], C, ldc, sC, batch)

    def _pack(self, args):
        """The kernel parameter array for `args`: each value in an 8-byte slot of one ctypes
        array (little-endian: a 4-byte argument is read from the slot's low bytes), and the
        array of the slots' addresses. Returns (slots, params); keep both alive."""
        ct = self._ctypes
        n = len(args)
        slots = (ct.c_uint64 * n)(*_slot_values(args))
        base = ct.addressof(slots)
        params = (ct.c_void_p * n)(*range(base, base + 8 * n, 8))
        return slots, params

    def _pack_shared(self, args):
        """As _pack, into this thread's one pair of arrays (made once: building ctypes arrays
        costs microseconds), for a launch that copies its arguments before the next pack."""
        n = len(args)
        pair = getattr(_PACKED, "pair", None)
        if n > _PACKED_SLOTS:
            return self._pack(args)
        if pair is None:
            ct = self._ctypes
            slots = (ct.c_uint64 * _PACKED_SLOTS)()
            base = ct.addressof(slots)
            pair = _PACKED.pair = (slots, (ct.c_void_p * _PACKED_SLOTS)(
                *range(base, base + 8 * _PACKED_SLOTS, 8)))
        pair[0][:n] = _slot_values(args)
        return pair

    @staticmethod
    def _dims(grid, block):
        return tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))

    def kernel(self, func, grid, block, args, step_arg):
        """A callable launch(step) of `func` with `args` (cupy arrays and numpy int32/int64/
        float32/float64 scalars); args[step_arg] is an int32 replaced by the step."""
        grid, block = self._dims(grid, block)
        if self.plain:
            args = list(args)

            def launch(step):
                args[step_arg] = np.int32(step)
                func(grid, block, tuple(args))
            return launch
        if type(args[step_arg]) is not np.int32:
            raise TypeError("the step argument must be an int32")
        slots, params = self._pack(args)
        # a RawKernel holds its CUfunction in .kernel (a cupy.cuda.Function, with .ptr)
        fptr, stream, launch_kernel = func.kernel.ptr, self.stream, self._launch_kernel
        address = self._ctypes.addressof(params)
        keep = (slots, params, args)

        def launch(step_value, _keep=keep):
            slots[step_arg] = step_value & 0xFFFFFFFF
            launch_kernel(fptr, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0,
                          stream, address, 0)
        return launch

    def launch(self, func, grid, block, args, *, shared_mem=0, cooperative=False):
        """Launch `func` once; cooperative: all blocks resident at once (the driver refuses a
        grid that does not fit), as a kernel with a barrier across blocks needs."""
        cp = cupy_module()
        grid, block = self._dims(grid, block)
        slots, params = self._pack_shared(args)
        address = self._ctypes.addressof(params)
        if cooperative:
            cp.cuda.driver.launchCooperativeKernel(func.kernel.ptr, *grid, *block, shared_mem,
                                                   self.stream, address)
        else:
            self._launch_kernel(func.kernel.ptr, *grid, *block, shared_mem, self.stream,
                                address, 0)
        # (the launch has copied the arguments: the next pack may reuse the arrays)


# ---------------------------------------------------------------------- argument checks
def backend(**arrays):
    """numpy or cupy, from the arrays given (None entries are skipped); mixed is a TypeError."""
    seen = {}
    cp = cupy_module()
    for name, a in arrays.items():
        if a is None:
            continue
        if isinstance(a, np.ndarray):
            seen.setdefault("numpy", name)
        elif cp is not None and isinstance(a, cp.ndarray):
            seen.setdefault("cupy", name)
        else:
            raise TypeError(f"{name} must be a numpy or cupy array, got {type(a).__name__}")
    if len(seen) > 1:
        raise TypeError(f"numpy and cupy arrays are mixed: {seen['numpy']} is a numpy array, "
                        f"{seen['cupy']} is a cupy array; move them to one device")
    if not seen:
        raise TypeError("no array arguments were given")
    return np if "numpy" in seen else cp


def check_array(name, a, *, ndim=(1, 2), dtype=None, dtype_of=None, shape=None, shape_of=None):
    """Validate one array argument; returns its dtype. Errors name the argument."""
    if a.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {a.dtype}")
    if dtype is not None and a.dtype != dtype:
        raise TypeError(f"{name} has dtype {a.dtype}, expected {np.dtype(dtype)} "
                        f"(the dtype of {dtype_of})")
    if ndim is None:
        if a.ndim < 1:
            raise ValueError(f"{name} must have at least 1 dimension, got a 0-d array")
    elif a.ndim not in ndim:
        want = " or ".join(str(d) for d in ndim)
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(a.shape)}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected {tuple(shape)}"
                         + (f" (to match {shape_of})" if shape_of else ""))
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {tuple(a.shape)}); sizes must be > 0")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous; pass xp.ascontiguousarray({name})")
    return a.dtype


def check_same(ref_name, ref, **others):
    """Each of `others` must have the dtype and shape of `ref` (None entries are skipped)."""
    for name, a in others.items():
        if a is not None:
            check_array(name, a, ndim=None, dtype=ref.dtype, dtype_of=ref_name,
                        shape=ref.shape, shape_of=ref_name)


_REAL_TYPES = (float, int, np.float32, np.float64)


def real(name, x, dtype, *, min_value=None, allow_equal=True):
    """A finite real scalar, wrapped in the array's dtype (CuPy would pass a bare float as double)."""
    if type(x) not in _REAL_TYPES and (isinstance(x, (bool, np.bool_))
                                       or not isinstance(x, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    if not math.isfinite(float(x)):
        raise ValueError(f"{name} must be finite, got {x}")
    if min_value is not None and (x < min_value or (x == min_value and not allow_equal)):
        op = ">=" if allow_equal else ">"
        raise ValueError(f"{name} must be {op} {min_value}, got {x}")
    return np.dtype(dtype).type(x)


def integer(name, x, *, min_value=None):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(x).__name__}")
    if min_value is not None and x < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {x}")
    return int(x)


def variant_of(variant):
    if variant not in ("standard", "book"):
        raise ValueError(f"variant must be 'standard' or 'book', got {variant!r}")
    return variant


def check_out(out, ref_name, ref, xp):
    """An optional output buffer: same backend, dtype and shape as `ref`; may alias inputs."""
    if out is None:
        return None
    backend(**{ref_name: ref, "out": out})
    check_array("out", out, ndim=None, dtype=ref.dtype, dtype_of=ref_name,
                shape=ref.shape, shape_of=ref_name)
    return out


def _span(a):
    start = a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else a.data.ptr
    return start, start + a.nbytes


def check_distinct(**arrays):
    """Arrays that a kernel updates in place must not overlap each other or its inputs."""
    items = [(k, _span(v)) for k, v in arrays.items() if v is not None]
    for x, (name_a, (a0, a1)) in enumerate(items):
        for name_b, (b0, b1) in items[x + 1:]:
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{name_a} and {name_b} share memory; they must be separate arrays")
