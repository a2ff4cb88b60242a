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
it without a graph break. Eager calls run the same two functions through a plain
torch.autograd.Function, which costs the host less per call.

Keyword arguments beyond nn.GRU's: ``quant`` (a cugru.QuantSpec: quantization-aware
training of every layer) and ``path`` (cugru's plan choice, "auto" by default).

torch is imported here only: ``import cugru`` does not import it.
"""
from __future__ import annotations

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


_STREAMS: dict = {}
_NP = {torch.float32: np.float32, torch.float64: np.float64}


class _OnDevice:
    """CuPy on the tensor's device and on torch's current stream there (a CuPy stream made
    once per torch stream), so cugru's launches queue behind torch's work with no sync; and
    CuPy's allocations in the block come from torch's caching allocator (uint8 tensors), so
    that torch accounts for cugru's memory and its results become tensors by a view of
    that memory (`tensor`), with no exchange protocol and no stream handshake."""

    def __init__(self, device):
        from cukernels import runtime
        self.cp = cp = runtime.cupy_module()
        if cp is None:
            raise RuntimeError("cugru.torch: CUDA tensors need CuPy (pip install "
                               "cupy-cuda12x or cupy-cuda13x)")
        self.index = index = device.index if device.index is not None else \
            torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        current = torch.cuda.current_stream(index)
        ptr = current.cuda_stream
        stream = _STREAMS.get((index, ptr))
        if stream is None:
            try:        # (the CUDA stream protocol, where CuPy and torch both have it)
                stream = cp.cuda.Stream.from_external(current)
            except (AttributeError, TypeError, ValueError):
                stream = cp.cuda.ExternalStream(ptr, index)
            _STREAMS[index, ptr] = stream
        self._dev, self._stream = cp.cuda.Device(index), stream
        self._owners = {}
        self._alloc = cp.cuda.using_allocator(self._allocate)

    def _allocate(self, size):
        t = torch.empty(size, dtype=torch.uint8, device=self.device)
        ptr = t.data_ptr()
        self._owners[ptr] = t
        cp = self.cp
        return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(ptr, size, t, self.index), 0)

    def __enter__(self):
        self._dev.__enter__()
        # (the launches go through the driver API, which needs the device's context current
        # on this thread: autograd runs backward on a thread of its own, where no CUDA call
        # may have made it current yet)
        self.cp.cuda.runtime.setDevice(self.index)
        self._stream.__enter__()
        self._alloc.__enter__()
        return self

    def __exit__(self, *exc):
        self._alloc.__exit__(*exc)
        self._stream.__exit__(*exc)
        self._dev.__exit__(*exc)
        return False

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
        cp = self.cp
        mem = cp.cuda.UnownedMemory(t.data_ptr(), t.nbytes, t, self.index)
        return cp.ndarray(tuple(t.shape), _NP.get(t.dtype) or np.int64,
                          cp.cuda.MemoryPointer(mem, 0))

    def tensor(self, a):
        """A C-contiguous cupy array made in this block as a tensor on the torch memory it
        lies in (DLPack for one made elsewhere). Set on that storage, not a view of the
        allocation's tensor: a user may change a result in place (y += skip, h_n.detach_()),
        which torch refuses for a view that an autograd Function returns."""
        if a is None:
            return None
        base = a.data.mem.ptr
        owner = self._owners.get(base)
        if owner is None or not a.flags.c_contiguous:
            return torch.from_dlpack(a)
        t = torch.empty(0, dtype=_TORCH[a.dtype.char], device=self.device)
        return t.set_(owner.untyped_storage(), (a.data.ptr - base) // a.itemsize, a.shape)


_TORCH = {"f": torch.float32, "d": torch.float64}


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


def _layer_forward(x, h0, weights, lengths, bidirectional, training, quant, path="auto"):
    """One layer's forward pass on tensors: (y, h_n, hs, gates, x_q, w_ih_q, w_hh_q); the
    history (hs, gates) and the quantized operands are empty tensors where the pass keeps
    none (x_q also where x is not quantized: the backward pass then takes x itself)."""
    spec = _list_to_spec(quant)
    D = 2 if bidirectional else 1
    kw = dict(bidirectional=bidirectional, training=training, quant=spec,
              lengths=_lengths(lengths), path=path)
    if x.is_cuda:
        with _OnDevice(x.device) as on:
            w = _stacked(on.cp, [on.arr(t) for t in weights], D)
            return _forward_results(x, spec, on.tensor,
                                    *gru_forward(on.arr(x), on.arr(h0), *w, **kw))
    w = _stacked(np, [_host(t) for t in weights], D)
    return _forward_results(x, spec, _tensor,
                            *oracle.gru_forward(_host(x), _host(h0), *w, **kw))


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
            return _backward_with(on.cp, on.arr, torch.from_dlpack if apart else on.tensor,
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


def _grads(ctx, dy, dh_n, backward):
    """(dx, dh0 or None, [the parameters' gradients]) from ctx and the gradients of y, h_n."""
    x, w_ih_q, w_hh_q, hs, gates, x_real, h0_real, lengths, *weights = ctx.saved_tensors
    if dy is None:
        dy = x.new_zeros(ctx.y_shape)
    dx, dh0, *dw = backward(dy.contiguous(), None if dh_n is None else dh_n.contiguous(), x,
                            weights, w_ih_q, w_hh_q, hs, gates, x_real, h0_real, lengths,
                            ctx.bidirectional, ctx.quant, ctx.path)
    return dx, dh0 if ctx.has_h0 else None, dw


def _keep(ctx, x, h0, weights, lengths, bidirectional, quant, path, output):
    ctx.save_for_backward(*_saved(x, h0, weights, lengths, quant, output))
    ctx.quant, ctx.bidirectional, ctx.path = quant, bidirectional, path
    ctx.has_h0, ctx.y_shape = h0 is not None, output[0].shape
    ctx.mark_non_differentiable(*output[2:])
    # (an output without a gradient comes to backward as None, not as zeros filled for it:
    # the history's would be the size of the history)
    ctx.set_materialize_grads(False)


def _setup(ctx, inputs, output):
    x, h0, weights, lengths, bidirectional, training, quant, path = inputs
    _keep(ctx, x, h0, weights, lengths, bidirectional, quant, path, output)


def _backward(ctx, dy, dh_n, *history):
    dx, dh0, dw = _grads(ctx, dy, dh_n, gru_layer_backward)
    return dx, dh0, dw, None, None, None, None, None


gru_layer.register_autograd(_backward, setup_context=_setup)


class _EagerLayer(torch.autograd.Function):
    """gru_layer's autograd through torch.autograd.Function: the same functions, with less
    host work per call than the registered operator's dispatch (eager mode). The parameters
    come last, one argument each (a Function tracks tensors passed as arguments only)."""

    @staticmethod
    def forward(ctx, x, h0, lengths, bidirectional, training, quant, path, *weights):
        output = _layer_forward(x, h0, weights, lengths, bidirectional, training, quant, path)
        _keep(ctx, x, h0, weights, lengths, bidirectional, quant, path, output)
        return output

    @staticmethod
    def backward(ctx, dy, dh_n, *history):
        dx, dh0, dw = _grads(ctx, dy, dh_n, _layer_backward)
        return (dx, dh0, None, None, None, None, None, *dw)


def layer(x, h0, weights, lengths=None, bidirectional=False, training=True, quant=None,
          path="auto"):
    """(y, h_n) of one layer, differentiable: `weights` the parameters (w_ih, w_hh, b_ih,
    b_hh of each direction in turn); `path` cugru's plan; the registered operator under
    torch.compile, the eager Function otherwise."""
    q = _spec_to_list(quant)
    if torch.compiler.is_compiling():
        out = gru_layer(x, h0, list(weights), lengths, bidirectional, training, q, path)
    else:
        out = _EagerLayer.apply(x, h0, lengths, bidirectional, training, q, path, *weights)
    return out[0], out[1]


# ------------------------------------------------------------------------------ the module
class GRU(nn.Module):
    """torch.nn.GRU on cugru's kernels (see the module's doc). Arguments as nn.GRU's, and
    quant (a cugru.QuantSpec, or None) and path (cugru's plan: "auto", "fast", "steps",
    "small")."""

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

    def _layer_weights(self, k, D):
        """Layer k's parameters, w_ih, w_hh, b_ih, b_hh of each direction in turn (zeros
        for the biases with bias=False), contiguous."""
        out = []
        for sfx in ("", "_reverse")[:D]:
            w_hh = getattr(self, f"weight_hh_l{k}{sfx}").contiguous()
            out += [getattr(self, f"weight_ih_l{k}{sfx}").contiguous(), w_hh]
            if self.bias:
                out += [getattr(self, f"bias_ih_l{k}{sfx}").contiguous(),
                        getattr(self, f"bias_hh_l{k}{sfx}").contiguous()]
            else:
                out += [w_hh.new_zeros(w_hh.shape[0]), w_hh.new_zeros(w_hh.shape[0])]
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
        for name, w in self.named_parameters():
            if w.device != x.device or w.dtype != x.dtype:
                raise ValueError(f"{name} is a {w.dtype} tensor on {w.device}, the input a "
                                 f"{x.dtype} tensor on {x.device}; move the module to the "
                                 "input's device and dtype (module.to(...))")
        if hx is not None:
            want = (L * D, B, H) if batched else (L * D, H)
            if tuple(hx.shape) != want:
                raise ValueError(f"hx has shape {tuple(hx.shape)}, expected {want}")
            if hx.device != x.device or hx.dtype != x.dtype:
                raise ValueError(f"hx is a {hx.dtype} tensor on {hx.device}, the input a "
                                 f"{x.dtype} tensor on {x.device}")
            hx = (hx if batched else hx.unsqueeze(1)).reshape(L, D, B, H)
        layer_in = x.contiguous()
        grad = torch.is_grad_enabled() and (
            layer_in.requires_grad or (hx is not None and hx.requires_grad)
            or any(p.requires_grad for p in self.parameters()))
        weights = [self._layer_weights(k, D) for k in range(L)]
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
