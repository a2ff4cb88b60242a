"""cugru.torch.GRU against torch.nn.GRU (cuDNN, FP32 strict), and variable lengths, in one
run.

    python -m bench.torch_gru [--json FILE] [--repeat N]

Rows, float32, train steps with autograd (forward, then backward of a fixed dy; h_n's
gradient none), wall clock per step of back-to-back steps (ms):
- models: 2 layers bidirectional (H = 256, B = 64, T = 100, I = 128) on a padded batch and
  on a PackedSequence with lengths drawn uniformly in 50..100; one layer on S1 and S7 (the
  GRU benchmark's shapes); and, not tuned on, 3 layers (H = 128, B = 32, T = 200, I = 64)
  packed. nn.GRU with torch.backends.cudnn.allow_tf32 = False. Goals: >= 2x on the 2-layer
  rows, >= 1.5x on S1 and S7.
- the adapter's own cost: one layer at T = B = I = H = 1 (the host's work alone), the module
  against cugru's functional calls on the same arrays (gru_forward, and gru_forward then
  gru_backward); goal: at most 30 µs a call above them.
- graphed: S1, S4, S7 (one layer) and the 2-layer padded model, a train step captured in a
  CUDA graph and replayed, ours and nn.GRU's (no goal: where an eager step is bound by the
  host, this is what the kernels give).
- lengths: cugru.gru_forward/gru_backward on one layer (H = 256, B = 64, T = 100, I = 128,
  bidirectional; and S1) without lengths, with every length T, and with lengths drawn
  uniformly in 1..T (mean about T/2); goals: all-T costs nothing (ratio 1), the half-length
  batch at most 0.65x the full one on the fast path.
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing
from .shapes import SHAPES

GOAL_MODEL = 2.0
GOAL_LAYER = 1.5
GOAL_ADAPTER_US = 30.0
GOAL_HALF = 0.65
#: (label, layers, T, B, I, H, bidirectional, lengths: None, or (low, high) drawn uniformly)
MODELS = [("2 layers bi, padded", 2, 100, 64, 128, 256, True, None),
          ("2 layers bi, packed 50..100", 2, 100, 64, 128, 256, True, (50, 100)),
          ("S1 (1 layer)", 1, *SHAPES["S1"], None),
          ("S7 (1 layer)", 1, *SHAPES["S7"], None),
          ("3 layers uni, packed 100..200 (not tuned on)", 3, 200, 32, 64, 128, False,
           (100, 200))]
LENGTH_SHAPES = [("H 256 B 64 T 100 bi", 100, 64, 128, 256, True), ("S1", *SHAPES["S1"])]


def _sync():
    torch = timing.torch_cuda()
    timing._cp().cuda.Device().synchronize()
    torch.cuda.synchronize()


def _model_step(torch, module, x, lengths, dy):
    """A train step of `module` (nn.GRU's interface) on x (padded) or its PackedSequence."""
    rnn = torch.nn.utils.rnn
    inp = x if lengths is None else rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)

    def step():
        out, _ = module(inp)
        torch.autograd.backward(out if lengths is None else out.data, dy)
    return step


