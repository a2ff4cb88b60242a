"""cugru/_cublaslt.py on the CPU: the descriptors a product is described by, the algorithm
chosen once per key, the refusals that send a product back to cuBLAS' GEMM. A stand-in for
the library records every call (the GPU tests run the real one: every small product of the
passes goes through it there)."""
import ctypes

import pytest

from cugru import _cublaslt as lt
from cugru import _device


class FakeLib:
    """The Library's functions, recording descriptors as dicts; `found` and `workspace` set
    what the heuristic answers."""
    check = staticmethod(lt.Library.check)

    def __init__(self, found=1, workspace=0, state=0):
        self.found, self.workspace, self.state = found, workspace, state
        self.objects, self.heuristics, self.destroyed = {}, 0, []

    def _new(self, ref, **what):
        handle = len(self.objects) + 1
        self.objects[handle] = what
        ref._obj.value = handle
        return 0

    def create(self, ref):
        return self._new(ref, kind="handle")

    def matmuldesccreate(self, ref, compute, scale):
        return self._new(ref, kind="desc", compute=compute, scale=scale)

    def matrixlayoutcreate(self, ref, dtype, rows, cols, ld):
        return self._new(ref, kind="layout", dtype=dtype, rows=rows, cols=cols, ld=ld)

    def matmulpreferencecreate(self, ref):
        return self._new(ref, kind="pref")

    def _set(self, obj, attr, ref, size):
        assert size == ctypes.sizeof(ref._obj)          # (the value's own size, declared)
        self.objects[obj.value if hasattr(obj, "value") else obj][attr] = ref._obj.value
        return 0

    matmuldescsetattribute = matrixlayoutsetattribute = matmulpreferencesetattribute = _set

    def matmulalgogetheuristic(self, handle, desc, a, b, c, d, pref, count, result, found):
        self.heuristics += 1
        self.last_pref = dict(self.objects[pref.value])
        result._obj.state = self.state
        result._obj.workspaceSize = self.workspace
        result._obj.algo[0] = 42
        found._obj.value = self.found
        return 0

    def matmulpreferencedestroy(self, pref):
        self.destroyed.append(pref.value)

    def matrixlayoutdestroy(self, layout):
        self.destroyed.append(layout.value)

    def matmuldescdestroy(self, desc):
        self.destroyed.append(desc.value)

    matmul = None


def _get(products, transa=False, transb=True, m=5, n=6, k=7, lda=5, sA=0, ldb=6, sB=0,
         ldc=5, sC=0, batch=1, align=256, itemsize=4, math="strict"):
    return products.get(itemsize, math, transa, transb, m, n, k, lda, sA, ldb, sB, ldc, sC,
                        batch, align)


@pytest.mark.parametrize("transa", [False, True])
@pytest.mark.parametrize("transb", [False, True])
def test_a_product_is_described_by_its_operands_as_stored(transa, transb):
    """op(A) is m x k and op(B) k x n: the layouts give each operand's rows and columns as
    stored (transposed ones swapped), with the leading dimensions as given."""
    lib = FakeLib()
    p = _get(lt.Products(lib), transa, transb, m=5, n=6, k=7, lda=11, ldb=12, ldc=13)
    layouts = [lib.objects[h] for h in p.call[1:4]]
    assert [(o["rows"], o["cols"], o["ld"]) for o in layouts] == [
        (7, 5, 11) if transa else (5, 7, 11), (6, 7, 12) if transb else (7, 6, 12), (5, 6, 13)]
    desc = lib.objects[p.call[0]]
    assert desc[lt.DESC_TRANSA] == (lt.OP_T if transa else lt.OP_N)
    assert desc[lt.DESC_TRANSB] == (lt.OP_T if transb else lt.OP_N)
    assert all(lt.LAYOUT_BATCH_COUNT not in o for o in layouts)     # (batch 1: no batch)


