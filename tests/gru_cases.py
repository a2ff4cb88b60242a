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


def random_lengths(rng, T, B):
    """B lengths in 1..T, unsorted, with 1 and T among them where B > 1; one below T where
    B = 1 (where T > 1), so that the lengths are used."""
    if B == 1:
        return np.array([rng.integers(1, T) if T > 1 else 1])
    lengths = rng.integers(1, T + 1, B)
    lengths[rng.permutation(B)[:2]] = (1, T)
    return lengths


def problem(rng, T, B, I, H, bidirectional, with_h0=True, dtype=np.float64, scale=None,
            lengths=False):
    """Random inputs, weights (torch's init range 1/sqrt(H)) and output gradients; with
    `lengths`, random sequence lengths (random_lengths) under the key "lengths"."""
    D = 2 if bidirectional else 1
    k = 1 / np.sqrt(H) if scale is None else scale
    u = lambda *s: rng.uniform(-k, k, s).astype(dtype)  # noqa: E731
    p = dict(
        x=rng.standard_normal((T, B, I)).astype(dtype),
        h0=rng.standard_normal((D, B, H)).astype(dtype) if with_h0 else None,
        w_ih=u(D, 3 * H, I), w_hh=u(D, 3 * H, H), b_ih=u(D, 3 * H), b_hh=u(D, 3 * H),
        dy=rng.standard_normal((T, B, D * H)).astype(dtype),
        dh_n=rng.standard_normal((D, B, H)).astype(dtype),
        bidirectional=bidirectional)
    if lengths:
        p["lengths"] = random_lengths(rng, T, B)
    return p


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
    if p.get("lengths") is None:
        y, hn = gru(x, h0)
    else:       # a PackedSequence of the lengths, y padded back to T with zeros
        rnn = torch.nn.utils.rnn
        packed = rnn.pack_padded_sequence(x, torch.tensor(p["lengths"]), enforce_sorted=False)
        out, hn = gru(packed, h0)
        y = rnn.pad_packed_sequence(out, total_length=T)[0]
    torch.autograd.backward([y, hn], [t(p["dy"]), t(p["dh_n"])])
    grads = [x.grad, h0.grad] + [
        torch.stack([getattr(gru, name + s).grad for s in sfx])
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")]
    np_ = lambda v: v.detach().cpu().double().numpy()  # noqa: E731
    return np_(y), np_(hn), tuple(np_(g) for g in grads)


# ------------------------------------------------------------- quantization-aware reference
#: quantization settings the QAT tests use: grids coarse enough that x, h and the gates clip
QAT_X = (0.0625, 3, -32, 31)
QAT_H = (1 / 64, -4, -64, 63)


def qat_specs():
    """(id, QuantSpec) of every combination of x, h and gates quantized, at 4 and 8 bits."""
    from cugru import QuantSpec
    out = []
    for bits in (8, 4):
        for xq in (False, True):
            for hq in (False, True):
                for gates in (False, True):
                    spec = QuantSpec(bits, QAT_X if xq else None, QAT_H if hq else None, gates)
                    out.append((f"w{bits}" + "-x" * xq + "-h" * hq + "-g" * gates, spec))
    return out


def torch_qat_gru(torch, p, spec, dtype=None):
    """A per-step torch GRU with the fake quantizers of `spec` (torch.fake_quantize_* and
    autograd), written from cugru.quant's formulas: (y, h_n, grads) as numpy, as torch_gru."""
    from cugru.quant import GATE_N, GATE_RZ, MIN_WEIGHT_SCALE
    dtype = dtype or torch.float64
    t = lambda a: torch.tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    T, B, I = p["x"].shape
    D, H3, H = p["w_hh"].shape
    x = t(p["x"]).requires_grad_()
    h0 = t(p["h0"] if p["h0"] is not None else np.zeros((D, B, H))).requires_grad_()
    w_ih, w_hh, b_ih, b_hh = (t(a).requires_grad_() for a in weights(p))
    qmax = 2 ** (spec.weight_bits - 1) - 1

    def fq(v, qp):
        return v if qp is None else torch.fake_quantize_per_tensor_affine(v, *qp)

    def fq_rows(w):
        s = torch.clamp(w.detach().abs().amax(dim=1) / qmax, min=MIN_WEIGHT_SCALE).float()
        zp = torch.zeros(w.shape[0], dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(w, s, zp, 0, -qmax, qmax)

    gq = (GATE_RZ, GATE_N) if spec.gates else (None, None)
    xq = fq(x, spec.x_qparams)
    outs, h_last = [], []
    for d in range(D):
        wi, wh = fq_rows(w_ih[d]), fq_rows(w_hh[d])
        h = fq(h0[d], spec.h_qparams)
        ys = [None] * T
        for s in range(T):
            tt = s if d == 0 else T - 1 - s
            gi = xq[tt] @ wi.T + b_ih[d]
            gh = h @ wh.T + b_hh[d]
            r = fq(torch.sigmoid(gi[:, :H] + gh[:, :H]), gq[0])
            z = fq(torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H]), gq[0])
            n = fq(torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:]), gq[1])
            h = fq((1 - z) * n + z * h, spec.h_qparams)
            ys[tt] = h
        outs.append(torch.stack(ys))
        h_last.append(h)
    y, hn = torch.cat(outs, dim=2), torch.stack(h_last)
    torch.autograd.backward([y, hn], [t(p["dy"]), t(p["dh_n"])])
    np_ = lambda v: v.detach().double().numpy()  # noqa: E731
    return np_(y), np_(hn), tuple(np_(g.grad) for g in (x, h0, w_ih, w_hh, b_ih, b_hh))


