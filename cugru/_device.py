"""cugru's device layer: everything the GRU's plans and passes ask of CuPy and CUDA.

It is the one seam between the GRU's launch code and the GPU: the CPU plan test
(tests/test_gru_plan.py) replaces these names with numpy stand-ins and runs the whole GPU
code path on the host. Kernels are cukernels.runtime's (arguments packed by the parameter
names of their CUDA declarations); ``Loop`` issues a pass's cuBLAS products and launches
with the least host work per call.
"""
from __future__ import annotations

import ctypes
import re
import threading
import warnings
from collections import OrderedDict

import numpy as np

from cukernels import runtime

from . import _catalog  # noqa: F401  (registers the GRU's kernel sources)
from . import _cublaslt

#: launch the per-step path's kernels (Loop.kernel) through CuPy's RawKernel call instead of
#: the packed launch (slower on the host; the reference that the packed launch is tested and
#: timed against)
PLAIN_LAUNCH = False


def cupy():
    """The cupy module (the CPU plan test gives a numpy stand-in)."""
    return runtime.cupy_module()


def device():
    """What the planner asks of the current device (runtime.Device: SMs, shared memory,
    compute capability)."""
    return runtime.device()


def kernel(family: str, name: str, params: tuple | None = None):
    """The compiled kernel `name` of a family (a cugru/kernels source), compiled on first use.
    `params`: the parameter names, in order, of a caller that launches it with positional
    values (Loop.launch_args), checked once against the CUDA declaration."""
    return runtime.kernel(family, name, params)


#: a pass's temporaries (the buffers it neither returns nor saves) of at most this many
#: bytes are kept between calls and reused, one set per shape, device, stream and thread:
#: a call on a small shape then allocates only what it returns. 0 turns the reuse off (the
#: GPU tests do, so that each call's buffers start as the NaN they poison them with).
#: (16 MiB: the input projections of S1 and S2, 4.7 and 9.4 MiB, are kept; their
#: inference calls wait on the host, two allocations of a call among what it waits on)
SCRATCH_BYTES = 1 << 24
#: at most this many sets are kept, of at most this many bytes together (the least
#: recently used go first)
SCRATCH_ENTRIES = 64
SCRATCH_KEPT_BYTES = 1 << 26
_SCRATCH: dict = {}
_SCRATCH_LOCK = threading.Lock()


def clear_scratch() -> None:
    """Drop the kept temporaries (their memory goes back to CuPy's pool)."""
    with _SCRATCH_LOCK:
        _SCRATCH.clear()


def _set_bytes(arrays) -> int:
    return sum(a.nbytes for a in arrays)


def scratch(name, dtype, *shapes):
    """The temporary arrays of a pass (`name` tells the pass's sets apart), one per shape:
    reused from an earlier call on this device, stream and thread where small enough
    (SCRATCH_BYTES in all), so that their contents are whatever that call left. The stream
    orders the calls that share them; other streams and threads get their own."""
    cp = runtime.cupy_module()
    dt = np.dtype(dtype)
    nbytes = _elements(shapes) * dt.itemsize
    if nbytes > SCRATCH_BYTES:
        return tuple(cp.empty(s, dt) for s in shapes)
    stream = cp.cuda.get_current_stream().ptr
    if capturing(cp, stream):
        # (a CUDA graph keeps the addresses it captured: temporaries of its own, which die
        # with the capture's memory, not kept ones another call would write)
        return outputs(dt, *shapes)
    key = (name, shapes, dt.char, cp.cuda.runtime.getDevice(), stream, threading.get_ident())
    with _SCRATCH_LOCK:
        arrays = _SCRATCH.pop(key, None)
        if arrays is None:
            arrays = outputs(dt, *shapes)
            kept = sum(_set_bytes(v) for v in _SCRATCH.values())
            while _SCRATCH and (len(_SCRATCH) >= SCRATCH_ENTRIES
                                or kept + nbytes > SCRATCH_KEPT_BYTES):
                kept -= _set_bytes(_SCRATCH.pop(next(iter(_SCRATCH))))
        _SCRATCH[key] = arrays      # (most recently used last)
    return arrays


#: pointer_table's kept tables: at most POINTER_TABLES of them and POINTER_TABLE_BYTES in
#: all, the least recently asked for dropped first (a dropped table's memory goes back to
#: CuPy's pool on the stream it was made on, which orders its next use after the launches
#: already issued there)
POINTER_TABLES = 256
POINTER_TABLE_BYTES = 1 << 26
_TABLES: OrderedDict = OrderedDict()
_TABLES_LOCK = threading.Lock()


