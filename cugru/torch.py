"""cugru.torch: torch.nn.GRU's drop-in on cugru's kernels.

    from cugru.torch import GRU          # in place of torch.nn.GRU
    gru = GRU(128, 256, num_layers=2, bidirectional=True).cuda()

``GRU`` takes nn.GRU's constructor arguments and has its parameters (names, shapes,
initialisation), so state dicts move both ways, and its ``forward(input, hx=None)``: a
Tensor (T, B, I), (B, T, I) with batch_first, or (T, I) unbatched, or a PackedSequence, in;
the same kind out, with h_n. CUDA tensors run cugru's kernels on torch's current stream,
on the tensors' own memory (no copy), and what cugru allocates in a call comes from torch's
caching allocator; CPU tensors run the numpy oracle (so torch.autograd.gradcheck runs in
float64 on the CPU). float32 and float64.

Each layer is one call of the operator ``torch.ops.cugru.gru_layer`` (its backward
``torch.ops.cugru.gru_layer_backward``), registered with torch.library with its autograd
formula and its shapes for tracing ("fake" tensors), so that torch.compile traces through
it without a graph break. Eager calls run the same passes through a plain
torch.autograd.Function with two outputs, which keeps the forward's GruSaved for its
backward pass and costs the host less per call (_eager_forward).

Keyword arguments beyond nn.GRU's: ``quant`` (a cugru.QuantSpec: quantization-aware
training of every layer) and ``path`` (cugru's plan choice, "auto" by default).

torch is imported here only: ``import cugru`` does not import it.
"""
from __future__ import annotations

import copy
import math
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import rnn as rnn_utils

from . import _args, oracle
from .gru import gru_backward, gru_forward
from .quant import QuantSpec
from .saved import GruSaved

_DTYPES = (torch.float32, torch.float64)


# ------------------------------------------------------------------ the operator's pieces
def _spec_to_list(spec: Optional[QuantSpec]) -> Optional[List[float]]:
    """A QuantSpec as the operator's list of floats (exact: its scales are float32 values)."""
    if spec is None:
        return None
    out = [float(spec.weight_bits), float(spec.gates)]
    for qp in (spec.x_qparams, spec.h_qparams):
        out += [0.0, 0.0, 0.0, 0.0, 0.0] if qp is None else [1.0, *map(float, qp)]
    return out


def _list_to_spec(values: Optional[List[float]]) -> Optional[QuantSpec]:
    if values is None:
        return None

    def grid(v):
        return None if not v[0] else (v[1], int(v[2]), int(v[3]), int(v[4]))
    return QuantSpec(int(values[0]), grid(values[2:7]), grid(values[7:12]), bool(values[1]))


#: the dtypes that move between torch and CuPy arrays
_PAIRS = ((torch.float32, np.float32), (torch.float64, np.float64), (torch.float16, np.float16),
          (torch.int8, np.int8), (torch.uint8, np.uint8), (torch.int32, np.int32),
          (torch.int64, np.int64), (torch.bool, np.bool_))
_NP = {t: np.dtype(n) for t, n in _PAIRS}
_TORCH = {np.dtype(n): t for t, n in _PAIRS}


class _Place:
    """CuPy's objects for one CUDA device and one torch stream on it, made once (_place)."""
    __slots__ = ("cp", "index", "device", "stream")

    def __init__(self, cp, index, stream):
        self.cp, self.index, self.stream = cp, index, stream
        self.device = torch.device("cuda", index)


_PLACES: dict = {}
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _place(device) -> _Place:
    """The _Place of torch's current stream on `device`."""
    from cukernels import runtime
    index = device.index if device.index is not None else torch.cuda.current_device()
    ptr = _raw_stream(index) if _raw_stream is not None else \
        torch.cuda.current_stream(index).cuda_stream
    place = _PLACES.get((index, ptr))
    if place is None:
        cp = runtime.cupy_module()
        if cp is None:
            raise RuntimeError("cugru.torch: CUDA tensors need CuPy (pip install "
                               "cupy-cuda12x or cupy-cuda13x)")
        current = torch.cuda.current_stream(index)
        try:        # (the CUDA stream protocol, where CuPy and torch both have it)
            stream = cp.cuda.Stream.from_external(current)
        except (AttributeError, TypeError, ValueError):
            stream = cp.cuda.ExternalStream(current.cuda_stream, index)
        place = _PLACES[index, ptr] = _Place(cp, index, stream)
    return place


