"""The passes' GEMMs through cuBLASLt, each product's descriptors and algorithm chosen once and
kept: a repeated product (the same shape, strides, batch, alignment, dtype and math) then
costs one library call on the host.

Why: cuBLAS' own GEMM entry points choose an algorithm at every call, which took 13-26 µs of
host time a product on an H100 host (tools/call_profile.py), more than the product itself on
the small shapes, where a call waits on the host. cuBLASLt takes the algorithm as an
argument; choosing it once per shape is the "cache what a call can reuse" of the house.

The library is the libcublasLt that the process has mapped beside CuPy's libcublas (cuBLAS
loads it), called through ctypes, checked by the version it reports. Its choices:
- no workspace: so no reduction across split K runs through memory shared by streams, and
  a captured CUDA graph names no buffer of ours beyond the operands;
- the operands' alignment, as found at the call, is part of the key (an algorithm chosen for
  256-byte aligned operands may need them);
- math: "strict" computes in float32 (float64 for float64 data), "tf32" lets float32
  products round their inputs to TF32 on tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
A product with no algorithm found is None in the cache: the caller then uses cuBLAS' GEMM.
The same product gives the same bits on every run (one algorithm per key, no workspace).
"""
from __future__ import annotations

import ctypes
import threading

#: cublasComputeType_t and cudaDataType_t of each (itemsize, math)
COMPUTE = {(4, "strict"): 68, (4, "tf32"): 77, (8, "strict"): 70}
SCALE_TYPE = {4: 0, 8: 1}           # CUDA_R_32F, CUDA_R_64F
DATA_TYPE = SCALE_TYPE
#: descriptor attributes (cublasLt.h)
DESC_TRANSA, DESC_TRANSB = 3, 4
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1
PREF_MIN_ALIGNMENT = (5, 6, 7, 8)   # A, B, C, D
OP_N, OP_T = 0, 1
#: the most products whose descriptors are kept (beyond, the oldest made are dropped, and
#: made again if asked for: a captured graph keeps what it needs of them)
ENTRIES = 512
#: the largest alignment asked of the operands (the heuristics' default)
MAX_ALIGNMENT = 256


def status_check(library):
    """A check(status, what) for `library`'s calls (cuBLAS and cuBLASLt alike): an error
    naming the library, the call and its status where the status is not 0."""
    def check(status, what):
        if status != 0:
            raise RuntimeError(f"{library} {what} failed with status {status}")
    return check


class HeuristicResult(ctypes.Structure):    # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t),
                ("state", ctypes.c_int), ("wavesCount", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


class Library:
    """The cuBLASLt functions the products call, with their argument types."""

    def __init__(self, lib):
        p, i32, u64, i64, sz = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                                ctypes.c_longlong, ctypes.c_size_t)
        pp = ctypes.POINTER(p)
        spec = {
            "cublasLtCreate": [pp],
            "cublasLtMatmulDescCreate": [pp, i32, i32],
            "cublasLtMatmulDescSetAttribute": [p, i32, p, sz],
            "cublasLtMatmulDescDestroy": [p],
            "cublasLtMatrixLayoutCreate": [pp, i32, u64, u64, i64],
            "cublasLtMatrixLayoutSetAttribute": [p, i32, p, sz],
            "cublasLtMatrixLayoutDestroy": [p],
            "cublasLtMatmulPreferenceCreate": [pp],
            "cublasLtMatmulPreferenceSetAttribute": [p, i32, p, sz],
            "cublasLtMatmulPreferenceDestroy": [p],
            "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i32,
                                               ctypes.POINTER(HeuristicResult),
                                               ctypes.POINTER(i32)],
            "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
        }
        for name, args in spec.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, name[len("cublasLt"):].lower(), fn)
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        self.version = lib.cublasLtGetVersion()

    check = staticmethod(status_check("cuBLASLt"))


class Product:
    """One product's descriptors and algorithm (kept while its cache entry lives)."""
    __slots__ = ("lib", "desc", "layouts", "algo", "call")

    def __init__(self, lib, desc, layouts, algo):
        self.lib, self.desc, self.layouts, self.algo = lib, desc, layouts, algo
        a, b, c = layouts
        #: (descriptor, A's, B's and C's layouts, algorithm) as the addresses matmul takes
        self.call = (desc.value, a.value, b.value, c.value, ctypes.addressof(algo))

    def __del__(self):
        # (when no call holds it any more: a call in flight keeps its product alive)
        try:
            _destroy(self.lib, self.desc, self.layouts)
        except Exception:  # noqa: BLE001 (at interpreter exit the library may be gone)
            pass