def pairwise(values):
    """The pairwise sum of 2^n values in their own dtype: the sums of the two halves added,
    down to single values (the order in which the tile kernels add a unit's lane sums)."""
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return pairwise(values[:half]) + pairwise(values[half:])


def lane_sum_problem(rng, B, H, D, lanes, first_k, dtype):
    """A one-step problem (T = I = 1, x and every bias zero) whose recurrent candidate term
    hn = W_hn h0 + b_hn is, at unit j of row b in direction d, the sum of `lanes` exact
    products, one in each lane of the tile kernels' product: h0[d, b] is nonzero only at
    the columns first_k[ks] (the first k of lane ks), where W_hn[d, j] holds lane ks's
    weight. Every factor has a 10-bit significand (exact in TF32 too, so each product is
    exact in float32) and an exponent drawn over a range wider than the dtype's
    significand, so that the sums round and the order of the adds shows; the values differ
    between units, rows and directions. Returns (p, the terms (D, B, H, lanes))."""
    span = 20 if np.dtype(dtype) == np.float32 else 40

    def factors(*shape):
        m = rng.integers(512, 1024, shape) * rng.choice([-1, 1], shape)
        return np.ldexp(m / 1024.0, rng.integers(-span, 1, shape)).astype(dtype)
    cols = np.asarray(first_k)
    assert cols.shape == (lanes,) and cols.max() < H and len(set(cols.tolist())) == lanes
    w, v = factors(D, H, lanes), factors(D, B, lanes)
    h0 = np.zeros((D, B, H), dtype)
    h0[:, :, cols] = v
    w_hh = np.zeros((D, 3 * H, H), dtype)
    w_hh[:, 2 * H:, cols] = w
    zeros = lambda *s: np.zeros(s, dtype)  # noqa: E731
    p = dict(x=zeros(1, B, 1), h0=h0, w_ih=zeros(D, 3 * H, 1), w_hh=w_hh,
             b_ih=zeros(D, 3 * H), b_hh=zeros(D, 3 * H), dy=zeros(1, B, D * H),
             dh_n=zeros(D, B, H), bidirectional=D == 2)
    return p, w[:, None] * v[:, :, None]


def check_pairwise_lane_sums(cp, rng, monkeypatch, plan, H, first_k, dtype, math="strict"):
    """lane_sum_problem (B = 5, both directions, `plan.lanes` lanes whose first k are
    first_k) through gru_forward on the fast path forced to `plan`: the history's hn of
    every unit, row and direction is the pairwise sum of its lanes' products, bit for bit.
    The problem must tell that order from the sum in lane order, and (from 32 lanes, the
    grid scope's loop over blocks of 8) from pairwise sums of 8 lanes added in order."""
    import cugru
    from cugru import _plan
    K = plan.lanes
    p, terms = lane_sum_problem(rng, 5, H, 2, K, first_k, dtype)
    lanes = [terms[..., k] for k in range(K)]
    expect = pairwise(lanes)
    others = {"lane order": lanes[0]}
    for t in lanes[1:]:
        others["lane order"] = others["lane order"] + t
    if K >= 32:
        blocks = [pairwise(lanes[b:b + 8]) for b in range(0, K, 8)]
        others["blocks of 8 in order"] = blocks[0]
        for t in blocks[1:]:
            others["blocks of 8 in order"] = others["blocks of 8 in order"] + t
    for name, got in others.items():
        assert (got != expect).any(), f"the problem does not tell pairwise from {name}"
    g = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in p.items()}
    monkeypatch.setattr(_plan, "choose", lambda *a, **k: plan)
    _, _, saved = cugru.gru_forward(g["x"], g["h0"], *weights(g), bidirectional=True,
                                    path="fast", math=math)
    hn = cp.asnumpy(saved.gates)[:, 0, :, 3 * H:]
    np.testing.assert_array_equal(hn, expect)
