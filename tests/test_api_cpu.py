"""The public API on the CPU (numpy oracle path): argument checks, batches, in-place calls,
stability and determinism. Every check here holds on the GPU path too (tests/test_gpu.py)."""
import numpy as np
import pytest

import cukernels as ck
from cases import ELEMENTWISE, UPDATES, dense_args
from cukernels import oracle as oracle_module


@pytest.mark.parametrize("case", ELEMENTWISE + UPDATES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_arrays_run_the_oracle_once_on_the_callers_arrays(case, dtype, rng, monkeypatch):
    """The public function, given numpy arrays, checks them and hands the very same arrays,
    in the same order, to its oracle twin, once, and returns what it returns; the scalars it
    passes on are the caller's values (finite, in range), converted to the arrays' dtype
    where the function converts them."""
    args, kw = case.make(rng, 37, dtype)
    calls = []
    real = case.oracle

    def recorder(*a, **k):
        calls.append((a, k))
        return real(*a, **k)
    monkeypatch.setattr(oracle_module, case.oracle.__name__, recorder)
    res = case.fn(*args, **kw)
    assert len(calls) == 1
    (got_args, got_kw), = calls
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    assert [a for a in got_args if isinstance(a, np.ndarray)] == arrays
    assert all(g is a for g, a in zip([a for a in got_args if isinstance(a, np.ndarray)],
                                      arrays))
    for g, a in zip(got_args, args):
        if not isinstance(a, np.ndarray):
            assert float(g) == float(np.dtype(dtype).type(a)) or float(g) == float(a)
    for out in case.outputs(res, args):
        assert out.dtype == np.dtype(dtype)


@pytest.mark.parametrize("name,betas", [("momentum_update", ("beta",)),
                                        ("rmsprop_update", ("beta",)),
                                        ("adadelta_update", ("beta1", "beta2")),
                                        ("adam_update", ("beta1", "beta2"))])
@pytest.mark.parametrize("variant", ["standard", "book"])
def test_every_decay_rate_has_one_rule(name, betas, variant):
    """beta, beta1 and beta2 are decay rates in [0, 1) for every update and variant."""
    n = {"momentum_update": 1, "rmsprop_update": 1}.get(name, 2)
    arrays = [np.ones(4), np.ones(4)] + [np.ones(4) for _ in range(n)]
    extra = {"t": 1} if name == "adam_update" else {}
    for beta in betas:
        for bad in (2.0, 1.0, -0.1):
            with pytest.raises(ValueError, match=rf"{beta} must be"):
                getattr(ck, name)(*[a.copy() for a in arrays], 1, variant=variant,
                                  **{beta: bad}, **extra)
        getattr(ck, name)(*[a.copy() for a in arrays], 1, variant=variant, **{beta: 0.0},
                          **extra)


# ------------------------------------------------------------------------- bad input
def test_wrong_dtype_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match="inputs must be float32 or float64"):
        ck.tanh_activation(np.arange(4))
    with pytest.raises(TypeError, match="output_gr has dtype float32, expected float64"):
        ck.tanh_derivative(np.ones(4), np.ones(4, np.float32))
    with pytest.raises(TypeError, match="inputs has dtype float64, expected float32"):
        ck.perceptron_feed_forward(np.ones(3), np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="float16"):
        ck.sgd_update(np.ones(4, np.float16), np.ones(4, np.float16), 1)


