"""cukernels.multi: the updates over lists of tensors do what the single-tensor updates do on
each tensor, bit for bit (numpy lists here; cupy lists, one launch, in the GPU tests below),
and its table sends every element to exactly one thread."""
import os

import numpy as np
import pytest

import cukernels as ck
from cases import UPDATES
from cukernels import multi, optim

#: tensor sizes of the lists: tails of every length around 16-byte packs and chunks
SIZES = (1, 3, 4, 5, 1000, 4097, multi.CHUNK - 1, multi.CHUNK + 5, 2 * multi.CHUNK)
SHAPES = [(s,) if k % 2 else (s, 1) for k, s in enumerate(SIZES)] + [(7, 3, 5)]


def _base(case):
    return case.name.split("[")[0]


def _lists(case, rng, dtype, shapes=SHAPES):
    """Per-tensor arguments of `case` for each shape, and the same arrays as lists (one list
    per array argument), with the shared scalars and keywords."""
    per = []
    for shape in shapes:
        args, kw = case.make(rng, int(np.prod(shape)), dtype)
        k = len(case.mutates)
        per.append([a.reshape(shape) for a in args[:k]])
        scalars = args[k:]
    return per, scalars, kw


def _copy(per, to=np.array):
    return [[to(a) for a in arrays] for arrays in per]


def _step(case, fn, tl, single, listed, prepared, scalars, kw):
    """One update of every tensor three ways: the single-tensor function on each, the list
    function, and TensorLists; the two list forms must give the single ones' bits."""
    for arrays in single:
        case.fn(*arrays, *scalars, **kw)
    fn(*[list(a) for a in zip(*listed)], *scalars, **kw)
    getattr(tl, _base(case))(*scalars, **kw)
    _assert_same_bits(listed, single)
    _assert_same_bits(prepared, single)


def _assert_same_bits(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        for j, (a, b) in enumerate(zip(g, w)):
            a = a.get() if hasattr(a, "get") else a
            b = b.get() if hasattr(b, "get") else b
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), \
                f"tensor {i}, array {j}: bits differ"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UPDATES, ids=lambda c: c.name)
def test_lists_on_the_cpu_are_the_single_updates_tensor_by_tensor(rng, case, dtype):
    per, scalars, kw = _lists(case, rng, dtype)
    single, listed, prepared = _copy(per), _copy(per), _copy(per)
    fn = getattr(multi, _base(case))
    tl = multi.TensorLists(*zip(*prepared))
    for step in (1, 2, 3):
        if "t" in kw:
            kw = {**kw, "t": step}
        _step(case, fn, tl, single, listed, prepared, scalars, kw)
        assert not any(a[0].any() for a in listed), "every delta is zeroed"


def _host_blocks(key, moments, chunk):
    """(table, chunk map) as the kernels read them, from the bytes made for the device."""
    host, table_bytes, total = multi._host_table(key, moments, chunk)
    table = host[:table_bytes].view(np.int64).reshape(-1, optim.MT_FIELDS)
    chunk_tensor = host[table_bytes:].view(np.int32)
    assert len(chunk_tensor) == total
    return table, chunk_tensor


@pytest.mark.parametrize("chunk", [4, 64, multi.CHUNK])
@pytest.mark.parametrize("moments", [0, 1, 2])
def test_the_table_sends_every_element_to_one_block(moments, chunk):
    """The blocks' ranges, worked out as the kernel does from the table, cover each tensor
    exactly once, and each row holds the addresses the kernel expects (unused moment
    columns repeat w's) with its alignment flag."""
    sizes = [1, 3, chunk, chunk + 1, 5 * chunk - 1, 17]
    key = [np.dtype(np.float32), 0]
    for i, n in enumerate(sizes):
        base = 1 << 20 + 4 * i
        key += [n] + [base + 2**16 * j + (4 if i == 2 and j == 1 else 0)
                      for j in range(2 + moments)]
    table, chunk_tensor = _host_blocks(tuple(key), moments, chunk)
    row = {k: i for i, k in enumerate(optim.MT_LAYOUT)}
    covered = [np.zeros(n, int) for n in sizes]
    for b, k in enumerate(chunk_tensor):
        e = table[k]
        start = (b - e[row["FIRST"]]) * chunk
        n = min(chunk, e[row["N"]] - start)
        assert 0 <= start and n > 0
        covered[k][start:start + n] += 1
    assert all((c == 1).all() for c in covered)
    for i, e in enumerate(table):
        addresses = key[2 + i * (3 + moments) + 1:2 + (i + 1) * (3 + moments)]
        assert e[row["D"]] == addresses[0] and e[row["W"]] == addresses[1]
        assert e[row["S1"]] == (addresses[2] if moments > 0 else addresses[1])
        assert e[row["S2"]] == (addresses[3] if moments > 1 else addresses[1])
        assert e[row["N"]] == sizes[i]
        assert e[row["VEC"]] == (i != 2)          # tensor 2's w lies 4 bytes off


