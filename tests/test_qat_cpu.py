"""Quantization-aware GRU (cugru.QuantSpec) on the CPU: the numpy oracle against a per-step
torch reference with torch.fake_quantize_* and autograd in float64, the straight-through
estimator against the float GRU, the spec's checks. Runs in CI."""
import numpy as np
import pytest

import cugru
from cugru import QuantSpec, oracle
from cugru.quant import fake_quant, quant_rows, row_scales
from gru_cases import NAMES, problem, qat_specs, torch_qat_gru, weights

SPECS = qat_specs()


def run(p, spec, fn=oracle):
    y, hn, saved = fn.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=p["bidirectional"],
                                  quant=spec)
    return y, hn, fn.gru_backward(p["dy"], p["dh_n"], saved)


#: the weights' range: torch's init (1/sqrt(H)), and large enough that the gates saturate
#: and their quantizers clip
WEIGHT_SCALES = {"init": None, "saturating": 2.5}


def qat_problem(rng, bidirectional, with_h0, scale):
    p = problem(rng, 6, 3, 5, 7, bidirectional, with_h0, scale=scale)
    p["x"] *= 1.5                      # (so that x reaches beyond QAT_X's range)
    if with_h0:
        p["h0"] *= 0.8
    return p


@pytest.mark.parametrize("spec", [s for _, s in SPECS], ids=[i for i, _ in SPECS])
@pytest.mark.parametrize("scale", WEIGHT_SCALES.values(), ids=WEIGHT_SCALES.keys())
@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_qat_oracle_matches_torch_fake_quant(torch, rng, spec, bidirectional, with_h0, scale):
    p = qat_problem(rng, bidirectional, with_h0, scale)
    y, hn, grads = run(p, spec)
    ty, thn, tgrads = torch_qat_gru(torch, p, spec)
    np.testing.assert_allclose(y, ty, rtol=0, atol=1e-13)
    np.testing.assert_allclose(hn, thn, rtol=0, atol=1e-13)
    for name, g, tg in zip(NAMES, grads, tgrads):
        scale = max(1.0, np.abs(tg).max())
        np.testing.assert_allclose(g, tg, rtol=0, atol=1e-12 * scale, err_msg=name)


def test_qat_problems_clip_at_every_quantizer(rng):
    """On the saturating problems every quantizer clips somewhere and passes elsewhere, so
    the comparison above tests every mask both ways."""
    from cugru.quant import GATE_N, GATE_RZ
    p = qat_problem(rng, True, True, WEIGHT_SCALES["saturating"])
    spec = dict(SPECS)["w8-x-h-g"]
    _, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                     quant=spec)
    H = saved.hs.shape[-1]
    g = saved.gates
    r, z, n = g[..., :H], g[..., H:2 * H], g[..., 2 * H:3 * H]
    zq, nq = fake_quant(z, GATE_RZ)[0], fake_quant(n, GATE_N)[0]
    pre = (1 - zq) * nq + zq * saved.hs[:, :-1]
    for what, v, qp in (("x", p["x"], spec.x_qparams), ("h0", p["h0"], spec.h_qparams),
                        ("r", r, GATE_RZ), ("z", z, GATE_RZ), ("n", n, GATE_N),
                        ("h", pre, spec.h_qparams)):
        inside = fake_quant(v, qp)[1]
        assert inside.any() and not inside.all(), what


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_qat_with_fine_grids_is_the_float_gru_on_quantized_weights(rng, bidirectional):
    """The straight-through estimator: with x and h on grids so fine that nothing clips and
    rounding moves a value by at most 2^-21, QAT is the float GRU run on the quantized
    weights (its weight gradients are the float GRU's, passed to the real weights)."""
    p = problem(rng, 5, 4, 3, 6, bidirectional)
    fine = (2.0 ** -20, 0, -2 ** 24, 2 ** 24)
    spec = QuantSpec(8, fine, fine, False)
    y, hn, grads = run(p, spec)
    wq = [quant_rows(p["w_ih"], 8)[0], quant_rows(p["w_hh"], 8)[0], p["b_ih"], p["b_hh"]]
    fy, fhn, fsaved = oracle.gru_forward(p["x"], p["h0"], *wq, bidirectional=bidirectional)
    fgrads = oracle.gru_backward(p["dy"], p["dh_n"], fsaved)
    np.testing.assert_allclose(y, fy, rtol=0, atol=1e-5)
    np.testing.assert_allclose(hn, fhn, rtol=0, atol=1e-5)
    for name, g, fg in zip(NAMES, grads, fgrads):
        np.testing.assert_allclose(g, fg, rtol=0, atol=1e-4 * max(1, np.abs(fg).max()),
                                   err_msg=name)
    assert not np.array_equal(wq[0], p["w_ih"])      # (the weights were quantized)


def test_quant_none_keeps_no_quantized_copy(rng):
    """quant=None takes the plain pass: the history refers to x and the weights as given
    (no quantized copies), and keeps no quantization fields."""
    p = problem(rng, 4, 3, 5, 6, True)
    _, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                     quant=None)
    assert saved.quant is None and saved.x_real is None and saved.h0_real is None
    assert saved.x is p["x"] and np.shares_memory(saved.w_hh, p["w_hh"])
    _, _, qsaved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                      quant=QuantSpec(8))
    assert not np.shares_memory(qsaved.w_hh, p["w_hh"]) and qsaved.x_real is p["x"]