def test_batches_strides_dtypes_maths_and_alignment():
    lib = FakeLib()
    products = lt.Products(lib)
    p = _get(products, sA=100, sB=0, sC=300, batch=4)
    layouts = [lib.objects[h] for h in p.call[1:4]]
    assert [o[lt.LAYOUT_BATCH_COUNT] for o in layouts] == [4, 4, 4]
    # (a stride of 0 broadcasts that operand to every batch: the bias sums' vector of ones)
    assert [o[lt.LAYOUT_STRIDED_BATCH_OFFSET] for o in layouts] == [100, 0, 300]
    assert lib.objects[p.call[0]]["compute"] == 68 and layouts[0]["dtype"] == 0
    tf32 = _get(products, math="tf32")
    assert lib.objects[tf32.call[0]]["compute"] == 77
    f64 = _get(products, itemsize=8)
    assert lib.objects[f64.call[0]]["compute"] == 70 and lib.objects[f64.call[0]]["scale"] == 1
    _get(products, align=16)
    pref = lib.last_pref
    assert pref[lt.PREF_MAX_WORKSPACE_BYTES] == 0
    assert [pref[a] for a in lt.PREF_MIN_ALIGNMENT] == [16] * 4
    with pytest.raises(KeyError):
        _get(products, itemsize=8, math="tf32")     # (no TF32 for float64)


def test_the_algorithm_is_chosen_once_per_key():
    lib = FakeLib()
    products = lt.Products(lib)
    first = _get(products)
    assert _get(products) is first and lib.heuristics == 1
    assert ctypes.cast(first.call[4], ctypes.POINTER(ctypes.c_uint64))[0] == 42
    assert _get(products, align=8) is not first and lib.heuristics == 2
    assert _get(products, m=6, lda=6, ldc=6) is not first and lib.heuristics == 3


@pytest.mark.parametrize("answer", [dict(found=0), dict(workspace=1024), dict(state=7)])
def test_no_algorithm_or_one_needing_a_workspace_is_none(answer):
    """The caller then runs cuBLAS' GEMM; the refusal is kept too (asked once), and the
    descriptors made for the question are destroyed."""
    lib = FakeLib(**answer)
    products = lt.Products(lib)
    assert _get(products) is None and _get(products) is None and lib.heuristics == 1
    made = {h for h, o in lib.objects.items() if o["kind"] in ("desc", "layout", "pref")}
    import gc
    gc.collect()
    assert made <= set(lib.destroyed)


def test_the_oldest_products_go_beyond_the_limit(monkeypatch):
    monkeypatch.setattr(lt, "ENTRIES", 3)
    products = lt.Products(FakeLib())
    for m in range(1, 6):
        _get(products, m=m, lda=m, ldc=m)
    assert [key[4] for key in products.kept] == [3, 4, 5]


def test_a_refused_descriptor_is_none_and_what_was_made_is_destroyed():
    """A failing library call while describing a product sends it to cuBLAS' GEMM (None)
    rather than failing the pass."""
    lib = FakeLib()
    lib.matrixlayoutsetattribute = lambda *a: 7          # (refused: not CUBLAS_STATUS_SUCCESS)
    products = lt.Products(lib)
    assert _get(products, batch=3) is None and lib.heuristics == 0
    import gc
    gc.collect()
    made = {h for h, o in lib.objects.items() if o["kind"] in ("desc", "layout")}
    assert made and made <= set(lib.destroyed)


def test_the_cublaslt_file_is_picked_beside_cublas():
    pick = _device.pick_cublas
    paths = {"/a/nvidia/cu13/lib/libcublas.so.13", "/a/nvidia/cu13/lib/libcublasLt.so.13",
             "/b/libcublasLt.so.12"}
    assert pick(paths, 13, "libcublasLt") == "/a/nvidia/cu13/lib/libcublasLt.so.13"
    assert pick(paths, 13) == "/a/nvidia/cu13/lib/libcublas.so.13"
    assert pick({"/a/libcublas.so.13"}, 13, "libcublasLt") is None
    assert pick({"/a/libcublasLt.so.13", "/b/libcublasLt.so.13.1"}, 13, "libcublasLt") is None


# ------------------------------------------------------------------ Loop's use of the products
class FakeStream:
    def __init__(self, cp, ptr):
        self.cp, self.ptr, self.captured = cp, ptr, False

    def __enter__(self):
        self.cp.current.append(self)
        return self

    def __exit__(self, *exc):
        self.cp.current.pop()

    def begin_capture(self, mode):
        self.captured = True

    def end_capture(self):
        self.captured = False
        return "graph"


