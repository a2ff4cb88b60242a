"""float16 and bfloat16 data on the numpy path (cugru.oracle, the CPU fallback and the
reference of the GPU kernels to come).

The rule: the pass computes in float32 from the rounded inputs (exact in float32), keeps
its history in float32 and rounds each result once to the data's dtype. Two checks of it:
bit for bit against the float32 pass on the same values, rounded; and, independently,
within half a unit in the last place (plus float32's own error) of the float64 oracle,
which tests/test_oracle_torch.py pins to torch.nn.GRU; that check fails on a planted
one-ulp error.
"""
import numpy as np
import pytest

import cugru
from cugru._args import HALF_DTYPES

#: (dtype, bits of its significand after the point, its smallest normal exponent)
FORMATS = {"float16": (10, -14), "bfloat16": (7, -126)}
HALVES = [d for d in HALF_DTYPES]
IDS = [d.name for d in HALVES]


def _problem(dtype, T=6, B=3, I=5, H=4, bi=True, seed=0):
    """Inputs drawn in float64 and rounded to `dtype`: x, h0, weights, dy, dh_n."""
    rng = np.random.default_rng(seed)
    D = 2 if bi else 1
    k = 1 / np.sqrt(H)
    shapes = {"x": (T, B, I), "h0": (D, B, H), "w_ih": (D, 3 * H, I), "w_hh": (D, 3 * H, H),
              "b_ih": (D, 3 * H), "b_hh": (D, 3 * H), "dy": (T, B, D * H), "dh_n": (D, B, H)}
    scale = {"w_ih": k, "w_hh": k, "b_ih": k, "b_hh": k}
    return {n: (rng.uniform(-1, 1, s) * scale.get(n, 1.0)).astype(dtype)
            for n, s in shapes.items()}


def _run(p, dtype, bi=True, lengths=None):
    """Forward and backward on p's values cast to `dtype`: y, h_n, then the six gradients."""
    v = {n: a.astype(dtype) for n, a in p.items()}
    y, h_n, saved = cugru.gru_forward(v["x"], v["h0"], v["w_ih"], v["w_hh"], v["b_ih"],
                                      v["b_hh"], bidirectional=bi, lengths=lengths)
    grads = cugru.gru_backward(v["dy"], v["dh_n"], saved)
    return (y, h_n) + tuple(grads), saved


NAMES = ("y", "h_n", "dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")


@pytest.mark.parametrize("dtype", HALVES, ids=IDS)
@pytest.mark.parametrize("bi", [False, True], ids=["uni", "bi"])
def test_a_half_pass_is_the_float32_pass_on_its_values_rounded_once(dtype, bi):
    p = _problem(dtype, bi=bi)
    ours, saved = _run(p, dtype, bi)
    f32, _ = _run(p, np.float32, bi)
    for name, a, b in zip(NAMES, ours, f32):
        assert a.dtype == dtype, name
        np.testing.assert_array_equal(a.view(np.uint16), b.astype(dtype).view(np.uint16),
                                      err_msg=name)
    # the history in float32; x and the weights kept as given (views, no copies)
    assert saved.hs.dtype == np.float32 and saved.gates.dtype == np.float32
    assert saved.x.dtype == dtype and saved.w_hh.dtype == dtype


@pytest.mark.parametrize("dtype", HALVES, ids=IDS)
def test_lengths_take_half_data_too(dtype):
    p = _problem(dtype, T=5, B=4)
    lengths = [5, 2, 1, 4]
    ours, _ = _run(p, dtype, lengths=lengths)
    f32, _ = _run(p, np.float32, lengths=lengths)
    for name, a, b in zip(NAMES, ours, f32):
        np.testing.assert_array_equal(a.view(np.uint16), b.astype(dtype).view(np.uint16),
                                      err_msg=name)


def _ulp(v, dtype):
    """The spacing of `dtype`'s numbers around |v| (float64 values)."""
    bits, emin = FORMATS[np.dtype(dtype).name]
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.abs(v)))
    return np.exp2(np.maximum(np.where(np.isfinite(e), e, emin), emin) - bits)


def _within_half_ulp(ours, ref, dtype):
    """Names of the results farther from the float64 reference than half an ulp of
    `dtype` at the reference, plus float32's error (2e-5 of the result's largest
    magnitude: the float32 pass errs by about 1e-6 of it here)."""
    bad = []
    for name, a, r in zip(NAMES, ours, ref):
        err = np.abs(a.astype(np.float64) - r)
        if (err > 0.5 * _ulp(r, dtype) + 2e-5 * np.abs(r).max()).any():
            bad.append(name)
    return bad


@pytest.mark.parametrize("dtype", HALVES, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_half_results_lie_within_half_an_ulp_of_the_float64_maths(dtype, seed):
    p = _problem(dtype, T=8, B=4, I=6, H=5, seed=seed)
    ours, _ = _run(p, dtype)
    ref, _ = _run(p, np.float64)
    assert _within_half_ulp(ours, ref, dtype) == []
    # the check sees a planted error of one ulp (away from the reference) in the largest
    # element of any result
    for k, name in enumerate(NAMES):
        planted = list(ours)
        a = planted[k].copy()
        flat, r = a.reshape(-1), ref[k].reshape(-1)
        i = int(np.abs(r).argmax())
        v = flat[i].astype(np.float64)
        flat[i] = (v + np.copysign(_ulp(r[i], dtype), v - r[i])).astype(dtype)
        planted[k] = a
        assert name in _within_half_ulp(planted, ref, dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=IDS)
def test_half_dtype_rules_are_clear_errors(dtype):
    p = _problem(dtype, bi=False)
    x, h0, w_ih, w_hh, b_ih, b_hh = (p[n] for n in ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh"))
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=f"w_hh has dtype float32, expected {name}"):
        cugru.gru_forward(x, None, w_ih, w_hh.astype(np.float32), b_ih, b_hh)
    with pytest.raises(TypeError, match=f"h0 has dtype float32, expected {name}"):
        cugru.gru_forward(x, h0.astype(np.float32), w_ih, w_hh, b_ih, b_hh)
    with pytest.raises(TypeError, match=f"quant= takes float32 or float64 data, x is {name}"):
        cugru.gru_forward(x, None, w_ih, w_hh, b_ih, b_hh, quant=cugru.QuantSpec())
    _, _, saved = cugru.gru_forward(x, None, w_ih, w_hh, b_ih, b_hh)
    with pytest.raises(TypeError, match=f"dy has dtype float32, expected {name}"):
        cugru.gru_backward(p["dy"].astype(np.float32), None, saved)
    with pytest.raises(TypeError, match="x must be float32, float64, float16"):
        cugru.gru_forward(x.astype(np.int32), None, w_ih, w_hh, b_ih, b_hh)
