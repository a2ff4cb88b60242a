"""The per-step path's products, one at a time: cuBLAS' strided batched GEMM (the call the
pass makes for a product beyond cuBLASLt's limits) in float32 and float64, beside every
algorithm cuBLASLt's heuristics offer for the float32 product (with and without a
workspace), each timed alone and run twice for its bits.

    python tools/gemm_probe.py [ids] [--algos N] [--workspace MiB] [--reps N]
                               [--slices S,S,...|divisors] [--products forward,backward]

For each shape: the forward product (gh = W_hh @ h: m = 3H, n = B, k = H) and the backward
one (dh += W_hh' @ dgh: m = H, n = B, k = 3H), batched over the directions, with the
pass's leading dimensions. Times in µs a product on the GPU (the median of rounds of a CUDA
graph of back-to-back products, as the pass replays its steps). The split rows try k in
S slices for each S of --slices that divides k into slices of at least 32 terms
("divisors": every such S up to 48). GPU needed.
"""
import argparse
import ctypes
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# cublasLtMatmulAlgoConfigAttributes_t: what each offered algorithm is
CONFIG = {"algo": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "stages": 6}


def products(T, B, I, H, bi):
    """(name, transa, transb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch, A, B, C elements)."""
    D, G = 2 if bi else 1, 3 * H
    return [("forward", True, False, G, B, H, H, G * H, H, B * H, G, T * B * G, D,
             D * G * H, D * B * H, D * T * B * G, 0.0),
            ("backward", False, False, H, B, G, H, G * H, G, T * B * G, H, B * H, D,
             D * G * H, D * T * B * G, D * B * H, 1.0)]


class Blas:
    """The cuBLAS calls the probe makes, through ctypes on the libcublas CuPy loaded (CuPy's
    own wrappers refuse to run under stream capture)."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        strided = [p, i32, i32, i32, i32, i32, p, p, i32, i64, p, i32, i64, p, p, i32, i64, i32]
        pointers = [p, i32, i32, i32, i32, i32, p, p, i32, p, i32, p, p, i32, i32]
        for attr, name, args in (("sgemm_sb", "cublasSgemmStridedBatched", strided),
                                 ("dgemm_sb", "cublasDgemmStridedBatched", strided),
                                 ("sgemm_b", "cublasSgemmBatched", pointers),
                                 ("_set_stream", "cublasSetStream_v2", [p, p])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
            setattr(self, attr, self._checked(fn, name))

    @staticmethod
    def _checked(fn, name):
        def call(*args):
            status = fn(*args)
            if status != 0:
                raise RuntimeError(f"{name} failed with status {status}")
        return call

    def set_stream(self, handle, stream):
        self._set_stream(handle, stream)


BLAS = []


def timed(cp, fn, reps, rounds=5):
    """µs per call of fn on the GPU: `reps` calls captured in a CUDA graph (as the pass
    replays its steps), the graph's launches timed with events, the median of rounds."""
    cublas = BLAS[0]
    handle = cp.cuda.device.get_cublas_handle()
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        with stream:
            cublas.set_stream(handle, stream.ptr)
            fn()
            stream.synchronize()
            stream.begin_capture()
            for _ in range(reps):
                fn()
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            got = []
            for _ in range(rounds):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(stream)
                graph.launch(stream)
                b.record(stream)
                b.synchronize()
                got.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / reps)
    finally:
        cublas.set_stream(handle, cp.cuda.get_current_stream().ptr)
    return statistics.median(got)


