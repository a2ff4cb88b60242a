"""The GRU's other precisions on the GPU: float16 and bfloat16 data, and math="tf32".

Chain of trust for half-precision data: (1) the conversions (gru_cast.cu) give numpy's and
ml_dtypes' bits, on every 16-bit pattern one way and on a sweep of float32 bit patterns,
ties, overflow and subnormals the other; (2) a half-precision call gives, bit for bit, the
float32 call on the same values with each result rounded once, on every path; the float32
call is checked against the oracle by test_gru_gpu.py. So the GPU path keeps the numpy
path's rule (tests/test_gru_half.py) and the two differ only where their float32 results do.

math="tf32" (float32 data): within a tolerance derived from TF32's unit roundoff (2^-11, against float32's
2^-24): the float32 oracle's error against the float64 oracle, scaled by the ratio of the
two, twice, plus a floor of 4 TF32 units of the result's scale; on every result it must
reject an error of 2.5% of the result's scale (PLANTED), so it is no blanket pass. The call must also differ from math="strict" where cuBLAS' products
are large (the mode took effect), leave the cuBLAS handle's math mode as it found it, and
repeat its bits. On half-precision data it is the float32 call with math="tf32", rounded
once, bit for bit.
"""
import numpy as np
import pytest

import cugru
from cugru._args import HALF_DTYPES
from cugru._catalog import MMA_TILES
from gru_cases import check_pairwise_lane_sums, problem, weights

pytestmark = pytest.mark.gpu

OUT_NAMES = ("y", "h_n", "dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")
HALVES = list(HALF_DTYPES)
HALF_IDS = [d.name for d in HALVES]
#: (T, B, I, H): small enough for every path, an H off the tiles' packs, a longer sequence
SHAPES = [(5, 3, 7, 8), (9, 4, 5, 13), (40, 2, 3, 33)]
TF32_U = 2.0 ** -11
F32_U = 2.0 ** -24
#: an error of this fraction of a result's scale at one element fails the TF32 tolerance
#: (on this file's problems the tolerance is at most 1.9% of the scale)
PLANTED = 0.025


def _half_bits(a):
    return np.asarray(a).view(np.uint16)


def _cast(p, dtype):
    return {k: v.astype(dtype) if isinstance(v, np.ndarray) and k != "lengths" else v
            for k, v in p.items()}


def _gpu(cp, p):
    return {k: cp.asarray(v) if isinstance(v, np.ndarray) and k != "lengths" else v
            for k, v in p.items()}


def _call(p, path, math="strict", training=True):
    kw = {"path": path, "lengths": p.get("lengths")}
    out = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=p["bidirectional"],
                            training=training, math=math, **kw)
    if not training:
        return out[:2], None
    y, h_n, saved = out
    grads = cugru.gru_backward(p["dy"], p["dh_n"], saved, path=path)
    return (y, h_n) + tuple(grads), saved


