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
