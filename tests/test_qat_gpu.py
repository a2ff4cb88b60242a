"""Quantization-aware GRU on the GPU (cugru.QuantSpec): every path's QAT kernels against the
numpy oracle, in float32 and float64.

A float32 kernel and a float32 (or float64) oracle compute a gate a few ulps apart, so where
a value lies within those ulps of the boundary between two levels, they may round it to
neighbouring levels (a tie), and in a recurrence that one step then moves every later state
a little: comparing two whole runs would need a tolerance for a fraction of the elements.
These tests need none. The forward pass is checked step by step from the kernel's own
history: each step's gates (before their quantizers) against the float64 cell run on the
kernel's previous state, within float tolerance; then each new state against the numpy
quantizer applied to the kernel's own gates and previous state, which must give the same
bits (the kernel rounds its products and sums as written: no FMA there). The backward pass
is the oracle's backward pass on the kernel's own history, within test_gru_gpu.py's float32
tolerance. float64 runs are also compared end to end with the oracle (no tie is within reach
of float64's rounding on these problems). The quantized operands (weights, x, h0) are the
numpy quantizer's to the bit.
"""
import os

import numpy as np
import pytest

import cugru
from cugru import oracle, plans
from cugru.quant import GATE_N, GATE_RZ, fake_quant, quant_rows
from cugru.saved import GruSaved
from gru_cases import NAMES, problem, qat_specs, weights
from test_gru_gpu import assert_within, cast, to_gpu

pytestmark = pytest.mark.gpu

QUICK = bool(os.environ.get("CK_QUICK"))   # under compute-sanitizer: fewer cases
SPECS = {k.replace("-", "_"): v for k, v in qat_specs()}
SPEC_IDS = ["w8_x_h_g", "w4_x"] if QUICK else ["w8", "w8_x_h_g", "w4_x_h_g", "w8_h", "w8_g",
                                                "w4_x"]
#: (T, B, I, H): shapes the small path, the persistent plans and the tile plans run
QAT_SHAPES = {"t6b3": (6, 3, 5, 7), "t9b17": (9, 17, 33, 40), "t5b64": (5, 64, 20, 128)}
if QUICK:
    QAT_SHAPES.pop("t5b64")


def _run(p, spec, path, training=True):
    return cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=p["bidirectional"],
                             quant=spec, path=path, training=training)


def check_forward_by_step(p, spec, y, hn, saved, dtype):
    """The kernel's forward pass, step by step from its own states (module doc)."""
    x, h0 = p["x"], p["h0"]
    w_ih, w_hh, b_ih, b_hh = weights(p)
    T, B, I, H, D = saved.dims
    sx, sw_ih, sw_hh = (a.get() for a in (saved.x, saved.w_ih, saved.w_hh))
    assert np.array_equal(sw_ih, quant_rows(w_ih, spec.weight_bits)[0])
    assert np.array_equal(sw_hh, quant_rows(w_hh, spec.weight_bits)[0])
    assert np.array_equal(sx, x if spec.x_qparams is None else fake_quant(x, spec.x_qparams)[0])
    hs, gates, y, hn = saved.hs.get(), saved.gates.get(), y.get(), hn.get()
    if h0 is None:
        assert not hs[:, 0].any()
    else:
        want0 = h0 if spec.h_qparams is None else fake_quant(h0, spec.h_qparams)[0]
        assert np.array_equal(hs[:, 0], want0)
    f64 = np.float64
    for d in range(D):
        ts = np.arange(T) if d == 0 else np.arange(T)[::-1]
        assert np.array_equal(y[ts, :, d * H:(d + 1) * H], hs[d, 1:])
        gi = sx[ts].astype(f64) @ sw_ih[d].T.astype(f64) + b_ih[d]          # (T, B, 3H)
        gh = hs[d, :T].astype(f64) @ sw_hh[d].T.astype(f64) + b_hh[d]
        r, z, n, hn_ = (gates[d][..., k * H:(k + 1) * H] for k in range(4))
        rq, zq = (fake_quant(v, GATE_RZ)[0] for v in (r, z)) if spec.gates else (r, z)
        want = {"r": oracle._sigmoid(gi[..., :H] + gh[..., :H]),
                "z": oracle._sigmoid(gi[..., H:2 * H] + gh[..., H:2 * H]),
                "hn": gh[..., 2 * H:],
                "n": np.tanh(gi[..., 2 * H:] + rq.astype(f64) * hn_)}
        tol = 64 * np.finfo(dtype).eps * max(1.0, float(np.abs(gi).max() + np.abs(gh).max()))
        for name, got in (("r", r), ("z", z), ("hn", hn_), ("n", n)):
            err = float(np.abs(got - want[name]).max())
            assert err <= tol, f"direction {d}, {name}: error {err:.3g} > {tol:.3g}"
        nq = fake_quant(n, GATE_N)[0] if spec.gates else n
        pre = (1 - zq) * nq + zq * hs[d, :T]        # (in the kernel's dtype, as written)
        h_want = pre if spec.h_qparams is None else fake_quant(pre, spec.h_qparams)[0]
        assert np.array_equal(hs[d, 1:], h_want), f"direction {d}: states"
    assert np.array_equal(hn, hs[:, T])


