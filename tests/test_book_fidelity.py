"""The book variants against a literal transcription of the documents, and each defect of
docs/fidelity.md pinned by a test (D1-D9, P1-P3, A1)."""
import numpy as np
import pytest

import book_transcription as book
import cukernels as ck

BOOK_SCALARS = {
    "sgd": dict(batch_size=3, learningRate=0.01, Lambda1=0.001, Lambda2=0.01),
    "momentum": dict(batch_size=3, learningRate=0.01, beta=0.9, Lambda1=0.001, Lambda2=0.01),
    "adagrad": dict(batch_size=3, learningRate=0.01, Lambda1=0.001, Lambda2=0.01),
    "rmsprop": dict(batch_size=3, learningRate=0.01, beta=0.9, Lambda1=0.001, Lambda2=0.01),
    "adadelta": dict(batch_size=3, beta1=0.9, beta2=0.999, Lambda1=0.001, Lambda2=0.01),
    "adam": dict(batch_size=3, learningRate=0.01, beta1=0.9, beta2=0.999, Lambda1=0.001,
                 Lambda2=0.01),
}


def _ours(name, D, W, moments, s):
    f = getattr(ck, f"{name}_update")
    bs, l1, l2 = s["batch_size"], s["Lambda1"], s["Lambda2"]
    if name == "sgd":
        f(D, W, bs, s["learningRate"], l1, l2, variant="book")
    elif name in ("momentum", "rmsprop"):
        f(D, W, moments[0], bs, s["learningRate"], s["beta"], l1, l2, variant="book")
    elif name == "adagrad":
        f(D, W, moments[0], bs, s["learningRate"], l1, l2, variant="book")
    elif name == "adadelta":
        f(D, W, moments[0], moments[1], bs, s["beta1"], s["beta2"], l1, l2, variant="book")
    else:
        f(D, W, moments[0], moments[1], bs, s["learningRate"], s["beta1"], s["beta2"], l1, l2,
          variant="book")


@pytest.mark.parametrize("total", [8, 10, 13])
@pytest.mark.parametrize("name", sorted(book.UPDATES))
def test_book_update_matches_transcription(rng, name, total):
    nmom = book.UPDATES[name][1]
    W0 = rng.standard_normal(total)
    mom0 = [np.abs(rng.standard_normal(total)) for _ in range(nmom)]
    W1, W2 = W0.copy(), W0.copy()
    m1, m2 = [m.copy() for m in mom0], [m.copy() for m in mom0]
    oob = []
    for _ in range(3):
        D = rng.standard_normal(total)
        D1, D2 = D.copy(), D.copy()
        oob += book.run_update(name, D1, W1, m1, BOOK_SCALARS[name])
        _ours(name, D2, W2, m2, BOOK_SCALARS[name])
        assert not D2.any()
    np.testing.assert_allclose(W2, W1, rtol=1e-13, atol=1e-15)
    for a, b in zip(m2, m1):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    # D1: the book's last chunk reads and writes past the end unless total % 4 == 0
    assert bool(oob) == (total % 4 != 0)


def test_d1_book_feed_forward_reads_past_the_buffers(rng):
    n, i = 3, 6                                  # 6 % 4 != 0
    x, W = rng.standard_normal(i), rng.standard_normal((n, i + 1))
    xb, Wb = book.Buffer(x), book.Buffer(W)
    book.perceptron_feed_forward(xb, Wb, n, i)
    assert xb.oob, "the transcription must show the out-of-bounds read of inputs"
    # with I a multiple of 4 the book is in bounds and agrees with ours
    i4 = 8
    x4, W4 = rng.standard_normal(i4), rng.standard_normal((n, i4 + 1))
    xb4, Wb4 = book.Buffer(x4), book.Buffer(W4)
    got = book.perceptron_feed_forward(xb4, Wb4, n, i4)
    assert not xb4.oob and not Wb4.oob
    np.testing.assert_allclose(ck.perceptron_feed_forward(x4, W4), got, rtol=1e-13)


