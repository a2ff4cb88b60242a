"""The weight updates over lists of tensors: one launch updates every tensor of a model.

Each function here takes lists (or tuples) where its namesake in cukernels.optim takes
arrays, element i of every list being one tensor with its delta and moments, and does what
that function would do called on each tensor in turn: the same maths, the same bits, D set
to zero. Tensors may differ in shape and size; all arrays of a call share one dtype
(float32 or float64) and one device, each is C-contiguous and as large as its weights, and
no two overlap. numpy lists run the numpy oracle, tensor by tensor (the CPU fallback).

On the GPU a call is one launch: a table of the tensors' addresses and sizes, on the
device, tells each block which chunk of which tensor it updates. The function form checks
every array on every call and keeps the table of the last few lists it met (keyed by their
addresses and sizes, so a table is made once per set of tensors). ``TensorLists`` checks
its lists once and keeps them and their table: its update methods then do no work per
tensor on the host, the form for a training loop over hundreds of tensors.
"""
from __future__ import annotations

import collections

import numpy as np

from . import checks, optim, oracle, runtime
from ._launch import BOOLS, CTYPES

#: elements per block of the list kernels (a multiple of 16 bytes' worth of either dtype,
#: so every chunk keeps its tensor's alignment). bench/multi.py sweeps it: on an H100, 4096
#: took 152 µs for Adam over 200 x 64K and 739 µs over 64 x 2^20, 16384 took 162 and 761,
#: 65536 took 159 and 784
CHUNK = 4096
#: threads per block of the list kernels
THREADS = 256
#: the parameters of optim.cu's *_multi kernels, in order: the launch passes positional
#: values, checked once against the kernel's declaration
MULTI_PARAMS = ("table", "chunk_tensor", "chunk", "batch", "lr", "beta1", "beta2", "l1", "l2",
                "eps", "c1", "c2")
#: tables kept by the function form (each a few bytes per tensor of device memory)
CACHE_SIZE = 8

#: moment lists each rule keeps, by name
MOMENTS = {"sgd_update": (), "momentum_update": ("momentum",),
           "adagrad_update": ("momentum",), "rmsprop_update": ("momentum",),
           "adadelta_update": ("momentum_w", "momentum_g"),
           "adam_update": ("momentum_m", "momentum_v")}
_NAMES = {(k, c, v): f"{k}_multi<{c},{BOOLS[v == 'book']}>" for k in MOMENTS
          for c in CTYPES for v in ("standard", "book")}
_ROW = {k: i for i, k in enumerate(optim.MT_LAYOUT)}


def _sequences(named):
    """The lists of `named` ({name: list}) as tuples, of one length >= 1; errors name them."""
    out = {}
    count = None
    for name, seq in named.items():
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"{name} must be a list or tuple of arrays, got "
                            f"{type(seq).__name__}")
        if count is None:
            count = len(seq)
            if not count:
                raise ValueError(f"{name} is empty; give at least one tensor")
        elif len(seq) != count:
            first = next(iter(named))
            raise ValueError(f"{name} has {len(seq)} arrays, {first} has {count}; one per "
                             "tensor in each list")
        out[name] = tuple(seq)
    return out, count


def _plain(seqs, count):
    """The common GPU call, checked with the least host work: every array a C-contiguous
    cupy array of one float dtype, each the shape of its weights, none overlapping another.
    Returns the table's key (dtype, device, then n and the addresses per tensor), or None
    for anything else (the general checks then decide, and word the errors)."""
    nd = checks.gpu_flat_type()
    weights = seqs["weights"]
    if nd is None or type(weights[0]) is not nd:
        return None
    dt = weights[0].dtype
    if dt not in checks.FLOAT_DTYPES:
        return None
    lists = list(seqs.values())
    device = runtime.cupy_module().cuda.runtime.getDevice()
    key = [dt, device]
    spans = []
    for i in range(count):
        w = weights[i]
        if type(w) is not nd or w.dtype is not dt or not w.size or not w._c_contiguous:
            return None
        shape, nbytes = w.shape, w.nbytes
        ptrs = []
        for seq in lists:
            a = seq[i]
            if type(a) is not nd or a.dtype is not dt or a.shape != shape or \
                    not a._c_contiguous:
                return None
            mem = a.data
            if mem.device_id != device:
                return None
            p = mem.ptr
            ptrs.append(p)
            spans.append((p, nbytes))
        key.append(w.size)
        key.extend(ptrs)
    spans.sort()
    for (a0, an), (b0, _) in zip(spans, spans[1:]):
        if b0 - a0 < an:
            return None
    return tuple(key)