def measured(cp, fn, C, reps):
    """(µs a call, C after one call from zeros, whether a second such call gives the same
    bits) of fn, which writes C (its beta kept: C zeroed before each checked call)."""
    us = timed(cp, fn, reps)
    got = []
    for _ in range(2):
        C.fill(0)
        fn()
        got.append(C.get())
    return us, got[0], np.array_equal(*got)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["O14", "S10", "S9", "O16", "O5", "O3"])
    ap.add_argument("--algos", type=int, default=24)
    ap.add_argument("--workspace", type=int, default=32, help="MiB for the workspace row")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--slices", default="2,3,4,6,8,12,16,24",
                    help="the split rows' slice counts, or 'divisors' (every one up to 48)")
    ap.add_argument("--products", default="forward,backward",
                    help="which per-step products to time")
    args = ap.parse_args(argv)
    try:
        slices = range(2, 49) if args.slices == "divisors" else \
            [int(v) for v in args.slices.split(",") if v]
    except ValueError:
        ap.error(f"--slices takes slice counts or 'divisors', got {args.slices!r}")
    if not slices or min(slices) < 2:
        ap.error(f"--slices takes counts of 2 or more, got {args.slices!r}")
    wanted = {v for v in args.products.split(",") if v}
    if not wanted <= {"forward", "backward"}:
        ap.error(f"--products names forward and/or backward, got {args.products!r}")
    import cupy as cp
    from cupy_backends.cuda.libs import cublas

    from bench.paths import ALL
    from cugru import _cublaslt, _device
    handle = cp.cuda.device.get_cublas_handle()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/libcublas" in line}
    version = cublas.getVersion(handle)
    major = version // (10000 if version >= 100000 else 1000)
    cdll = ctypes.CDLL(_device.pick_cublas(paths, major, "libcublasLt"))
    BLAS.append(Blas(_device.pick_cublas(paths, major)))
    blas = BLAS[0]
    lt_lib = _cublaslt.Library(cdll)
    get = cdll.cublasLtMatmulAlgoConfigGetAttribute
    lt_handle = ctypes.c_void_p()
    lt_lib.check(lt_lib.create(ctypes.byref(lt_handle)), "create")
    ws = cp.empty(args.workspace << 20, np.uint8)
    rng = np.random.default_rng(0)
    print("| id | product | m, n, k, batch | way | algo, tile, split k, reduction | µs | "
          "same bits twice |")
    print("|---|---|---|---|---|---|---|")
    for sid in args.ids:
        shape = ALL[sid][0]
        for (name, ta, tb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch, na, nb, nc, beta) \
                in products(*shape):
            if name not in wanted:
                continue
            dims = f"{m}, {n}, {k}, {batch}"
            for dt, fn in ((np.float32, blas.sgemm_sb), (np.float64, blas.dgemm_sb)):
                A, Bm = (cp.asarray(rng.uniform(-1, 1, s).astype(dt)) for s in (na, nb))
                C = cp.zeros(nc, dt)
                one, b_ = np.ones(1, dt), np.full(1, beta, dt)

                def run(fn=fn, A=A, Bm=Bm, C=C, one=one, b_=b_):
                    fn(handle, int(ta), int(tb), m, n, k, one.ctypes.data, A.data.ptr, lda, sA,
                       Bm.data.ptr, ldb, sB, b_.ctypes.data, C.data.ptr, ldc, sC, batch)
                us, first, same = measured(cp, run, C, args.reps)
                print(f"| {sid} | {name} | {dims} | cuBLAS {np.dtype(dt).name} | - | "
                      f"{us:.1f} | {same} |")
                if dt == np.float32:
                    A32, B32, C32, ref = A, Bm, C, first
            for row in _split_k(cp, blas, handle, args.reps, A32, B32, ref,
                                (ta, tb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch), beta,
                                slices):
                print(f"| {sid} | {name} | {dims} | " + " | ".join(row) + " |")
            for wbytes in (0, args.workspace << 20):
                for algo, conf in _algos(lt_lib, get, lt_handle, (ta, tb, m, n, k, lda, sA, ldb,
                                                             sB, ldc, sC, batch),
                                         wbytes, args.algos):
                    call = _matmul(lt_lib, lt_handle, algo, A32, B32, C32, ws.data.ptr,
                                   wbytes, (ta, tb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch),
                                   beta)
                    if call is None:
                        continue
                    try:
                        us, first, same = measured(cp, call, C32, args.reps)
                    except RuntimeError as e:
                        print(f"| {sid} | {name} | {dims} | Lt | {conf} | failed: {e} | - |")
                        continue
                    err = float(np.abs(first - ref).max() / max(1e-30, np.abs(ref).max()))
                    print(f"| {sid} | {name} | {dims} | Lt ws {wbytes >> 20} MiB | {conf} | "
                          f"{us:.1f} | {same} (vs cuBLAS {err:.1e}) |")


_REDUCE = r"""
extern "C" __global__ void reduce_parts(const float* parts, float* c, int S, int mn,
                                        int batch, long long sC, float beta) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int d = blockIdx.y;
    if (i >= mn) return;
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc += parts[((long long)d * S + s) * mn + i];
    float* out = c + d * sC + i;
    *out = beta != 0.0f ? *out + acc : acc;
}
"""


