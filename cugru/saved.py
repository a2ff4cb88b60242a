"""What the forward pass keeps for the backward pass: ``GruSaved``, and the history's layout.

The history is the contract between the passes (and between the two GPU paths: a forward
on one path may be followed by a backward on another). Shapes, D = 2 when bidirectional:

    hs    (D, T + 1, B, H)  hidden states in each direction's step order: hs[d, s] is the
                            state before step s (hs[d, 0] = h0[d]); direction 0 steps
                            through time t = s, direction 1 through t = T - 1 - s
    gates (D, T, B, 4H)     per step r | z | n | hn, with hn = W_hn h + b_hn (the recurrent
                            candidate term): everything backward needs, so no gate and no
                            product of the forward pass is recomputed
    x, w_ih, w_hh           the inputs of the backward pass's products (views, no copies)

Size: (5T + 1)·D·B·H elements. A quantization-aware pass (cugru.QuantSpec) keeps the
same history, with the gates before their quantizers (the backward pass quantizes them
again, with the same bits, for its masks and products) and the states as quantized; w_ih
and w_hh are then the quantized copies (D·3H·(I + H) more elements), and x too with
x_qparams (T·B·I more), and x and h0 as given are kept as views for the masks of dx and
dh0. Step order, not time order, makes every step's recurrent
product one strided-batched GEMM over both directions with a fixed stride.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GruSaved:
    """What gru_forward(..., training=True) keeps for gru_backward (see the module's doc)."""
    x: object              # (T, B, I)
    w_ih: object           # (D, 3H, I)
    w_hh: object           # (D, 3H, H)
    hs: object             # (D, T + 1, B, H)
    gates: object          # (D, T, B, 4H)
    squeeze: bool          # the weights came as (3H, ...) arrays: return gradients that way
    quant: object = None   # the QuantSpec of a quantization-aware pass (else None); then
    x_real: object = None  # x and h0 as given (x and the weights above are quantized):
    h0_real: object = None  # the straight-through estimator's masks come from them
    lengths: object = None  # the sequences' lengths (B,), or None: every step ran
    math: str = "strict"   # the forward pass's math (gru_backward's default)

    def with_inputs(self, x, w_ih, w_hh):
        """A copy with other inputs of the products (dataclasses.replace without its
        per-field work: the half-precision calls make one a pass)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.x, new.w_ih, new.w_hh = x, w_ih, w_hh
        return new

    @property
    def dims(self):
        """(T, B, I, H, D)"""
        T, B, I = self.x.shape
        D, H3, H = self.w_hh.shape
        return T, B, I, H, D