def _checked(seqs, count):
    """The general checks of the lists (every error names the array, as weights[3]);
    returns (on the GPU, dtype)."""
    named = {f"{name}[{i}]": seq[i] for name, seq in seqs.items() for i in range(count)}
    xp = checks.backend(**named)
    dt = checks.check_array("weights[0]", seqs["weights"][0], ndim=None)
    if xp is not np:
        device = runtime.cupy_module().cuda.runtime.getDevice()
        for name, a in named.items():
            if a.data.device_id != device:
                raise ValueError(f"{name} is on device {a.data.device_id}, not on the current "
                                 f"device {device}; the lists' arrays must all be there")
    for i in range(count):
        w = seqs["weights"][i]
        checks.check_array(f"weights[{i}]", w, ndim=None, dtype=dt, dtype_of="weights[0]")
        checks.check_same(f"weights[{i}]", w,
                          **{f"{name}[{i}]": seq[i] for name, seq in seqs.items()})
    checks.check_distinct(**named)
    return xp is not np, dt


def _key(seqs, count, dt):
    """The table's key of checked cupy lists (as _plain makes it)."""
    key = [dt, runtime.cupy_module().cuda.runtime.getDevice()]
    lists = list(seqs.values())
    for i in range(count):
        key.append(seqs["weights"][i].size)
        key.extend(seq[i].data.ptr for seq in lists)
    return tuple(key)


