"""Shapes, random GRU problems and the torch.nn.GRU reference, shared by the GRU tests."""
import numpy as np

from bench.shapes import SHAPES as BENCH_SHAPES  # noqa: F401  (id -> T, B, I, H, bi)

SIZES = (1, 2, 3, 17, 33, 130)
# (T, B, I, H): two rotations of SIZES, so that every size appears in every position
SHAPES = sorted({(SIZES[k], SIZES[(k + 1) % 6], SIZES[(k + 2) % 6], SIZES[(k + 3) % 6])
                 for k in range(6)}
                | {(SIZES[k], SIZES[(k + 3) % 6], SIZES[(k + 5) % 6], SIZES[(k + 2) % 6])
                   for k in range(6)})
NAMES = ("dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")


def problem(rng, T, B, I, H, bidirectional, with_h0=True, dtype=np.float64, scale=None):
    """Random inputs, weights (torch's init range 1/sqrt(H)) and output gradients."""
    D = 2 if bidirectional else 1
    k = 1 / np.sqrt(H) if scale is None else scale
    u = lambda *s: rng.uniform(-k, k, s).astype(dtype)  # noqa: E731
    return dict(
        x=rng.standard_normal((T, B, I)).astype(dtype),
        h0=rng.standard_normal((D, B, H)).astype(dtype) if with_h0 else None,
        w_ih=u(D, 3 * H, I), w_hh=u(D, 3 * H, H), b_ih=u(D, 3 * H), b_hh=u(D, 3 * H),
        dy=rng.standard_normal((T, B, D * H)).astype(dtype),
        dh_n=rng.standard_normal((D, B, H)).astype(dtype),
        bidirectional=bidirectional)


def weights(p):
    return p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"]


def torch_gru(torch, p, device="cpu", dtype=None):
    """torch.nn.GRU on problem p: (y, h_n, (dx, dh0, dw_ih, dw_hh, db_ih, db_hh)), numpy.

    h0 = None runs torch with a zero h0 that requires grad, so dh0 can be compared too.
    """
    dtype = dtype or torch.float64
    T, B, I = p["x"].shape
    D, H3, H = p["w_hh"].shape
    gru = torch.nn.GRU(I, H, bidirectional=D == 2).to(device=device, dtype=dtype)
    sfx = ["", "_reverse"][:D]
    t = lambda a: torch.tensor(np.asarray(a), device=device, dtype=dtype)  # noqa: E731
    with torch.no_grad():
        for name, arr in zip(("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"),
                             weights(p)):
            for d, s in enumerate(sfx):
                getattr(gru, name + s).copy_(t(arr[d]))
    x = t(p["x"]).requires_grad_()
    h0 = t(p["h0"] if p["h0"] is not None else np.zeros((D, B, H))).requires_grad_()
    y, hn = gru(x, h0)
    torch.autograd.backward([y, hn], [t(p["dy"]), t(p["dh_n"])])
    grads = [x.grad, h0.grad] + [
        torch.stack([getattr(gru, name + s).grad for s in sfx])
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
    np_ = lambda v: v.detach().cpu().double().numpy()  # noqa: E731
    return np_(y), np_(hn), tuple(np_(g) for g in grads)