@pytest.mark.parametrize("cols", [4, 5, 6, 7, 8, 9, 10, 14, 16, 17, 30, 33])
def test_d2_book_softmax_reduction_is_wrong_for_some_lengths_ours_never(rng, cols):
    x = rng.standard_normal(cols)
    ours = ck.softmax_activation(x)
    assert abs(ours.sum() - 1.0) < 1e-12
    book_sum = sum(book.softmax_row(list(x), ls=cols))
    wrong = abs(book_sum - 1.0) > 1e-9
    # the book's bound uses the group size instead of the previous round's count
    # (5, 6, 9-14, 17-30, 33-62, ...): only 2^k and 2^k - 1 elements reduce correctly
    expected_wrong = not any(cols in (2**k, 2**k - 1) for k in range(12))
    assert wrong == expected_wrong


def test_d3_book_adagrad_moves_weights_without_a_gradient():
    w, G, D = np.ones(6), np.zeros(6), np.zeros(6)
    ck.adagrad_update(D, w, G, 1, 1e-3, variant="book")
    assert (w > 1e12).all()                      # lr/sqrt(1e-37)
    w2 = np.ones(6)
    ck.adagrad_update(np.zeros(6), w2, np.zeros(6), 1, 1e-3)
    np.testing.assert_array_equal(w2, np.ones(6))


def test_d4_book_adam_step_ratio_to_standard():
    b1, b2 = 0.9, 0.999
    ratios = {}
    for t_end in (1, 12, 20000):
        wb, ws = np.zeros(1), np.zeros(1)
        Mb, Vb, Ms, Vs = (np.zeros(1) for _ in range(4))
        for t in range(1, t_end + 1):
            wb_prev, ws_prev = wb.copy(), ws.copy()
            ck.adam_update(np.ones(1), wb, Mb, Vb, 1, 1e-3, b1, b2, eps=0.0, variant="book")
            ck.adam_update(np.ones(1), ws, Ms, Vs, 1, 1e-3, b1, b2, t=t, eps=0.0)
        ratios[t_end] = ((wb - wb_prev) / (ws - ws_prev))[0]
    assert ratios[12] == pytest.approx(2.078, abs=2e-3)
    assert ratios[20000] == pytest.approx(np.sqrt(1 - b2) / (1 - b1), rel=1e-3)   # 0.316
    assert ratios[1] == pytest.approx(1.0, rel=1e-12)  # both take a step of lr at t = 1


def test_d5_book_l1_is_a_constant_shift_standard_is_lr_scaled_and_decoupled():
    w = np.array([-1.0, 0.0, 1.0])
    wb = w.copy()
    for _ in range(10):
        ck.sgd_update(np.zeros(3), wb, 1, 0.1, 0.5, 0.0, variant="book")
    np.testing.assert_allclose(wb, w - 10 * 0.5)           # every weight marches down
    ws = w.copy()
    ck.sgd_update(np.zeros(3), ws, 1, 0.1, 0.5, 0.0)
    np.testing.assert_allclose(ws, [-1 + 0.05, 0.0, 1 - 0.05])  # toward 0, scaled by lr


def test_d6_book_adadelta_averages_squared_weights(rng):
    w = rng.standard_normal(5)
    W, G = np.zeros(5), np.zeros(5)
    ck.adadelta_update(np.zeros(5), w.copy(), W, G, 1, 0.9, 0.999, variant="book")
    np.testing.assert_allclose(W, 0.1 * w * w)
    W2, G2, w2 = np.zeros(5), np.zeros(5), w.copy()
    ck.adadelta_update(np.zeros(5), w2, W2, G2, 1, 0.9, 0.999)
    np.testing.assert_array_equal(W2, 0.0)                 # standard: squared updates
    np.testing.assert_array_equal(w2, w)


