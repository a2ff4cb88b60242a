"""Chain of trust, link 2: every kernel against the numpy oracle on the GPU.

Fresh random inputs, odd sizes, both dtypes, both variants, misaligned views (the scalar
path), in-place calls, and every buffer that a function allocates poisoned with NaN before
the launch. Tolerance, element by element: the kernel's error against the float64 oracle may
be at most twice the float32 oracle's error against it on that element (float32; for outputs
that are sums over a row, the largest such error in the row), plus a floor of a few ulps of
the largest value of the output (of its row, for sums).
"""
import os

import numpy as np
import pytest

import cukernels as ck
from cases import ELEMENTWISE, UPDATES, dense_args
from cukernels import oracle
from tolerance import elementwise_excess

pytestmark = pytest.mark.gpu

QUICK = bool(os.environ.get("CK_QUICK"))   # the sanitizer runs a smaller grid of sizes
SIZES = [5, 1001] if QUICK else [1, 3, 5, 33, 257, 1001, 4099]
def assert_matches(gpu_outs, args, kw, case_oracle, dtype, scope="element"):
    """Compare GPU outputs with the float64 oracle, element by element (see the module's doc)."""
    dtype = np.dtype(dtype)
    up = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
    same = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    ref = case_oracle(up, kw)
    low = case_oracle(same, kw)
    for k, (got, r, lo) in enumerate(zip(gpu_outs, ref, low)):
        got = got.get() if hasattr(got, "get") else got
        assert got.dtype == dtype
        excess = elementwise_excess(got, r, lo, dtype, scope)
        assert excess <= 1, f"output {k}: an element's error is {excess:.3g} times its bound"


def to_gpu(cp, args, misaligned=False):
    out = []
    for a in args:
        if not isinstance(a, np.ndarray):
            out.append(a)
        elif misaligned:       # a contiguous view one element into a larger buffer
            buf = cp.empty(a.size + 1, dtype=a.dtype)
            view = buf[1:].reshape(a.shape)
            view[...] = cp.asarray(a)
            out.append(view)
        else:
            out.append(cp.asarray(a))
    return out


def _run_oracle(case):
    def run(args, kw):
        res = case.oracle(*args, **kw)
        return case.outputs(res, args)
    return run


@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ELEMENTWISE, ids=lambda c: c.name)
def test_elementwise_kernel_matches_oracle(cp, poison, rng, case, dtype, n, misaligned):
    args, kw = case.make(rng, n, dtype)
    g = to_gpu(cp, args, misaligned)
    out = case.fn(*g, **kw)
    assert_matches([out], args, kw, _run_oracle(case), dtype)
    # in place: the result written over the first input
    g2 = to_gpu(cp, args, misaligned)
    res = case.fn(*g2, out=g2[0], **kw)
    assert res is g2[0]
    cp.testing.assert_array_equal(g2[0], out)


@pytest.mark.parametrize("misaligned", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UPDATES, ids=lambda c: c.name)
def test_update_kernel_matches_oracle_over_several_steps(cp, rng, case, dtype, n, misaligned):
    args, kw = case.make(rng, n, dtype)
    g = to_gpu(cp, args, misaligned)
    cpu = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    cpu64 = [a.astype(np.float64) if isinstance(a, np.ndarray) else a for a in args]
    for step in range(1, 5):
        D = np.random.default_rng(step * 7 + n).uniform(-3, 3, args[0].shape).astype(dtype)
        g[0][...] = cp.asarray(D)
        cpu[0][...] = D
        cpu64[0][...] = D
        if "t" in kw:
            kw = {**kw, "t": step}
        case.fn(*g, **kw)
        case.oracle(*cpu, **kw)
        case.oracle(*cpu64, **kw)
        assert int(cp.count_nonzero(g[0])) == 0, "the accumulator must be zeroed"
    for i in case.mutates[1:]:
        excess = elementwise_excess(g[i].get(), cpu64[i], cpu[i], dtype)
        assert excess <= 1, f"array {i}: an element's error is {excess:.3g} times its bound"


SOFTMAX_SHAPES = [(1,), (3,), (1, 1), (5, 33), (17, 257), (3, 1001), (2, 2048), (2, 4096),
                  (2, 5000), (2, 8192), (3, 9001), (1000, 128), (4, 3, 7)]