class _OnDevice:
    """One call's CuPy context: the tensor's device and torch's current stream there (a CuPy
    stream made once per torch stream), so cugru's launches queue behind torch's work with
    no sync; and the memory from torch's caching allocator, so that torch accounts for it
    and a result is a tensor from the start: cugru's results (cukernels.runtime.empty) are
    made as torch tensors of their shape and dtype, CuPy's other allocations in the block
    as uint8 tensors."""
    __slots__ = ("cp", "index", "device", "made", "_stream", "_restore")

    def __init__(self, device):
        place = _place(device)
        self.cp, self.index, self.device = place.cp, place.index, place.device
        self._stream = place.stream
        self.made = {}          # data pointer -> the tensor allocated there in this call

    def __enter__(self):
        from cukernels import runtime
        cp = self.cp
        previous = cp.cuda.runtime.getDevice()
        # (the launches go through the driver API, which needs the device's context current
        # on this thread: autograd runs backward on a thread of its own, where no CUDA call
        # may have made it current yet; so set it even where it is the current device)
        cp.cuda.runtime.setDevice(self.index)
        self._stream.__enter__()
        # (what undoes the settings refers to nothing that refers back to this object: a
        # cycle would keep the call's tensors, `made`, alive until the garbage collector
        # runs)
        try:
            undo_alloc = _allocator_set(cp, self._allocate)
        except BaseException:
            self._stream.__exit__(None, None, None)
            raise
        self._restore = (previous, undo_alloc, runtime.made_by(self._make))
        return self

    def __exit__(self, *exc):
        previous, undo_alloc, undo_maker = self._restore
        self._restore = None
        undo_maker()
        undo_alloc()
        self._stream.__exit__(None, None, None)
        if previous != self.index:
            self.cp.cuda.runtime.setDevice(previous)
        return False

    def _allocate(self, size):
        t = torch.empty(size, dtype=torch.uint8, device=self.device)
        ptr = t.data_ptr()
        self.made[ptr] = t
        cp = self.cp
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, size, t, self.index), 0)

    def _make(self, shape, dtype):
        dt = np.dtype(dtype)
        tdt = _TORCH.get(dt)
        if tdt is None:
            return self.cp.ndarray(shape, dt)       # (through _allocate)
        return self._on(torch.empty(shape, dtype=tdt, device=self.device), shape, dt)

    def _on(self, t, shape, dt):
        """A cupy array of `shape` on tensor t's memory (keeping t alive), recorded as made
        in this call."""
        ptr = t.data_ptr()
        self.made[ptr] = t
        cp = self.cp
        mem = cp.cuda.UnownedMemory(ptr, t.nbytes, t, self.index)
        return cp.ndarray(shape, dt, cp.cuda.MemoryPointer(mem, 0))

    def arr(self, t):
        """A contiguous CUDA tensor as a cupy array on its memory (no copy; the array keeps
        the tensor alive). Built from its address: DLPack's export costs the host several
        times more (it queries torch's streams on every call)."""
        if t is None:
            return None
        if not t.is_cuda or t.device.index != self.index or not t.is_contiguous():
            raise ValueError(f"cugru.torch: a tensor on {t.device} (contiguous: "
                             f"{t.is_contiguous()}) where a contiguous tensor on cuda:"
                             f"{self.index} is needed")
        dt = _NP.get(t.dtype)
        if dt is None:
            raise TypeError(f"cugru.torch: a {t.dtype} tensor where cugru takes "
                            f"{', '.join(str(k) for k in _NP)}")
        cp = self.cp
        mem = cp.cuda.UnownedMemory(t.data_ptr(), t.nbytes, t, self.index)
        return cp.ndarray(tuple(t.shape), dt, cp.cuda.MemoryPointer(mem, 0))

    def unowned(self, a):
        """`a` (C-contiguous) as an array on the same memory that keeps nothing alive."""
        cp = self.cp
        mem = cp.cuda.UnownedMemory(a.data.ptr, a.nbytes, None, self.index)
        return cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0))

    def tensor(self, a, apart=False):
        """A C-contiguous cupy array made in this block as a tensor: the tensor it was made
        as, or one set on the storage of the allocation it lies in (not a view: a user may
        change a result in place, y += skip, which torch refuses for a view that an autograd
        Function returns); `apart`, or an array made elsewhere: through DLPack (a storage
        of its own: the registered operator's results may not alias each other)."""
        if a is None:
            return None
        tdt = _TORCH[a.dtype]
        if a.size == 0:
            return torch.empty(a.shape, dtype=tdt, device=self.device)
        t = self.made.get(a.data.ptr)
        if t is not None and t.dtype is tdt and t.shape == a.shape:
            return t
        owner = self.made.get(a.data.mem.ptr)
        if apart or owner is None or not a.flags.c_contiguous:
            return torch.from_dlpack(a)
        return torch.empty(0, dtype=tdt, device=self.device).set_(
            owner.untyped_storage(), (a.data.ptr - a.data.mem.ptr) // a.itemsize, a.shape)


def _allocator_set(cp, allocate):
    """Make `allocate` CuPy's allocator on this thread; returns the function that undoes it
    (CuPy's thread-local setters where it has them: its context manager costs more)."""
    mem = cp.cuda.memory
    get = getattr(mem, "_get_thread_local_allocator", None)
    put = getattr(mem, "_set_thread_local_allocator", None)
    if get is not None and put is not None:
        previous = get()
        put(allocate)
        return lambda: put(previous)
    block = cp.cuda.using_allocator(allocate)
    block.__enter__()
    return lambda: block.__exit__(None, None, None)


def _tensor(a):
    """A numpy array as a tensor, sharing its memory."""
    return None if a is None else torch.from_numpy(a)


def _lengths(lengths: Optional[Tensor]):
    return None if lengths is None else lengths.detach().cpu().numpy()


def _host(t):
    return None if t is None else t.detach().numpy()


def _stacked(xp, weights, D, kinds=4):
    """The first `kinds` of the layer's (w_ih, w_hh, b_ih, b_hh) in cugru's form from the
    parameters (w_ih, w_hh, b_ih, b_hh of each direction in turn): one direction as given
    (cugru takes weights without the direction axis), two stacked (copies)."""
    if D == 1:
        return list(weights[:kinds])
    return [xp.stack((weights[k], weights[4 + k])) for k in range(kinds)]


def _unstacked(grads, D):
    """The weight gradients per parameter, in the parameters' order (see _stacked)."""
    if D == 1:
        return list(grads)
    return [g[d] for d in range(2) for g in grads]


def _run_forward(on, x, h0, weights, lengths, D, training, spec, path):
    """cugru's forward call on one layer's tensors: (y, h_n, GruSaved or None) as arrays,
    cupy ones within `on` (an entered _OnDevice), or the oracle's where `on` is None."""
    kw = dict(bidirectional=D == 2, training=training, quant=spec, lengths=_lengths(lengths),
              path=path)
    if on is None:
        w = _stacked(np, [_host(t) for t in weights], D)
        return oracle.gru_forward(_host(x), _host(h0), *w, **kw)
    w = _stacked(on.cp, [on.arr(t) for t in weights], D)
    return gru_forward(on.arr(x), on.arr(h0), *w, **kw)


def _layer_forward(x, h0, weights, lengths, bidirectional, training, quant, path="auto"):
    """One layer's forward pass on tensors: (y, h_n, hs, gates, x_q, w_ih_q, w_hh_q); the
    history (hs, gates) and the quantized operands are empty tensors where the pass keeps
    none (x_q also where x is not quantized: the backward pass then takes x itself)."""
    spec = _list_to_spec(quant)
    D = 2 if bidirectional else 1
    if x.is_cuda:
        with _OnDevice(x.device) as on:
            return _forward_results(x, spec, on.tensor, *_run_forward(
                on, x, h0, weights, lengths, D, training, spec, path))
    return _forward_results(x, spec, _tensor, *_run_forward(
        None, x, h0, weights, lengths, D, training, spec, path))


def _forward_results(x, spec, tensor, y, h_n, saved):
    """_layer_forward's results as tensors (`tensor` converts an array)."""
    none = lambda: x.new_empty(0)  # noqa: E731  (outputs must not alias each other)
    if saved is None:
        return (tensor(y), tensor(h_n)) + tuple(none() for _ in range(5))
    hist = (tensor(y), tensor(h_n), tensor(saved.hs), tensor(saved.gates))
    if spec is None:
        return hist + (none(), none(), none())
    x_q = tensor(saved.x) if spec.x_qparams is not None else none()
    return hist + (x_q, tensor(saved.w_ih), tensor(saved.w_hh))


def _layer_backward(dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates, x_real, h0_real,
                    lengths, bidirectional, quant, path="auto", apart=False):
    """One layer's backward pass from what _layer_forward kept, with the parameters as given
    (their quantized copies w_ih_q, w_hh_q for a quantization-aware pass): [dx, dh0, then
    the parameters' gradients in their order]. The weight gradients lie in one allocation;
    `apart`: each tensor gets a storage of its own (the registered operator's results may
    not alias each other)."""
    spec = _list_to_spec(quant)
    D = 2 if bidirectional else 1
    if x.is_cuda:
        with _OnDevice(x.device) as on:
            return _backward_with(on.cp, on.arr, lambda a: on.tensor(a, apart),
                                  dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates, x_real,
                                  h0_real, lengths, D, spec, path)
    return _backward_with(np, _host, _tensor, dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates,
                          x_real, h0_real, lengths, D, spec, path)


def _backward_with(xp, arr, tensor, dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates, x_real,
                   h0_real, lengths, D, spec, path):
    """_layer_backward on the arrays `arr` makes of the tensors (numpy or cupy: `xp`), the
    results made tensors by `tensor`."""
    T, B, _ = x.shape
    if spec is None:
        w_ih, w_hh = _stacked(xp, [arr(t) for t in weights], D, kinds=2)
    else:
        w_ih, w_hh = arr(w_ih_q), arr(w_hh_q)
    # (the history keeps the weights with their direction axis; D = 1 gives gradients
    # without it, as the parameters are)
    saved = GruSaved(arr(x), w_ih.reshape(D, *w_ih.shape[-2:]),
                     w_hh.reshape(D, *w_hh.shape[-2:]), arr(hs), arr(gates), D == 1, spec,
                     arr(x_real), arr(h0_real), _args.check_lengths(_lengths(lengths), T, B, xp))
    run = gru_backward if xp is not np else oracle.gru_backward
    dx, dh0, *dw = run(arr(dy), arr(dh_n), saved, path=path)
    return [tensor(dx), tensor(dh0)] + [tensor(g) for g in _unstacked(dw, D)]


# ------------------------------------------------------------ the registered operator
@torch.library.custom_op("cugru::gru_layer", mutates_args=())
def gru_layer(x: Tensor, h0: Optional[Tensor], weights: List[Tensor],
              lengths: Optional[Tensor], bidirectional: bool, training: bool,
              quant: Optional[List[float]], path: str) -> Tuple[Tensor, Tensor, Tensor, Tensor,
                                                                Tensor, Tensor, Tensor]:
    """One GRU layer: x (T, B, I), h0 (D, B, H) or None, `weights` the parameters w_ih
    (3H, I), w_hh (3H, H), b_ih, b_hh (3H) of each direction in turn; returns y, h_n and
    what the backward pass needs (see _layer_forward)."""
    return _layer_forward(x, h0, weights, lengths, bidirectional, training, quant, path)


@gru_layer.register_fake
def _(x, h0, weights, lengths, bidirectional, training, quant, path):
    T, B, I = x.shape
    D, H = 2 if bidirectional else 1, weights[1].shape[1]
    none = lambda: x.new_empty(0)  # noqa: E731
    y, h_n = x.new_empty(T, B, D * H), x.new_empty(D, B, H)
    if not training:
        return (y, h_n) + tuple(none() for _ in range(5))
    hist = (y, h_n, x.new_empty(D, T + 1, B, H), x.new_empty(D, T, B, 4 * H))
    spec = _list_to_spec(quant)
    if spec is None:
        return hist + (none(), none(), none())
    x_q = x.new_empty(T, B, I) if spec.x_qparams is not None else none()
    return hist + (x_q, x.new_empty(D, 3 * H, I), x.new_empty(D, 3 * H, H))


@torch.library.custom_op("cugru::gru_layer_backward", mutates_args=())
def gru_layer_backward(dy: Tensor, dh_n: Optional[Tensor], x: Tensor, weights: List[Tensor],
                       w_ih_q: Tensor, w_hh_q: Tensor, hs: Tensor, gates: Tensor,
                       x_real: Optional[Tensor], h0_real: Optional[Tensor],
                       lengths: Optional[Tensor], bidirectional: bool,
                       quant: Optional[List[float]], path: str) -> List[Tensor]:
    """The gradients of gru_layer: [dx, dh0, then one per parameter of `weights`]."""
    return _layer_backward(dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates, x_real, h0_real,
                           lengths, bidirectional, quant, path, apart=True)


@gru_layer_backward.register_fake
def _(dy, dh_n, x, weights, w_ih_q, w_hh_q, hs, gates, x_real, h0_real, lengths,
      bidirectional, quant, path):
    D, H = 2 if bidirectional else 1, weights[1].shape[1]
    return [x.new_empty(x.shape), x.new_empty(D, x.shape[1], H)] + \
        [w.new_empty(w.shape) for w in weights]


def _saved(x, h0, weights, lengths, quant, output):
    """What the backward pass keeps: x as the pass used it, the parameters, their quantized
    copies (or empty tensors), hs, gates, x and h0 as given for a quantization-aware pass
    (else None), lengths."""
    y, h_n, hs, gates, x_q, w_ih_q, w_hh_q = output
    if quant is None:
        return (x, w_ih_q, w_hh_q, hs, gates, None, None, lengths, *weights)
    return (x_q if x_q.numel() else x, w_ih_q, w_hh_q, hs, gates, x, h0, lengths, *weights)


def _setup(ctx, inputs, output):
    x, h0, weights, lengths, bidirectional, training, quant, path = inputs
    ctx.save_for_backward(*_saved(x, h0, weights, lengths, quant, output))
    ctx.quant, ctx.bidirectional, ctx.path = quant, bidirectional, path
    ctx.has_h0, ctx.y_shape = h0 is not None, output[0].shape
    ctx.mark_non_differentiable(*output[2:])
    # (an output without a gradient comes to backward as None, not as zeros filled for it:
    # the history's would be the size of the history)
    ctx.set_materialize_grads(False)


def _backward(ctx, dy, dh_n, *history):
    x, w_ih_q, w_hh_q, hs, gates, x_real, h0_real, lengths, *weights = ctx.saved_tensors
    if dy is None:
        dy = x.new_zeros(ctx.y_shape)
    dx, dh0, *dw = gru_layer_backward(
        dy.contiguous(), None if dh_n is None else dh_n.contiguous(), x, weights, w_ih_q,
        w_hh_q, hs, gates, x_real, h0_real, lengths, ctx.bidirectional, ctx.quant, ctx.path)
    return dx, dh0 if ctx.has_h0 else None, dw, None, None, None, None, None


gru_layer.register_autograd(_backward, setup_context=_setup)


#: the fields of a GruSaved that may lie on a tensor the eager Function saves
_ON_TENSORS = ("x", "w_ih", "w_hh", "hs", "gates", "x_real", "h0_real")


def _eager_forward(ctx, x, h0, weights, lengths, D, spec, path):
    """The eager Function's forward: y and h_n, with what the backward pass needs in ctx.

    The GruSaved of the call is kept in ctx, with its arrays made once: the backward pass
    builds none. Its arrays on tensors (x, the parameters, the history, the quantized
    operands) keep nothing alive; those tensors go through save_for_backward, so torch
    decides their lifetime (freed after backward), checks them for changes in place and
    applies saved-tensor hooks; the backward pass checks that they come back at the same
    addresses (else it makes the arrays anew on what comes back)."""
    keep = [x, h0, *weights]
    if not x.is_cuda:
        y, h_n, saved = _run_forward(None, x, h0, weights, lengths, D, True, spec, path)
        ctx.save_for_backward(*keep)
        ctx.saved, ctx.fields = saved, ()
        return _tensor(y), _tensor(h_n)
    with _OnDevice(x.device) as on:
        y, h_n, saved = _run_forward(on, x, h0, weights, lengths, D, True, spec, path)
        y, h_n = on.tensor(y), on.tensor(h_n)
        ptrs = {t.data_ptr(): i for i, t in enumerate(keep) if t is not None}
        fields = []
        for name in _ON_TENSORS:
            a = getattr(saved, name)
            if a is None or not a.flags.c_contiguous or a.size == 0:
                continue
            i = ptrs.get(a.data.ptr)
            if i is None or keep[i].nbytes != a.nbytes:
                t = on.made.get(a.data.ptr)
                if t is None or t.nbytes != a.nbytes:
                    continue        # (a copy made here: the GruSaved keeps it)
                i = len(keep)
                keep.append(t)
                ptrs[t.data_ptr()] = i
            fields.append((name, i, a.shape, a.dtype))
            setattr(saved, name, on.unowned(a))
    ctx.save_for_backward(*keep)
    ctx.saved, ctx.fields = saved, fields
    ctx.ptrs = [0 if t is None else t.data_ptr() for t in keep]
    return y, h_n


def _eager_backward(ctx, dy, dh_n):
    """The eager Function's backward: dx, dh0, [the parameters' gradients]."""
    tensors = ctx.saved_tensors      # (torch's checks: freed, or changed in place)
    x, saved, D = tensors[0], ctx.saved, ctx.D
    if dy is None:
        dy = torch.zeros(ctx.y_shape, dtype=x.dtype, device=x.device)
    dy = dy.contiguous()
    dh_n = None if dh_n is None else dh_n.contiguous()
    if not x.is_cuda:
        dx, dh0, *dw = oracle.gru_backward(_host(dy), _host(dh_n), saved, path=ctx.path)
        return _tensor(dx), _tensor(dh0), [_tensor(g) for g in _unstacked(dw, D)]
    with _OnDevice(x.device) as on:
        moved = [f for f in ctx.fields if tensors[f[1]].data_ptr() != ctx.ptrs[f[1]]]
        if moved:           # (saved-tensor hooks gave other tensors: arrays on those)
            saved = copy.copy(saved)
            for name, i, shape, dtype in moved:
                t = tensors[i].contiguous().view(_TORCH[dtype])   # (CuPy's allocations: uint8)
                setattr(saved, name, on.arr(t).reshape(shape))
        dx, dh0, *dw = gru_backward(on.arr(dy), on.arr(dh_n), saved, path=ctx.path)
        return on.tensor(dx), on.tensor(dh0), [on.tensor(g) for g in _unstacked(dw, D)]


class _EagerLayer(torch.autograd.Function):
    """gru_layer's autograd through torch.autograd.Function, for eager mode: less host work
    per call than the registered operator's dispatch, two outputs (y, h_n) and the history
    in ctx (_eager_forward). The parameters come last, one argument each (a Function
    tracks tensors passed as arguments only)."""

    @staticmethod
    def forward(ctx, x, h0, lengths, D, quant, path, *weights):
        y, h_n = _eager_forward(ctx, x, h0, weights, lengths, D, quant, path)
        ctx.D, ctx.path, ctx.has_h0, ctx.y_shape = D, path, h0 is not None, y.shape
        # (an output without a gradient comes to backward as None, not as zeros)
        ctx.set_materialize_grads(False)
        return y, h_n

    @staticmethod
    def backward(ctx, dy, dh_n):
        dx, dh0, dw = _eager_backward(ctx, dy, dh_n)
        return (dx, dh0 if ctx.has_h0 else None, None, None, None, None, *dw)


def _infer(x, h0, weights, lengths, D, quant, path):
    """(y, h_n) of one layer with no history kept (no autograd)."""
    if not x.is_cuda:
        y, h_n, _ = _run_forward(None, x, h0, weights, lengths, D, False, quant, path)
        return _tensor(y), _tensor(h_n)
    with _OnDevice(x.device) as on:
        y, h_n, _ = _run_forward(on, x, h0, weights, lengths, D, False, quant, path)
        return on.tensor(y), on.tensor(h_n)


def layer(x, h0, weights, lengths=None, bidirectional=False, training=True, quant=None,
          path="auto"):
    """(y, h_n) of one layer, differentiable when `training`: `weights` the parameters
    (w_ih, w_hh, b_ih, b_hh of each direction in turn, contiguous); `path` cugru's plan;
    the registered operator under torch.compile, else the eager Function (or, without
    `training`, the forward call alone)."""
    D = 2 if bidirectional else 1
    if torch.compiler.is_compiling():
        out = gru_layer(x, h0, list(weights), lengths, bidirectional, training,
                        _spec_to_list(quant), path)
        return out[0], out[1]
    if not training:
        return _infer(x, h0, weights, lengths, D, quant, path)
    return _EagerLayer.apply(x, h0, lengths, D, quant, path, *weights)


# ------------------------------------------------------------------------------ the module
class GRU(nn.Module):
    """torch.nn.GRU on cugru's kernels (see the module's doc). Arguments as nn.GRU's, and
    quant (a cugru.QuantSpec, or None) and path (cugru's plan: "auto", "fast", "steps",
    "small", "resident")."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None, *, quant=None,
                 path="auto"):
        super().__init__()
        for name, v, low in (("input_size", input_size, 1), ("hidden_size", hidden_size, 1),
                             ("num_layers", num_layers, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or \
                not 0 <= dropout <= 1:
            raise ValueError(f"dropout must be a number in [0, 1], got {dropout!r}")
        if quant is not None and not isinstance(quant, QuantSpec):
            raise TypeError(f"quant must be a cugru.QuantSpec or None, got "
                            f"{type(quant).__name__}")
        self.path = _args.check_path(path)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.quant = bool(bidirectional), quant
        self.mode = "GRU"
        D, G = 2 if bidirectional else 1, 3 * hidden_size
        self._names = []
        for k in range(num_layers):
            size_in = input_size if k == 0 else hidden_size * D
            for sfx in ("", "_reverse")[:D]:
                shapes = {f"weight_ih_l{k}{sfx}": (G, size_in),
                          f"weight_hh_l{k}{sfx}": (G, hidden_size)}
                if bias:
                    shapes.update({f"bias_ih_l{k}{sfx}": (G,), f"bias_hh_l{k}{sfx}": (G,)})
                for name, shape in shapes.items():
                    self.register_parameter(
                        name, nn.Parameter(torch.empty(shape, device=device, dtype=dtype)))
                    self._names.append(name)
        self.reset_parameters()

    def reset_parameters(self):
        """nn.GRU's initialisation: every parameter uniform in +-1/sqrt(hidden_size)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for w in self.parameters():
            nn.init.uniform_(w, -bound, bound)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        for name, default in (("num_layers", 1), ("bias", True), ("batch_first", False),
                              ("dropout", 0.0), ("bidirectional", False), ("quant", None)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s

    def _layer_weights(self, k, D, params=None):
        """Layer k's parameters, w_ih, w_hh, b_ih, b_hh of each direction in turn (zeros
        for the biases with bias=False), contiguous; `params`: the module's parameters in
        their order, where the caller has them."""
        if params is None:
            params = [getattr(self, name) for name in self._names]
        per = 4 if self.bias else 2
        out = []
        for w in params[k * D * per:(k + 1) * D * per]:
            out.append(w.contiguous())
            if per == 2 and len(out) % 4 == 2:
                out += [w.new_zeros(w.shape[0]), w.new_zeros(w.shape[0])]
        return out

    def forward(self, input, hx=None):
        packed = isinstance(input, rnn_utils.PackedSequence)
        D, H, L = 2 if self.bidirectional else 1, self.hidden_size, self.num_layers
        lengths = None
        if packed:
            x, lengths = rnn_utils.pad_packed_sequence(input)
            batched = True
        else:
            if not isinstance(input, Tensor):
                raise TypeError(f"input must be a Tensor or a PackedSequence, got "
                                f"{type(input).__name__}")
            if input.dim() not in (2, 3):
                raise ValueError(f"input must have 2 (unbatched) or 3 dimensions, got shape "
                                 f"{tuple(input.shape)}")
            batched = input.dim() == 3
            x = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                x = x.transpose(0, 1)
        if x.dtype not in _DTYPES:
            raise TypeError(f"input has dtype {x.dtype}; cugru.torch.GRU runs float32 and "
                            "float64")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input has {x.shape[-1]} features, expected input_size = "
                             f"{self.input_size}")
        B = x.shape[1]
        params = [getattr(self, name) for name in self._names]
        device, dtype, grad = x.device, x.dtype, x.requires_grad
        for name, w in zip(self._names, params):
            if w.dtype != dtype or w.device != device:
                raise ValueError(f"{name} is a {w.dtype} tensor on {w.device}, the input a "
                                 f"{x.dtype} tensor on {x.device}; move the module to the "
                                 "input's device and dtype (module.to(...))")
            grad = grad or w.requires_grad
        if hx is not None:
            want = (L * D, B, H) if batched else (L * D, H)
            if tuple(hx.shape) != want:
                raise ValueError(f"hx has shape {tuple(hx.shape)}, expected {want}")
            if hx.device != x.device or hx.dtype != x.dtype:
                raise ValueError(f"hx is a {hx.dtype} tensor on {hx.device}, the input a "
                                 f"{x.dtype} tensor on {x.device}")
            hx = (hx if batched else hx.unsqueeze(1)).reshape(L, D, B, H)
        layer_in = x.contiguous()
        grad = torch.is_grad_enabled() and (grad or (hx is not None and hx.requires_grad))
        weights = [self._layer_weights(k, D, params) for k in range(L)]
        h_n = []
        for k in range(L):
            h0 = None if hx is None else hx[k].contiguous()
            y, hk = layer(layer_in, h0, weights[k], lengths, D == 2, grad, self.quant,
                          self.path)
            h_n.append(hk)
            if self.dropout and self.training and k < L - 1:
                y = nn.functional.dropout(y, self.dropout, training=True)
            layer_in = y
        h_n = torch.cat(h_n) if L > 1 else h_n[0]
        if packed:
            order = input.sorted_indices
            y_sorted = layer_in if order is None else layer_in.index_select(1, order)
            lens = lengths if order is None else lengths.index_select(0, order.cpu())
            data = rnn_utils.pack_padded_sequence(y_sorted, lens, enforce_sorted=True).data
            return (rnn_utils.PackedSequence(data, input.batch_sizes, input.sorted_indices,
                                             input.unsorted_indices), h_n)
        y = layer_in
        if not batched:
            return y.squeeze(1), h_n.squeeze(1)
        return (y.transpose(0, 1) if self.batch_first else y), h_n


__all__ = ["GRU", "gru_layer", "gru_layer_backward", "layer"]
