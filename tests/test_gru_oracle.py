"""The GRU oracle (the CPU fallback) against torch.nn.GRU on the CPU in float64, against
central finite differences, and its argument checks. Runs in CI."""
import numpy as np
import pytest

import cugru
from cugru import oracle
from gru_cases import NAMES, SHAPES, problem, torch_gru, weights


def run_oracle(p, fn=oracle):
    y, hn, saved = fn.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=p["bidirectional"],
                                  lengths=p.get("lengths"))
    return y, hn, fn.gru_backward(p["dy"], p["dh_n"], saved)


@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", SHAPES)
def test_oracle_matches_torch_gru(torch, rng, T, B, I, H, bidirectional, with_h0):
    p = problem(rng, T, B, I, H, bidirectional, with_h0)
    y, hn, grads = run_oracle(p)
    ty, thn, tgrads = torch_gru(torch, p)
    np.testing.assert_allclose(y, ty, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(hn, thn, rtol=1e-12, atol=1e-13)
    for name, g, tg in zip(NAMES, grads, tgrads):
        scale = max(1.0, np.abs(tg).max())
        np.testing.assert_allclose(g, tg, rtol=0, atol=1e-12 * scale, err_msg=name)


def _loss(p, dy, dh_n):
    y, hn, _ = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=p["bidirectional"],
                                  training=False)
    return float((y * dy).sum() + (hn * dh_n).sum())


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_oracle_gradients_match_finite_differences(rng, bidirectional):
    p = problem(rng, 3, 2, 2, 3, bidirectional, scale=0.8)
    _, _, grads = run_oracle(p)
    eps = 1e-6
    for name, key in zip(NAMES, ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh")):
        a = p[key]
        num = np.empty_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + eps
            up = _loss(p, p["dy"], p["dh_n"])
            a[idx] = old - eps
            down = _loss(p, p["dy"], p["dh_n"])
            a[idx] = old
            num[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grads[NAMES.index(name)], num, rtol=1e-6, atol=1e-8,
                                   err_msg=name)


def test_two_layer_stack_matches_torch(torch, rng):
    """Layer 1 bidirectional, layer 2 unidirectional on its output: composition by calling."""
    T, B, I, H1, H2 = 5, 3, 4, 6, 5
    p1 = problem(rng, T, B, I, H1, True)
    p2 = problem(rng, T, B, 2 * H1, H2, False)
    y1, h1, s1 = oracle.gru_forward(p1["x"], p1["h0"], *weights(p1), bidirectional=True)
    y2, h2, s2 = oracle.gru_forward(y1, p2["h0"], *weights(p2))
    g2 = oracle.gru_backward(p2["dy"], p2["dh_n"], s2)
    g1 = oracle.gru_backward(g2[0], p1["dh_n"], s1)

    t = torch.tensor
    l1 = torch.nn.GRU(I, H1, bidirectional=True)
    l2 = torch.nn.GRU(2 * H1, H2)
    with torch.no_grad():
        for layer, p, sfxs in ((l1, p1, ("", "_reverse")), (l2, p2, ("",))):
            for name, arr in zip(("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"),
                                 weights(p)):
                for d, s in enumerate(sfxs):
                    getattr(layer, name + s).copy_(t(arr[d]))
    x = t(p1["x"]).requires_grad_()
    ty1, th1 = l1(x, t(p1["h0"]))
    ty2, th2 = l2(ty1, t(p2["h0"]))
    torch.autograd.backward([ty2, th2, th1], [t(p2["dy"]), t(p2["dh_n"]), t(p1["dh_n"])])
    np.testing.assert_allclose(y2, ty2.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g1[0], x.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g1[2][1], l1.weight_ih_l0_reverse.grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(g2[3][0], l2.weight_hh_l0.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_public_functions_check_their_arguments_once_and_run_the_oracle(rng, monkeypatch):
    """cugru.gru_forward / gru_backward on numpy arrays: one argument check each, then the
    oracle's passes on the checked arguments (the oracle's own public functions, which
    check too, are not called)."""
    import cugru.gru as api
    counts = {"forward_args": 0, "backward_args": 0, "oracle.forward": 0,
              "oracle.backward": 0}

    def counted(key, fn):
        def wrapper(*a, **k):
            counts[key] += 1
            return fn(*a, **k)
        return wrapper
    monkeypatch.setattr(api, "forward_args", counted("forward_args", api.forward_args))
    monkeypatch.setattr(api, "backward_args", counted("backward_args", api.backward_args))
    monkeypatch.setattr(oracle, "forward", counted("oracle.forward", oracle.forward))
    monkeypatch.setattr(oracle, "backward", counted("oracle.backward", oracle.backward))
    monkeypatch.setattr(oracle, "gru_forward", lambda *a, **k: pytest.fail("checked twice"))
    monkeypatch.setattr(oracle, "gru_backward", lambda *a, **k: pytest.fail("checked twice"))
    p = problem(rng, 4, 3, 5, 2, True)
    y, hn, grads = run_oracle(p, cugru)
    assert counts == {"forward_args": 1, "backward_args": 1, "oracle.forward": 1,
                      "oracle.backward": 1}
    assert y.shape == (4, 3, 4) and len(grads) == 6


def test_float32_stays_float32_and_is_close_to_float64(rng):
    p64 = problem(rng, 17, 3, 5, 4, True)
    p32 = {k: (v.astype(np.float32) if isinstance(v, np.ndarray) else v) for k, v in p64.items()}
    y64, _, g64 = run_oracle(p64)
    y32, hn32, g32 = run_oracle(p32)
    assert y32.dtype == hn32.dtype == np.float32
    assert all(g.dtype == np.float32 for g in g32)
    np.testing.assert_allclose(y32, y64, atol=1e-5)
    for name, a, b in zip(NAMES, g32, g64):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * max(1, np.abs(b).max()),
                                   err_msg=name)


def test_weights_without_direction_axis_give_gradients_in_that_shape(rng):
    p = problem(rng, 3, 2, 4, 5, False)
    flat = [w[0] for w in weights(p)]
    y, hn, saved = oracle.gru_forward(p["x"], p["h0"], *flat)
    grads = oracle.gru_backward(p["dy"], p["dh_n"], saved)
    y3, _, ref = run_oracle(p)
    np.testing.assert_array_equal(y, y3)
    for g, r, w in zip(grads[2:], ref[2:], flat):
        assert g.shape == w.shape
        np.testing.assert_array_equal(g, r[0])


def test_inference_keeps_no_history_and_gives_the_same_outputs(rng):
    p = problem(rng, 6, 2, 3, 4, True)
    y, hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                      training=False)
    y2, hn2, _ = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    assert saved is None
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_array_equal(hn, hn2)
    with pytest.raises(TypeError, match="training=False"):
        oracle.gru_backward(p["dy"], p["dh_n"], saved)


def test_no_dh_n_equals_zero_dh_n(rng):
    p = problem(rng, 4, 2, 3, 3, True)
    _, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    a = oracle.gru_backward(p["dy"], None, saved)
    b = oracle.gru_backward(p["dy"], np.zeros_like(p["dh_n"]), saved)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_saved_history_has_the_documented_layout(rng):
    T, B, I, H = 4, 3, 2, 5
    p = problem(rng, T, B, I, H, True)
    y, hn, s = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    assert s.hs.shape == (2, T + 1, B, H) and s.gates.shape == (2, T, B, 4 * H)
    np.testing.assert_array_equal(s.hs[:, 0], p["h0"])
    # direction 0 steps forward in time, direction 1 backward
    np.testing.assert_array_equal(s.hs[0, 1:], y[:, :, :H])
    np.testing.assert_array_equal(s.hs[1, 1:], y[::-1, :, H:])
    np.testing.assert_array_equal(hn, s.hs[:, T])
    r, z, n = (s.gates[..., k * H:(k + 1) * H] for k in range(3))
    assert ((r > 0) & (r < 1) & (z > 0) & (z < 1) & (np.abs(n) < 1)).all()


def test_long_sequence_stays_finite():
    rng = np.random.default_rng(7)
    p = problem(rng, 10000, 2, 3, 4, True, scale=1.0)
    y, hn, grads = run_oracle(p)
    assert np.isfinite(y).all() and np.isfinite(hn).all()
    assert all(np.isfinite(g).all() for g in grads)
    # h' is a convex mix of h and n (|n| < 1): |h| never exceeds max(1, |h0|)
    assert np.abs(y).max() <= max(1.0, np.abs(p["h0"]).max())


def _good(rng, bidirectional=False, dtype=np.float64):
    p = problem(rng, 3, 2, 4, 5, bidirectional, dtype=dtype)
    return dict(x=p["x"], h0=p["h0"], w_ih=p["w_ih"], w_hh=p["w_hh"], b_ih=p["b_ih"],
                b_hh=p["b_hh"])


BAD_FORWARD = [
    ("x rank", lambda a: a.update(x=a["x"][0]), ValueError, "x must have shape"),
    ("T = 0", lambda a: a.update(x=a["x"][:0]), ValueError, "T = 0"),
    ("B = 0", lambda a: a.update(x=a["x"][:, :0], h0=None), ValueError, "B = 0"),
    ("H = 0", lambda a: a.update(w_hh=np.zeros((1, 0, 0)), h0=None), ValueError, "H = 0"),
    ("w_hh rows", lambda a: a.update(w_hh=a["w_hh"][:, :-1]), ValueError, "w_hh"),
    ("w_ih shape", lambda a: a.update(w_ih=a["w_ih"][:, :, :-1].copy()), ValueError, "w_ih"),
    ("b_hh shape", lambda a: a.update(b_hh=a["b_hh"][:, :-1].copy()), ValueError, "b_hh"),
    ("h0 shape", lambda a: a.update(h0=a["h0"][:, :1].copy()), ValueError, "h0"),
    ("dtype mix", lambda a: a.update(w_hh=a["w_hh"].astype(np.float32)), TypeError, "w_hh"),
    ("int x", lambda a: a.update(x=a["x"].astype(np.int64)), TypeError, "x"),
    ("list x", lambda a: a.update(x=a["x"].tolist()), TypeError, "x"),
    ("directions", lambda a: a.update(w_ih=np.concatenate([a["w_ih"]] * 2)), ValueError,
     "w_ih has 2 direction"),
    ("not contiguous", lambda a: a.update(x=np.asfortranarray(a["x"])), ValueError, "x"),
]


@pytest.mark.parametrize("case", BAD_FORWARD, ids=[c[0] for c in BAD_FORWARD])
def test_bad_forward_input_names_the_argument(rng, case):
    _, change, exc, match = case
    args = _good(rng)
    change(args)
    with pytest.raises(exc, match=match):
        cugru.gru_forward(**args)


def test_bidirectional_needs_two_directions_of_weights(rng):
    args = _good(rng)
    args["h0"] = None
    with pytest.raises(ValueError, match="w_hh has 1 direction"):
        cugru.gru_forward(**args, bidirectional=True)
    flat = {k: (v[0] if k.startswith(("w_", "b_")) else v) for k, v in args.items()}
    with pytest.raises(ValueError, match="without a direction axis"):
        cugru.gru_forward(**flat, bidirectional=True)
    with pytest.raises(TypeError, match="bidirectional"):
        cugru.gru_forward(**args, bidirectional="yes")


def test_bad_backward_input_names_the_argument(rng):
    args = _good(rng, bidirectional=True)
    y, hn, saved = cugru.gru_forward(**args, bidirectional=True)
    with pytest.raises(ValueError, match="dy has shape"):
        cugru.gru_backward(y[:, :, :5], None, saved)
    with pytest.raises(TypeError, match="dy has dtype"):
        cugru.gru_backward(y.astype(np.float32), None, saved)
    with pytest.raises(ValueError, match="dh_n has shape"):
        cugru.gru_backward(y, hn[:1], saved)
    with pytest.raises(TypeError, match="saved must be"):
        cugru.gru_backward(y, hn, (y, hn))


def test_path_is_checked_on_the_cpu_too(rng):
    args = _good(rng)
    y, hn, saved = cugru.gru_forward(**args, path="fast")   # no effect on numpy arrays
    y2, _, _ = oracle.gru_forward(**args, path="steps")
    np.testing.assert_array_equal(y, y2)
    with pytest.raises(ValueError, match="path must be one of"):
        cugru.gru_forward(**args, path="gpu")
    with pytest.raises(ValueError, match="path must be one of"):
        cugru.gru_backward(y, hn, saved, path="cuda")