class FakeCupy:
    """What Loop asks of CuPy: the current stream (7, or a `with` stream's), cuBLAS' handle
    (1234), device 0 and streams (a new one is 9)."""

    def __init__(self):
        self.current = [FakeStream(self, 7)]
        cp = self

        class cuda:
            class runtime:
                streamCaptureModeThreadLocal = 2

                @staticmethod
                def getDevice():
                    return 0

                @staticmethod
                def streamIsCapturing(ptr):
                    return 0

            class device:
                @staticmethod
                def get_cublas_handle():
                    return 1234

            @staticmethod
            def get_current_stream():
                return cp.current[-1]

            @staticmethod
            def Stream(non_blocking=False):
                return FakeStream(cp, 9)
        self.cuda = cuda


class FakeDirect:
    """_device._Cublas: records every call; the handle's math mode starts at 0."""
    check = staticmethod(_device._Cublas.check)

    def __init__(self):
        self.calls = []
        self.gemm = {4: self._gemm, 8: self._gemm}

    def _gemm(self, *args):
        self.calls.append(("gemm",) + args)
        return 0

    def set_stream(self, handle, stream):
        self.calls.append(("set_stream", stream))
        return 0

    def get_mode(self, handle, ref):
        ref._obj.value = 0
        return 0

    def get_math(self, handle, ref):
        self.calls.append(("get_math",))
        ref._obj.value = 0
        return 0

    def set_mode(self, handle, mode):
        self.calls.append(("set_mode", mode))
        return 0

    def set_math(self, handle, mode):
        self.calls.append(("set_math", mode))
        return 0


class FakeProducts:
    """_cublaslt.Products: `refuse` keys get None; matmul records its arguments."""
    handle = 77

    def __init__(self, refuse=False):
        self.asked, self.matmuls, self.refuse = [], [], refuse

    def get(self, *key):
        self.asked.append(key)
        if self.refuse:
            return None
        product = type("P", (), {})()
        product.call = (11, 12, 13, 14, 15)
        return product

    def matmul(self, *args):
        self.matmuls.append(args)
        return 0


class FakeCublasModule:
    CUBLAS_OP_N, CUBLAS_OP_T, CUBLAS_POINTER_MODE_HOST = 0, 1, 0


@pytest.fixture
def stubs(monkeypatch):
    import numpy as np
    from cukernels import runtime
    cp, direct, products = FakeCupy(), FakeDirect(), FakeProducts()
    monkeypatch.setattr(runtime, "cupy_module", lambda: cp)
    monkeypatch.setattr(_device.Loop, "_cublas", FakeCublasModule)
    monkeypatch.setattr(_device, "_CUBLAS", {"lib": direct, "lt": object()})
    monkeypatch.setattr(_device, "_LT_PRODUCTS", {0: products})
    monkeypatch.setattr(_device, "_SIDE", {})
    return cp, direct, products, np.float32


def _product(loop, m=8, n=8, k=8, batch=1, A=0x1000, B=0x2010, C=0x3000):
    loop.gemm(False, True, m, n, k, A, m, 0, B, n, 0, 1.0, C, m, 0, batch)


def test_a_small_short_product_takes_cublaslt_and_leaves_the_handle_alone(stubs):
    cp, direct, products, f32 = stubs
    with _device.Loop(f32, math="tf32") as loop:
        _product(loop)
    (key,) = products.asked
    assert key == (4, "tf32", False, True, 8, 8, 8, 8, 0, 8, 0, 8, 0, 1, 16)   # (B: 16-aligned)
    (args,) = products.matmuls
    alpha, beta = _device._host_scalars("f")[1.0], _device._host_scalars("f")[1.0]
    assert args == (77, 11, alpha, 0x1000, 12, 0x2010, 13, beta, 0x3000, 14, 0x3000, 14, 15,
                    None, 0, 7)
    # (the handle is left alone: not even read, as no replay needs its math mode)
    assert direct.calls == [] and loop._math_mode is None


@pytest.mark.parametrize("kw", [dict(k=_device.LT_MAX_K + 1),
                                dict(m=1 << 10, n=1 << 10, k=1 << 7, batch=2)])
def test_long_sums_and_large_products_take_cublas_gemm(stubs, kw):
    cp, direct, products, f32 = stubs
    with _device.Loop(f32) as loop:
        _product(loop, **kw)
        assert [c[0] for c in direct.calls] == ["set_mode", "get_math", "set_stream", "gemm"]
    assert not products.matmuls and not products.asked
    assert direct.calls[-1] == ("set_mode", 0)          # (the handle's pointer mode restored)