def _to_host_saved(saved, dtype):
    g = lambda a: None if a is None else np.asarray(a.get(), dtype)  # noqa: E731
    return GruSaved(g(saved.x), g(saved.w_ih), g(saved.w_hh), g(saved.hs), g(saved.gates),
                    saved.squeeze, saved.quant, g(saved.x_real), g(saved.h0_real))


def check_qat_pass(cp, rng, T, B, I, H, bidirectional, with_h0, spec, dtype, path):
    """A quantization-aware train step and inference call on `path` against the oracle
    (the module's doc)."""
    p = cast(problem(rng, T, B, I, H, bidirectional, with_h0, scale=2.0), dtype)
    p["x"] *= 1.5
    g = to_gpu(cp, p)
    y, hn, saved = _run(g, spec, path)
    assert saved.quant is spec and y.dtype == dtype
    check_forward_by_step(p, spec, y, hn, saved, dtype)
    # inference: the same states, bit for bit
    y_inf, hn_inf, none = _run(g, spec, path, training=False)
    assert none is None
    assert np.array_equal(y_inf.get(), y.get()) and np.array_equal(hn_inf.get(), hn.get())
    # backward: the oracle's on the kernel's own history
    got = [a.get() for a in cugru.gru_backward(g["dy"], g["dh_n"], saved, path=path)]
    host = _to_host_saved(saved, np.float64)
    ref = oracle.gru_backward(p["dy"].astype(np.float64), p["dh_n"].astype(np.float64), host)
    ref32 = ref if dtype == np.float64 else oracle.gru_backward(
        p["dy"], p["dh_n"], _to_host_saved(saved, np.float32))
    assert_within(got, ref, ref32, dtype, NAMES)
    if dtype == np.float64:   # end to end: no tie is within reach of float64's rounding
        ey, ehn, esaved = oracle.gru_forward(p["x"], p["h0"], *weights(p),
                                             bidirectional=bidirectional, quant=spec)
        np.testing.assert_allclose(y.get(), ey, rtol=0, atol=1e-11)
        egrads = oracle.gru_backward(p["dy"], p["dh_n"], esaved)
        assert_within(got, egrads, egrads, dtype, NAMES)


