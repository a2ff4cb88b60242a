"""math= on the numpy path and the cuBLAS math mode it asks for (no GPU needed).

The numpy path computes every product strict whatever math says (TF32 permits rounding,
it does not require it): math="tf32" gives the strict bits there, is recorded in the
history for gru_backward's default, and is refused where it has no meaning.
"""
import numpy as np
import pytest

import cugru
from cugru import _device
from gru_cases import problem, weights


def test_math_mode_sets_tf32_or_turns_it_off_and_keeps_the_flags():
    mm = _device.math_mode
    assert mm(0, "tf32") == 3 and mm(0, "strict") == 0
    assert mm(3, "strict") == 0 and mm(3, "tf32") == 3
    assert mm(2, "strict") == 2                    # (pedantic stays pedantic)
    assert mm(16 | 3, "strict") == 16 and mm(16, "tf32") == 16 | 3


def test_tf32_on_numpy_is_strict_recorded_and_checked(rng):
    p = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v)
         for k, v in problem(rng, 4, 3, 5, 6, True).items()}
    strict = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    tf32 = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True, math="tf32")
    assert strict[2].math == "strict" and tf32[2].math == "tf32"
    for a, b in zip(strict[:2], tf32[:2]):
        np.testing.assert_array_equal(a, b)
    g1 = cugru.gru_backward(p["dy"], p["dh_n"], tf32[2])
    g2 = cugru.gru_backward(p["dy"], p["dh_n"], strict[2], math="tf32")
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="math must be one of \\('strict', 'tf32'\\), got 'fp32'"):
        cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True, math="fp32")
    with pytest.raises(ValueError, match="math must be one of"):
        cugru.gru_backward(p["dy"], p["dh_n"], tf32[2], math="TF32")
    d = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) else v) for k, v in p.items()}
    with pytest.raises(TypeError, match="math='tf32' takes float32, float16 or bfloat16 "
                                        "data, x is float64"):
        cugru.gru_forward(d["x"], d["h0"], *weights(d), bidirectional=True, math="tf32")
    _, _, saved64 = cugru.gru_forward(d["x"], d["h0"], *weights(d), bidirectional=True)
    with pytest.raises(TypeError, match="x is float64"):
        cugru.gru_backward(d["dy"], None, saved64, math="tf32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tf32_on_half_data_is_taken_and_strict_on_numpy(rng, dtype):
    """Half-precision data takes math="tf32" (its values are exact in TF32), its default
    (float32's is "strict"); the numpy path computes it strict: the bits of
    math="strict", the math recorded."""
    from cugru._args import HALF_DTYPES
    dt = next((d for d in HALF_DTYPES if d.name == dtype), None)
    if dt is None:
        pytest.skip(f"{dtype} needs ml_dtypes")
    h = {k: (v.astype(dt) if isinstance(v, np.ndarray) else v)
         for k, v in problem(rng, 4, 3, 5, 6, True).items()}
    strict = cugru.gru_forward(h["x"], h["h0"], *weights(h), bidirectional=True,
                               math="strict")
    tf32 = cugru.gru_forward(h["x"], h["h0"], *weights(h), bidirectional=True)
    assert tf32[2].math == "tf32" and strict[2].math == "strict"     # (tf32: the default)
    f32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v) for k, v in h.items()}
    assert cugru.gru_forward(f32["x"], None, *weights(f32),
                             bidirectional=True)[2].math == "strict"
    for a, b in zip(strict[:2] + cugru.gru_backward(h["dy"], None, strict[2]),
                    tf32[:2] + cugru.gru_backward(h["dy"], None, tf32[2])):
        assert a.dtype == dt
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_the_conversions_positional_parameters_are_their_declarations():
    """cugru/_half.py launches gru_cast.cu's kernels with values in CAST_PARAMS' order:
    that order is the CUDA declaration's, for both kernels."""
    from cugru import _catalog, _half
    from cukernels import runtime
    sigs = runtime.signatures("gru_cast.cu")
    for name in ("gru_widen", "gru_narrow"):
        assert tuple(n for n, _ in sigs[name]) == _half.CAST_PARAMS
        kinds = [k for _, k in sigs[name]]
        A = _catalog.CAST_ARRAYS
        assert kinds == ["ptr"] * (2 * A) + ["i64"] * A