def test_a_product_cublaslt_refuses_takes_cublas_gemm(stubs):
    cp, direct, products, f32 = stubs
    products.refuse = True
    with _device.Loop(f32) as loop:
        _product(loop)
    assert products.asked and not products.matmuls
    assert "gemm" in [c[0] for c in direct.calls]


def test_a_capture_puts_the_handle_back_on_the_pass_stream(stubs):
    """An inner loop whose product took cuBLAS' GEMM bound the handle to the side stream; the
    pass's later GEMMs (the backward tail's) must run on the pass's stream."""
    cp, direct, products, f32 = stubs
    loop = _device.Loop(f32)
    loop.bind()

    def issue(inner):
        assert inner.stream == 9
        _product(inner, k=_device.LT_MAX_K + 1)
    assert loop._capture(cp, issue) == "graph"
    streams = [c[1] for c in direct.calls if c[0] == "set_stream"]
    assert streams == [9, 7]


def test_a_replay_names_the_handle_math_mode_in_its_key_reading_it_then(stubs, monkeypatch):
    """Where the products took cuBLASLt, the handle's math mode is read for a replay's key
    alone (a product of the recurrence that takes cuBLAS' GEMM runs that mode)."""
    cp, direct, products, f32 = stubs
    keys = []

    class Graphs:
        def get(self, key):
            keys.append(key)
            return _device.EAGER
    monkeypatch.setattr(_device, "_GRAPHS", Graphs())
    monkeypatch.setattr(_device, "GRAPHS", True)
    ran = []
    with _device.Loop(f32, math="tf32", plain=False) as loop:
        _product(loop)
        assert direct.calls == []
        loop.replay(("recurrence",), lambda inner: ran.append(inner))
    assert ran == [loop] and direct.calls == [("get_math",)]
    (key,) = keys
    assert key[:3] == (("recurrence",), "f", ("cublasLt", 3)) and key[3:5] == (0, 7)


def test_both_libraries_checks_name_the_library_the_call_and_the_status():
    for check, library in ((_device._Cublas.check, "cuBLAS"), (lt.Library.check, "cuBLASLt")):
        check(0, "anything")
        with pytest.raises(RuntimeError, match=f"^{library} setStream failed with status 7$"):
            check(7, "setStream")


@pytest.mark.parametrize("before", [0, 2], ids=["default", "pedantic"])
def test_a_product_s_own_math_is_set_around_it_and_the_pass_s_set_back(stubs, before):
    """Loop.gemm(math=): through cuBLASLt, the product's math names its descriptor; through
    cuBLAS' GEMM, the handle gets the mode a pass of that math would set from the handle's
    mode before the pass (pedantic kept), for that call alone, also when it raises."""
    cp, direct, products, f32 = stubs
    direct.get_math = lambda handle, ref: setattr(ref._obj, "value", before) or 0
    with _device.Loop(f32, math="tf32") as loop:
        _product(loop)
        loop.gemm(False, True, 8, 8, 8, 0x1000, 8, 0, 0x2000, 8, 0, 1.0, 0x3000, 8, 0,
                  math="strict")
        assert [key[1] for key in products.asked] == ["tf32", "strict"]
        direct.calls.clear()
        long_k = _device.LT_MAX_K + 1
        _product(loop, k=long_k)
        tf32 = loop._math_mode
        assert tf32 == _device.math_mode(before, "tf32") != before
        assert [c[0] for c in direct.calls] == ["set_mode", "set_math", "set_stream", "gemm"]
        direct.calls.clear()
        loop.gemm(False, True, 8, 8, long_k, 0x1000, 8, 0, 0x2000, long_k, 0, 1.0, 0x3000, 8,
                  0, math="strict")
        assert [c[0] for c in direct.calls] == ["set_math", "gemm", "set_math"]
        assert direct.calls[0] == ("set_math", before) and direct.calls[2] == ("set_math", tf32)
        direct.calls.clear()

        def fails(*args):
            raise RuntimeError("the product's own error")
        loop._gemm = fails                  # (the GEMM the loop bound to)
        with pytest.raises(RuntimeError, match="own error"):
            loop.gemm(False, True, 8, 8, long_k, 0x1000, 8, 0, 0x2000, long_k, 0, 1.0, 0x3000,
                      8, 0, math="strict")
        assert direct.calls == [("set_math", before), ("set_math", tf32)]