if QUICK:
    SOFTMAX_SHAPES = [(5, 33), (3, 1001), (2, 4096), (3, 9001), (300, 128)]


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_and_derivative_match_oracle(cp, poison, rng, dtype, shape):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    y = ck.softmax_activation(cp.asarray(x))
    assert_matches([y], [x], {}, lambda a, k: [oracle.softmax_activation(a[0])], dtype,
                   scope="row")
    g = rng.standard_normal(shape).astype(dtype)
    yd = oracle.softmax_activation(x)
    dx = ck.softmax_derivative(cp.asarray(yd), cp.asarray(g))
    assert_matches([dx], [yd, g], {}, lambda a, k: [oracle.softmax_derivative(a[0], a[1])], dtype,
                   scope="array")
    xg = cp.asarray(x)                              # in place
    ck.softmax_activation(xg, out=xg)
    cp.testing.assert_array_equal(xg, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("cols", [33, 4096, 9001])
def test_softmax_of_huge_logits_is_finite_and_repeatable(cp, rng, dtype, cols):
    x = cp.asarray((rng.standard_normal((3, cols)) * 1e4).astype(dtype))
    y = ck.softmax_activation(x)
    assert bool(cp.isfinite(y).all())
    cp.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-5 if dtype == np.float32 else 1e-12)
    assert ck.softmax_activation(x).tobytes() == y.tobytes()


DENSE = [(1, 1, None), (3, 5, None), (33, 257, 3), (257, 33, 9), (5, 1001, 1), (130, 4099, 8),
         (1001, 17, None), (17, 1001, 4), (64, 64, 33)]
if QUICK:
    DENSE = [(3, 5, None), (33, 257, 3), (257, 33, 9)]


@pytest.mark.parametrize("n,i,batch", DENSE)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_kernels_match_oracle(cp, poison, rng, dtype, n, i, batch):
    W, x, g = dense_args(rng, n, i, batch, dtype)
    Wg, xg, gg = (cp.asarray(a) for a in (W, x, g))
    assert_matches([ck.perceptron_feed_forward(xg, Wg)], [x, W], {},
                   lambda a, k: [oracle.perceptron_feed_forward(a[0], a[1])], dtype, scope="row")
    assert_matches([ck.calc_hidden_gradient(Wg, gg)], [W, g], {},
                   lambda a, k: [oracle.calc_hidden_gradient(a[0], a[1])], dtype, scope="row")
    D = rng.uniform(-1, 1, W.shape).astype(dtype)
    Dg = cp.asarray(D)
    assert ck.calc_delta_weights(xg, Dg, gg) is Dg
    assert_matches([Dg], [x, D, g], {},
                   lambda a, k: [oracle.calc_delta_weights(a[0], a[1].copy(), a[2])], dtype,
                   scope="row")