def pointer_table(key, build):
    """A device array of the uint64 addresses `build()` gives (a numpy array), kept per
    `key` on this device: `key` names every buffer and size the addresses are made from,
    so a table is a function of its key, and a CUDA graph that read one (Loop.replay, whose
    key holds the table) reads the same addresses from any table made for that key."""
    cp = runtime.cupy_module()
    key = (key, cp.cuda.runtime.getDevice())
    with _TABLES_LOCK:
        table = _TABLES.get(key)
        if table is None:
            table = cp.asarray(np.ascontiguousarray(build(), dtype=np.uint64))
            kept = sum(t.nbytes for t in _TABLES.values())
            while _TABLES and (len(_TABLES) >= POINTER_TABLES
                               or kept + table.nbytes > POINTER_TABLE_BYTES):
                kept -= _TABLES.popitem(last=False)[1].nbytes
            _TABLES[key] = table
        else:
            _TABLES.move_to_end(key)
    return table


def capturing(cp, stream=None) -> bool:
    """Whether `stream` (default: the current one) is being captured into a CUDA graph (the
    legacy default stream, while another thread captures, answers with an error: counted
    as capturing)."""
    try:
        if stream is None:
            stream = cp.cuda.get_current_stream().ptr
        return bool(cp.cuda.runtime.streamIsCapturing(stream))
    except cp.cuda.runtime.CUDARuntimeError:
        return True


def _elements(shapes):
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def outputs(dtype, *shapes):
    """New arrays of `shapes` for a call's results: runtime.empty_set (one allocation for
    them all where they are small together, else one each)."""
    return runtime.empty_set(dtype, shapes)


def shared(kern, nbytes: int):
    """`kern` allowed `nbytes` of dynamic shared memory."""
    return kern.allow_shared(nbytes)


def blocks_per_sm(kern, threads: int, shared_mem: int) -> int:
    """How many blocks of `kern` one SM holds at once (the occupancy API)."""
    return runtime.cupy_module().cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
        kern.ptr, threads, shared_mem)


class _LaunchConfig(ctypes.Structure):       # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


_DRIVER = None


def clusters_at_once(kern, cluster: int, threads: int, shared_mem: int):
    """cuOccupancyMaxActiveClusters for a kernel with compile-time cluster dimensions: how
    many of its clusters the GPU runs at once; None where the driver has no such query."""
    global _DRIVER
    try:
        if _DRIVER is None:
            _DRIVER = ctypes.CDLL("libcuda.so.1")
        query = _DRIVER.cuOccupancyMaxActiveClusters
    except (OSError, AttributeError):
        return None
    config = _LaunchConfig(cluster, 1, 1, threads, 1, 1, shared_mem, None, None, 0)
    count = ctypes.c_int(0)
    rc = query(ctypes.byref(count), ctypes.c_void_p(kern.ptr), ctypes.byref(config))
    return count.value if rc == 0 and count.value > 0 else None


def copy_bytes(dst: int, src: int, nbytes: int) -> None:
    """Device-to-device copy of nbytes between raw addresses, on the current stream."""
    cp = runtime.cupy_module()
    cp.cuda.runtime.memcpyAsync(dst, src, nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                cp.cuda.get_current_stream().ptr)


def zero_bytes(dst: int, nbytes: int) -> None:
    """Zero nbytes at a raw device address, on the current stream."""
    cp = runtime.cupy_module()
    cp.cuda.runtime.memsetAsync(dst, 0, nbytes, cp.cuda.get_current_stream().ptr)


_ONES: dict = {}


def ones(n: int, dtype):
    """A device vector of n ones for the bias GEMMs: the first n of one vector kept per
    (dtype, device), made anew (a power of two long) only when a longer one is asked for,
    so that passes of many lengths keep one vector, not one each. The caller keeps the
    returned view while its address is used."""
    cp = runtime.cupy_module()
    key = (np.dtype(dtype).char, cp.cuda.runtime.getDevice())
    vec = _ONES.get(key)
    if vec is None or vec.size < n:
        vec = cp.ones(1 << max(n - 1, 1).bit_length(), dtype)
        cp.cuda.get_current_stream().synchronize()   # (filled before any stream reads it)
        _ONES[key] = vec
    return vec[:n]


_HOST_SCALARS: dict = {}
_HOST_KEPT: list = []


def _host_scalars(dtype):
    """{0.0: address, 1.0: address} of host scalars of `dtype` for cuBLAS' alpha and beta,
    made once and kept (reading an array's .ctypes.data costs microseconds per call)."""
    got = _HOST_SCALARS.get(dtype)
    if got is None:
        arrays = [np.array(v, dtype=dtype) for v in (0.0, 1.0)]
        got = _HOST_SCALARS[dtype] = {float(a): a.ctypes.data for a in arrays}
        _HOST_KEPT.extend(arrays)
    return got