def test_the_conversions_pack_each_array_pointer_and_size_in_the_declared_order(monkeypatch):
    """_half.convert on host stand-ins: a model of gru_cast.cu's kernels reads every
    launch's values by the declared order (in0..in5, out0..out5, n0..n5; a zero size ends
    the unused ones) and converts through raw addresses. Eight arrays and a None take two
    launches; each result is its input widened (then rounded back), None stays None, an
    empty array gives an empty result, and no launch exceeds the grid's cap."""
    import ctypes
    import types

    from cugru import _catalog, _device, _half

    class Addressed(np.ndarray):
        @property
        def data(self):
            return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    sizes = {}        # (every array's address -> bytes: the model reads no further)

    def known(a):
        sizes[a.data.ptr] = a.nbytes
        return a

    def at(address, n, ctype):
        assert n * ctypes.sizeof(ctype) <= sizes.get(address, 0), "outside every array"
        return np.ctypeslib.as_array((ctype * n).from_address(address))

    A = _catalog.CAST_ARRAYS
    launches, blocks_seen = [], []

    class CastModel:
        def __init__(self, name):
            self.widen = name.startswith("gru_widen")

        def launch_1d(self, blocks, threads, values):
            assert len(values) == 3 * A and 1 <= blocks <= _half.CAST_MAX_BLOCKS
            assert threads == _half.CAST_THREADS
            launches.append(values)
            blocks_seen.append(blocks)
            for s in range(A):
                n = values[2 * A + s]
                if not n:
                    continue
                if self.widen:
                    src = at(values[s], n, ctypes.c_uint16).view(np.float16)
                    at(values[A + s], n, ctypes.c_float)[:] = src.astype(np.float32)
                else:
                    src = at(values[s], n, ctypes.c_float)
                    at(values[A + s], n, ctypes.c_uint16)[:] = \
                        src.astype(np.float16).view(np.uint16)

    monkeypatch.setattr(_device, "kernel", lambda family, name, params=None: CastModel(name))
    monkeypatch.setattr(_device, "outputs", lambda dt, *shapes: tuple(
        known(np.full(s, np.nan, dt).view(Addressed)) for s in shapes))
    named = []        # (the names the temporaries were asked for by)
    monkeypatch.setattr(_device, "scratch", lambda name, dt, *shapes: (
        named.append(name), _device.outputs(dt, *shapes))[1])
    rng = np.random.default_rng(5)
    halves = [known(rng.standard_normal(s).astype(np.float16).view(Addressed))
              for s in ((3, 4), (7,), (2, 3, 5), (0, 4), (1,), (6, 2), (300_000,), (4, 4))]
    arrays = halves[:3] + [None] + halves[3:]
    wide = _half.widen(*arrays)
    assert len(launches) == 2 and wide[3] is None
    assert _half.CAST_MAX_BLOCKS in blocks_seen      # (300 000 elements: the grid's cap)
    for a, w in zip(arrays, wide):
        if a is not None:
            assert w.dtype == np.float32 and w.shape == a.shape
            np.testing.assert_array_equal(w, a.astype(np.float32))
    back = _half.narrow(np.float16, *wide)
    assert len(launches) == 4 and back[3] is None and not named
    with pytest.raises(TypeError, match="float16 arrays, got a float32"):
        _half.widen(halves[0], wide[1])
    with pytest.raises(TypeError, match="float32 arrays, got a float16"):
        _half.narrow(np.float16, wide[0], halves[1])
    with pytest.raises(TypeError, match="strided"):
        _half.widen(halves[0], halves[7][:, ::2])
    temps = _half.widen(*arrays, temporaries="half forward")
    assert named == ["half forward"] and temps[3] is None
    for a, w in zip(arrays, temps):
        if a is not None:
            np.testing.assert_array_equal(w, a.astype(np.float32))
    for a, b in zip(arrays, back):
        if a is not None:
            assert b.dtype == np.float16
            np.testing.assert_array_equal(b.view(np.uint16), a.view(np.uint16))


