"""cugru: a GRU training operator with saved forward history, on CuPy and numpy.

    y, h_n, saved = gru_forward(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional=False)
    dx, dh0, dw_ih, dw_hh, db_ih, db_hh = gru_backward(dy, dh_n, saved)

torch.nn.GRU's maths and weight layout (gate blocks r | z | n). numpy arrays run the numpy
oracle (cugru.oracle, the CPU fallback); cupy arrays run the kernels of cugru/kernels/.
Layers stack by calling again on y. See docs/api.md; cugru.plans shows which GPU plan a
shape runs, for tools and benchmarks.
"""
from . import oracle
from .gru import gru_backward, gru_forward
from .quant import QuantSpec
from .saved import GruSaved

__all__ = ["gru_forward", "gru_backward", "GruSaved", "QuantSpec", "oracle"]
