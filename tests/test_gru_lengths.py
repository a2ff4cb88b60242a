"""Variable lengths (gru_forward(..., lengths=)) on the CPU: the oracle against torch.nn.GRU
on a PackedSequence (float64), against each sequence run alone, and its argument checks."""
import numpy as np
import pytest

import cugru
from cugru import oracle
from gru_cases import NAMES, SHAPES, problem, qat_specs, random_lengths, torch_gru, weights


_FROM_P = object()


def run(p, lengths=_FROM_P, quant=None, dh_n=True):
    lengths = p.get("lengths") if lengths is _FROM_P else lengths
    y, hn, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p),
                                      bidirectional=p["bidirectional"], lengths=lengths,
                                      quant=quant)
    return (y, hn) + oracle.gru_backward(p["dy"], p["dh_n"] if dh_n else None, saved)


@pytest.mark.parametrize("with_h0", [True, False], ids=["h0", "no_h0"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("T,B,I,H", [s for s in SHAPES if s[0] > 1 and s[1] > 1][:6])
def test_lengths_match_torch_packed_sequences(torch, rng, T, B, I, H, bidirectional, with_h0):
    """torch.nn.GRU on pack_padded_sequence(enforce_sorted=False) of the lengths, y padded
    back with zeros: y, h_n and all six gradients."""
    p = problem(rng, T, B, I, H, bidirectional, with_h0, lengths=True)
    got = run(p)
    ty, thn, tgrads = torch_gru(torch, p)
    np.testing.assert_allclose(got[0], ty, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got[1], thn, rtol=1e-12, atol=1e-13)
    for name, g, tg in zip(NAMES, got[2:], tgrads):
        scale = max(1.0, np.abs(tg).max())
        np.testing.assert_allclose(g, tg, rtol=0, atol=1e-12 * scale, err_msg=name)


def _alone(p, b, n, quant=None):
    """Row b of problem p as a batch of one sequence of its own n steps."""
    c = np.ascontiguousarray
    q = dict(p, x=c(p["x"][:n, b:b + 1]), dy=c(p["dy"][:n, b:b + 1]),
             dh_n=c(p["dh_n"][:, b:b + 1]), h0=None if p["h0"] is None else c(p["h0"][:, b:b + 1]))
    q.pop("lengths", None)
    return run(q, quant=quant)


QUANT = [("float", None)] + [(i, q) for i, q in qat_specs() if i in ("w8-x-h-g", "w4-h")]


@pytest.mark.parametrize("quant", [q for _, q in QUANT], ids=[i for i, _ in QUANT])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_a_batch_with_lengths_is_each_sequence_run_alone(rng, bidirectional, quant):
    """Each row of the batch, cut to its length and run alone, gives that row's y (zero
    beyond), h_n, dx (zero beyond), dh0, and its share of the weight gradients (the batch's
    are the sum over rows); quantization-aware passes too."""
    T, B, I, H = 7, 5, 3, 4
    p = problem(rng, T, B, I, H, bidirectional, lengths=True)
    p["lengths"] = np.array([3, 7, 1, 5, 2])
    y, hn, dx, dh0, *dw = run(p, quant=quant)
    total = [np.zeros_like(g) for g in dw]
    for b, n in enumerate(p["lengths"]):
        ya, hna, dxa, dh0a, *dwa = _alone(p, b, n, quant)
        np.testing.assert_allclose(y[:n, b:b + 1], ya, rtol=1e-12, atol=1e-14)
        assert not y[n:, b].any() and not dx[n:, b].any()
        np.testing.assert_allclose(hn[:, b:b + 1], hna, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(dx[:n, b:b + 1], dxa, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(dh0[:, b:b + 1], dh0a, rtol=1e-11, atol=1e-13)
        total = [t + g for t, g in zip(total, dwa)]
    for name, g, t in zip(NAMES[2:], dw, total):
        np.testing.assert_allclose(g, t, rtol=1e-11, atol=1e-12, err_msg=name)


def test_lengths_all_t_is_the_gru_without_lengths_bit_for_bit(rng):
    p = problem(rng, 6, 4, 3, 5, True)
    plain = run(p, lengths=None)
    for lengths in ([6] * 4, (6, 6, 6, 6), np.full(4, 6, np.int32), np.full(4, 6, np.uint8)):
        for a, b in zip(run(p, lengths=lengths), plain):
            assert np.array_equal(a, b)


def test_lengths_in_any_integer_form_give_the_same_bits(rng):
    p = problem(rng, 6, 4, 3, 5, True)
    ref = run(p, lengths=np.array([2, 6, 1, 4]))
    for lengths in ([2, 6, 1, 4], (2, 6, 1, 4), np.array([2, 6, 1, 4], np.uint16)):
        for a, b in zip(run(p, lengths=lengths), ref):
            assert np.array_equal(a, b)


def test_padding_beyond_a_length_changes_nothing(rng):
    """The padded steps of x and dy are never used: other (finite) values there give the
    same bits; the saved history keeps the lengths for the backward pass."""
    p = problem(rng, 6, 3, 2, 4, True)
    p["lengths"] = np.array([2, 6, 4])
    ref = run(p)
    q = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in p.items()}
    for b, n in enumerate(q["lengths"]):
        q["x"][n:, b] = 1e3
        q["dy"][n:, b] = -7.0
    for a, b in zip(run(q), ref):
        assert np.array_equal(a, b)
    _, _, saved = oracle.gru_forward(p["x"], None, *weights(p), bidirectional=True,
                                     lengths=p["lengths"])
    assert np.array_equal(saved.lengths, p["lengths"])


def test_public_function_runs_the_oracle_with_lengths(rng):
    p = problem(rng, 5, 3, 2, 4, False, lengths=True)
    y, hn, saved = cugru.gru_forward(p["x"], p["h0"], *weights(p), lengths=p["lengths"])
    ref = run(p)
    assert np.array_equal(y, ref[0]) and np.array_equal(hn, ref[1])
    for a, b in zip(cugru.gru_backward(p["dy"], p["dh_n"], saved), ref[2:]):
        assert np.array_equal(a, b)


BAD = [
    ([1, 2], ValueError, r"lengths must have shape \(B,\) = \(3,\), one length per sequence of "
                         r"x, got shape \(2,\)"),
    (np.ones((3, 1), int), ValueError, r"got shape \(3, 1\)"),
    ([1, 0, 2], ValueError, r"lengths must lie in 1..T = 1..5 \(the steps of x\); "
                            r"lengths\[1\] = 0"),
    ([1, 6, 2], ValueError, r"lengths\[1\] = 6"),
    (np.array([1, -3, 2]), ValueError, r"lengths\[1\] = -3"),
    ([1.0, 2.0, 3.0], TypeError, "lengths must hold integers, got dtype float64"),
    (np.array([True, True, True]), TypeError, "lengths must hold integers, got dtype bool"),
    ("123", TypeError, "lengths must be a numpy or cupy array, list or tuple of B integers, "
                       "got str"),
    ([[1], 2, 3], TypeError, "lengths must be a sequence of B integers"),
]


@pytest.mark.parametrize("lengths,err,match", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_lengths_name_the_argument(rng, lengths, err, match):
    p = problem(rng, 5, 3, 2, 4, True)
    with pytest.raises(err, match=match):
        cugru.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True, lengths=lengths)


def test_random_lengths_cover_both_ends(rng):
    for B in (2, 3, 9):
        lengths = random_lengths(rng, 6, B)
        assert lengths.min() == 1 and lengths.max() == 6 and len(lengths) == B
