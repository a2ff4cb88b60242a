"""Quantization-aware training (cugru.QuantSpec) on S1-S10: our QAT train step against our
own float train step, cuDNN's float train step (FP32 strict, torch.nn.GRU) and the per-step
torch loop with fake-quant ops and autograd, all in one run.

    python -m bench.qat [--json FILE] [--repeat N]

QAT here: 8-bit weights per row, x and the state quantized (``SPEC``) and the gates on their
fixed grids; path="auto" for both of ours. Device times (medians of CUDA-event intervals
around back-to-back calls, bench.timing), float32, ms. Ratios are time / our QAT time: above
1, our QAT step is faster. Goals: QAT at least 0.8x our float step on every shape, and at
least 100x the torch fake-quant loop where it is timed (the unidirectional shapes). Where
the host issues a step more slowly than the GPU runs it, the events measure the host's pace;
so the train steps are also timed with the host's issue time and the device's time held
apart (bench.timing.held_times_us): the "held" columns.
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing
from .shapes import SHAPES, make_problem

#: the quantization the benchmark trains with (x from make_problem lies in [-1, 1))
SPEC_ARGS = dict(weight_bits=8, x_qparams=(1 / 128, 0, -128, 127),
                 h_qparams=(1 / 128, 0, -128, 127), gates=True)
GOAL_VS_FLOAT = 0.8
GOAL_VS_LOOP = 100.0


def _ours(p, cp, quant):
    import cugru
    a = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in p.items()}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])

    def train():
        y, hn, saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"],
                                         quant=quant)
        return cugru.gru_backward(a["dy"], None, saved)

    def infer():
        return cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"], training=False,
                                 quant=quant)
    return train, infer


def torch_fake_quant_loop(torch, p, spec):
    """The per-step torch GRU with torch.fake_quantize_* ops and autograd (unidirectional):
    the weights fake-quantized once per call, x before the loop, the gates and the state
    every step."""
    from cugru.quant import GATE_N, GATE_RZ, MIN_WEIGHT_SCALE
    t = lambda a: torch.tensor(a, device="cuda")  # noqa: E731
    w_ih, w_hh = t(p["w_ih"][0]).requires_grad_(), t(p["w_hh"][0]).requires_grad_()
    b_ih, b_hh = t(p["b_ih"][0]).requires_grad_(), t(p["b_hh"][0]).requires_grad_()
    x, h0, dy = t(p["x"]).requires_grad_(), t(p["h0"][0]), t(p["dy"])
    qmax = 2 ** (spec.weight_bits - 1) - 1
    F = torch.nn.functional
    fq = torch.fake_quantize_per_tensor_affine

    def rows(w):
        s = torch.clamp(w.detach().abs().amax(dim=1) / qmax, min=MIN_WEIGHT_SCALE).float()
        zp = torch.zeros(w.shape[0], dtype=torch.int32, device="cuda")
        return torch.fake_quantize_per_channel_affine(w, s, zp, 0, -qmax, qmax)

    def train():
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            wi, wh = rows(w_ih), rows(w_hh)
            xq = fq(x, *spec.x_qparams)
            h, outs = fq(h0, *spec.h_qparams), []
            for step in range(x.shape[0]):
                ir, iz, i_n = F.linear(xq[step], wi, b_ih).chunk(3, 1)
                hr, hz, hn = F.linear(h, wh, b_hh).chunk(3, 1)
                r, z = fq(torch.sigmoid(ir + hr), *GATE_RZ), fq(torch.sigmoid(iz + hz), *GATE_RZ)
                n = fq(torch.tanh(i_n + r * hn), *GATE_N)
                h = fq((1 - z) * n + z * h, *spec.h_qparams)
                outs.append(h)
            torch.autograd.backward(torch.stack(outs), dy)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    return train


def measure(repeat=30):
    import cupy as cp

    import cugru
    from bench.gru import torch_gru_calls
    spec = cugru.QuantSpec(**SPEC_ARGS)
    torch = timing.torch_cuda()
    rows = []
    for sid, (T, B, I, H, bi) in SHAPES.items():
        p = make_problem(T, B, I, H, bi)
        row = {"id": sid, "shape": [T, B, I, H, bi]}
        for label, quant in (("float", None), ("qat", spec)):
            train, infer = _ours(p, cp, quant)
            row[f"{label}_train"] = timing.gpu_time_us(train, n_repeat=repeat) / 1e3
            row[f"{label}_infer"] = timing.gpu_time_us(infer, n_repeat=repeat) / 1e3
            row[f"{label}_train_held"] = timing.held_times_us(train, n_repeat=10)
        if torch is not None:
            train, infer = torch_gru_calls(torch, p, "cuda", False)
            row["cudnn_train"] = timing.gpu_time_us(train, n_repeat=repeat) / 1e3
            if not bi:
                row["loop_train"] = timing.gpu_time_us(torch_fake_quant_loop(torch, p, spec),
                                                       n_repeat=3, n_warmup=1) / 1e3
        rows.append(row)
        print(f"  {sid}: {row}", file=sys.stderr, flush=True)
    return rows


def _r(a, b):
    return a / b if a and b else None


def markdown(rows):
    f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    x = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    out = ["| id | T, B, I, H, bi | float train (ms) | QAT train (ms) | float / QAT (goal "
           f">= {GOAL_VS_FLOAT}x) | cuDNN strict train (ms) | cuDNN strict / QAT | torch "
           f"fake-quant loop (ms) | loop / QAT (goal >= {GOAL_VS_LOOP:.0f}x) | float infer "
           "(ms) | QAT infer (ms) | float / QAT infer | train, held: device float / QAT | "
           "train, held: host µs float, QAT |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {"float": [], "cudnn": [], "loop": [], "infer": [], "held": []}
    for r in rows:
        vs_float = _r(r["float_train"], r["qat_train"])
        vs_cudnn = _r(r.get("cudnn_train"), r["qat_train"])
        vs_loop = _r(r.get("loop_train"), r["qat_train"])
        vs_infer = _r(r["float_infer"], r["qat_infer"])
        (fh, fd), (qh, qd) = r["float_train_held"], r["qat_train_held"]
        vs_held = _r(fd, qd)
        for k, v in (("float", vs_float), ("cudnn", vs_cudnn), ("loop", vs_loop),
                     ("infer", vs_infer), ("held", vs_held)):
            if v is not None:
                ratios[k].append(v)
        out.append(f"| {r['id']} | {', '.join(map(str, r['shape']))} | {f(r['float_train'])} "
                   f"| {f(r['qat_train'])} | {x(vs_float)} | {f(r.get('cudnn_train'))} | "
                   f"{x(vs_cudnn)} | {f(r.get('loop_train'))} | {x(vs_loop)} | "
                   f"{f(r['float_infer'])} | {f(r['qat_infer'])} | {x(vs_infer)} | "
                   f"{x(vs_held)} | {fh:.0f}, {qh:.0f} |")
    g = {k: timing.geomean(v) for k, v in ratios.items()}
    out.append(f"| geomean | ({len(rows)} shapes; the loop on {len(ratios['loop'])}) | | | "
               f"{x(g['float'])} | | {x(g['cudnn'])} | | {x(g['loop'])} | | | "
               f"{x(g['infer'])} | {x(g['held'])} | |")
    met_f = all(v >= GOAL_VS_FLOAT for v in ratios["float"]) and ratios["float"]
    met_l = all(v >= GOAL_VS_LOOP for v in ratios["loop"]) and ratios["loop"]
    out += ["", f"- QAT >= {GOAL_VS_FLOAT}x our float step on every shape: "
            f"{'met' if met_f else 'NOT met'} (lowest {x(min(ratios['float'], default=None))}; "
            f"device time held apart: lowest {x(min(ratios['held'], default=None))})",
            f"- QAT >= {GOAL_VS_LOOP:.0f}x the torch fake-quant loop on every timed shape: "
            f"{'met' if met_l else 'NOT met'} (lowest {x(min(ratios['loop'], default=None))})"]
    return out


def main(argv=None):
    return timing.table_main(__doc__, measure, markdown, argv, repeat=30)


if __name__ == "__main__":
    sys.exit(main())