def test_wrong_shape_or_rank_is_a_value_error_naming_the_argument():
    with pytest.raises(ValueError, match=r"output_gr has shape \(5,\), expected \(4,\)"):
        ck.tanh_derivative(np.ones(4), np.ones(5))
    with pytest.raises(ValueError, match="inputs has 4 elements per vector, expected 3"):
        ck.perceptron_feed_forward(np.ones(4), np.ones((2, 4)))
    with pytest.raises(ValueError, match="weights must have 2 dimensions"):
        ck.perceptron_feed_forward(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="gradients has 3 elements per vector, expected 2"):
        ck.calc_hidden_gradient(np.ones((2, 4)), np.ones(3))
    with pytest.raises(ValueError, match="inputs .* and gradients .* batches of the same size"):
        ck.calc_delta_weights(np.ones((2, 3)), np.zeros((2, 4)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="momentum has shape"):
        ck.momentum_update(np.ones(4), np.ones(4), np.ones(3), 1)
    with pytest.raises(ValueError, match="inputs must have 1 or 2 dimensions"):
        ck.perceptron_feed_forward(np.ones((1, 2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="weights must have shape"):
        ck.perceptron_feed_forward(np.ones(0), np.ones((2, 1)))


def test_non_contiguous_is_refused_naming_the_argument():
    a = np.ones((4, 6))[:, ::2]
    with pytest.raises(ValueError, match="inputs must be C-contiguous"):
        ck.sigmoid_activation(a)
    with pytest.raises(ValueError, match="weights must be C-contiguous"):
        ck.sgd_update(np.ones((4, 3)), a, 1)


def test_size_zero_is_refused():
    with pytest.raises(ValueError, match="inputs is empty"):
        ck.softmax_activation(np.ones((0, 3)))
    with pytest.raises(ValueError, match="weights is empty"):
        ck.adam_update(np.ones(0), np.ones(0), np.ones(0), np.ones(0), 1, t=1)


@pytest.mark.parametrize("bs", [0, -3])
def test_batch_size_must_be_positive(bs):
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ck.sgd_update(np.ones(4), np.ones(4), bs)


def test_bad_scalars_and_options():
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        ck.sgd_update(np.ones(4), np.ones(4), 2.5)
    with pytest.raises(ValueError, match="learning_rate must be finite"):
        ck.sgd_update(np.ones(4), np.ones(4), 1, float("nan"))
    with pytest.raises(TypeError, match="a must be a real number"):
        ck.lrelu_activation(np.ones(4), "0.3")
    with pytest.raises(ValueError, match="variant must be 'standard' or 'book'"):
        ck.sgd_update(np.ones(4), np.ones(4), 1, variant="fast")
    with pytest.raises(ValueError, match="t .* is required"):
        ck.adam_update(np.ones(4), np.ones(4), np.ones(4), np.ones(4), 1)
    with pytest.raises(ValueError, match="t must be >= 1"):
        ck.adam_update(np.ones(4), np.ones(4), np.ones(4), np.ones(4), 1, t=0)
    with pytest.raises(TypeError, match="loss_function must be an integer"):
        ck.calc_output_gradient(np.ones(4), np.ones(4), 1.0)
    with pytest.raises(TypeError, match="activation must be an integer"):
        ck.article.feed_forward(np.ones((2, 4)), np.ones(3), None)


def test_non_arrays_and_overlaps_are_refused():
    with pytest.raises(TypeError, match="inputs must be a numpy or cupy array, got list"):
        ck.tanh_activation([1.0, 2.0])
    w = np.ones(8)
    with pytest.raises(ValueError, match="weights and momentum share memory"):
        ck.momentum_update(np.ones(8), w, w, 1)
    with pytest.raises(ValueError, match="delta_weights and weights share memory"):
        ck.sgd_update(w, w, 1)


def test_out_buffer_is_checked():
    with pytest.raises(ValueError, match="out has shape"):
        ck.tanh_activation(np.ones(4), out=np.ones(5))
    with pytest.raises(TypeError, match="out has dtype"):
        ck.tanh_activation(np.ones(4), out=np.ones(4, np.float32))


# --------------------------------------------------------------------------- behaviour
def test_in_place_derivative_calls_work(rng):
    y, g = rng.uniform(-1, 1, 50), rng.standard_normal(50)
    want = ck.tanh_derivative(y, g)
    r = ck.tanh_derivative(y, g, out=g)
    assert r is g
    np.testing.assert_array_equal(g, want)
    y = ck.softmax_activation(rng.standard_normal((3, 9)))
    g = rng.standard_normal((3, 9))
    want = ck.softmax_derivative(y, g)
    ck.softmax_derivative(y, g, out=g)
    np.testing.assert_array_equal(g, want)
    t, o = rng.uniform(size=9), rng.uniform(0.1, 0.9, 9)
    want = ck.calc_output_gradient(t, o, 3)
    ck.calc_output_gradient(t, o, 3, out=t)           # target aliases gradients
    np.testing.assert_array_equal(t, want)


@pytest.mark.parametrize("batch", [2, 5])
def test_a_batch_behaves_as_calls_in_a_row(rng, batch):
    W, x, g = dense_args(rng, 4, 6, batch, np.float64)
    # numpy's BLAS rounds a batch and a vector differently: compare to the terms' scale
    ys = np.stack([ck.perceptron_feed_forward(x[b], W) for b in range(batch)])
    np.testing.assert_allclose(ck.perceptron_feed_forward(x, W), ys, rtol=1e-13, atol=1e-13)
    gs = np.stack([ck.calc_hidden_gradient(W, g[b]) for b in range(batch)])
    np.testing.assert_allclose(ck.calc_hidden_gradient(W, g), gs, rtol=1e-13, atol=1e-13)
    D1, D2 = np.zeros_like(W), np.zeros_like(W)
    for b in range(batch):
        ck.calc_delta_weights(x[b], D1, g[b])
    ck.calc_delta_weights(x, D2, g)
    np.testing.assert_allclose(D2, D1, rtol=1e-13, atol=1e-13)
    W1, W2, M1, M2 = W.copy(), W.copy(), np.zeros_like(W), np.zeros_like(W)
    for b in range(batch):
        ck.article.update_weights(W1, g[b], x[b], M1, 0.1, 0.5)
    ck.article.update_weights(W2, g, x, M2, 0.1, 0.5)
    np.testing.assert_array_equal(W2, W1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_of_huge_logits_is_finite_and_sums_to_one(rng, dtype):
    x = (rng.standard_normal((4, 33)) * 1e4).astype(dtype)
    y = ck.softmax_activation(x)
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=4 * np.finfo(dtype).eps * 33)


def test_repeated_calls_give_the_same_bits(rng):
    x = rng.standard_normal((7, 129)).astype(np.float32)
    a, b = ck.softmax_activation(x), ck.softmax_activation(x)
    assert a.tobytes() == b.tobytes()


def test_package_imports_and_runs_without_cupy():
    import subprocess
    import sys
    code = ("import sys; sys.modules['cupy'] = None\n"       # make `import cupy` fail
            "import numpy as np, cukernels, cugru\n"
            "assert cukernels.gpu_available() is False\n"
            "y = cukernels.softmax_activation(np.ones((2, 3)))\n"
            "assert abs(y.sum() - 2.0) < 1e-12\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------- properties (hypothesis)
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 40)),
              elements=st.floats(-1e4, 1e4)), st.floats(-1e3, 1e3))
def test_softmax_rows_sum_to_one_and_ignore_a_shift(x, shift):
    y = ck.softmax_activation(x)
    assert np.isfinite(y).all() and (y >= 0).all()
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(ck.softmax_activation(x + shift), y, atol=1e-9)


@settings(max_examples=40, deadline=None)
@given(arrays(np.float32, st.integers(1, 64), elements=st.floats(-10, 10, width=32)),
       st.integers(1, 16))
def test_updates_zero_the_accumulator_and_keep_shapes(d, batch):
    w, m, v = np.ones_like(d), np.zeros_like(d), np.zeros_like(d)
    D = d.copy()
    ck.adam_update(D, w, m, v, batch, t=1)
    assert not D.any() and np.isfinite(w).all()
    # with D = d*batch, Adam's first step moves each weight by lr*sign(d) (up to eps)
    D2, w2, m2, v2 = d * batch, np.ones_like(d), np.zeros_like(d), np.zeros_like(d)
    ck.adam_update(D2, w2, m2, v2, batch, 0.01, t=1)
    big = np.abs(d) > 1e-3
    np.testing.assert_allclose((w2 - 1)[big], 0.01 * np.sign(d[big]), rtol=1e-3)