def _destroy(lib, desc, layouts):
    """Destroy a product's descriptors (those made: a handle of None was not)."""
    for layout in layouts:
        if layout.value:
            lib.matrixlayoutdestroy(layout)
    if desc.value:
        lib.matmuldescdestroy(desc)


class Products:
    """The products of one device: its cuBLASLt handle (`handle`, an address), the library's
    matmul (`matmul`) and the kept products by key (at most ENTRIES, the oldest dropped)."""

    def __init__(self, lib: Library):
        self.lib = lib
        handle = ctypes.c_void_p()
        lib.check(lib.create(ctypes.byref(handle)), "create")
        self.handle = handle.value
        self.matmul = lib.matmul
        self.kept: dict = {}
        self.lock = threading.Lock()

    def get(self, itemsize, math, transa, transb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch,
            align):
        """The Product of this GEMM (column-major C_i = op(A_i) @ op(B_i) + beta*C_i, the
        arguments of cublas<t>gemmStridedBatched, `align` the operands' alignment in
        bytes), or None where cuBLASLt offers none."""
        key = (itemsize, math, transa, transb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch,
               align)
        got = self.kept.get(key, False)
        if got is not False:
            return got
        with self.lock:
            got = self.kept.get(key, False)
            if got is False:
                got = self.kept[key] = self._make(*key)
                while len(self.kept) > ENTRIES:
                    del self.kept[next(iter(self.kept))]
            return got

    def _make(self, itemsize, math, transa, transb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch,
              align):
        """The Product of a key, or None where cuBLASLt refuses a descriptor or offers no
        algorithm that runs without a workspace (what was made for it is destroyed)."""
        lib, check = self.lib, self.lib.check
        desc, layouts, pref = ctypes.c_void_p(), [], ctypes.c_void_p()
        result, found = HeuristicResult(), ctypes.c_int(0)
        try:
            check(lib.matmuldesccreate(ctypes.byref(desc), COMPUTE[itemsize, math],
                                       SCALE_TYPE[itemsize]), "MatmulDescCreate")
            for attr, value in ((DESC_TRANSA, transa), (DESC_TRANSB, transb)):
                v = ctypes.c_int32(OP_T if value else OP_N)
                check(lib.matmuldescsetattribute(desc, attr, ctypes.byref(v), 4),
                      "MatmulDescSetAttribute")
            # (rows, cols) of each operand as stored: op(A) is m x k, op(B) k x n, C m x n
            for (rows, cols), ld, stride in (((k, m) if transa else (m, k), lda, sA),
                                             ((n, k) if transb else (k, n), ldb, sB),
                                             ((m, n), ldc, sC)):
                layout = ctypes.c_void_p()
                check(lib.matrixlayoutcreate(ctypes.byref(layout), DATA_TYPE[itemsize], rows,
                                             cols, ld), "MatrixLayoutCreate")
                layouts.append(layout)
                if batch > 1:
                    count, offset = ctypes.c_int32(batch), ctypes.c_int64(stride)
                    check(lib.matrixlayoutsetattribute(layout, LAYOUT_BATCH_COUNT,
                                                       ctypes.byref(count), 4),
                          "MatrixLayoutSetAttribute")
                    check(lib.matrixlayoutsetattribute(layout, LAYOUT_STRIDED_BATCH_OFFSET,
                                                       ctypes.byref(offset), 8),
                          "MatrixLayoutSetAttribute")
            check(lib.matmulpreferencecreate(ctypes.byref(pref)), "MatmulPreferenceCreate")
            zero = ctypes.c_uint64(0)
            check(lib.matmulpreferencesetattribute(pref, PREF_MAX_WORKSPACE_BYTES,
                                                   ctypes.byref(zero), 8),
                  "MatmulPreferenceSetAttribute")
            bytes_ = ctypes.c_uint32(align)
            for attr in PREF_MIN_ALIGNMENT:
                check(lib.matmulpreferencesetattribute(pref, attr, ctypes.byref(bytes_), 4),
                      "MatmulPreferenceSetAttribute")
            a, b, c = layouts
            status = lib.matmulalgogetheuristic(self.handle, desc, a, b, c, c, pref, 1,
                                                ctypes.byref(result), ctypes.byref(found))
        except RuntimeError:
            status = -1
        finally:
            if pref.value:
                lib.matmulpreferencedestroy(pref)
        if status != 0 or found.value < 1 or result.state != 0 or result.workspaceSize:
            _destroy(lib, desc, layouts)
            return None
        return Product(lib, desc, tuple(layouts), (ctypes.c_uint64 * 8)(*result.algo))