def _split_k(cp, cublas, handle, reps, A, B, ref, key, beta, slices):
    """Split k by hand into S slices: the slices' products (one strided batched call per
    direction, S slices a call; and one pointer-array call of batch * S), into partial
    sums, then a kernel adding the S partial sums in order (the product's beta kept)."""
    ta, tb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch = key
    reduce = cp.RawKernel(_REDUCE, "reduce_parts")
    rows = []
    one, zero, fbeta = np.ones(1, np.float32), np.zeros(1, np.float32), np.float32(beta)
    C = cp.zeros(batch * sC + m * n, np.float32)
    for S in slices:
        if k % S or k // S < 32:
            continue
        ks = k // S
        parts = cp.zeros(batch * S * m * n, np.float32)
        # slice s of k: A's columns (N: A + s*ks*lda; T: rows, A + s*ks), B's rows (B + s*ks)
        step_a = ks if ta else ks * lda
        ptrs = []
        for d in range(batch):
            for s_ in range(S):
                ptrs.append((A.data.ptr + (d * sA + s_ * step_a) * 4,
                             B.data.ptr + (d * sB + s_ * ks) * 4,
                             parts.data.ptr + (d * S + s_) * m * n * 4))
        arrays = [cp.asarray(np.array(col, np.uint64)) for col in zip(*ptrs)]
        grid = (-(-m * n // 256), batch)

        def add_parts():
            reduce(grid, (256,), (parts, C, np.int32(S), np.int32(m * n), np.int32(batch),
                                  np.int64(sC), fbeta))

        def strided():
            for d in range(batch):
                cublas.sgemm_sb(
                    handle, int(ta), int(tb), m, n, ks, one.ctypes.data,
                    A.data.ptr + d * sA * 4, lda, step_a, B.data.ptr + d * sB * 4, ldb, ks,
                    zero.ctypes.data, parts.data.ptr + d * S * m * n * 4, m, m * n, S)
            add_parts()

        def pointers():
            cublas.sgemm_b(handle, int(ta), int(tb), m, n, ks, one.ctypes.data,
                           arrays[0].data.ptr, lda, arrays[1].data.ptr, ldb,
                           zero.ctypes.data, arrays[2].data.ptr, m, batch * S)
            add_parts()
        for label, fn in (("split k by hand, strided", strided),
                          ("split k by hand, pointers", pointers)):
            try:
                us, got, same = measured(cp, fn, C, reps)
            except Exception as e:  # noqa: BLE001
                rows.append((label, f"S = {S}", f"failed: {e}", "-"))
                continue
            err = float(np.abs(got[:ref.size] - ref).max() / max(1e-30, np.abs(ref).max()))
            rows.append((label, f"S = {S}", f"{us:.1f}", f"{same} (vs cuBLAS {err:.1e})"))
    return rows


def _layouts(lib, key):
    ta, tb, m, n, k, lda, sA, ldb, sB, ldc, sC, batch = key
    from cugru import _cublaslt as L
    out = []
    for (rows, cols), ld, stride in (((k, m) if ta else (m, k), lda, sA),
                                     ((n, k) if tb else (k, n), ldb, sB), ((m, n), ldc, sC)):
        layout = ctypes.c_void_p()
        lib.check(lib.matrixlayoutcreate(ctypes.byref(layout), 0, rows, cols, ld), "layout")
        if batch > 1:
            c, o = ctypes.c_int32(batch), ctypes.c_int64(stride)
            lib.matrixlayoutsetattribute(layout, L.LAYOUT_BATCH_COUNT, ctypes.byref(c), 4)
            lib.matrixlayoutsetattribute(layout, L.LAYOUT_STRIDED_BATCH_OFFSET,
                                         ctypes.byref(o), 8)
        out.append(layout)
    return out


_KEEP = []


def _desc(lib, key):
    from cugru import _cublaslt as L
    desc = ctypes.c_void_p()
    lib.check(lib.matmuldesccreate(ctypes.byref(desc), 68, 0), "desc")
    for attr, value in ((L.DESC_TRANSA, key[0]), (L.DESC_TRANSB, key[1])):
        v = ctypes.c_int32(1 if value else 0)
        lib.matmuldescsetattribute(desc, attr, ctypes.byref(v), 4)
    return desc


def _algos(lib, get, handle, key, wbytes, count):
    from cugru import _cublaslt as L
    desc, layouts = _desc(lib, key), _layouts(lib, key)
    pref = ctypes.c_void_p()
    lib.check(lib.matmulpreferencecreate(ctypes.byref(pref)), "pref")
    w = ctypes.c_uint64(wbytes)
    lib.matmulpreferencesetattribute(pref, L.PREF_MAX_WORKSPACE_BYTES, ctypes.byref(w), 8)
    results = (L.HeuristicResult * count)()
    found = ctypes.c_int(0)
    a, b, c = layouts
    status = lib.matmulalgogetheuristic(handle, desc, a, b, c, c, pref, count, results,
                                        ctypes.byref(found))
    if status != 0:
        return []
    out = []
    for r in results[:found.value]:
        if r.state != 0:
            continue
        algo = (ctypes.c_uint64 * 8)(*r.algo)
        conf = []
        for attr in ("algo", "tile", "splitk", "reduction"):
            v, size = ctypes.c_uint32(0), ctypes.c_size_t(0)
            get(ctypes.byref(algo), CONFIG[attr], ctypes.byref(v), 4, ctypes.byref(size))
            conf.append(str(v.value))
        out.append((algo, ", ".join(conf) + f" (ws {r.workspaceSize})"))
    _KEEP.append((desc, layouts))
    return out


def _matmul(lib, handle, algo, A, B, C, ws, wbytes, key, beta):
    desc, layouts = _desc(lib, key), _layouts(lib, key)
    _KEEP.append((desc, layouts, algo))
    a, b, c = layouts
    one, b_ = ctypes.c_float(1.0), ctypes.c_float(beta)
    import cupy as cp

    def call():
        s = lib.matmul(handle.value, desc.value, ctypes.addressof(one), A.data.ptr, a.value,
                       B.data.ptr, b.value, ctypes.addressof(b_), C.data.ptr, c.value,
                       C.data.ptr, c.value, ctypes.addressof(algo), ws if wbytes else None,
                       wbytes, cp.cuda.get_current_stream().ptr)
        if s != 0:
            raise RuntimeError(f"status {s}")
    return call


if __name__ == "__main__":
    main()