@pytest.mark.parametrize("chunk", [0, 6, 1001, 4.0, True])
def test_a_chunk_that_would_break_alignment_is_an_error(chunk):
    key = (np.dtype(np.float32), 0, 8, 0, 64)
    with pytest.raises(ValueError, match="multi.CHUNK must be a positive multiple of 4"):
        multi._host_table(key, 0, chunk)


def test_bad_lists_are_errors_naming_them(rng):
    D = [rng.standard_normal(s).astype(np.float32) for s in ((3,), (4, 2))]
    W = [rng.standard_normal(s).astype(np.float32) for s in ((3,), (4, 2))]
    with pytest.raises(TypeError, match="weights must be a list or tuple"):
        multi.sgd_update(D, W[0], 2)
    with pytest.raises(ValueError, match="delta_weights is empty"):
        multi.sgd_update([], [], 2)
    with pytest.raises(ValueError, match="weights has 1 arrays, delta_weights has 2"):
        multi.sgd_update(D, W[:1], 2)
    with pytest.raises(ValueError, match=r"delta_weights\[1\] has shape \(4, 2\), expected "
                                         r"\(8,\)"):
        multi.sgd_update(D, [W[0], W[1].ravel()], 2)
    with pytest.raises(TypeError, match=r"weights\[1\] has dtype float64"):
        multi.sgd_update(D, [W[0], W[1].astype(np.float64)], 2)
    with pytest.raises(ValueError, match=r"weights\[0\] and weights\[1\] share memory"):
        multi.sgd_update([D[0], D[0].copy()], [W[0], W[0]], 2)
    with pytest.raises(ValueError, match=r"delta_weights\[1\] and momentum\[1\] share"):
        multi.momentum_update(D, W, [np.zeros(3, np.float32), D[1]], 2)
    with pytest.raises(ValueError, match=r"weights\[1\] must be C-contiguous"):
        multi.sgd_update(D, [W[0], np.asfortranarray(W[1].reshape(2, 4).T)], 2)
    with pytest.raises(ValueError, match="batch_size"):
        multi.sgd_update(D, W, 0)
    with pytest.raises(ValueError, match="beta"):
        multi.momentum_update(D, W, [np.zeros(3, np.float32), np.zeros((4, 2), np.float32)],
                              2, beta=1.0)
    with pytest.raises(ValueError, match="t .the step number"):
        multi.adam_update(D, W, [a * 0 for a in W], [a * 0 for a in W], 2)
    with pytest.raises(ValueError, match="variant"):
        multi.sgd_update(D, W, 2, variant="books")
    tl = multi.TensorLists(D, W, [a * 0 for a in W])
    with pytest.raises(ValueError, match=r"adam_update keeps 2 moment list\(s\) "
                                         r"\(momentum_m, momentum_v\); these TensorLists hold 1"):
        tl.adam_update(2, t=1)
    with pytest.raises(ValueError, match="sgd_update keeps 0"):
        tl.sgd_update(2)
    before = [w.copy() for w in W]
    with pytest.raises(ValueError, match="learning_rate"):
        tl.momentum_update(2, learning_rate=float("nan"))
    assert all(np.array_equal(a, b) for a, b in zip(W, before)), "a refused call changes nothing"