def test_saved_with_inputs_replaces_the_products_inputs_and_keeps_the_rest(rng):
    """GruSaved.with_inputs (the half-precision passes' copy): x, w_ih and w_hh replaced,
    every other field the same object, the original unchanged."""
    import dataclasses
    p = problem(rng, 3, 2, 4, 5, False)
    saved = cugru.gru_forward(p["x"], p["h0"], *weights(p), lengths=[3, 2])[2]
    x, w_ih, w_hh = p["x"] + 1, saved.w_ih + 1, saved.w_hh + 1
    new = saved.with_inputs(x, w_ih, w_hh)
    assert type(new) is type(saved) and new is not saved
    for f in dataclasses.fields(saved):
        want = {"x": x, "w_ih": w_ih, "w_hh": w_hh}.get(f.name, getattr(saved, f.name))
        assert getattr(new, f.name) is want, f.name
    assert saved.x is not x and saved.w_hh is not w_hh


def test_plans_passes_refuse_half_precision_data_naming_x(rng):
    """cugru.plans runs float32 and float64 data on a given plan; half data is an error
    that names x and points to gru_forward (not a KeyError from inside)."""
    from cugru import plans
    p = {k: (v.astype(np.float16) if isinstance(v, np.ndarray) else v)
         for k, v in problem(rng, 3, 2, 4, 5, False).items()}
    with pytest.raises(TypeError, match="x is float16.*gru_forward"):
        plans.forward(p["x"], p["h0"], *weights(p), plans.STEPS)
    saved = cugru.gru_forward(p["x"], p["h0"], *weights(p))[2]
    for call in (lambda: plans.backward(p["dy"], None, saved, plans.STEPS),
                 lambda: plans.backward_recurrence(p["dy"], None, saved, plans.STEPS)):
        with pytest.raises(TypeError, match="x is float16"):
            call()


def test_a_rebuild_drops_the_kept_graphs():
    """cukernels.runtime.rebuild forgets the compiled kernels, and with them cugru's CUDA
    graphs (which launch those kernels): the hook cugru registers clears the cache."""
    from cugru import _device
    from cukernels import runtime
    cache = _device._GRAPHS
    cache.put(("a key",), "a graph")
    assert cache.get(("a key",)) == "a graph"
    runtime.rebuild()
    assert cache.get(("a key",)) == _device.EAGER     # (forgotten: a first sighting again)
    cache.clear()


def test_use_graphs_turns_the_per_step_graphs_off_and_on_and_checks_its_argument():
    """cugru.plans.use_graphs: returns the setting before, sets it, and turning it off
    drops the kept graphs; a non-bool is a TypeError naming `on`."""
    from cugru import _device, plans
    before = _device.GRAPHS
    try:
        _device._GRAPHS.put(("a key",), "a graph")
        assert plans.use_graphs(False) is before and _device.GRAPHS is False
        assert _device._GRAPHS.get(("a key",)) == _device.EAGER     # (dropped)
        assert plans.use_graphs(True) is False and _device.GRAPHS is True
        with pytest.raises(TypeError, match="on must be True or False"):
            plans.use_graphs(1)
    finally:
        _device.GRAPHS = before
        _device.clear_graphs()