# ------------------------------------------------------------------------- the conversions
@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_widening_every_16_bit_pattern_gives_numpy_s_float32(cp, dtype):
    from cugru import _half
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = bits.view(dtype).astype(np.float32)
    got = cp.asnumpy(_half.widen(cp.asarray(bits).view(dtype))[0])
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _float32_sweep(rng):
    """float32 values: random bit patterns, each format's ties (half-way between two of its
    neighbours) and their neighbours, the edges of its range, subnormals, zeros, infinities."""
    u = [rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)]
    # bfloat16 ties: the dropped 16 bits exactly 0x8000, on odd and even kept bits
    kept = rng.integers(0, 1 << 16, 4096, dtype=np.uint64).astype(np.uint32) << 16
    u += [kept | 0x8000, kept | 0x7fff, kept | 0x8001]
    f = [np.concatenate(u).view(np.float32)]
    # float16 ties: the midpoints of neighbouring float16 values, and either side
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float64)
    h.sort()
    mid = ((h[1:] + h[:-1]) / 2).astype(np.float32)
    f += [mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))]
    edges = [65504, 65519.99, 65520, 65536, 6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-45,
             3.3895314e38, 3.4028235e38, 1.1754944e-38, 0.0, -0.0, np.inf, -np.inf, np.nan]
    f.append(np.array(edges + [-e for e in edges], np.float32))
    return np.concatenate(f)


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_rounding_float32_gives_numpy_s_bits(cp, rng, dtype):
    from cugru import _half
    with np.errstate(over="ignore", invalid="ignore"):
        values = _float32_sweep(rng)
        want = values.astype(dtype)
    got = cp.asnumpy(_half.narrow(dtype, cp.asarray(values))[0])
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    bad = np.flatnonzero(_half_bits(got)[~nan] != _half_bits(want)[~nan])
    assert not bad.size, (f"{bad.size} values rounded differently, e.g. "
                          f"{values[~nan][bad[0]]!r}: {_half_bits(got)[~nan][bad[0]]:#06x} "
                          f"!= {_half_bits(want)[~nan][bad[0]]:#06x}")