@pytest.mark.parametrize("activation", [0, 1, 2])
@pytest.mark.parametrize("n,i,batch", DENSE[:6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_article_kernels_match_oracle(cp, poison, rng, dtype, n, i, batch, activation):
    W, x, g = dense_args(rng, n, i, batch, dtype)
    Wg, xg, gg = (cp.asarray(a) for a in (W, x, g))
    assert_matches([ck.article.feed_forward(Wg, xg, activation)], [W, x], {},
                   lambda a, k: [oracle.article_feed_forward(a[0], a[1], activation)], dtype,
                   scope="row")
    o = oracle.article_feed_forward(W, x, activation)          # this layer's outputs
    t = rng.uniform(-1.2, 1.2, o.shape).astype(dtype)
    assert_matches([ck.article.calc_output_gradient(cp.asarray(t), cp.asarray(o), activation)],
                   [t, o], {}, lambda a, k: [oracle.article_calc_output_gradient(a[0], a[1], activation)],
                   dtype)
    W2 = rng.uniform(-1, 1, (7, n + 1)).astype(dtype)          # the next layer
    g2 = rng.uniform(-1, 1, (7,) if batch is None else (batch, 7)).astype(dtype)
    assert_matches([ck.article.calc_hidden_gradient(cp.asarray(W2), cp.asarray(g2), cp.asarray(o),
                                                    activation)],
                   [W2, g2, o], {},
                   lambda a, k: [oracle.article_calc_hidden_gradient(a[0], a[1], a[2], activation)],
                   dtype, scope="row")
    dW = rng.uniform(-0.1, 0.1, W.shape).astype(dtype)
    Wu, dWu = cp.asarray(W), cp.asarray(dW)
    ck.article.update_weights(Wu, gg, xg, dWu, 0.05, 0.9)

    def upd(a, k):
        w, dw = a[0].copy(), a[3].copy()
        oracle.article_update_weights(w, a[1], a[2], dw, 0.05, 0.9)
        return [w, dw]
    assert_matches([Wu, dWu], [W, g, x, dW], {}, upd, dtype)


def test_float32_denormals_are_flushed_to_zero(cp):
    # CuPy compiles with -ftz=true: a float32 denormal input counts as 0 on the GPU, so the
    # article's sigmoid guard (o == 0 -> 0.01) fires for it; numpy keeps the denormal
    o = np.array([1e-40, 0.0, 0.5], dtype=np.float32)
    t = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    got = ck.article.calc_output_gradient(cp.asarray(t), cp.asarray(o), 1).get()
    np.testing.assert_allclose(got, [0.01, 0.01, 0.5 * 0.5 * 0.5], rtol=1e-6)
    cpu = ck.article.calc_output_gradient(t, o, 1)
    assert cpu[0] < 1e-30


@pytest.mark.parametrize("batch", [2, 5, 7])
def test_small_batches_give_the_bits_of_single_calls(cp, rng, batch):
    W, x, g = (cp.asarray(a) for a in dense_args(rng, 300, 1001, batch, np.float32))
    ys = cp.stack([ck.perceptron_feed_forward(x[b], W) for b in range(batch)])
    assert ck.perceptron_feed_forward(x, W).tobytes() == ys.tobytes()
    gs = cp.stack([ck.calc_hidden_gradient(W, g[b]) for b in range(batch)])
    assert ck.calc_hidden_gradient(W, g).tobytes() == gs.tobytes()
    D1, D2 = cp.zeros_like(W), cp.zeros_like(W)
    for b in range(batch):
        ck.calc_delta_weights(x[b], D1, g[b])
    ck.calc_delta_weights(x, D2, g)
    assert D1.tobytes() == D2.tobytes()


def test_kernels_are_bitwise_repeatable(cp, rng):
    W, x, g = (cp.asarray(a) for a in dense_args(rng, 2049, 3001, 1, np.float32))
    xb = cp.asarray(rng.standard_normal((64, 3001)).astype(np.float32))
    for f in (lambda: ck.calc_hidden_gradient(W, g), lambda: ck.perceptron_feed_forward(x, W),
              lambda: ck.perceptron_feed_forward(xb, W),
              lambda: ck.softmax_activation(xb), lambda: ck.sigmoid_activation(xb)):
        assert f().tobytes() == f().tobytes()
    states = []
    for _ in range(2):
        D, w, m, v = (cp.asarray(np.random.default_rng(5).standard_normal(1001).astype(np.float32))
                      for _ in range(4))
        v = cp.abs(v)
        ck.adam_update(D, w, m, v, 3, t=2)
        states.append(w.tobytes() + m.tobytes() + v.tobytes())
    assert states[0] == states[1]


def test_gpu_bad_input(cp):
    with pytest.raises(TypeError, match="numpy and cupy arrays are mixed"):
        ck.tanh_derivative(cp.ones(4), np.ones(4))
    with pytest.raises(TypeError, match="numpy and cupy arrays are mixed"):
        ck.perceptron_feed_forward(np.ones(3), cp.ones((2, 4)))
    with pytest.raises(TypeError, match="must be float32 or float64"):
        ck.sigmoid_activation(cp.ones(4, cp.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        ck.sigmoid_activation(cp.ones((4, 4))[:, ::2])
    with pytest.raises(ValueError, match="empty"):
        ck.softmax_activation(cp.ones((0, 4)))
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ck.sgd_update(cp.ones(4), cp.ones(4), 0)
    with pytest.raises(TypeError, match="out"):
        ck.tanh_activation(cp.ones(4), out=np.ones(4))


def test_elementwise_fast_path_checks_as_the_others(cp, rng):
    """A plain call (one cupy array, plain float scalars: the fast path) refuses and accepts
    what every other call does, with the same bits."""
    x32 = cp.asarray(rng.standard_normal(37).astype(np.float32))
    x64 = x32.astype(cp.float64)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        ck.sigmoid_activation(cp.asarray(np.float32(1.0)))
    with pytest.raises(ValueError, match="a must be finite"):
        ck.sigmoid_activation(x32, float("nan"))
    with pytest.raises(ValueError, match="a must be finite in float32"):
        ck.sigmoid_activation(x32, 1e39)
    big = ck.line_activation(x64, 1e300)           # finite in float64: accepted
    cp.testing.assert_array_equal(big, x64 * 1e300)
    for fn, kw in ((ck.sigmoid_activation, {"a": 2.0, "b": 0.5}), (ck.lrelu_activation, {"a": 0.1}),
                   (ck.swish_activation, {"b": 1.5}), (ck.tanh_activation, {})):
        fast = fn(x32, **kw)
        as_numpy = {k: np.float32(v) for k, v in kw.items()}   # (not plain floats: checked)
        out = cp.empty_like(x32)
        if kw:
            cp.testing.assert_array_equal(fast, fn(x32, **as_numpy))
        cp.testing.assert_array_equal(fast, fn(x32, out=out, **kw))


def test_update_fast_path_checks_as_the_others(cp, rng):
    """A plain update call (cupy arrays, plain floats, an int batch: the fast path) refuses
    what the general checks refuse, and gives the bits of a call with numpy scalars of the
    same values."""
    n = 40
    buf = cp.zeros(2 * n, cp.float32)
    w = cp.asarray(rng.standard_normal(n).astype(np.float32))
    with pytest.raises(ValueError, match="momentum_m and momentum_v share memory"):
        ck.adam_update(cp.ones(n, cp.float32), w, buf[:n], buf[n // 2:n // 2 + n], 2, t=1)
    with pytest.raises(ValueError, match="beta1 must be < 1.0"):
        ck.adam_update(cp.ones(n, cp.float32), w, cp.zeros(n, cp.float32),
                       cp.zeros(n, cp.float32), 2, beta1=1.0, t=1)
    with pytest.raises(ValueError, match="learning_rate must be finite in float32"):
        ck.sgd_update(cp.ones(n, cp.float32), w, 2, learning_rate=1e39)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ck.sgd_update(cp.ones(n, cp.float32), w, 0)
    with pytest.raises(ValueError, match="t must be >= 1"):
        ck.adam_update(cp.ones(n, cp.float32), w, cp.zeros(n, cp.float32),
                       cp.zeros(n, cp.float32), 2, t=0)
    d = rng.standard_normal(n).astype(np.float32)
    results = []
    # (numpy scalars take the general checks; float64 ones hold the same values, where
    # float32 ones would change the host's float64 bias factors)
    for wrap in (float, np.float64):
        D, w2, m, v = (cp.asarray(a) for a in (d, np.ones(n, np.float32),
                                               np.zeros(n, np.float32), np.zeros(n, np.float32)))
        ck.adam_update(D, w2, m, v, 4, wrap(1e-3), wrap(0.9), wrap(0.999), t=3)
        results.append(cp.concatenate([w2, m, v]))
    cp.testing.assert_array_equal(results[0], results[1])


@pytest.mark.slow
def test_update_beyond_2_pow_31_elements(cp):
    n = 2**31 + 5
    D = cp.random.default_rng(0).random(n, dtype=cp.float32)
    D0 = D.copy()
    w = cp.ones(n, dtype=cp.float32)
    ck.sgd_update(D, w, 4, 0.5)
    expected = 1 + cp.float32(0.5) * (D0 / cp.float32(4))
    assert float(cp.abs(w - expected).max()) <= 1e-6
    tail = 1 + 0.5 * (D0[-7:].get().astype(np.float64) / 4)     # past index 2**31
    np.testing.assert_allclose(w[-7:].get(), tail, rtol=1e-6)
    assert int(cp.count_nonzero(D)) == 0
