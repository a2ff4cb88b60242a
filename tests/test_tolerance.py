"""The GPU tests' tolerance (tests/tolerance.py) on the CPU: it catches one element off."""
import numpy as np

from tolerance import elementwise_excess


def _case(rng, n=4099):
    x = rng.uniform(-3, 3, n)
    ref = np.tanh(x)                              # the float64 oracle
    low = np.tanh(x.astype(np.float32))           # the float32 oracle
    return ref, low


def test_one_element_off_by_1e_4_fails_among_4099(rng):
    ref, low = _case(rng)
    got = low.copy()
    assert elementwise_excess(got, ref, low, np.float32) <= 1
    got[1234] += np.float32(1e-4)
    assert elementwise_excess(got, ref, low, np.float32) > 100
    # a norm over the array, as the earlier rule took it, would have let it pass:
    norm_rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert norm_rel < 4e-6


def test_a_few_ulps_pass_and_nan_fails(rng):
    ref, low = _case(rng)
    ulp = np.spacing(np.abs(low).astype(np.float32))
    got = (low + 2 * ulp * np.sign(rng.standard_normal(low.shape))).astype(np.float32)
    assert elementwise_excess(got, ref, low, np.float32) <= 1
    got[7] = np.nan
    assert elementwise_excess(got, ref, low, np.float32) == np.inf


def test_rows_take_the_row_s_largest_error_for_sums(rng):
    """Outputs that are sums over a row are held to the float32 oracle's largest error in
    the row: a product's element may be off by more than that oracle was on it by chance."""
    W, x = rng.standard_normal((4, 999)), rng.standard_normal((3, 999))
    ref = x @ W.T
    low = x.astype(np.float32) @ W.T.astype(np.float32)
    e = np.abs(low - ref)
    got = ref.copy()
    i, j = np.unravel_index(np.argmin(e), e.shape)
    got[i, j] += 1.5 * e[i].max()                 # beyond its own, within its row's
    assert elementwise_excess(got, ref, low, np.float32, scope="row") <= 1
    got[i, j] += 10 * e[i].max() + 1e-4 * np.abs(ref[i]).max()
    assert elementwise_excess(got, ref, low, np.float32, scope="row") > 1


def test_array_scope_takes_the_output_s_largest_error(rng):
    """softmax's derivative shares one sum per row: held to the largest error of the whole
    output, so a row whose float32 sum happened to be exact is not held to zero."""
    ref = rng.standard_normal((50, 16))
    low = (ref + rng.standard_normal(ref.shape) * 1e-7).astype(np.float32)
    low[3] = ref[3]                                  # a row the float32 oracle got exactly
    got = ref + 1e-7
    assert elementwise_excess(got, ref, low, np.float32, scope="array") <= 1
    got[3, 5] += 1e-3
    assert elementwise_excess(got, ref, low, np.float32, scope="array") > 1