def test_a_replayed_half_inference_keys_every_buffer_its_calls_touch(monkeypatch, rng):
    """A half-precision inference call on a plan whose forward pass `captures` issues the
    widening and the float32 pass through Loop.replay, whose CUDA graph is launched again on
    any call with an equal key: on host stand-ins, every byte those calls read or write (the
    conversions, the copies, the products, the plan's buffers) lies in a buffer the key
    names, for a whole-pass plan and for one with the input projection around it, with and
    without h0. The key changes with any array's address and stays for the same arrays; the
    check fails on a key without x; the results are the pass's float32 results rounded."""
    import ctypes
    import types

    from cugru import _args, _catalog, _half

    class Addressed(np.ndarray):
        @property
        def data(self):
            return types.SimpleNamespace(ptr=self.__array_interface__["data"][0])

    touched, keys, replayed = [], [], []

    def touch(address, nbytes):
        touched.append((address, nbytes))

    def arr(a):
        return np.ascontiguousarray(a).view(Addressed)

    def mem(address, n, ctype):
        touch(address, n * ctypes.sizeof(ctype))
        return np.ctypeslib.as_array((ctype * n).from_address(address))

    A = _catalog.CAST_ARRAYS

    class CastModel:
        def __init__(self, name):
            self.widen = name.startswith("gru_widen")

        def launch_1d(self, blocks, threads, values):
            for s in range(A):
                n = values[2 * A + s]
                if n and self.widen:
                    mem(values[A + s], n, ctypes.c_float)[:] = \
                        mem(values[s], n, ctypes.c_uint16).view(np.float16)
                elif n:
                    mem(values[A + s], n, ctypes.c_uint16)[:] = \
                        mem(values[s], n, ctypes.c_float).astype(np.float16).view(np.uint16)

    class FakeLoop:
        def __init__(self, dtype, math="strict"):
            self.it = np.dtype(dtype).itemsize

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def replay(self, key, issue):
            keys.append(key)
            touched.clear()         # (what the replayed calls touch, the narrowing after not)
            issue(self)
            replayed.append(list(touched))

        def gemm(self, ta, tb, m, n, k, A_, lda, sA, B_, ldb, sB, beta, C, ldc, sC, batch=1):
            for address, ld, cols, rows, stride in ((A_, lda, *((m, k) if ta else (k, m)), sA),
                                                    (B_, ldb, *((k, n) if tb else (n, k)), sB),
                                                    (C, ldc, n, m, sC)):
                touch(address, ((batch - 1) * stride + (cols - 1) * ld + rows) * self.it)

    def uses(p, *names):
        for name in names:
            v = getattr(p, name)
            if v is not None:
                touch(v.data.ptr, v.nbytes)

    class WholePlan:        # (the small path's kind: the pass in one launch)
        captures, whole_pass, writes_h_n = True, True, True

        def forward(self, loop, p):
            uses(p, "x", "h0", "w_ih", "w_hh", "b_ih", "b_hh", "y", "h_n")
            p.y[...], p.h_n[...] = 0.5, -0.25

    class ProjectedPlan:    # (the tile kernels' kind: the projection before, h_n after)
        captures, whole_pass, writes_h_n = True, False, False

        def forward(self, loop, p):
            uses(p, "gi", "w_hh", "b_ih", "b_hh", "hs", "y")
            p.y[...], p.hs[...] = 0.75, 1.5

    monkeypatch.setattr(_device, "kernel", lambda family, name, params=None: CastModel(name))
    fresh = lambda dt, *shapes: tuple(arr(np.full(s, np.nan, dt)) for s in shapes)  # noqa: E731
    monkeypatch.setattr(_device, "outputs", fresh)
    kept = {}
    monkeypatch.setattr(_device, "scratch", lambda name, dt, *shapes: kept.setdefault(
        (name, shapes), fresh(dt, *shapes)))
    monkeypatch.setattr(_device, "copy_bytes", lambda dst, src, n: (
        touch(dst, n), touch(src, n), ctypes.memmove(dst, src, n)))
    monkeypatch.setattr(_device, "zero_bytes", lambda dst, n: (touch(dst, n),
                                                               ctypes.memset(dst, 0, n)))
    monkeypatch.setattr(_device, "Loop", FakeLoop)

    def outside(key):
        named = [b[1:] for b in key if isinstance(b, tuple) and b[:1] == ("buffer",)]
        return [(a, n) for a, n in replayed[-1]
                if not any(s <= a and a + n <= s + size for s, size in named)]

    p = problem(rng, 4, 3, 5, 6, True)
    half = {k: arr(v.astype(np.float16)) for k, v in p.items() if isinstance(v, np.ndarray)}
    for plan in (WholePlan(), ProjectedPlan()):
        for h0 in (half["h0"], None):
            a = _args.forward_args(half["x"], h0, half["w_ih"], half["w_hh"], half["b_ih"],
                                   half["b_hh"], True, False)
            y, h_n, saved = _half.forward(a, plan, "strict")
            assert saved is None and y.dtype == h_n.dtype == np.float16
            assert replayed[-1] and outside(keys[-1]) == []
            x_buffer = ("buffer", half["x"].data.ptr, half["x"].nbytes)
            assert outside(tuple(b for b in keys[-1] if b != x_buffer))   # (x is read)
            np.testing.assert_array_equal(y, np.float16(0.5 if plan.whole_pass else 0.75))
            if plan.whole_pass:
                np.testing.assert_array_equal(h_n, np.float16(-0.25))
            else:       # (h_n: the last slot of the ping-pong states, T = 4 steps)
                np.testing.assert_array_equal(h_n, np.float16(1.5))
            _half.forward(a, plan, "strict")
            assert keys[-1] == keys[-2]
            other = a._replace(x=arr(np.array(half["x"])))
            _half.forward(other, plan, "strict")
            assert keys[-1] != keys[-2]