def test_nan_propagates_through_the_quantizers(rng):
    p = problem(rng, 4, 3, 5, 6, False)
    p["w_ih"][0, 2, 1] = np.nan
    y, _, _ = oracle.gru_forward(p["x"], p["h0"], *weights(p),
                                 quant=QuantSpec(8, None, (1 / 64, 0, -64, 63), True))
    assert np.isnan(y).any()
    v, inside = fake_quant(np.array([np.nan, 0.3]), (0.1, 0, -8, 7))
    assert np.isnan(v[0]) and not inside[0] and inside[1]


def test_a_tile_without_a_qat_backward_kernel_says_so():
    from cugru import _catalog, plans
    tile = _catalog.QAT_BACKWARD_LEFT_OUT[4][0]
    plan = plans.tile_split(1, 128, 1, tile, 1, 4)
    assert plan is not None and not plan.has_qat_backward("float")
    with pytest.raises(ValueError, match="has no backward kernel quantization-aware"):
        plan.kernel("float", "backward", qat=True)


def test_a_tile_without_kernels_for_lengths_says_so():
    from cugru import _catalog, plans
    tile = _catalog.LENGTHS_LEFT_OUT[4][0]
    plan = plans.tile_split(1, 128, 1, tile, 1, 4)
    assert plan is not None and plan.kernels("float", lengths=True) == ()
    for kind in ("train", "infer", "backward"):
        with pytest.raises(ValueError, match=f"has no {kind} kernel for variable lengths"):
            plan.kernel("float", kind, lengths=True)


def test_weight_rows_are_quantized_on_their_own_scale(rng):
    w = rng.standard_normal((2, 9, 5))
    w[0, 3] = 0                                   # a zero row keeps the floor scale
    for bits, qmax in ((8, 127), (4, 7)):
        wq, s = quant_rows(w, bits)
        assert s.dtype == np.float32 and s.shape == (2, 9)
        assert s[0, 3] == np.float32(2.0 ** -23)
        levels = wq / s[..., None].astype(np.float64)
        np.testing.assert_allclose(levels, np.rint(levels), atol=1e-9)
        assert np.abs(levels).max() <= qmax
        # the largest weight of a row lands on qmax: nothing clipped
        big = np.abs(w).argmax(-1)
        top = np.take_along_axis(np.abs(levels), big[..., None], -1)[..., 0]
        assert np.all((top == qmax) | (s == np.float32(2.0 ** -23)))
        np.testing.assert_array_equal(row_scales(w, bits), s)


def test_fake_quant_matches_torch_on_float32_to_the_bit(torch, rng):
    v = (rng.standard_normal(10000) * 3).astype(np.float32)
    for qp in ((0.0625, 3, -32, 31), (1 / 256, 0, 0, 255), (0.013, -7, -128, 127)):
        ours, inside = fake_quant(v, QuantSpec(8, qp).x_qparams)
        tv = torch.tensor(v, dtype=torch.float32, requires_grad=True)
        ref = torch.fake_quantize_per_tensor_affine(tv, *QuantSpec(8, qp).x_qparams)
        ref.sum().backward()
        assert np.array_equal(ours, ref.detach().numpy())
        assert np.array_equal(inside.astype(np.float32), tv.grad.numpy())


@pytest.mark.parametrize("kwargs,field", [
    ({"weight_bits": 6}, "weight_bits"), ({"weight_bits": True}, "weight_bits"),
    ({"x_qparams": (0.0, 0, -8, 7)}, "x_qparams: scale"),
    ({"x_qparams": (-1.0, 0, -8, 7)}, "x_qparams: scale"),
    ({"h_qparams": (float("nan"), 0, -8, 7)}, "h_qparams: scale"),
    ({"h_qparams": (float("inf"), 0, -8, 7)}, "h_qparams: scale"),
    ({"h_qparams": (1e-50, 0, -8, 7)}, "h_qparams: scale"),
    ({"x_qparams": (0.1, 9, -8, 7)}, "x_qparams: zero_point"),
    ({"x_qparams": (0.1, 0, 7, 7)}, "x_qparams: qmin"),
    ({"x_qparams": (0.1, 0.5, -8, 7)}, "x_qparams: zero_point"),
    ({"h_qparams": (0.1, 0, -8)}, "h_qparams"),
    ({"h_qparams": (0.1, 0, -2 ** 30, 7)}, "h_qparams: qmin"),
    ({"gates": 1}, "gates"),
    ({"x_qparams": (1e-39, 0, -128, 127)}, "x_qparams: scale must be finite and at least"),
    ({"h_qparams": (1e38, 0, -2 ** 24, 2 ** 24)}, "h_qparams: scale .* overflows float32"),
    ({"x_qparams": (0.1, 2 ** 24, -2 ** 24, 2 ** 24)}, "x_qparams: qmin - zero_point"),
])
def test_bad_quant_spec_names_the_field(kwargs, field):
    with pytest.raises((ValueError, TypeError), match=field):
        QuantSpec(**kwargs)


def test_quant_must_be_a_spec(rng):
    p = problem(rng, 2, 1, 2, 3, False)
    with pytest.raises(TypeError, match="quant must be a cugru.QuantSpec"):
        cugru.gru_forward(p["x"], None, *weights(p), quant={"weight_bits": 8})


def test_spec_keeps_float32_scales():
    spec = QuantSpec(8, (0.1, 0, -128, 127))
    assert spec.x_qparams[0] == float(np.float32(0.1))
    assert spec.weight_qmax == 127 and QuantSpec(4).weight_qmax == 7