class _Cublas:
    """cuBLAS' strided-batched GEMMs and the settings they need, called on the library CuPy
    loaded (its handles are that library's), through ctypes: CuPy's wrappers set the stream
    before every call and refuse any call while the stream is being captured into a CUDA
    graph, which cuBLAS itself allows (its workspace comes from cudaMallocAsync since CUDA
    12.2). Loaded once; None where the library cannot be found (then CuPy's wrappers)."""

    def __init__(self, lib):
        i32, i64, ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        self.set_stream = lib.cublasSetStream_v2
        self.set_stream.argtypes = [ptr, ptr]
        self.get_mode = lib.cublasGetPointerMode_v2
        self.get_mode.argtypes = [ptr, ctypes.POINTER(i32)]
        self.set_mode = lib.cublasSetPointerMode_v2
        self.set_mode.argtypes = [ptr, i32]
        self.get_math = lib.cublasGetMathMode
        self.get_math.argtypes = [ptr, ctypes.POINTER(i32)]
        self.set_math = lib.cublasSetMathMode
        self.set_math.argtypes = [ptr, i32]
        gemm_args = [ptr, i32, i32, i32, i32, i32, ptr, ptr, i32, i64, ptr, i32, i64, ptr, ptr,
                     i32, i64, i32]
        self.gemm = {}
        for itemsize, name in ((4, "cublasSgemmStridedBatched"),
                               (8, "cublasDgemmStridedBatched")):
            fn = getattr(lib, name)
            fn.argtypes = gemm_args
            fn.restype = ctypes.c_int
            self.gemm[itemsize] = fn
        # (the batched GEMMs of pointer arrays: each item's A, B and C at its own address)
        pointer_args = [ptr, i32, i32, i32, i32, i32, ptr, ptr, i32, ptr, i32, ptr, ptr, i32,
                        i32]
        self.gemm_pointers = {}
        for itemsize, name in ((4, "cublasSgemmBatched"), (8, "cublasDgemmBatched")):
            fn = getattr(lib, name)
            fn.argtypes = pointer_args
            fn.restype = ctypes.c_int
            self.gemm_pointers[itemsize] = fn
        for fn in (self.set_stream, self.get_mode, self.set_mode, self.get_math, self.set_math):
            fn.restype = ctypes.c_int

    check = staticmethod(_cublaslt.status_check("cuBLAS"))


_CUBLAS: dict = {}


def pick_cublas(paths, major, name="libcublas"):
    """Of the `name` files (libcublas, or libcublasLt) mapped in the process, the one of
    cuBLAS major version `major`: the file whose name carries that major, if exactly one
    does, or the only file mapped where its name carries no major; else None. (With two
    files of one major, which one CuPy calls is not known: CuPy's wrappers serve then.)"""
    paths = {p for p in paths if re.search(rf"/{name}\.so(\.[0-9.]*)?$", p)}
    found = {p for p in paths if re.search(rf"/{name}\.so\.{major}(\.[0-9.]*)?$", p)}
    if not found and len(paths) == 1 and re.search(rf"/{name}\.so$", next(iter(paths))):
        found = set(paths)
    return found.pop() if len(found) == 1 else None


def _cublas_lib(handle):
    """The _Cublas of the libcublas that CuPy calls (pick_cublas among the files the
    process maps, by the major version cuBLAS reports; checked by the version the file
    reports for CuPy's handle), or None. Found with it: the cuBLASLt library of the same
    version (_CUBLAS["lt"], a _cublaslt.Library, or None)."""
    if "lib" not in _CUBLAS:
        from cupy_backends.cuda.libs import cublas
        found = lt = None
        try:
            version = cublas.getVersion(handle)
            try:
                major = cublas.getProperty(0)       # (libraryPropertyType MAJOR_VERSION)
            except AttributeError:                  # (the version's encoding: 12.x on
                major = version // (10000 if version >= 100000 else 1000)   # vs 11.x)
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "/libcublas" in line}
            path = pick_cublas(paths, major)
            if path is not None:
                lib = ctypes.CDLL(path)
                got = ctypes.c_int(0)
                lib.cublasGetVersion_v2.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
                if lib.cublasGetVersion_v2(handle, ctypes.byref(got)) == 0 and \
                        got.value == version:
                    found = _Cublas(lib)
                    lt_path = pick_cublas(paths, major, "libcublasLt")
                    if lt_path is not None and USE_CUBLASLT:
                        lt = _cublaslt.Library(ctypes.CDLL(lt_path))
                        lt = lt if lt.version == version else None
        except Exception:  # noqa: BLE001 (any failure: CuPy's wrappers serve)
            found = lt = None
        _CUBLAS["lib"], _CUBLAS["lt"] = found, lt
    return _CUBLAS["lib"]