def models(repeat):
    import cugru.torch as ct
    torch = timing.torch_cuda()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for label, L, T, B, I, H, bi, span in MODELS:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(T, B, I, generator=g).cuda()
        lengths = None if span is None else torch.randint(span[0], span[1] + 1, (B,),
                                                          generator=g)
        if lengths is not None:
            lengths[0] = T           # (the padded batch is T long)
        ref = torch.nn.GRU(I, H, num_layers=L, bidirectional=bi).cuda()
        ours = ct.GRU(I, H, num_layers=L, bidirectional=bi, device="cuda")
        ours.load_state_dict(ref.state_dict())
        # (the gradient of the output: padded (T, B, D*H), or of the packed data)
        rows_out = (T, B) if lengths is None else (int(lengths.sum()),)
        dy = torch.randn(*rows_out, (2 if bi else 1) * H, generator=g).cuda()
        row = {"case": label, "shape": [L, T, B, I, H, bi], "lengths": span}
        for name, module in (("ours", ours), ("cudnn", ref)):
            step = _model_step(torch, module, x, lengths, dy)
            row[f"{name} ms"] = timing.host_time_us(step, n_repeat=max(5, repeat // 20),
                                                    sync=_sync) / 1e3
        rows.append(row)
    return rows


def adapter(repeat):
    """The module's cost per call above cugru's functional calls, at the tiny shape."""
    import cugru
    import cugru.torch as ct
    torch = timing.torch_cuda()
    cp = timing._cp()
    gru = ct.GRU(1, 1, device="cuda")
    x = torch.randn(1, 1, 1, device="cuda")
    xg = x.clone().requires_grad_()
    w = [p.detach().unsqueeze(0) for p in gru.parameters()]
    cx, cw = cp.from_dlpack(x), [cp.from_dlpack(t) for t in w]
    dy_t = torch.ones(1, 1, 1, device="cuda")
    dy = cp.from_dlpack(dy_t)

    def f_infer():
        return cugru.gru_forward(cx, None, *cw, training=False)

    def f_train():
        y, hn, saved = cugru.gru_forward(cx, None, *cw)
        return cugru.gru_backward(dy, None, saved)

    def m_infer():
        with torch.no_grad():
            return gru(x)

    def m_train():
        y, hn = gru(xg)
        torch.autograd.backward(y, dy_t)

    n = max(50, repeat)
    t = {k: timing.host_time_us(fn, n_repeat=n, sync=_sync)
         for k, fn in (("functional infer", f_infer), ("module infer", m_infer),
                       ("functional train", f_train), ("module train", m_train))}
    return {**t, "infer overhead": t["module infer"] - t["functional infer"],
            "train overhead": t["module train"] - t["functional train"]}


#: (label, layers, T, B, I, H, bidirectional): train steps captured in a CUDA graph
GRAPHED = [("S1 (1 layer)", 1, *SHAPES["S1"]), ("S4 (1 layer)", 1, *SHAPES["S4"]),
           ("S7 (1 layer)", 1, *SHAPES["S7"]),
           ("2 layers bi, padded", 2, 100, 64, 128, 256, True)]


def captured_step(torch, module, x, dy):
    """A train step of `module` on x with output gradient dy, captured in a CUDA graph
    (torch.cuda.graph, after warm-up steps on a side stream, as torch's docs prescribe):
    returns the graph. The gradients are set to None before the capture, so the graph
    makes them (the parameters' .grad and x.grad then lie in its memory) and each replay
    writes them anew."""
    def step():
        y, _ = module(x)
        torch.autograd.backward(y, dy)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    module.zero_grad(set_to_none=True)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def graphed(repeat):
    """Train steps replayed from a CUDA graph, ours and nn.GRU's (each captured the same
    way), beside the same steps run eagerly: where the host sets the pace of an eager step,
    a replay costs the GPU's work."""
    import cugru.torch as ct
    torch = timing.torch_cuda()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for label, L, T, B, I, H, bi in GRAPHED:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(T, B, I, generator=g).cuda().requires_grad_()
        dy = torch.randn(T, B, (2 if bi else 1) * H, generator=g).cuda()
        ref = torch.nn.GRU(I, H, num_layers=L, bidirectional=bi).cuda()
        ours = ct.GRU(I, H, num_layers=L, bidirectional=bi, device="cuda",
                      dtype=torch.float32)
        ours.load_state_dict(ref.state_dict())
        row = {"case": label, "shape": [L, T, B, I, H, bi]}
        for name, module in (("ours", ours), ("cudnn", ref)):
            graph = captured_step(torch, module, x, dy)
            row[f"{name} graphed ms"] = timing.host_time_us(
                graph.replay, n_repeat=max(5, repeat // 20), sync=_sync) / 1e3
            row[f"{name} eager ms"] = timing.host_time_us(
                _model_step(torch, module, x, None, dy), n_repeat=max(5, repeat // 20),
                sync=_sync) / 1e3
        rows.append(row)
    return rows


def lengths_rows(repeat):
    import cugru
    cp = timing._cp()
    rows = []
    for label, T, B, I, H, bi in LENGTH_SHAPES:
        from .shapes import make_problem
        p = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v
             for k, v in make_problem(T, B, I, H, bi).items()}
        w = (p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"])
        rng = np.random.default_rng(1)
        half = rng.integers(1, T + 1, B)
        row = {"case": label, "shape": [T, B, I, H, bi], "mean length": float(half.mean())}
        for name, lengths in (("none", None), ("all T", np.full(B, T)), ("1..T", half)):
            def step(lengths=lengths):
                y, hn, saved = cugru.gru_forward(p["x"], p["h0"], *w, bidirectional=bi,
                                                 lengths=lengths)
                cugru.gru_backward(p["dy"], None, saved)
            row[f"{name} ms"] = timing.host_time_us(step, n_repeat=max(5, repeat // 20)) / 1e3
        rows.append(row)
    return rows


def measure(repeat):
    timing.require_gpu()
    if timing.torch_cuda() is None:
        raise SystemExit("bench.torch_gru needs torch with CUDA")
    return {"models": models(repeat), "adapter": adapter(repeat),
            "lengths": lengths_rows(repeat), "graphed": graphed(repeat)}


def goals(res):
    """The goals' lines."""
    out = []
    for r in res["models"]:
        goal = GOAL_MODEL if r["case"].startswith("2 layers") else \
            GOAL_LAYER if r["case"].startswith(("S1", "S7")) else None
        if goal is None:
            continue
        ratio = r["cudnn ms"] / r["ours ms"]
        out.append(f"- {r['case']}: >= {goal}x nn.GRU: {'met' if ratio >= goal else 'NOT met'}"
                   f" ({ratio:.2f}x)")
    a = res["adapter"]
    worst = max(a["infer overhead"], a["train overhead"] / 2)
    out.append(f"- the adapter's cost <= {GOAL_ADAPTER_US:.0f} µs a call: "
               f"{'met' if worst <= GOAL_ADAPTER_US else 'NOT met'} ({a['infer overhead']:.1f}"
               f" µs inference, {a['train overhead']:.1f} µs a train step of two calls)")
    for r in res["lengths"]:
        same = r["all T ms"] / r["none ms"]
        half = r["1..T ms"] / r["none ms"]
        out.append(f"- {r['case']}: all lengths T {same:.3f}x the call without; mean length "
                   f"{r['mean length']:.0f} of {r['shape'][0]} at {half:.2f}x the full batch "
                   f"(goal <= {GOAL_HALF}: {'met' if half <= GOAL_HALF else 'NOT met'})")
    return out


def markdown(res):
    out = ["Train steps with autograd, float32, wall clock per step, ms (ratio: nn.GRU on "
           "cuDNN FP32 strict / cugru.torch.GRU)", "",
           "| model | layers, T, B, I, H, bi | cugru.torch.GRU | nn.GRU (cuDNN) | ratio |",
           "|---|---|---|---|---|"]
    for r in res["models"]:
        out.append(f"| {r['case']} | {', '.join(map(str, r['shape']))} | {r['ours ms']:.3f} | "
                   f"{r['cudnn ms']:.3f} | {r['cudnn ms'] / r['ours ms']:.2f}x |")
    a = res["adapter"]
    out += ["", "The adapter at T = B = I = H = 1, µs a call (wall clock): "
            f"functional inference {a['functional infer']:.1f}, module {a['module infer']:.1f};"
            f" functional train step {a['functional train']:.1f}, module "
            f"{a['module train']:.1f}.", "",
            "Variable lengths (cugru.gru_forward + gru_backward, one layer), ms:", "",
            "| shape | no lengths | all lengths T | lengths 1..T (mean) |", "|---|---|---|---|"]
    for r in res["lengths"]:
        out.append(f"| {r['case']} | {r['none ms']:.3f} | {r['all T ms']:.3f} | "
                   f"{r['1..T ms']:.3f} ({r['mean length']:.0f}) |")
    if res.get("graphed"):
        out += ["", "Train steps captured in a CUDA graph (torch.cuda.graph) and replayed, "
                "each module captured the same way, ms a replay; beside them the same steps "
                "run eagerly:", "",
                "| model | layers, T, B, I, H, bi | ours graphed | nn.GRU graphed | ratio "
                "graphed | ours eager | nn.GRU eager | ratio eager |",
                "|---|---|---|---|---|---|---|---|"]
        for r in res["graphed"]:
            out.append(
                f"| {r['case']} | {', '.join(map(str, r['shape']))} | "
                f"{r['ours graphed ms']:.3f} | {r['cudnn graphed ms']:.3f} | "
                f"{r['cudnn graphed ms'] / r['ours graphed ms']:.2f}x | "
                f"{r['ours eager ms']:.3f} | {r['cudnn eager ms']:.3f} | "
                f"{r['cudnn eager ms'] / r['ours eager ms']:.2f}x |")
    return out + ["", "Goals:"] + goals(res)


def main(argv=None):
    return timing.table_main(__doc__, measure, markdown, argv, repeat=200)


if __name__ == "__main__":
    sys.exit(main())