def test_d7_book_bce_has_the_wrong_sign_and_cce_an_extra_log(rng):
    t, o = rng.uniform(0, 1, 20), rng.uniform(0.1, 0.9, 20)
    std3 = ck.calc_output_gradient(t, o, 3, eps=0.0)
    book3 = ck.calc_output_gradient(t, o, 3, variant="book")
    np.testing.assert_allclose(book3, -std3, rtol=1e-12)
    book2 = ck.calc_output_gradient(t, o, 2, variant="book")
    np.testing.assert_allclose(book2, -ck.calc_output_gradient(t, o, 2, eps=0.0) * np.log(o),
                               rtol=1e-12)
    for code in range(-1, 5):
        want = [book.calc_output_gradient(a, b, code) for a, b in zip(t, o)]
        np.testing.assert_allclose(ck.calc_output_gradient(t, o, code, variant="book"), want,
                                   rtol=1e-14)


def test_d8_softmax_of_large_logits_stays_finite():
    x = np.array([[1e4, 1e4 - 1.0, -1e4, 0.0]], dtype=np.float32)
    y = ck.softmax_activation(x)
    assert np.isfinite(y).all() and abs(float(y.sum()) - 1.0) < 1e-6
    with np.errstate(over="ignore", invalid="ignore"):
        book_row = np.exp(x[0]) / np.exp(x[0]).sum()   # the book: no max subtraction
    assert not np.isfinite(book_row).all()


def test_d9_book_epsilon_gives_no_damping_in_float32():
    d = np.full(4, 1e-25 * 3, dtype=np.float32)         # d*d underflows to 0 in float32
    wb, Gb = np.zeros(4, np.float32), np.zeros(4, np.float32)
    ck.rmsprop_update(d.copy(), wb, Gb, 3, 3e-4, 0.9, variant="book")
    ws, Gs = np.zeros(4, np.float32), np.zeros(4, np.float32)
    ck.rmsprop_update(d.copy(), ws, Gs, 3, 3e-4, 0.9)
    assert (np.abs(wb) > 1e6).all() and (np.abs(ws) < 1e-10).all()


def test_p1_p2_article_hidden_gradient_uses_the_right_weights_and_no_stray_bias(rng):
    n_next, i = 5, 3                     # 5 % 4 != 0: where the article adds a bias weight
    W, g, o = rng.standard_normal((n_next, i + 1)), rng.standard_normal(n_next), rng.uniform(-.5, .5, i)
    want = np.array([sum(g[k] * W[k, j] for k in range(n_next)) for j in range(i)])
    np.testing.assert_allclose(ck.article.calc_hidden_gradient(W, g, o, 2), want, rtol=1e-13)


def test_p3_article_hidden_gradient_clamps_sum_plus_output(rng):
    W, g = np.eye(3, 4) * 10.0, np.array([1.0, -1.0, 0.01])
    o = np.array([0.5, -0.5, 0.2])
    got = ck.article.calc_hidden_gradient(W, g, o, 0)
    s = np.array([10.0, -10.0, 0.1])
    want = (np.clip(s + o, -1, 1) - o) * (1 + o) * (1 - o)
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_a1_article_output_gradient_for_a_linear_output_is_t_minus_o(rng):
    t, o = rng.standard_normal(7), rng.standard_normal(7)
    np.testing.assert_allclose(ck.article.calc_output_gradient(t, o, 2), t - o)
    # sigmoid with the article's guards: o == 1 uses 1 - 0.99, o == 0 uses 0.01
    o1 = np.array([1.0, 0.0, 0.3])
    got = ck.article.calc_output_gradient(np.array([0.5, 0.5, 0.9]), o1, 1)
    np.testing.assert_allclose(got, [-0.5 * 1.0 * 0.01, 0.5 * 0.01 * 1.0, 0.6 * 0.3 * 0.7],
                               rtol=1e-12)