def has_batched_pointers() -> bool:
    """Whether cuBLAS's batched GEMM of pointer arrays is at hand on the current device
    (the libcublas CuPy calls, found by _cublas_lib): what the per-step path's split
    backward product (Loop.gemm_pointers) needs."""
    return _cublas_lib(runtime.cupy_module().cuda.device.get_cublas_handle()) is not None


#: the passes' products go through cuBLASLt with each product's algorithm chosen once
#: (cugru/_cublaslt.py) where the library is found; False: through cuBLAS' GEMM (read when
#: the library is first looked for)
USE_CUBLASLT = True
#: ... for products of at most this many multiply-adds (m*n*k*batch): where the product's
#: time on the GPU is about the host's time to issue it. Larger ones go through cuBLAS' GEMM,
#: whose algorithms (with the handle's workspace) were up to 2x faster on the GPU than those
#: cuBLASLt offers without a workspace (S9's products, docs/performance.md)
LT_MAX_MACS = 1 << 27
#: ... and of sums at most this long (k): a long sum over few outputs is where cuBLAS' GEMM
#: splits the sum across blocks, which cuBLASLt without a workspace cannot (the per-step
#: path's products at H = 650-700, B = 20 took 2.3x the time through it: bench.paths)
LT_MAX_K = 256
_LT_PRODUCTS: dict = {}
_LT_LOCK = threading.Lock()


def products_on(lib):
    """The cuBLASLt products (_cublaslt.Products) of the current device, or None where
    cuBLASLt's handle cannot be made (then cuBLAS' GEMM serves, and the next pass asks
    again)."""
    device_id = runtime.cupy_module().cuda.runtime.getDevice()
    got = _LT_PRODUCTS.get(device_id)
    if got is None:
        with _LT_LOCK:
            got = _LT_PRODUCTS.get(device_id)
            if got is None:
                try:
                    got = _LT_PRODUCTS[device_id] = _cublaslt.Products(lib)
                except RuntimeError:
                    return None
    return got


#: cuBLAS' math modes (cublasMath_t): the low bits name the mode, higher bits are flags
_MATH_DEFAULT, _MATH_TF32, _MATH_MODE_BITS = 0, 3, 0xF


def math_mode(current: int, math: str) -> int:
    """The cuBLAS math mode for `math` (cugru._args.MATHS: "strict" or "tf32"), from the
    handle's `current` one: its flags kept; "tf32" sets the TF32 mode, "strict" turns TF32
    off and keeps any other mode (the default and pedantic modes compute float32 products
    in float32)."""
    flags, mode = current & ~_MATH_MODE_BITS, current & _MATH_MODE_BITS
    if math == "tf32":
        return flags | _MATH_TF32
    return flags | (_MATH_DEFAULT if mode == _MATH_TF32 else mode)


#: the per-step path issues two calls a step, and the host took about twice the GPU's time
#: to issue them on large shapes (docs/performance.md). So a pass's recurrence there runs
#: through Loop.replay: a call that repeats an earlier one (the same shape, buffers, settings,
#: stream and thread, as in a training loop, where CuPy's pool hands each call the buffers
#: of the call before) runs as one CUDA graph launch. False: every call issues its calls.
GRAPHS = True
#: at most this many graphs are kept, and this many keys seen once remembered (the least
#: recently used go first; a graph keeps no buffer alive, only the addresses it names)
GRAPH_ENTRIES = 16
GRAPH_SEEN = 64
EAGER, CAPTURE = "eager", "capture"


class GraphCache:
    """Loop.replay's memory: for a key, EAGER (first seen), CAPTURE (seen once before) or
    the graph kept for it (EAGER for good after a capture that failed)."""

    def __init__(self):
        self.graphs, self.seen = OrderedDict(), OrderedDict()
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            graph = self.graphs.get(key)
            if graph is not None:
                self.graphs.move_to_end(key)
                return graph
            if self.seen.pop(key, False):
                return CAPTURE
            self.seen[key] = True
            while len(self.seen) > GRAPH_SEEN:
                self.seen.popitem(last=False)
            return EAGER

    def put(self, key, graph):
        with self.lock:
            self.graphs[key] = graph
            while len(self.graphs) > GRAPH_ENTRIES:
                self.graphs.popitem(last=False)

    def clear(self):
        with self.lock:
            self.graphs.clear()
            self.seen.clear()


