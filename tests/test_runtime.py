"""cukernels.runtime without a GPU: kernel signatures read from CUDA text, arguments packed
by name into the parameter block cuLaunchKernel reads, sources and headers registered."""
import ctypes
import pathlib
import struct
import types

import numpy as np
import pytest

from cukernels import runtime

TEXT = r"""
#define PARAMS const T* __restrict__ a, T* b, long long n, \
    unsigned int* counters, int k
#define MAKE(NAME, OP) \
    template <typename T> __global__ void NAME(const T* x, T s, double d, int c) { OP; } \
    template <typename T> __global__ void NAME##_list(const long long* t, int* m) { OP; }
template <typename T>
__global__ void __launch_bounds__(256, 1) plain(const T* __restrict__ x, T* y, T alpha,
                                                long long n, int vec) {}
template <typename T, int C>
__global__ void __launch_bounds__(C, 1) DIMS(C)
macro_params(PARAMS) {}
__global__ void untemplated(unsigned int* counter, int n) {}
MAKE(first, (void)0)
MAKE(second, (void)1)
"""


def test_signatures_are_read_from_declarations_macros_and_kernel_macros():
    sig = runtime.parse_signatures(TEXT)
    assert sig["plain"] == (("x", "ptr"), ("y", "ptr"), ("alpha", "elem"), ("n", "i64"),
                            ("vec", "i32"))
    assert sig["macro_params"] == (("a", "ptr"), ("b", "ptr"), ("n", "i64"),
                                   ("counters", "ptr"), ("k", "i32"))
    assert sig["untemplated"] == (("counter", "ptr"), ("n", "i32"))
    for name in ("first", "second"):
        assert sig[name] == (("x", "ptr"), ("s", "elem"), ("d", "f64"), ("c", "i32"))
        assert sig[name + "_list"] == (("t", "ptr"), ("m", "ptr"))
    assert "NAME" not in sig and not any("#" in name for name in sig)


def _kernel(name, params):
    raw = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=1234),
                                max_dynamic_shared_size_bytes=0)
    return runtime.Kernel(name, raw, params)


class _Dev:
    """A device array's stand-in: .data.ptr"""

    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


def test_arguments_are_packed_by_name_as_each_parameter_reads_them():
    """Every parameter in its own 8-byte slot, as cuLaunchKernel reads it through one
    pointer per parameter: pointers (an array, None for null, an int address), the element
    type of the instance (a Python float rounded to float32, never passed as a double),
    int, long long, unsigned int, double."""
    sig = (("x", "ptr"), ("y", "ptr"), ("z", "ptr"), ("alpha", "elem"), ("n", "i64"),
           ("k", "i32"), ("u", "u32"), ("d", "f64"))
    k = _kernel("k<float,3>", sig)
    buf = (ctypes.c_uint64 * 8)()
    k.pack_into(buf, {"n": -(1 << 40), "x": _Dev(0xABC0), "y": None, "z": 4096, "alpha": 0.1,
                      "k": -7, "u": 3_000_000_000, "d": -2.5})
    raw = bytes(buf)
    slot = lambda i, fmt: struct.unpack_from("<" + fmt, raw, 8 * i)[0]  # noqa: E731
    assert [slot(0, "Q"), slot(1, "Q"), slot(2, "Q")] == [0xABC0, 0, 4096]
    assert slot(3, "f") == np.float32(0.1) and slot(3, "f") != 0.1
    assert slot(4, "q") == -(1 << 40) and slot(5, "i") == -7 and slot(6, "I") == 3_000_000_000
    assert slot(7, "d") == -2.5
    assert _kernel("k<double>", sig).fmt.count("d") == 2       # T = double: 8-byte slot
    typed = k.typed({"n": 5, "x": None, "y": None, "z": 8, "alpha": 1.5, "k": 2, "u": 1,
                     "d": 0.5})
    assert [type(v) for v in typed] == [np.uint64] * 3 + [np.float32, np.int64, np.int32,
                                                          np.uint32, np.float64]