def _host_table(key, moments, chunk):
    """The bytes of the device table of the tensors in `key` (their n and the addresses of
    D, w and the moments: MT_FIELDS words per tensor) followed by the chunk-to-tensor map
    (an int32 per block); returns (bytes, the table's share of them, blocks)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 4 or chunk % 4:
        raise ValueError(f"multi.CHUNK must be a positive multiple of 4 (16 bytes of float32, "
                         f"so that each chunk keeps its tensor's alignment), got {chunk!r}")
    nlists = 2 + moments
    rows = np.asarray(key[2:], dtype=np.int64).reshape(-1, 1 + nlists)
    count = len(rows)
    n = rows[:, 0]
    blocks = -(-n // chunk)
    total = int(blocks.sum())
    if total >= 2**31:
        raise ValueError(f"the tensors need {total} blocks of {chunk} elements; at most "
                         f"2^31 - 1")
    table = np.zeros((count, optim.MT_FIELDS), np.int64)
    addresses = rows[:, 1:]
    table[:, _ROW["D"]] = addresses[:, 0]
    table[:, _ROW["W"]] = addresses[:, 1]
    # (a rule's unused moment columns repeat w's address, as the single-tensor kernels take it)
    table[:, _ROW["S1"]] = addresses[:, 2] if moments > 0 else addresses[:, 1]
    table[:, _ROW["S2"]] = addresses[:, 3] if moments > 1 else addresses[:, 1]
    table[:, _ROW["N"]] = n
    table[:, _ROW["FIRST"]] = np.cumsum(blocks) - blocks
    table[:, _ROW["VEC"]] = (np.bitwise_or.reduce(addresses, axis=1) & 15) == 0
    chunk_tensor = np.repeat(np.arange(count, dtype=np.int32), blocks)
    host = np.concatenate((table.view(np.uint8).ravel(), chunk_tensor.view(np.uint8)))
    return host, table.nbytes, total


def _table(key, moments, chunk):
    """_host_table uploaded in one copy. Returns (the device array, the table's address,
    the map's address, blocks)."""
    host, table_bytes, total = _host_table(key, moments, chunk)
    buf = runtime.cupy_module().asarray(host)
    return buf, buf.data.ptr, buf.data.ptr + table_bytes, total


_TABLES: collections.OrderedDict = collections.OrderedDict()


def _cached_table(key, moments):
    """_table of `key`, kept for the next calls on the same tensors (CACHE_SIZE at most)."""
    full = (CHUNK, key)
    entry = _TABLES.get(full)
    if entry is None:
        entry = _TABLES[full] = _table(key, moments, CHUNK)
        while len(_TABLES) > CACHE_SIZE:
            _TABLES.popitem(last=False)
    else:
        _TABLES.move_to_end(full)
    return entry


def _apply(rule, lists, dt, entry, batch_size, variant, scalars, factors=None, **extra):
    """Check the scalars, then run `rule` over the tensors: one launch with the device table
    `entry`, or (entry None) the oracle tensor by tensor over `lists`. `factors`: Adam's
    check of its step and bias factors, after the other checks as in optim.adam_update."""
    checks.integer("batch_size", batch_size, min_value=1)
    checks.variant_of(variant)
    sc = optim.check_scalars(dt, scalars)
    c1, c2 = factors() if factors else (0.0, 0.0)
    if entry is None:
        one = getattr(oracle, rule)
        for arrays in zip(*lists):
            one(*arrays, batch_size, **scalars, **extra, variant=variant)
        return
    _, table, chunk_tensor, blocks = entry
    runtime.kernel("optim.cu", _NAMES[rule, optim._CTYPE[dt], variant],
                   MULTI_PARAMS).launch_values(
        (blocks,), (THREADS,),
        (table, chunk_tensor, CHUNK, *optim.kernel_scalars(batch_size, sc, c1, c2)))


class TensorLists:
    """Lists of tensors checked once, for updates called again and again.

    ``TensorLists(delta_weights, weights, *moments)``: the lists as the update functions of
    this module take them (no moments for SGD, one list for Momentum, AdaGrad and RMSProp,
    two for AdaDelta and Adam). The object keeps the arrays (so their memory stays theirs)
    and, on the GPU, their device table; each update method takes the scalars of its
    namesake and launches once, with no work per tensor on the host. The arrays' contents
    may change between calls; the arrays themselves may not be replaced.
    """

    def __init__(self, delta_weights, weights, *moments):
        named = {"delta_weights": delta_weights, "weights": weights}
        named.update({f"moments[{j}]": m for j, m in enumerate(moments)})
        seqs, self.count = _sequences(named)
        gpu, self.dtype = _checked(seqs, self.count)
        self.gpu = gpu
        self._seqs = tuple(seqs.values())
        self._tables = {}
        self._key = _key(seqs, self.count, self.dtype) if gpu else None

    def _entry(self, rule):
        """This rule's table on the device (made the first time), after checking that the
        object holds the moment lists the rule keeps."""
        want = MOMENTS[rule]
        have = len(self._seqs) - 2
        if have != len(want):
            raise ValueError(f"{rule} keeps {len(want)} moment list(s) "
                             f"({', '.join(want) or 'none'}); these TensorLists hold {have}")
        if not self.gpu:
            return None
        entry = self._tables.get((rule, CHUNK))
        if entry is None:
            entry = self._tables[rule, CHUNK] = _table(self._key, have, CHUNK)
        return entry

    def _update(self, rule, batch_size, variant, scalars, factors=None, **extra):
        """Run `rule` over every tensor (_apply): one launch on the GPU, the oracle tensor by
        tensor on the CPU."""
        _apply(rule, self._seqs, self.dtype, self._entry(rule), batch_size, variant, scalars,
               factors, **extra)

    def sgd_update(self, batch_size, learning_rate=3e-4, lambda1=0.0, lambda2=0.0, *,
                   variant="standard"):
        """cukernels.optim.sgd_update on every tensor."""
        self._update("sgd_update", batch_size, variant, {
            "learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2})

    def momentum_update(self, batch_size, learning_rate=3e-4, beta=0.9, lambda1=0.0,
                        lambda2=0.0, *, variant="standard"):
        """cukernels.optim.momentum_update on every tensor."""
        self._update("momentum_update", batch_size, variant, {
            "learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
            "lambda2": lambda2})

    def adagrad_update(self, batch_size, learning_rate=3e-4, lambda1=0.0, lambda2=0.0, *,
                       variant="standard", eps=1e-10):
        """cukernels.optim.adagrad_update on every tensor."""
        self._update("adagrad_update", batch_size, variant, {
            "learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2,
            "eps": eps})

    def rmsprop_update(self, batch_size, learning_rate=3e-4, beta=0.9, lambda1=0.0,
                       lambda2=0.0, *, variant="standard", eps=1e-8):
        """cukernels.optim.rmsprop_update on every tensor."""
        self._update("rmsprop_update", batch_size, variant, {
            "learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
            "lambda2": lambda2, "eps": eps})

    def adadelta_update(self, batch_size, beta1=0.9, beta2=0.999, lambda1=0.0, lambda2=0.0,
                        *, variant="standard", learning_rate=1.0, eps=1e-6):
        """cukernels.optim.adadelta_update on every tensor."""
        self._update("adadelta_update", batch_size, variant, {
            "beta1": beta1, "beta2": beta2, "lambda1": lambda1, "lambda2": lambda2,
            "learning_rate": learning_rate, "eps": eps})

    def adam_update(self, batch_size, learning_rate=3e-4, beta1=0.9, beta2=0.999,
                    lambda1=0.0, lambda2=0.0, *, t=None, variant="standard", eps=1e-8):
        """cukernels.optim.adam_update on every tensor (t, the step, as there)."""
        self._update("adam_update", batch_size, variant, {
            "learning_rate": learning_rate, "beta1": beta1, "beta2": beta2,
            "lambda1": lambda1, "lambda2": lambda2, "eps": eps},
            lambda: optim.adam_factors(variant, learning_rate, beta1, beta2, t), t=t)


def _call(rule, named, batch_size, variant, scalars, factors=None, **extra):
    """The function form: check the lists (every call), then _apply: one launch with the
    cached table of these tensors, or the oracle tensor by tensor for numpy lists."""
    seqs, count = _sequences(named)
    key = _plain(seqs, count)
    entry = None
    if key is None:
        gpu, dt = _checked(seqs, count)
        if gpu:
            key = _key(seqs, count, dt)
    if key is not None:
        dt = key[0]
        entry = _cached_table(key, len(MOMENTS[rule]))
    _apply(rule, seqs.values(), dt, entry, batch_size, variant, scalars, factors, **extra)


def sgd_update(delta_weights, weights, batch_size, learning_rate=3e-4, lambda1=0.0,
               lambda2=0.0, *, variant="standard"):
    """cukernels.optim.sgd_update over lists of tensors, in one launch."""
    _call("sgd_update", {"delta_weights": delta_weights, "weights": weights}, batch_size,
          variant, {"learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2})


def momentum_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                    lambda1=0.0, lambda2=0.0, *, variant="standard"):
    """cukernels.optim.momentum_update over lists of tensors, in one launch."""
    _call("momentum_update", {"delta_weights": delta_weights, "weights": weights,
                              "momentum": momentum}, batch_size, variant,
          {"learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
           "lambda2": lambda2})


def adagrad_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-10):
    """cukernels.optim.adagrad_update over lists of tensors, in one launch."""
    _call("adagrad_update", {"delta_weights": delta_weights, "weights": weights,
                             "momentum": momentum}, batch_size, variant,
          {"learning_rate": learning_rate, "lambda1": lambda1, "lambda2": lambda2, "eps": eps})


def rmsprop_update(delta_weights, weights, momentum, batch_size, learning_rate=3e-4, beta=0.9,
                   lambda1=0.0, lambda2=0.0, *, variant="standard", eps=1e-8):
    """cukernels.optim.rmsprop_update over lists of tensors, in one launch."""
    _call("rmsprop_update", {"delta_weights": delta_weights, "weights": weights,
                             "momentum": momentum}, batch_size, variant,
          {"learning_rate": learning_rate, "beta": beta, "lambda1": lambda1,
           "lambda2": lambda2, "eps": eps})


def adadelta_update(delta_weights, weights, momentum_w, momentum_g, batch_size, beta1=0.9,
                    beta2=0.999, lambda1=0.0, lambda2=0.0, *, variant="standard",
                    learning_rate=1.0, eps=1e-6):
    """cukernels.optim.adadelta_update over lists of tensors, in one launch."""
    _call("adadelta_update", {"delta_weights": delta_weights, "weights": weights,
                              "momentum_w": momentum_w, "momentum_g": momentum_g},
          batch_size, variant,
          {"beta1": beta1, "beta2": beta2, "lambda1": lambda1, "lambda2": lambda2,
           "learning_rate": learning_rate, "eps": eps})


def adam_update(delta_weights, weights, momentum_m, momentum_v, batch_size, learning_rate=3e-4,
                beta1=0.9, beta2=0.999, lambda1=0.0, lambda2=0.0, *, t=None,
                variant="standard", eps=1e-8):
    """cukernels.optim.adam_update over lists of tensors, in one launch."""
    _call("adam_update", {"delta_weights": delta_weights, "weights": weights,
                          "momentum_m": momentum_m, "momentum_v": momentum_v},
          batch_size, variant,
          {"learning_rate": learning_rate, "beta1": beta1, "beta2": beta2, "lambda1": lambda1,
           "lambda2": lambda2, "eps": eps},
          lambda: optim.adam_factors(variant, learning_rate, beta1, beta2, t), t=t)


__all__ = ["TensorLists", "sgd_update", "momentum_update", "adagrad_update", "rmsprop_update",
           "adadelta_update", "adam_update", "CHUNK"]