_GRAPHS = GraphCache()
_SIDE: dict = {}
_FORK: dict = {}


def clear_graphs() -> None:
    """Drop the kept graphs and the keys seen (also at cukernels.runtime.rebuild: a graph
    names the compiled kernels it launches)."""
    _GRAPHS.clear()


runtime.on_rebuild(clear_graphs)


def _side_stream(cp):
    """The stream Loop.replay captures on, one per device and thread (a capture cannot run
    on the legacy default stream; the graph launches on the caller's)."""
    key = (cp.cuda.runtime.getDevice(), threading.get_ident())
    with _SCRATCH_LOCK:
        side = _SIDE.get(key)
        if side is None:
            side = _SIDE[key] = cp.cuda.Stream(non_blocking=True)
    return side


def _fork_setting(cp):
    """Loop.fork's second stream, one per device and thread, with the cuBLAS handle its
    products run on (a handle runs on one stream at a time: the pass's own stays on the
    pass's stream) and the two events that fork it from a pass's stream and join it back."""
    key = (cp.cuda.runtime.getDevice(), threading.get_ident())
    with _SCRATCH_LOCK:
        got = _FORK.get(key)
        if got is None:
            from cupy_backends.cuda.libs import cublas
            got = _FORK[key] = (cp.cuda.Stream(non_blocking=True), cublas.create(),
                                cp.cuda.Event(disable_timing=True),
                                cp.cuda.Event(disable_timing=True))
    return got


def fork_made() -> bool:
    """Whether this device and thread has Loop.fork's stream and handle already."""
    cp = runtime.cupy_module()
    return (cp.cuda.runtime.getDevice(), threading.get_ident()) in _FORK


def graph_key(*items):
    """A hashable key of a pass's calls for Loop.replay: each array (anything with
    .data.ptr) as its address and byte count, a dict as its sorted items, tuples and lists
    item by item, None and other values as they are."""
    def one(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, np.generic):
            return v.item()
        if isinstance(v, dict):
            return tuple((k, one(v[k])) for k in sorted(v))
        if isinstance(v, (tuple, list)):
            return tuple(one(i) for i in v)
        data = getattr(v, "data", None)
        if data is not None and hasattr(data, "ptr"):
            return ("buffer", int(data.ptr), int(v.nbytes))
        raise TypeError(f"graph_key takes arrays, dicts, sequences and scalars, got {type(v)}")
    return one(items)