def test_a_positional_launch_packs_what_the_launch_by_name_packs(monkeypatch):
    """launch_args (values in the declaration's order, arrays or None for pointers) hands
    cuLaunchKernel the same parameter block as launch (arguments by name)."""
    sig = (("x", "ptr"), ("y", "ptr"), ("alpha", "elem"), ("n", "i64"), ("k", "i32"))
    k = _kernel("k<float>", sig)
    blocks = []

    def launched(self, grid, block, addrs, shared_mem, stream, cooperative):
        blocks.append((bytes(runtime._shared_block()[0])[:8 * len(sig)], grid, block,
                       shared_mem, stream))
    monkeypatch.setattr(runtime.Kernel, "_launch", launched)
    args = {"x": _Dev(0xABC0), "y": None, "alpha": 0.1, "n": -(1 << 40), "k": 7}
    k.launch((3,), (64,), args, shared_mem=128, stream=5)
    k.launch_args((3,), (64,), (_Dev(0xABC0), None, 0.1, -(1 << 40), 7), shared_mem=128,
                  stream=5)
    k.launch_args((3,), (64,), (0xABC0, 0, 0.1, -(1 << 40), 7), shared_mem=128, stream=5)
    assert blocks[0] == blocks[1] == blocks[2]
    with pytest.raises(ValueError, match="do not fit the parameters"):
        k.launch_args((1,), (1,), (None, None, 0.1, 1, 2**31))


def test_wrong_arguments_are_errors_naming_them():
    k = _kernel("k<float>", (("x", "ptr"), ("n", "i32")))
    buf = (ctypes.c_uint64 * 2)()
    with pytest.raises(TypeError, match=r"missing argument\(s\) \['n'\]"):
        k.pack_into(buf, {"x": None})
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['m'\]"):
        k.pack_into(buf, {"x": None, "n": 1, "m": 2})
    with pytest.raises(TypeError, match="missing argument 'n'"):
        k.pack_into(buf, {"x": None, "m": 2})
    with pytest.raises(ValueError, match="does not fit its parameter"):
        k.pack_into(buf, {"x": None, "n": 2**31})
    with pytest.raises(ValueError, match="has parameters of type T|no element type"):
        _kernel("untemplated", (("a", "elem"),))


@pytest.fixture
def registry(monkeypatch):
    """The runtime's registries, restored after the test."""
    monkeypatch.setattr(runtime, "_SOURCES", dict(runtime._SOURCES))
    monkeypatch.setattr(runtime, "_HEADERS", dict(runtime._HEADERS))


def test_sources_paste_their_headers_once_and_render_defines_first(tmp_path, registry):
    (tmp_path / "own.cuh").write_text('#include "shared_hdr.cuh"\nint own_header;\n')
    shared = tmp_path / "elsewhere"
    shared.mkdir()
    (shared / "shared_hdr.cuh").write_text("int shared_header = SHARED_K;\n")
    (tmp_path / "k.cu").write_text('#include "own.cuh"\n#include "shared_hdr.cuh"\nint body;\n')
    runtime.register_header(shared / "shared_hdr.cuh", lambda: {"SHARED_K": 7})
    src = runtime.Source("k.cu", tmp_path, lambda: {"float": ("k<float>",)},
                         defines=lambda: {"OWN_K": 3})
    text = src.text()
    assert text.index("#define SHARED_K 7") < text.index("#define OWN_K 3") < \
        text.index("int shared_header")
    assert text.count("int shared_header") == 1 and "int own_header" in text
    assert "#include" not in text and text.rstrip().endswith("int body;")
    (tmp_path / "bad.cu").write_text('#include "nowhere.cuh"\n')
    with pytest.raises(FileNotFoundError, match="nowhere.cuh"):
        runtime.Source("bad.cu", tmp_path, dict).text()


def test_a_source_name_is_registered_once_and_instances_have_one_group(tmp_path, registry):
    src = runtime.Source("dup_test.cu", tmp_path, lambda: {"a": ("x<float>",),
                                                           "b": ("x<double>",)})
    runtime.register(src)
    runtime.register(src)                          # the same file again: fine
    other = pathlib.Path(tmp_path) / "other"
    with pytest.raises(ValueError, match="two kernel sources named dup_test.cu"):
        runtime.register(runtime.Source("dup_test.cu", other, dict))
    assert src.group_of("x<double>") == "b"
    with pytest.raises(KeyError, match="not a registered instance"):
        src.group_of("y<float>")