@pytest.mark.parametrize("path", ["steps", "fast", "small"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", QAT_SHAPES.values(), ids=QAT_SHAPES.keys())
def test_qat_with_lengths_matches_oracle_in_float64(cp, poison, rng, T, B, I, H,
                                                    bidirectional, path):
    """Quantization-aware passes with variable lengths, end to end against the oracle in
    float64 (the QAT kernels' code for lengths is the plain kernels', checked in float32 in
    test_gru_gpu.py)."""
    if path == "small" and not plans.SMALL.fits(B, H, 2 if bidirectional else 1):
        return
    spec = SPECS["w8_x_h_g"]
    p = problem(rng, T, B, I, H, bidirectional, scale=2.0, lengths=True)
    p["x"] *= 1.5
    g = to_gpu(cp, p)
    y, hn, saved = cugru.gru_forward(g["x"], g["h0"], *weights(g), bidirectional=bidirectional,
                                     quant=spec, path=path, lengths=p["lengths"])
    ey, ehn, esaved = oracle.gru_forward(p["x"], p["h0"], *weights(p),
                                         bidirectional=bidirectional, quant=spec,
                                         lengths=p["lengths"])
    np.testing.assert_allclose(y.get(), ey, rtol=0, atol=1e-11)
    np.testing.assert_allclose(hn.get(), ehn, rtol=0, atol=1e-11)
    got = [a.get() for a in cugru.gru_backward(g["dy"], g["dh_n"], saved, path=path)]
    want = oracle.gru_backward(p["dy"], p["dh_n"], esaved)
    assert_within(got, want, want, np.float64, NAMES)


@pytest.mark.parametrize("path", ["steps", "fast", "small"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("spec_id", SPEC_IDS)
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", QAT_SHAPES.values(), ids=QAT_SHAPES.keys())
def test_qat_kernels_match_oracle(cp, poison, rng, T, B, I, H, bidirectional, with_h0, spec_id,
                                  dtype, path):
    D = 2 if bidirectional else 1
    if path == "small" and not plans.SMALL.fits(B, H, D):
        pytest.skip("beyond the small path")
    if path == "fast" and plans.fast_plan(B, H, D, np.dtype(dtype), True, qat=True) is None:
        pytest.skip("no persistent plan holds this shape")
    check_qat_pass(cp, rng, T, B, I, H, bidirectional, with_h0, SPECS[spec_id], dtype, path)


#: shapes whose quantization-aware passes run each scope of the persistent plans
SCOPE_SHAPES = ([((5, 8, 4, 300, False), "grid")] if QUICK else
                [((6, 8, 4, 32, True), "block"), ((5, 8, 4, 160, False), "cluster"),
                 ((5, 8, 4, 300, False), "grid"), ((4, 3, 5, 1024, True), "grid")])


@pytest.mark.parametrize("shape,scope", SCOPE_SHAPES,
                         ids=[f"{s}-H{sh[3]}" for sh, s in SCOPE_SHAPES])
def test_qat_runs_every_scope(cp, poison, rng, shape, scope):
    """The persistent plans at block, cluster and grid scope, quantization-aware (the grid
    scope's cooperative launch is sized from the QAT kernels' occupancy too)."""
    T, B, I, H, bi = shape
    D = 2 if bi else 1
    f32 = np.dtype(np.float32)
    assert {plans.fast_plan(B, H, D, f32, back, qat=True).scope for back in (0, 1)} == {scope}
    check_qat_pass(cp, rng, T, B, I, H, bi, True, SPECS["w8_x_h_g"], np.float32, "fast")


@pytest.mark.parametrize("path", ["steps", "fast", "small"])
def test_a_plain_call_launches_no_quantization_aware_kernel(cp, rng, monkeypatch, path):
    """quant=None launches the plain instances (their QAT flag false) and no quantizer;
    quant=spec the QAT instances and the quantizers. (Every launch packs its arguments: by
    name, or in the declared order.)"""
    from cukernels import runtime
    launched = []
    pack, values = runtime.Kernel.pack_into, runtime.Kernel.launch_values
    monkeypatch.setattr(runtime.Kernel, "pack_into",
                        lambda self, buf, args: launched.append(self.name) or
                        pack(self, buf, args))
    monkeypatch.setattr(runtime.Kernel, "launch_values",
                        lambda self, *a, **kw: launched.append(self.name) or
                        values(self, *a, **kw))
    p = to_gpu(cp, cast(problem(rng, 6, 3, 5, 7, True), np.float32))
    def qat_flag(name):
        # (a tile kernel's last flag is LEN, a per-step one's last arguments the element
        # types (forward: the products' and the projection's, backward: the products'):
        # their QAT flag comes before)
        flags = name.rstrip(">").split(",")
        return flags[-3 if name.startswith("gru_forward_step") else
                     -2 if name.startswith(("gru_tile", "gru_backward_step")) else -1]

    for quant, flag in ((None, "false"), (SPECS["w8_x_h_g"], "true")):
        launched.clear()
        y, hn, saved = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                         path=path, quant=quant)
        cugru.gru_backward(p["dy"], p["dh_n"], saved, path=path)
        quantizers = [n for n in launched if n.startswith("gru_quant_")]
        cell = [n for n in launched if n.startswith("gru_") and not n.startswith(
            ("gru_quant_", "gru_sum_chunks", "gru_bias_sums"))]     # (the tail's sums)
        assert cell and all(qat_flag(n) == flag for n in cell), (quant, launched)
        assert len(quantizers) == (0 if quant is None else 2), launched
        assert (saved.quant is None) == (quant is None)


@pytest.mark.parametrize("path", ["steps", "fast", "small"])
def test_nan_weights_give_nan_as_the_oracle_does(cp, rng, path):
    """A NaN weight makes the outputs NaN on the GPU where it does in the oracle (the
    quantizers keep NaN: a diverging quantization-aware run shows up as one)."""
    p = cast(problem(rng, 6, 3, 5, 7, True), np.float32)
    p["w_hh"][1, 4, 2] = np.nan
    spec = SPECS["w8_x_h_g"]
    want = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True, quant=spec)[0]
    g = to_gpu(cp, p)
    got = _run(g, spec, path)[0].get()
    assert np.isnan(want).any() and not np.isnan(want).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))