def test_the_package_exports_the_list_forms():
    assert ck.multi is multi
    for name in multi.MOMENTS:
        assert callable(getattr(multi, name)) and callable(getattr(multi.TensorLists, name))


# ---------------------------------------------------------------------- on the GPU
QUICK = bool(os.environ.get("CK_QUICK"))   # under compute-sanitizer: one chunk size


@pytest.mark.gpu
@pytest.mark.parametrize("chunk", [multi.CHUNK] if QUICK else [multi.CHUNK, 4 * multi.CHUNK])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", UPDATES, ids=lambda c: c.name)
def test_one_launch_is_the_single_kernels_bit_for_bit(cp, rng, monkeypatch, case, dtype,
                                                      chunk):
    """Lists of every tail size, one of them misaligned (a view one element into a buffer:
    the kernel's scalar path), over three steps of the function form and of TensorLists
    against the single-tensor kernel on each tensor."""
    monkeypatch.setattr(multi, "CHUNK", chunk)
    per, scalars, kw = _lists(case, rng, dtype)

    def to_gpu(a, i):
        if i != 3:
            return cp.asarray(a)
        buf = cp.empty(a.size + 1, a.dtype)
        view = buf[1:].reshape(a.shape)
        view[...] = cp.asarray(a)
        return view

    single = [[to_gpu(a, i) for a in arrays] for i, arrays in enumerate(per)]
    listed = [[to_gpu(a, i) for a in arrays] for i, arrays in enumerate(per)]
    prepared = [[to_gpu(a, i) for a in arrays] for i, arrays in enumerate(per)]
    fn = getattr(multi, _base(case))
    tl = multi.TensorLists(*zip(*prepared))
    for step in (1, 2, 3):
        if "t" in kw:
            kw = {**kw, "t": step}
        D = [rng.uniform(-3, 3, a[0].shape).astype(dtype) for a in per]
        for group in (single, listed, prepared):
            for arrays, d in zip(group, D):
                arrays[0][...] = cp.asarray(d)
        _step(case, fn, tl, single, listed, prepared, scalars, kw)
        assert all(int(cp.count_nonzero(a[0])) == 0 for a in listed)


@pytest.mark.gpu
def test_the_function_form_keeps_a_table_per_set_of_tensors(cp, rng):
    """A second call on the same tensors reuses the table; new tensors (new addresses) get
    their own, and the oldest tables go beyond CACHE_SIZE."""
    multi._TABLES.clear()
    W = [cp.asarray(rng.standard_normal(n).astype(np.float32)) for n in (5, 4097)]
    D = [cp.zeros_like(w) for w in W]
    multi.sgd_update(D, W, 1)
    multi.sgd_update(D, W, 1)
    assert len(multi._TABLES) == 1
    kept = []      # (alive, so that the pool hands out new addresses)
    for _ in range(multi.CACHE_SIZE + 2):
        kept.append(([cp.zeros_like(w) for w in W], [w.copy() for w in W]))
        multi.sgd_update(*kept[-1], 1)
    assert len(multi._TABLES) == multi.CACHE_SIZE
    assert (multi.CHUNK, multi._plain({"delta_weights": tuple(kept[-1][0]),
                                       "weights": tuple(kept[-1][1])}, 2)) in multi._TABLES


@pytest.mark.gpu
def test_gpu_lists_check_as_the_cpu_ones(cp, rng):
    W = [cp.asarray(rng.standard_normal(n).astype(np.float32)) for n in (5, 6)]
    D = [cp.zeros_like(w) for w in W]
    with pytest.raises(TypeError, match="numpy and cupy arrays are mixed"):
        multi.sgd_update(D, [W[0], W[1].get()], 1)
    with pytest.raises(ValueError, match=r"weights\[0\] and weights\[1\] share memory"):
        multi.sgd_update([D[0], cp.zeros(4, cp.float32)], [W[0], W[0][1:]], 1)
    with pytest.raises(ValueError, match=r"delta_weights\[1\] has shape"):
        multi.sgd_update([D[0], D[1][:5]], W, 1)
    with pytest.raises(TypeError, match=r"weights\[1\] has dtype float64"):
        multi.sgd_update(D, [W[0], W[1].astype(cp.float64)], 1)