class Loop:
    """The launches and cuBLAS products of one pass, with the least host work per call.

    Use as a context manager around the pass. A product of at most LT_MAX_MACS
    multiply-adds, whose sums have at most LT_MAX_K terms, goes through cuBLASLt with the
    algorithm chosen for its shape once (_cublaslt.Products: one library call on the host);
    any other through cuBLAS' GEMM, for which, at the first such product, it binds cuBLAS'
    handle to the pass's stream, sets its pointer mode to host and its math mode to the
    pass's `math` (math_mode) (and restores both after). It keeps alpha and beta in host
    arrays, and packs a per-step kernel's arguments once (``kernel``), so a step costs one
    cuLaunchKernel and one library call. GEMM operands are raw addresses (ints); the caller
    keeps the arrays alive. The GEMMs go straight to the libraries (_Cublas,
    _cublaslt.Library), so a pass may be captured into a CUDA graph.
    """

    _cublas = None

    def __init__(self, dtype, *, plain=None, math="strict", stream=None, handle=None):
        if Loop._cublas is None:
            from cupy_backends.cuda.libs import cublas
            Loop._cublas = cublas
        self.dtype = np.dtype(dtype)
        self.plain = PLAIN_LAUNCH if plain is None else plain
        self.math = math
        self._gemm = self._scalars = self.handle = self._mode = None   # (set by the first gemm)
        self._math_was = None     # (the handle's math mode before, where the pass changed it)
        self._math_mode = None    # (the one the pass runs: its flags included)
        self._direct = None
        self._lt = None           # (the device's cuBLASLt products, where they serve)
        self._bound = False
        self._own_handle = handle     # (a fork's: _fork_setting's; None: CuPy's)
        self.stream = runtime.cupy_module().cuda.get_current_stream().ptr if stream is None \
            else stream

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._mode is not None:
            mode, self._mode = self._mode, None
            was, self._math_was = self._math_was, None
            if self._direct is not None:
                # (CuPy's wrappers bind their stream again before each call of theirs)
                status = self._direct.set_mode(self.handle, mode)
                if was is not None and status == 0:
                    status = self._direct.set_math(self.handle, was)
                if exc[0] is None:      # (an error in the pass goes first)
                    self._direct.check(status, "setPointerMode or setMathMode")
            else:
                self._cublas.setPointerMode(self.handle, mode)
                if was is not None:
                    self._cublas.setMathMode(self.handle, was)
        return False

    def _bind(self):
        """Find the libraries and the host scalars; the products then go through cuBLASLt
        (products_on) where it serves this dtype and math, else through cuBLAS' handle,
        bound at once (_bind_handle)."""
        self._bound = True
        self._scalars = _host_scalars(self.dtype.char)
        cupys = runtime.cupy_module().cuda.device.get_cublas_handle()
        self.handle = cupys if self._own_handle is None else self._own_handle
        self._direct = _cublas_lib(cupys)
        lt = _CUBLAS.get("lt")
        products = products_on(lt) if lt is not None and (
            self.dtype.itemsize, self.math) in _cublaslt.COMPUTE else None
        if products is None:
            self._bind_handle()
            return
        self._lt = products

    def _bind_handle(self):
        """Bind cuBLAS' handle to the pass: its stream, host pointer mode and math mode
        (restored by __exit__)."""
        cb = self._cublas
        direct = self._direct
        if direct is None:
            self._gemm = (cb.sgemmStridedBatched if self.dtype.itemsize == 4
                          else cb.dgemmStridedBatched)
            self._mode = cb.getPointerMode(self.handle)
            cb.setPointerMode(self.handle, cb.CUBLAS_POINTER_MODE_HOST)
            was = cb.getMathMode(self.handle)
            want = self._math_mode = math_mode(was, self.math)
            if want != was:
                cb.setMathMode(self.handle, want)
                self._math_was = was
            return
        self._gemm = direct.gemm[self.dtype.itemsize]
        mode = ctypes.c_int(0)
        direct.check(direct.get_mode(self.handle, ctypes.byref(mode)), "getPointerMode")
        self._mode = mode.value
        direct.check(direct.set_mode(self.handle, cb.CUBLAS_POINTER_MODE_HOST),
                     "setPointerMode")
        direct.check(direct.get_math(self.handle, ctypes.byref(mode)), "getMathMode")
        want = self._math_mode = math_mode(mode.value, self.math)
        if want != mode.value:
            direct.check(direct.set_math(self.handle, want), "setMathMode")
            self._math_was = mode.value
        direct.check(direct.set_stream(self.handle, self.stream), "setStream")

    def _set_math(self, mode):
        """Set cuBLAS' handle's math mode (bound to the pass: _bind_handle)."""
        if self._direct is None:
            self._cublas.setMathMode(self.handle, mode)
        else:
            self._direct.check(self._direct.set_math(self.handle, mode), "setMathMode")

    def bind(self):
        """Bind the pass's products to its library (done by the first product where not
        before)."""
        if not self._bound:
            self._bind()

    def can_fork(self) -> bool:
        """Whether fork serves this pass: its launches are not plain (a plain launch runs
        on CuPy's current stream) and its products go through cuBLAS' own library."""
        self.bind()
        return not self.plain and self._direct is not None

    def fork(self):
        """A loop of this pass on a second stream (_fork_setting's), whose calls run after
        this loop's calls so far and beside its later ones, up to join(): two chains of
        calls at once, eagerly or inside one captured graph (the second stream joins the
        capture through the fork's event). Its cuBLAS products run on a handle of its own;
        cuBLASLt takes the stream per product. That handle runs the pass's math from its
        own default mode: flags a caller set on CuPy's handle (e.g. pedantic) do not reach
        it. Only where can_fork()."""
        cp = runtime.cupy_module()
        stream, handle, forked, _ = _fork_setting(cp)
        rt = cp.cuda.runtime
        rt.eventRecord(forked.ptr, self.stream)
        rt.streamWaitEvent(stream.ptr, forked.ptr, 0)
        other = Loop(self.dtype, plain=self.plain, math=self.math, stream=stream.ptr,
                     handle=handle)
        other.bind()
        return other

    def join(self, other):
        """This loop's later calls run after every call of `other` (this loop's fork)."""
        other.__exit__(None, None, None)
        cp = runtime.cupy_module()
        joined = _fork_setting(cp)[3]
        cp.cuda.runtime.eventRecord(joined.ptr, other.stream)
        cp.cuda.runtime.streamWaitEvent(self.stream, joined.ptr, 0)

    def replay(self, key, issue):
        """Issue the calls of ``issue(loop)`` (a pass's recurrence, whose calls touch only
        the buffers, and bake in only the values, that `key` names: graph_key): eagerly the
        first time this loop's setting sees `key`, captured into a CUDA graph the second
        time, and as that one graph's launch from then on (GRAPHS). Eager where graphs
        cannot serve: GRAPHS off, the plain launches, CuPy's cuBLAS wrappers (they refuse a
        capture), or a stream the caller is capturing (the calls go into that capture)."""
        self.bind()
        cp = runtime.cupy_module()
        stream = cp.cuda.get_current_stream()
        if not GRAPHS or self.plain or self._direct is None or stream.ptr != self.stream \
                or capturing(cp, self.stream):
            issue(self)
            return
        math = self._math_mode if self._math_mode is not None else self._lt_math_mode()
        key = (key, self.dtype.char, math, cp.cuda.runtime.getDevice(), self.stream,
               threading.get_ident())
        got = _GRAPHS.get(key)
        if got is EAGER:
            issue(self)
            return
        if got is CAPTURE:
            try:
                got = self._capture(cp, issue)
            except Exception as e:  # noqa: BLE001 (the calls then run as they are)
                # (a capture this setting refuses, e.g. a library that allocates while
                # captured: this key's calls run eagerly from now on; a real error in the
                # calls raises again below)
                _GRAPHS.put(key, EAGER)
                warnings.warn(f"cugru: a CUDA graph capture failed ({e}); these calls run "
                              "without a graph", RuntimeWarning, stacklevel=3)
                issue(self)
                return
            _GRAPHS.put(key, got)
        got.launch(stream)

    def _lt_math_mode(self):
        """The math mode a replay's key names where the pass's products went through
        cuBLASLt and none yet through cuBLAS' GEMM: a product the recurrence sends to cuBLAS'
        GEMM runs the handle's mode with its flags (read here, on the replays alone, not
        on every pass)."""
        mode = ctypes.c_int(0)
        self._direct.check(self._direct.get_math(self.handle, ctypes.byref(mode)),
                           "getMathMode")
        return "cublasLt", math_mode(mode.value, self.math)

    def _capture(self, cp, issue):
        """``issue``'s calls captured, on a side stream of this device and thread, into an
        instantiated CUDA graph (cupy.cuda.Graph). The capture is thread-local (a
        cudaMalloc on this thread meanwhile fails rather than joining the graph); the calls
        allocate nothing: every buffer they touch is in the key."""
        side = _side_stream(cp)
        mode = getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", None)
        try:
            with side:
                inner = Loop(self.dtype, math=self.math)
                side.begin_capture(mode)
                try:
                    with inner:
                        issue(inner)
                except BaseException:
                    try:
                        side.end_capture()
                    except Exception:  # noqa: BLE001 (the issue's error goes first)
                        pass
                    raise
                return side.end_capture()
        finally:
            # (an inner loop whose products took cuBLAS' GEMM bound the handle to the side
            # stream: this pass's later GEMMs must run on its own)
            self._direct.check(self._direct.set_stream(self.handle, self.stream), "setStream")

    def gemm(self, transa, transb, m, n, k, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch=1,
             math=None, wide=False):
        """Column-major C_i = op(A_i) @ op(B_i) + beta*C_i for i < batch; A, B, C are device
        addresses (ints), strides in elements. `math`: this product's own (cugru._args.MATHS)
        where it differs from the pass's (None: the pass's). `wide`: operands and result in
        float64 whatever the pass's dtype (cugru._plan.wide_products; a float32 pass under
        math="strict")."""
        if not self._bound:
            self._bind()
        math = "strict" if wide else self.math if math is None else math
        itemsize = 8 if wide else self.dtype.itemsize
        scalars = _host_scalars("d") if wide else self._scalars
        lt = self._lt
        if lt is not None and k <= LT_MAX_K and m * n * k * batch <= LT_MAX_MACS:
            bits = A | B | C | _cublaslt.MAX_ALIGNMENT
            product = lt.get(itemsize, math, transa, transb, m, n, k, lda, sA, ldb, sB, ldc,
                             sC, batch, bits & -bits)
            if product is not None:
                desc, a, b, c, algo = product.call
                status = lt.matmul(lt.handle, desc, scalars[1.0], A, a, B, b,
                                   scalars[float(beta)], C, c, C, c, algo, None, 0,
                                   self.stream)
                if status != 0:
                    raise RuntimeError(f"cuBLASLt matmul failed with status {status} (m={m}, "
                                       f"n={n}, k={k}, batch={batch})")
                return
        if self._mode is None:
            self._bind_handle()
        cb = self._cublas
        own = self._math_mode
        if math != self.math:
            # (from the handle's mode before the pass: what a pass of this math would set)
            own = math_mode(self._math_mode if self._math_was is None else self._math_was,
                            math)
        if own != self._math_mode:
            self._set_math(own)
        gemm = self._gemm
        if wide:
            gemm = (cb.dgemmStridedBatched if self._direct is None
                    else self._direct.gemm[8])
        try:
            status = gemm(self.handle, cb.CUBLAS_OP_T if transa else cb.CUBLAS_OP_N,
                          cb.CUBLAS_OP_T if transb else cb.CUBLAS_OP_N, m, n, k, scalars[1.0],
                          A, lda, sA, B, ldb, sB, scalars[float(beta)], C, ldc, sC, batch)
        except BaseException:
            if own != self._math_mode:
                try:
                    self._set_math(self._math_mode)
                except Exception:  # noqa: BLE001 (the product's error goes first)
                    pass
            raise
        if own != self._math_mode:
            self._set_math(self._math_mode)
        if self._direct is not None and status != 0:
            raise RuntimeError(f"cuBLAS {'s' if itemsize == 4 else 'd'}"
                               f"gemmStridedBatched failed with status {status} (m={m}, "
                               f"n={n}, k={k}, batch={batch})")

    def has_gemm_pointers(self) -> bool:
        """Whether gemm_pointers serves this pass (cuBLAS' own library found: _Cublas)."""
        self.bind()
        return self._direct is not None

    def gemm_pointers(self, transa, transb, m, n, k, A, lda, B, ldb, beta, C, ldc, batch,
                      wide=False):
        """Column-major C_i = op(A_i) @ op(B_i) + beta*C_i for i < batch, where A, B and C
        are the addresses of device arrays of the items' addresses (pointer_table): cuBLAS'
        batched GEMM on the pass's handle, stream and math (has_gemm_pointers: only where
        the library is found). `wide`: the items in float64 whatever the pass's dtype (as
        for gemm; float64 products have one math)."""
        if not self.has_gemm_pointers():
            raise RuntimeError("gemm_pointers needs cuBLAS' own library (has_gemm_pointers)")
        if self._mode is None:
            self._bind_handle()
        cb = self._cublas
        itemsize = 8 if wide else self.dtype.itemsize
        scalars = _host_scalars("d") if wide else self._scalars
        status = self._direct.gemm_pointers[itemsize](
            self.handle, cb.CUBLAS_OP_T if transa else cb.CUBLAS_OP_N,
            cb.CUBLAS_OP_T if transb else cb.CUBLAS_OP_N, m, n, k, scalars[1.0], A, lda,
            B, ldb, scalars[float(beta)], C, ldc, batch)
        if status != 0:
            raise RuntimeError(f"cuBLAS {'s' if itemsize == 4 else 'd'}gemmBatched "
                               f"failed with status {status} (m={m}, n={n}, k={k}, "
                               f"batch={batch})")

    def launch(self, kern, grid, block, args, *, shared_mem=0, cooperative=False):
        """Launch `kern` once with `args` (by parameter name); `cooperative`: every block
        resident at once, for a kernel with a barrier across blocks."""
        kern.launch(grid, block, args, shared_mem=shared_mem, cooperative=cooperative,
                    stream=self.stream)

    def launch_args(self, kern, grid, block, values, *, shared_mem=0):
        """Launch `kern` once with `values` in the order of its parameters (arrays or None
        where they are pointers; the order checked by kernel(..., params=)): no dictionary
        per call, for the plans whose whole pass is one launch."""
        kern.launch_args(grid, block, values, shared_mem=shared_mem, stream=self.stream)

    def kernel(self, kern, grid, block, args, step_arg):
        """A callable launch(step) of `kern` with `args`, whose int parameter `step_arg` is
        the step: the arguments are packed once, and each step rewrites that one slot (with
        `plain`, each step goes through CuPy's RawKernel call instead)."""
        if self.plain:
            args = dict(args)

            def launch(step):
                args[step_arg] = step
                kern.raw(tuple(grid), tuple(block), kern.typed(args))
            return launch
        slot = kern.names.index(step_arg)
        buf = (ctypes.c_uint64 * len(kern.params))()
        kern.pack_into(buf, args)
        base = ctypes.addressof(buf)
        addrs = (ctypes.c_void_p * len(kern.params))(*range(base, base + 8 * len(buf), 8))
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        fptr, stream, address = kern.ptr, self.stream, ctypes.addressof(addrs)
        launch_kernel = runtime.cupy_module().cuda.driver.launchKernel

        def launch(step, _keep=(buf, addrs)):
            buf[slot] = step & 0xFFFFFFFF
            launch_kernel(fptr, gx, gy, gz, bx, by, bz, 0, stream, address, 0)
        return launch