def test_an_array_maker_serves_its_thread_until_undone():
    """runtime.made_by: `empty` returns what the maker makes on the thread that set it,
    nested makers restore each other, and other threads never see them."""
    import threading
    made = []

    def maker(tag):
        def make(shape, dtype):
            made.append(tag)
            return np.full(shape, tag, dtype)
        return make
    undo_outer = runtime.made_by(maker(1))
    undo_inner = runtime.made_by(maker(2))
    assert runtime.empty((2, 3), np.float32).tolist() == [[2.0] * 3] * 2
    seen = []
    other = threading.Thread(target=lambda: seen.append(getattr(runtime._MAKER, "make", None)))
    other.start()
    other.join()
    assert seen == [None]
    undo_inner()
    assert runtime.empty(4, np.int32).dtype == np.int32 and made == [2, 1]
    undo_outer()
    assert getattr(runtime._MAKER, "make", None) is None


def test_positional_launch_orders_are_the_declarations():
    """Every parameter order a positional launch passes values in is its kernels' declared
    order (runtime.kernel checks it on the GPU at the first launch; here without one)."""
    from cugru import _plan
    from cukernels import _launch, multi
    opt = runtime.signatures("optim.cu")
    names = lambda sig, k: [n for n, _ in sig[k]]  # noqa: E731
    rules = [k for k in opt if k.endswith("_update")]
    assert rules and all(names(opt, k) == list(_launch.UPDATE_PARAMS) for k in rules)
    assert all(names(opt, k + "_multi") == list(multi.MULTI_PARAMS) for k in rules)
    act = runtime.signatures("activations.cu")
    assert all(names(act, k) == list(_launch.EW_PARAMS) for k in act)
    small = runtime.signatures("gru_small.cu")
    assert names(small, "gru_small_forward") == list(_plan.SMALL_FORWARD_PARAMS)
    assert names(small, "gru_small_backward") == list(_plan.SMALL_BACKWARD_PARAMS)


class _Block(int):
    """A stand-in for a cupy MemoryPointer: an address, with + an offset."""
    def __add__(self, other):
        return _Block(int(self) + other)


def test_empty_set_puts_small_results_on_one_allocation(monkeypatch):
    """empty_set: small results on one allocation, each at an aligned offset of its own
    (checked with a stand-in CuPy: the arrays are made on block + offset); a set beyond
    SET_BYTES, a single result, or a thread with an array maker gets `empty` for each."""
    allocs, made = [], []

    class FakeCupy:
        class cuda:
            @staticmethod
            def alloc(n):
                allocs.append(n)
                return _Block(1 << 20)

        @staticmethod
        def ndarray(shape, dtype, memptr=None):
            made.append((shape, np.dtype(dtype).name, None if memptr is None else int(memptr)))
            return made[-1]
    monkeypatch.setattr(runtime, "_CUPY", FakeCupy)
    monkeypatch.setattr(runtime, "_SET_LAYOUTS", {})
    got = runtime.empty_set(np.float32, ((1, 1, 1), (1, 3), 70, (0, 5)))
    base, a = 1 << 20, runtime.SET_ALIGN
    # (70 floats take 280 bytes: two aligned slots; an empty array one)
    assert allocs == [5 * a]
    assert [g[:2] for g in got] == [((1, 1, 1), "float32"), ((1, 3), "float32"),
                                    (70, "float32"), ((0, 5), "float32")]
    assert [g[2] for g in got] == [base, base + a, base + 2 * a, base + 4 * a]
    # beyond SET_BYTES together, or one result: an allocation each (no memptr)
    allocs.clear(), made.clear()
    n = runtime.SET_BYTES // 8 + 1
    big = runtime.empty_set(np.float64, ((n,), (1,)))
    one = runtime.empty_set(np.float64, ((3,),))
    assert allocs == [] and [g[2] for g in big + one] == [None, None, None]
    # an array maker (made_by) makes each result
    undo = runtime.made_by(lambda shape, dtype: ("made", shape))
    try:
        assert runtime.empty_set(np.float32, ((1,), (2,))) == (("made", (1,)), ("made", (2,)))
    finally:
        undo()
    assert allocs == []