# ----------------------------------------------------------------------- half-precision data
@pytest.mark.parametrize("path", ["steps", "fast", "small"])
@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("bi", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", SHAPES)
def test_a_half_call_is_the_float32_call_rounded_once(cp, poison, rng, T, B, I, H, bi, dtype,
                                                     path):
    p = _cast(problem(rng, T, B, I, H, bi), dtype)
    if path == "small" and (2 if bi else 1) * B * H > 1024:
        return
    ours, saved = _call(_gpu(cp, p), path)
    wide, _ = _call(_gpu(cp, _cast(p, np.float32)), path)
    for name, a, b in zip(OUT_NAMES, ours, wide):
        assert a.dtype == dtype, name
        np.testing.assert_array_equal(_half_bits(cp.asnumpy(a)),
                                      _half_bits(cp.asnumpy(b).astype(dtype)), err_msg=name)
    # the history in float32; x and the weights kept as given
    assert saved.hs.dtype == np.float32 and saved.gates.dtype == np.float32
    assert saved.x.dtype == dtype and saved.w_hh.dtype == dtype


@pytest.mark.parametrize("path", ["steps", "fast"])
@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_a_half_call_with_tf32_is_the_float32_tf32_call_rounded_once(cp, poison, rng, dtype,
                                                                    path):
    """math="tf32" on half-precision data: the float32 pass with math="tf32" on the same
    values, each result rounded once (so its accuracy is the float32 TF32 call's, checked by
    test_tf32_within_its_tolerance_and_not_strict, and one rounding); on products this
    large it differs from math="strict"."""
    p = _cast(problem(rng, 8, 64, 300, 300, True), dtype)
    g = _gpu(cp, p)
    ours, saved = _call(g, path, math="tf32")
    assert saved.math == "tf32"
    wide, _ = _call(_gpu(cp, _cast(p, np.float32)), path, math="tf32")
    strict, _ = _call(g, path)
    differs = False
    for name, a, b, s in zip(OUT_NAMES, ours, wide, strict):
        assert a.dtype == dtype, name
        bits = _half_bits(cp.asnumpy(a))
        np.testing.assert_array_equal(bits, _half_bits(cp.asnumpy(b).astype(dtype)),
                                      err_msg=name)
        differs |= not np.array_equal(bits, _half_bits(cp.asnumpy(s)))
    assert differs, "math='tf32' on half data gave the bits of math='strict'"


@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
def test_half_calls_with_lengths_inference_and_two_dimensional_weights(cp, poison, rng,
                                                                       dtype):
    """Variable lengths, training=False and weights without the direction axis, each the
    float32 call rounded once; repeat calls give the same bits."""
    p = _cast(problem(rng, 11, 5, 6, 20, False, lengths=True), dtype)
    for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
        p[name] = p[name][0]
    g, g32 = _gpu(cp, p), _gpu(cp, _cast(p, np.float32))
    for training in (True, False):
        ours, _ = _call(g, "auto", training=training)
        again, _ = _call(g, "auto", training=training)
        wide, _ = _call(g32, "auto", training=training)
        for name, a, a2, b in zip(OUT_NAMES, ours, again, wide):
            assert a.shape == b.shape, name
            bits = _half_bits(cp.asnumpy(a))
            np.testing.assert_array_equal(bits, _half_bits(cp.asnumpy(a2)), err_msg=name)
            np.testing.assert_array_equal(bits, _half_bits(cp.asnumpy(b).astype(dtype)),
                                          err_msg=name)


@pytest.mark.parametrize("path", ["auto", "fast", "small", "steps"])
@pytest.mark.parametrize("dtype", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("T,B,I,H,bi,h0", [(7, 3, 5, 12, True, True), (30, 4, 9, 64, False,
                                                                      False)])
def test_a_repeated_half_inference_replays_a_graph_with_the_float32_bits_rounded(
        cp, rng, T, B, I, H, bi, h0, dtype, path):
    """A half-precision inference call on a plan that `captures` runs eagerly, then is
    captured, then replays one CUDA graph (its temporaries kept between calls, as outside
    the tests): each call gives the float32 call's results rounded once, bit for bit, new
    values written into the same arrays (x, h0, the weights) included (the graph reads
    them afresh), and an array at another address gives a graph of its own. Plans that do
    not capture (the small path) keep to eager calls with the same bits."""
    from cugru import _device, _plan, plans
    was = plans.use_graphs(True)
    _device.clear_graphs()
    D = 2 if bi else 1
    if path == "small" and D * B * H > 1024:
        return
    try:
        p = _cast(problem(rng, T, B, I, H, bi, with_h0=h0), dtype)
        g = _gpu(cp, p)

        def check(g):
            ref, _ = _call(_gpu(cp, _cast({k: cp.asnumpy(v) if hasattr(v, "device") else v
                                           for k, v in g.items()}, np.float32)), path,
                           training=False)
            for _ in range(4):      # (eager, captured, replayed, replayed)
                ours, _ = _call(g, path, training=False)
                for name, a, b in zip(OUT_NAMES, ours, ref):
                    assert a.dtype == dtype, name
                    np.testing.assert_array_equal(
                        _half_bits(cp.asnumpy(a)), _half_bits(cp.asnumpy(b).astype(dtype)),
                        err_msg=name)

        check(g)
        new = _cast(problem(rng, T, B, I, H, bi, with_h0=h0), dtype)
        for name in ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh"):    # (the same addresses)
            if g[name] is not None:
                g[name][...] = cp.asarray(new[name])
        check(g)
        g["x"] = cp.asarray(new["x"]) + 0     # (another address)
        check(g)
        plan = _plan.choose(path, B, H, D, np.dtype(np.float32), False, T, I)
        # (graphs, not keys left eager by a capture that failed)
        kept = [k for k, v in _device._GRAPHS.graphs.items()
                if k[0][0] == ("half inference", np.dtype(dtype).name)
                and v is not _device.EAGER]
        assert len(kept) == (2 if plan.captures else 0), (plan, len(kept))
    finally:
        plans.use_graphs(was)


def _ulp(v, dtype):
    """The format's unit in the last place at magnitudes `v` (float64)."""
    bits, emin = {"float16": (10, -14), "bfloat16": (7, -126)}[np.dtype(dtype).name]
    e = np.floor(np.log2(np.maximum(v, 2.0 ** emin)))
    return 2.0 ** (e - bits)


def test_half_data_against_the_numpy_path(cp, rng):
    """The GPU and numpy paths on the same half-precision values: one rule, so they differ
    only where their float32 results round to neighbouring half values (at most one unit of
    the format in the last place, at a few elements)."""
    for dtype in HALVES:
        p = _cast(problem(rng, 7, 3, 5, 12, True), dtype)
        ours, _ = _call(_gpu(cp, p), "auto")
        ref, _ = _call(p, "auto")
        for name, a, r in zip(OUT_NAMES, ours, ref):
            a = cp.asnumpy(a).astype(np.float64)
            r = np.asarray(r).astype(np.float64)
            assert (np.abs(a - r) <= _ulp(np.maximum(np.abs(a), np.abs(r)), dtype)).all(), name
            assert np.mean(a != r) < 0.05, name


def test_bad_precision_combinations_are_errors_naming_them(cp, rng):
    p = _gpu(cp, _cast(problem(rng, 3, 2, 4, 5, False), np.float16))
    w = list(weights(p))
    with pytest.raises(TypeError, match="w_hh has dtype float32, expected float16"):
        cugru.gru_forward(p["x"], None, w[0], w[1].astype(np.float32), w[2], w[3])
    with pytest.raises(TypeError, match="math='tf32' takes float32, float16 or bfloat16 "
                                        "data, x is float64"):
        cugru.gru_forward(p["x"].astype(np.float64), None, *[a.astype(np.float64) for a in w],
                          math="tf32")
    with pytest.raises(ValueError, match="math must be one of"):
        cugru.gru_forward(p["x"].astype(np.float32), None, *[a.astype(np.float32) for a in w],
                          math="fp16")
    with pytest.raises(TypeError, match="quant= takes float32 or float64 data"):
        cugru.gru_forward(p["x"], None, *w, quant=cugru.QuantSpec())


# ------------------------------------------------------------------------------ math="tf32"
def _tf32_bound(ref32, ref64):
    """The tolerance of a TF32 result: TF32's unit roundoff over float32's times the
    float32 oracle's error, twice, plus 4 TF32 units of the result's scale."""
    scale = max(1.0, float(np.abs(ref64).max()))
    err32 = float(np.abs(ref32.astype(np.float64) - ref64).max())
    return 2 * (TF32_U / F32_U) * err32 + 4 * TF32_U * scale


@pytest.mark.parametrize("path", ["steps", "fast"])
@pytest.mark.parametrize("bi", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", [(6, 3, 7, 8), (20, 16, 200, 96), (8, 64, 300, 300)])
def test_tf32_within_its_tolerance_and_not_strict(cp, poison, rng, T, B, I, H, bi, path):
    p = problem(rng, T, B, I, H, bi)
    ref64, _ = _call(p, "auto")
    ref32, _ = _call(_cast(p, np.float32), "auto")
    g = _gpu(cp, _cast(p, np.float32))
    handle = cp.cuda.device.get_cublas_handle()
    from cupy_backends.cuda.libs import cublas
    mode = cublas.getMathMode(handle)
    ours, saved = _call(g, path, math="tf32")
    assert cublas.getMathMode(handle) == mode, "the cuBLAS handle's math mode changed"
    assert saved.math == "tf32"
    again, _ = _call(g, path, math="tf32")
    strict, _ = _call(g, path)
    differs = False
    for name, a, a2, s, r32, r64 in zip(OUT_NAMES, ours, again, strict, ref32, ref64):
        a = cp.asnumpy(a)
        assert a.dtype == np.float32, name
        np.testing.assert_array_equal(a, cp.asnumpy(a2), err_msg=name)
        bound = _tf32_bound(np.asarray(r32), np.asarray(r64))
        err = float(np.abs(a.astype(np.float64) - r64).max())
        assert err <= bound, f"{name}: error {err:.3g} > bound {bound:.3g}"
        scale = max(1.0, float(np.abs(r64).max()))
        assert bound < PLANTED * scale, (f"{name}: the tolerance {bound:.3g} would pass an "
                                         f"error of {PLANTED} of the result's scale")
        differs |= not np.array_equal(a, cp.asnumpy(s))
    if I * 3 * H >= 200 * 3 * 96:      # (large products: cuBLAS runs them on tensor cores)
        assert differs, "math='tf32' gave the bits of math='strict'"


def test_backward_takes_the_forward_pass_s_math_or_its_own(cp, rng):
    g = _gpu(cp, _cast(problem(rng, 10, 32, 256, 128, False), np.float32))
    y, h_n, saved = cugru.gru_forward(g["x"], g["h0"], *weights(g), path="steps", math="tf32")
    by_default = cugru.gru_backward(g["dy"], None, saved, path="steps")
    tf32 = cugru.gru_backward(g["dy"], None, saved, path="steps", math="tf32")
    strict = cugru.gru_backward(g["dy"], None, saved, path="steps", math="strict")
    assert all(np.array_equal(cp.asnumpy(a), cp.asnumpy(b)) for a, b in zip(by_default, tf32))
    assert not all(np.array_equal(cp.asnumpy(a), cp.asnumpy(b)) for a, b in zip(tf32, strict))
    with pytest.raises(ValueError, match="math must be one of"):
        cugru.gru_backward(g["dy"], None, saved, math="TF32")


# --------------------------------------------------- the product on tensor cores (MMA tiles)
def _mma_split(cp, tile, B, H, rows):
    """The tile's split for both directions where its MMA kernels run (grid scope: with its
    slots), else None."""
    import types

    from cugru import plans
    plan = plans.tile_split(B, H, 2, tile, rows, 4)
    if plan is None or not plan.mma_holds("float"):
        return None
    if not plan.cluster:
        n = plans.groups_at_once(plan, np.dtype(np.float32).str, cp.cuda.runtime.getDevice())
        plan = plans.resident(plan, 2, n)
    tf32 = types.SimpleNamespace(math="tf32", qat=False, lengths=None, ctype="float", D=2)
    return plan if plan is not None and plan.runs_mma(tf32) else None


def _record_tile_kernels(monkeypatch):
    """A list that gets (kind, mma) of every tile kernel a plan asks for from now on."""
    from cugru import _plan
    launched = []
    kernel = _plan.TilePlan.kernel

    def spy(self, ctype, kind, qat=False, lengths=False, mma=False):
        launched.append((kind, mma))
        return kernel(self, ctype, kind, qat, lengths, mma)
    monkeypatch.setattr(_plan.TilePlan, "kernel", spy)
    return launched


@pytest.mark.parametrize("tile", MMA_TILES, ids=lambda t: "c{}_q{}_r{}_t{}_u{}".format(*t))
@pytest.mark.parametrize("end", ["low", "top"])
def test_each_mma_tile_kernel_within_the_tf32_tolerance(cp, poison, rng, monkeypatch, tile,
                                                        end):
    """Every tile kernel with the product on tensor cores (cugru._catalog.MMA_TILES), at the
    smallest and the largest H its MMA kernels hold, with one row per group and with the
    most rows a group takes (B = 9: full groups and a partial one): math="tf32" runs the MMA
    kernels (their names are the ones launched), within TF32's tolerance of the float64
    oracle, the same bits on a repeat call, and not the bits of the same plan's FMA kernels
    under math="tf32" (plans.use_mma(False): the products outside the recurrence the same)."""
    from cugru import _plan, plans
    if not plans.tile_runs_on(tile, int(cp.cuda.Device().compute_capability)):
        pytest.skip("not launched on this GPU")
    holds = [H for H in range(1, 300 if tile[0] else 1100) if _mma_split(cp, tile, 1, H, 1)]
    H = min(holds) if end == "low" else max(holds)
    launched = _record_tile_kernels(monkeypatch)
    most = max(r for r in range(1, tile[2] + 1) if _mma_split(cp, tile, 9, H, r))
    for rows in sorted({1, most}):
        plan = _mma_split(cp, tile, 9, H, rows)
        monkeypatch.setattr(_plan, "choose", lambda *a, **k: plan)
        p = problem(rng, 5, 9, 3, H, True)
        ref64, _ = _call(p, "auto")
        ref32, _ = _call(_cast(p, np.float32), "auto")
        g = _gpu(cp, _cast(p, np.float32))
        launched.clear()
        ours, _ = _call(g, "fast", math="tf32")
        # (at grid scope the planner also asks for the infer kernel, for its occupancy)
        assert all(m for _, m in launched), launched
        assert {"train", "backward"} <= {k for k, _ in launched}, launched
        again, _ = _call(g, "fast", math="tf32")
        was = plans.use_mma(False)       # (the same plan's FMA kernels, the same math)
        try:
            fma, _ = _call(g, "fast", math="tf32")
        finally:
            plans.use_mma(was)
        differs = False
        for name, a, a2, s, r32, r64 in zip(OUT_NAMES, ours, again, fma, ref32, ref64):
            a = cp.asnumpy(a)
            np.testing.assert_array_equal(a, cp.asnumpy(a2), err_msg=name)
            bound = _tf32_bound(np.asarray(r32), np.asarray(r64))
            err = float(np.abs(a.astype(np.float64) - r64).max())
            assert err <= bound, f"{name} (H = {H}, rows {rows}): error {err:.3g} > {bound:.3g}"
            assert bound < PLANTED * max(1.0, float(np.abs(r64).max())), name
            differs |= not np.array_equal(a, cp.asnumpy(s))
        assert differs, "the MMA kernels gave the FMA kernels' bits under math='tf32'"
        launched.clear()
        _call(g, "fast", math="tf32", training=False)
        assert ("infer", True) in launched and all(m for _, m in launched), launched


@pytest.mark.parametrize("tile", MMA_TILES, ids=lambda t: "c{}_q{}_r{}_t{}_u{}".format(*t))
def test_each_mma_tile_kernel_adds_a_unit_s_lane_sums_pairwise(cp, rng, monkeypatch, tile):
    """The MMA kernels' lane sums (lane ks takes the packs*4 consecutive k from
    ks*packs*4) are added pairwise too, bit for bit, at the largest H each tile holds whose
    last lane starts below H (gru_cases.check_pairwise_lane_sums: its products are exact in
    TF32); the MMA kernels are the ones launched."""
    from cugru import plans
    if not plans.tile_runs_on(tile, int(cp.cuda.Device().compute_capability)):
        pytest.skip("not launched on this GPU")
    H = max(H for H in range(1, 300 if tile[0] else 1100) if _mma_split(cp, tile, 1, H, 1)
            and (_mma_split(cp, tile, 1, H, 1).lanes - 1) * tile[1] * 4 < H)
    rows = max(r for r in range(1, tile[2] + 1) if _mma_split(cp, tile, 5, H, r))
    plan = _mma_split(cp, tile, 5, H, rows)
    if plan.lanes < 4:
        pytest.skip(f"{plan.lanes} lanes: every order gives the same sum")
    launched = _record_tile_kernels(monkeypatch)
    check_pairwise_lane_sums(cp, rng, monkeypatch, plan, H,
                             np.arange(plan.lanes) * plan.packs * 4, np.float32, math="tf32")
    assert ("train", True) in launched and all(m for _, m in launched), launched


# ------------------------------------------------------ the tail's sums of few rows (S6's)
def test_tf32_sums_the_weight_gradients_of_few_rows_in_float32(cp, rng, monkeypatch):
    """Under math="tf32", a weight gradient of at most _passes.WGRAD_STRICT_MACS
    multiply-adds (S6's shape: T = 100, B = 1, H = 256) is summed in float32: a backward
    pass under "tf32" on a history gives the bits of one under "strict" on it in every
    weight and bias gradient (the FMA recurrence is the same in both: dh0's bits too), and
    with the bound at 0 its dW_hh moves off them by about TF32's rounding."""
    from cugru import _passes, plans
    g = _gpu(cp, _cast(problem(rng, 100, 1, 40, 256, False), np.float32))
    was = plans.use_mma(False)
    try:
        y, h_n, saved = cugru.gru_forward(g["x"], g["h0"], *weights(g), path="fast",
                                          math="tf32")
        tf32 = [cp.asnumpy(a) for a in cugru.gru_backward(g["dy"], g["dh_n"], saved,
                                                          path="fast", math="tf32")]
        strict = [cp.asnumpy(a) for a in cugru.gru_backward(g["dy"], g["dh_n"], saved,
                                                            path="fast", math="strict")]
        monkeypatch.setattr(_passes, "WGRAD_STRICT_MACS", 0)
        all_tf32 = [cp.asnumpy(a) for a in cugru.gru_backward(g["dy"], g["dh_n"], saved,
                                                              path="fast", math="tf32")]
    finally:
        plans.use_mma(was)
    names = ("dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")
    for name, a, s in zip(names, tf32, strict):
        if name != "dx":
            np.testing.assert_array_equal(a, s, err_msg=name)
    dw_hh, ref = all_tf32[3].astype(np.float64), strict[3].astype(np.float64)
    moved = float(np.abs(dw_hh - ref).max()) / float(np.abs(ref).max())
    assert 2.0 ** -16 < moved < 16 * TF32_U, moved


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("D,rows,H", [(1, 1, 1), (1, 100, 256), (2, 333, 13), (2, 2048, 40)])
def test_bias_sums_round_the_exact_sum_once(cp, rng, dtype, D, rows, H):
    """gru_bias_sums (the bias gradients of a pass of at most _passes.BIAS_KERNEL_ROWS rows):
    every column of d_gate_i (rows, D*3H) and of d_gate_h (D, rows, 3H), summed in double,
    is the float64 sum rounded once to the dtype (within one unit of the last place, and
    equal in nearly all), the same bits on a repeat launch, nothing written outside db (a
    view into a larger buffer, as the pass's gradients are)."""
    from cugru import _catalog, _device
    G = 3 * H
    dgi = rng.standard_normal((rows, D * G)).astype(dtype)
    dgh = rng.standard_normal((D, rows, G)).astype(dtype)
    # (the exact sums: each float64 term of float32 data is exact, fsum rounds once)
    import math
    ref = np.array([math.fsum(c) for c in dgi.astype(np.float64).T]
                   + [math.fsum(c) for d in range(D) for c in dgh[d].astype(np.float64).T])
    kern = _device.kernel("gru_tail.cu", _catalog.bias_sums(_catalog.CTYPE[dgi.itemsize]))
    outs, before = [], 3
    for _ in range(2):
        buf = cp.full(before + 2 * D * G + 5, 7.0, dtype)
        kern.launch((-(-2 * D * G // _catalog.BIAS_COLS),),
                    (_catalog.BIAS_COLS, _catalog.BIAS_LANES),
                    {"dgi": cp.asarray(dgi), "dgh": cp.asarray(dgh), "db": buf[before:],
                     "rows": rows, "DG": D * G, "G": G})
        outs.append(cp.asnumpy(buf))
    np.testing.assert_array_equal(outs[0], outs[1])
    got = outs[0]
    assert (got[:before] == 7.0).all() and (got[before + 2 * D * G:] == 7.0).all(), \
        "wrote outside db"
    got = got[before:before + 2 * D * G].astype(np.float64)
    ulp = np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
    if dtype == np.float32:
        # (the double sum's own error, at most rows * 2^-53 of the terms' magnitudes, is
        # far below a float32 unit: the result is the exact sum rounded, to within a unit)
        assert (np.abs(got - ref) <= ulp).all()
        assert np.mean(got == ref.astype(np.float32)) >= 0.99
    else:
        mags = np.concatenate([np.abs(dgi).sum(0), np.abs(dgh).sum(1).reshape(-1)])
        assert (np.abs(got - ref) <= ulp + rows * 2.0 ** -53 * mags).all()