def test_qat_calls_are_deterministic(cp, rng):
    spec = SPECS["w8_x_h_g"]
    p = to_gpu(cp, cast(problem(rng, 9, 17, 33, 40, True), np.float32))
    runs = []
    for _ in range(2):
        y, hn, saved = cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                         quant=spec)
        grads = cugru.gru_backward(p["dy"], p["dh_n"], saved)
        runs.append([a.get() for a in (y, hn) + tuple(grads)])
    assert all(np.array_equal(u, v) for u, v in zip(*runs))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_qat_backward_plans_have_their_kernels(dtype):
    """Every persistent plan a quantization-aware backward pass takes has its QAT kernel
    (the tiles of QAT_BACKWARD_LEFT_OUT have none: the planner passes them by)."""
    from cugru import _catalog
    from cukernels import runtime
    from gru_cases import BENCH_SHAPES
    names = set(runtime.source("gru_tile.cu").names())
    left_out = _catalog.QAT_BACKWARD_LEFT_OUT[np.dtype(dtype).itemsize]
    shapes = [(B, H, 2 if bi else 1) for T, B, I, H, bi in BENCH_SHAPES.values()]
    shapes += [(B, H, D) for T, B, I, H in QAT_SHAPES.values() for D in (1, 2)]
    shapes += [(1, 128, 1), (1, 256, 1), (2, 256, 1), (1, 512, 1)]
    for B, H, D in shapes:
        plan = plans.fast_plan(B, H, D, np.dtype(dtype), True, qat=True)
        if isinstance(plan, plans.TilePlan):
            assert plan.tile not in left_out
            assert _catalog.tile_backward(_catalog.CTYPE[np.dtype(dtype).itemsize], plan.tile,
                                          True) in names


def test_main_job_qat_runs_on_the_gpu(cp, capsys):
    from cugru import train
    assert train.main(["--device", "gpu", "--epochs", "2", "--hidden", "8", "--qat",
                       "--qat-epochs", "2", "--freeze-epochs", "1", "--no-progress",
                       "--plot", ""]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("QAT:"))
    assert float(line.split("model on ")[1].split("%")[0]) >= 99.0
