"""The GRU benchmark: shapes S1-S10, ours against cuDNN (through torch) in the same run.

    python -m bench.gru [--shapes S1,S3] [--out DIR] [--repeat N] [--no-cpu]

For each shape, float32, a train step (forward + backward with a given dy, no dh_n) and a
forward-only inference pass, timed for
  - ours: every entry of OURS (path="fast", the persistent kernels, and path="steps"),
  - cuDNN FP32 strict (torch.backends.cudnn.allow_tf32 = False) and cuDNN with TF32 (torch's
    default), through torch.nn.GRU,
  - the naive per-step loop of torch ops with autograd (unidirectional shapes only).
Device times are medians of CUDA-event intervals around back-to-back calls (bench.suite).
Ratios are baseline time / our time: above 1, ours is faster. Also reported: our host time
per step (the Python issuing one step's launches, GPU idle at the start, no sync), where the
per-step GPU time goes (one recurrent GEMM and one pointwise kernel each way, timed alone),
the fast path's split per shape and its limits on the device, the peak memory of a train
step for S3 and S9, and the CPU fallback against torch's CPU GRU on S1 and S2. Writes
DIR/gru-bench.json, DIR/gru-bench.md and DIR/gru-ratios.png.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from . import suite

#: id -> (T, B, I, H, bidirectional), the spec's table
SHAPES = {
    "S1": (100, 64, 40, 64, False), "S2": (100, 64, 40, 128, False),
    "S3": (100, 64, 40, 256, False), "S4": (100, 64, 40, 128, True),
    "S5": (200, 32, 80, 256, True), "S6": (100, 1, 40, 256, False),
    "S7": (500, 1, 64, 128, False), "S8": (100, 64, 512, 512, False),
    "S9": (100, 64, 1024, 1024, False), "S10": (50, 256, 512, 512, True),
}
MEMORY_SHAPES = ("S3", "S9", "S10")
CPU_SHAPES = ("S1", "S2")
#: our implementations: label -> the path= they run (the first is the one ratios are of)
OURS = {"fast": "fast", "steps": "steps"}


def make_problem(T, B, I, H, bi, seed=0):
    rng = np.random.default_rng(seed)
    D, k = (2 if bi else 1), 1 / math.sqrt(H)
    u = lambda *s: rng.uniform(-k, k, s).astype(np.float32)  # noqa: E731
    return dict(x=rng.standard_normal((T, B, I)).astype(np.float32),
                h0=rng.standard_normal((D, B, H)).astype(np.float32),
                w_ih=u(D, 3 * H, I), w_hh=u(D, 3 * H, H), b_ih=u(D, 3 * H), b_hh=u(D, 3 * H),
                dy=rng.standard_normal((T, B, D * H)).astype(np.float32), bi=bi)


class _Settings:
    """Set cugru.gru's module attributes for a block, restoring them after."""

    def __init__(self, **values):
        from cugru import gru
        self.mod, self.values = gru, values

    def __enter__(self):
        self.old = {k: getattr(self.mod, k) for k in self.values}
        for k, v in self.values.items():
            setattr(self.mod, k, v)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            setattr(self.mod, k, v)


def ours_calls(p, xp, path="auto", settings=None):
    import cugru
    a = {k: xp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in p.items()}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    settings = settings or {}
    kw = {} if xp is np else {"path": path}

    def train():
        with _Settings(**settings):
            y, hn, saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"], **kw)
            return cugru.gru_backward(a["dy"], None, saved, **kw)

    def infer():
        with _Settings(**settings):
            return cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"], training=False,
                                     **kw)
    return train, infer


def fast_info(p, repeat=None):
    """The fast path's plan for a problem, with the kernels' registers and, given `repeat`,
    the measured time of one barrier of its scope on its grid (None: no plan)."""
    from cugru import gru
    T, B, I = p["x"].shape
    D, G, H = p["w_hh"].shape
    plan = gru.fast_plan(B, H, D, np.float32)
    if plan is None:
        return None
    if isinstance(plan, gru.TilePlan):
        names = (plan.forward_kernel("float", True), plan.backward_kernel("float"))
        # every block receives its rows' whole vector (distributed shared memory, or L2 at
        # grid scope)
        moved = D * plan.blocks * plan.rows * H * 4
        info = {"cluster": plan.cluster or f"{plan.group_blocks} per group, {plan.slots} at once",
                "rows": f"{plan.rows} per group", "lanes": plan.lanes,
                "threads": plan.threads, "packs": f"{plan.packs} x {plan.per_thread} units"}
    else:
        names = (f"gru_persist_forward<float,{plan.rows_per_thread},true>",
                 f"gru_persist_backward<float,{plan.rows_per_thread}>")
        moved = plan.blocks * D * B * H * 4     # every block reads its direction's h from L2
        info = {"cluster": "-", "rows": f"{plan.rows_per_thread} per thread", "lanes": "-",
                "threads": gru.FAST_THREADS, "packs": "-"}
    regs = [gru._persist_kernel(name, smem).num_regs
            for name, smem in zip(names, (plan.smem_fwd, plan.smem_bwd))]
    back = gru.fast_plan(B, H, D, np.float32, backward=True)
    scope = plan.scope if back == plan else f"{plan.scope} (backward: {back.scope})"
    info.update({"scope": scope, "blocks": plan.blocks * D, "units": plan.units,
                 "smem": max(plan.smem_fwd, plan.smem_bwd), "regs": regs,
                 "h_bytes_per_step": moved})
    if repeat:
        info["barrier_us"] = barrier_us(plan, D, repeat)
        info["phases_ms"] = fast_phases(p, plan, repeat)
    return info


def fast_phases(p, plan, repeat):
    """Device ms of the fast path's train step by piece: the forward pass (history kept),
    the backward recurrence (one launch) and the backward tail (dx and weight-gradient
    GEMMs)."""
    import cupy as cp

    from cugru import gru
    from cugru._args import GruSaved
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    T, B, I = p["x"].shape
    D, G, H = p["w_hh"].shape
    dims = (T, B, I, H, D)
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    y, hn, hs, gates = gru._forward_gpu(a["x"], a["h0"], *w, dims, True, plan)
    saved = GruSaved(a["x"], a["w_ih"], a["w_hh"], hs, gates, False)
    back = gru.fast_plan(B, H, D, np.float32, backward=True)   # (may differ from `plan`)
    dgi, dgh, dh = gru._backward_recurrence(a["dy"], None, saved, dims, back)
    pieces = {"forward": lambda: gru._forward_gpu(a["x"], a["h0"], *w, dims, True, plan),
              "backward recurrence": lambda: gru._backward_recurrence(a["dy"], None, saved,
                                                                      dims, back),
              "backward tail": lambda: gru._backward_tail(saved, dgi, dgh, dims)}
    return {k: suite.gpu_time_us(fn, n_repeat=repeat) / 1e3 for k, fn in pieces.items()}


def barrier_us(plan, D, repeat, n=2000):
    """Device time of one barrier of the plan's scope on the plan's grid: a launch of n
    barriers less a launch of none, over n (cugru's gru_barrier_probe kernels)."""
    import cupy as cp

    from cugru import gru
    from cukernels import _rt
    tile = isinstance(plan, gru.TilePlan) and plan.cluster > 0
    grid = (plan.group_blocks if isinstance(plan, gru.TilePlan) and not tile else plan.blocks, D)
    block = (plan.threads if isinstance(plan, gru.TilePlan) else gru.FAST_THREADS,)
    if tile:
        fn = _rt.kernel("gru.cu", f"gru_barrier_probe<{plan.cluster}>")

        def call(k):
            fn(grid, block, (np.int32(k),))
    else:
        fn = _rt.kernel("gru.cu", "gru_grid_barrier_probe")
        counters = [cp.zeros(D, np.uint32) for _ in range(2)]

        def call(k):
            counters[k > 0].fill(0)
            with _rt.StepLoop(np.float32) as loop:
                loop.launch(fn, grid, block, (counters[k > 0], np.int32(k)), cooperative=True)
    t_n = suite.gpu_time_us(lambda: call(n), n_repeat=repeat)
    t_0 = suite.gpu_time_us(lambda: call(0), n_repeat=repeat)
    return max(t_n - t_0, 0.0) / n


def torch_gru_calls(torch, p, device, tf32):
    T, B, I = p["x"].shape
    D, H3, H = p["w_hh"].shape
    gru = torch.nn.GRU(I, H, bidirectional=p["bi"]).to(device=device, dtype=torch.float32)
    sfx = ["", "_reverse"][:D]
    t = lambda a: torch.tensor(a, device=device)  # noqa: E731
    with torch.no_grad():
        for name, key in (("weight_ih_l0", "w_ih"), ("weight_hh_l0", "w_hh"),
                          ("bias_ih_l0", "b_ih"), ("bias_hh_l0", "b_hh")):
            for d, s in enumerate(sfx):
                getattr(gru, name + s).copy_(t(p[key][d]))
    x, h0, dy = t(p["x"]).requires_grad_(), t(p["h0"]), t(p["dy"])

    def with_mode(fn):
        def run():
            old = torch.backends.cudnn.allow_tf32
            torch.backends.cudnn.allow_tf32 = tf32
            try:
                return fn()
            finally:
                torch.backends.cudnn.allow_tf32 = old
        return run

    def train():
        y, hn = gru(x, h0)
        torch.autograd.backward(y, dy)

    def infer():
        with torch.no_grad():
            return gru(x, h0)
    return with_mode(train), with_mode(infer)


def naive_train_call(torch, p):
    """The per-step torch loop (unidirectional): two linears and the gate ops per step."""
    dev = "cuda"
    t = lambda a: torch.tensor(a, device=dev)  # noqa: E731
    w_ih, w_hh = t(p["w_ih"][0]).requires_grad_(), t(p["w_hh"][0]).requires_grad_()
    b_ih, b_hh = t(p["b_ih"][0]).requires_grad_(), t(p["b_hh"][0]).requires_grad_()
    x, h0, dy = t(p["x"]).requires_grad_(), t(p["h0"][0]), t(p["dy"])
    F = torch.nn.functional

    def train():
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            h, outs = h0, []
            for step in range(x.shape[0]):
                gi = F.linear(x[step], w_ih, b_ih)
                gh = F.linear(h, w_hh, b_hh)
                ir, iz, i_n = gi.chunk(3, 1)
                hr, hz, hn = gh.chunk(3, 1)
                r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                n = torch.tanh(i_n + r * hn)
                h = (1 - z) * n + z * h
                outs.append(h)
            torch.autograd.backward(torch.stack(outs), dy)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    return train


def host_us_per_step(fn, steps, repeat=5):
    """Median wall time of issuing fn (GPU idle at the start, no sync inside) per step."""
    import cupy as cp
    fn()
    times = []
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    cp.cuda.Device().synchronize()
    return float(np.median(times)) / steps * 1e6


def step_costs(p, repeat):
    """Host and device time of each piece of one step, timed alone on the shape's buffers
    (us; bench.suite.held_times_us: the device time excludes the host's issue time)."""
    import cupy as cp

    from cukernels import _rt
    from cugru import gru
    T, B, I = p["x"].shape
    D, G, H = p["w_hh"].shape
    f32, it = np.float32, 4
    w_hh = cp.asarray(p["w_hh"])
    hs = cp.asarray(np.random.default_rng(1).standard_normal((D, T + 1, B, H)).astype(f32))
    gh, dh = cp.zeros((D, B, G), f32), cp.zeros((D, B, H), f32)
    dgh = cp.zeros((D, T, B, G), f32)
    gi, y = cp.zeros((T, B, D, G), f32), cp.zeros((T, B, D * H), f32)
    gates, bias = cp.full((D, T, B, 4 * H), 0.5, f32), cp.zeros((D, G), f32)
    dy = cp.zeros_like(y)
    i32 = np.int32
    out = {}
    with _rt.StepLoop(f32) as loop:
        fwd = loop.kernel(_rt.kernel("gru.cu", "gru_forward_step<float,true>"),
                          gru._grid(B, H, D), (gru.THREADS,),
                          (gi, gh, bias, bias, hs, y, gates, i32(T), i32(B), i32(H),
                           i32(T + 1), i32(0)), step_arg=11)
        bwd = loop.kernel(_rt.kernel("gru.cu", "gru_backward_step<float>"),
                          gru._grid(B, H, D), (gru.THREADS,),
                          (dy, gates, hs, dh, gi, dgh, i32(T), i32(B), i32(H), i32(0)),
                          step_arg=9)
        pieces = {
            "recurrent GEMM (forward)": lambda: loop.gemm(
                True, False, G, B, H, w_hh.data.ptr, H, G * H, hs.data.ptr, H,
                (T + 1) * B * H, 0.0, gh.data.ptr, G, B * G, D),
            "pointwise (forward)": lambda: fwd(1),
            "pointwise (backward, S1)": lambda: bwd(1),
            "recurrent GEMM (backward)": lambda: loop.gemm(
                False, False, H, B, G, w_hh.data.ptr, H, G * H, dgh.data.ptr + B * G * it, G,
                T * B * G, 1.0, dh.data.ptr, H, B * H, D),
        }
        for name, fn in pieces.items():
            out[name] = suite.held_times_us(fn, n_repeat=repeat)
    return out


def fast_limits(batches=(1, 64), h_max=16384):
    """Largest H with a fast-path split (cugru.gru.fast_plan), per dtype, directions and B."""
    from cugru import gru
    out = []
    for dtype in (np.float32, np.float64):
        for D in (1, 2):
            for B in batches:
                lo, hi = 0, h_max
                while lo < hi:                     # largest H in [0, h_max] that fits
                    mid = (lo + hi + 1) // 2
                    if gru.fast_plan(B, mid, D, dtype) is not None:
                        lo = mid
                    else:
                        hi = mid - 1
                plan = gru.fast_plan(B, lo, D, dtype) if lo else None
                out.append({"dtype": np.dtype(dtype).name, "D": D, "B": B, "max_H": lo,
                            "scope": plan.scope if plan else "-",
                            "blocks": plan.blocks * D if plan else 0,
                            "block_scope_max_H": _scope_limit(gru, B, D, dtype, "block"),
                            "cluster_scope_max_H": _scope_limit(gru, B, D, dtype, "cluster")})
    return out


def _scope_limit(gru, B, D, dtype, scope):
    """Largest H that fast_plan runs at `scope` (block: one block per batch group)."""
    best = 0
    for H in range(1, 600):
        plan = gru.fast_plan(B, H, D, dtype)
        if plan is not None and plan.scope == scope:
            best = H
    return best


def peak_memory(p, torch):
    """Bytes allocated beyond the inputs during one train step: ours (CuPy pool high-water
    mark) and cuDNN's (torch.cuda.max_memory_allocated)."""
    import cupy as cp
    pool = cp.get_default_memory_pool()
    train, _ = ours_calls(p, cp, "auto")
    cp.cuda.Device().synchronize()
    pool.free_all_blocks()
    base = pool.used_bytes()
    train()
    cp.cuda.Device().synchronize()
    ours = pool.total_bytes() - base
    res = {"ours": ours}
    if torch is not None:
        t_train, _ = torch_gru_calls(torch, p, "cuda", False)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t_train()
        torch.cuda.synchronize()
        res["cuDNN"] = torch.cuda.max_memory_allocated() - base
    return res


def cpu_fallback(p, torch, repeat=3):
    """The numpy train step against torch's CPU nn.GRU (float32), in ms."""
    train, _ = ours_calls(p, np)
    res = {"ours (numpy)": _wall_ms(train, repeat)}
    if torch is not None:
        t_train, _ = torch_gru_calls(torch, p, "cpu", False)
        res["torch CPU"] = _wall_ms(t_train, repeat)
    return res


def _wall_ms(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def run(shape_ids, repeat, cpu=True):
    import cupy as cp
    torch = suite._torch()
    rows = []
    for sid in shape_ids:
        T, B, I, H, bi = SHAPES[sid]
        p = make_problem(T, B, I, H, bi)
        row = {"id": sid, "shape": [T, B, I, H, bi], "train": {}, "infer": {}, "host": {}}
        row["fast"] = fast_info(p, repeat)
        row["auto"] = auto_paths(B, H, 2 if bi else 1)
        for label, path in OURS.items():
            if path == "fast" and row["fast"] is None:
                continue
            train, infer = ours_calls(p, cp, path)
            row["train"][label] = suite.gpu_time_us(train, n_repeat=repeat) / 1e3
            row["infer"][label] = suite.gpu_time_us(infer, n_repeat=repeat) / 1e3
            row["host"][label] = host_us_per_step(train, T)
        plain_train, _ = ours_calls(p, cp, "steps", {"PLAIN_LAUNCH": True})
        row["host"]["steps, CuPy launch"] = host_us_per_step(plain_train, T)
        if torch is not None:
            for label, tf32 in (("cuDNN strict", False), ("cuDNN TF32", True)):
                train, infer = torch_gru_calls(torch, p, "cuda", tf32)
                row["train"][label] = suite.gpu_time_us(train, n_repeat=repeat) / 1e3
                row["infer"][label] = suite.gpu_time_us(infer, n_repeat=repeat) / 1e3
            if not bi:
                row["train"]["naive torch loop"] = suite.gpu_time_us(
                    naive_train_call(torch, p), n_repeat=max(5, repeat // 4)) / 1e3
        row["steps"] = step_costs(p, repeat)
        if sid in MEMORY_SHAPES:
            row["memory"] = peak_memory(p, torch)
        if cpu and sid in CPU_SHAPES:
            row["cpu"] = cpu_fallback(p, torch)
        rows.append(row)
        print(f"  {sid}: {row['train']}", file=sys.stderr, flush=True)
    return rows


def auto_paths(B, H, D):
    """What path="auto" runs in float32 on this GPU: [forward, backward], each "fast" or
    "steps" (the labels of OURS)."""
    from cugru import gru
    return ["steps" if gru._choose("auto", B, H, D, np.float32, back) is None else "fast"
            for back in (False, True)]


def _auto_table(rows, bases):
    """path="auto" against the baselines: the times of the path it takes in both passes
    (a shape where the passes take different paths has no row), the ratios, their geomeans
    and the shapes below 1x."""
    lines = ["| id | auto takes | train (ms) | " + " | ".join(f"{b} / auto" for b in bases)
             + " | inference (ms) | " + " | ".join(f"{b} / auto" for b in bases) + " |",
             "|---|---|---|" + "---|" * len(bases) + "---|" + "---|" * len(bases)]
    got = {(k, b): [] for k in ("train", "infer") for b in bases}
    below = []
    for r in rows:
        fwd, bwd = r.get("auto", (None, None))
        if fwd is None or fwd != bwd or fwd not in r["train"]:
            continue
        cells = [r["id"], f"{fwd}"]
        for kind in ("train", "infer"):
            ours = r[kind][fwd]
            cells.append(f"{ours:.3f}")
            for b in bases:
                t = r[kind].get(b)
                v = t / ours if t else None
                got[kind, b].append(v)
                cells.append("-" if v is None else f"{v:.2f}x")
                if v is not None and v < 1 and b == bases[0]:
                    below.append(f"{r['id']} {'train' if kind == 'train' else 'inference'} "
                                 f"{v:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["geomean", ""]
    for kind in ("train", "infer"):
        cells.append("")
        cells += [f"{geomean(got[kind, b]):.2f}x" for b in bases]
    lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Below 1x against {bases[0]}: " + (", ".join(below) or "none") + "."]
    return lines


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def ratios(rows, kind, ours, base):
    return [r[kind][base] / r[kind][ours] if base in r[kind] and ours in r[kind] else None
            for r in rows]


def _table(rows, kind, bases):
    ours = list(OURS)
    head = ("| id | T, B, I, H, bi | " + " | ".join(f"{o} (ms)" for o in ours) + " | "
            + " | ".join(f"{b} (ms) | {b} / {o}" for b in bases for o in ours[:1]) + " | "
            + " | ".join(f"{b} / {o}" for b in bases for o in ours[1:]) + " |")
    n = len(ours) + 2 * len(bases) + len(bases) * (len(ours) - 1)
    lines = [head, "|---|---|" + "---|" * n]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        cells = [fmt(r[kind].get(o), ".3f") for o in ours]
        for b in bases:
            t = r[kind].get(b)
            cells += [fmt(t, ".3f"), fmt(t / r[kind][ours[0]] if t and ours[0] in r[kind]
                                         else None, ".2f") + ("x" if t and ours[0] in r[kind] else "")]
        for b in bases:
            for o in ours[1:]:
                t = r[kind].get(b)
                cells.append(fmt(t / r[kind][o] if t and o in r[kind] else None, ".2f")
                             + ("x" if t and o in r[kind] else ""))
        lines.append(f"| {r['id']} | {', '.join(str(v) for v in r['shape'])} | "
                     + " | ".join(cells) + " |")
    cells = ["" for _ in ours]
    for b in bases:
        cells += ["", f"{geomean(ratios(rows, kind, ours[0], b)):.2f}x"]
    for b in bases:
        for o in ours[1:]:
            cells.append(f"{geomean(ratios(rows, kind, o, b)):.2f}x")
    lines.append("| geomean | | " + " | ".join(cells) + " |")
    return lines


def markdown(rows, device, limits=None):
    bases = ["cuDNN strict", "cuDNN TF32", "naive torch loop"]
    lines = [f"Device: {device}. float32. Times in ms: medians of CUDA-event intervals around "
             "back-to-back calls. Ratio = baseline time / our time (> 1: ours is faster). "
             "fast = the persistent kernels (path='fast'), steps = the per-step path.", "",
             "### Train step (forward + backward)", ""]
    lines += _table(rows, "train", bases)
    lines += ["", "### Inference (forward only, no history kept)", ""]
    lines += _table(rows, "infer", bases[:2])
    lines += ["", "### path='auto' (what a user gets by default) against cuDNN", "",
              "Per shape the path path='auto' takes in both passes on this GPU, its times from "
              "the tables above, and the ratios to cuDNN.", ""]
    lines += _auto_table(rows, bases[:2])
    fast = [r for r in rows if r.get("fast")]
    if fast:
        lines += ["", "### The fast path per shape", "",
                  "Scope: block (one block per batch group, __syncthreads), cluster (a thread-"
                  "block cluster per batch group, distributed shared memory and the cluster "
                  "barrier) or grid (all blocks of a direction, a barrier through global "
                  "memory). Time per step = the pass's time / T (the input GEMM, and for the "
                  "train step the weight-gradient GEMMs, included). Barrier = one barrier of the "
                  "scope on the plan's grid, timed alone (gru_barrier_probe). Floor = the "
                  "barriers alone: one per step forward, one per step backward. h moved per "
                  "step = bytes of h that reach the blocks each forward step (backward moves "
                  "d_gate_h, 3x): through distributed shared memory (block, cluster), or read "
                  "from L2 by every block (grid).", "",
                  "| id | scope | blocks | threads | cluster | units per block | rows | "
                  "lanes per unit | packs per thread | registers fwd / bwd | shared memory (KiB) "
                  "| inference µs/step | train µs/step | barrier µs | train floor µs/step | "
                  "train / floor | h moved per step (KiB) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in fast:
            f, T = r["fast"], r["shape"][0]
            train_step = r["train"]["fast"] * 1e3 / T
            floor = 2 * f.get("barrier_us", float("nan"))
            lines.append(f"| {r['id']} | {f['scope']} | {f['blocks']} | {f['threads']} | "
                         f"{f['cluster']} | {f['units']} | {f['rows']} | {f['lanes']} | "
                         f"{f['packs']} | "
                         f"{f['regs'][0]} / {f['regs'][1]} | {f['smem'] / 1024:.1f} | "
                         f"{r['infer']['fast'] * 1e3 / T:.2f} | {train_step:.2f} | "
                         f"{floor / 2:.3f} | {floor:.3f} | {train_step / floor:.1f}x | "
                         f"{f['h_bytes_per_step'] / 1024:.1f} |")
        phased = [r for r in fast if "phases_ms" in r["fast"]]
        if phased:
            names = list(phased[0]["fast"]["phases_ms"])
            lines += ["", "The fast path's train step by piece (device ms; µs per step in "
                      "brackets): the forward pass keeping the history, the backward "
                      "recurrence (one launch), and the tail (dx and the weight-gradient "
                      "GEMMs).", "",
                      "| id | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
            for r in phased:
                ph, T = r["fast"]["phases_ms"], r["shape"][0]
                lines.append(f"| {r['id']} | " + " | ".join(
                    f"{ph[k]:.3f} ({ph[k] * 1e3 / T:.2f})" for k in names) + " |")
    pieces = list(rows[0]["steps"]) if rows else []
    lines += ["", "### Where a step's time goes (the per-step path, µs)", "",
              "measured µs/step = train step time / T (forward and backward of one step). "
              "Host µs/step = the Python issuing the train step, per step, GPU idle at the "
              "start. Each piece of a step is timed alone as host issue time / device time "
              "(the device time with the host's issue time hidden, bench.suite.held_times_us); "
              "their device times add up to the per-step path's GPU floor.", "",
              "| id | measured µs/step | host µs/step | host µs/step, CuPy launch | "
              + " | ".join(f"{k}: host / device" for k in pieces) + " | device floor µs/step |",
              "|---|---|---|---|" + "---|" * (len(pieces) + 1)]
    for r in rows:
        T = r["shape"][0]
        floor = sum(r["steps"][k][1] for k in pieces)
        lines.append(f"| {r['id']} | {r['train']['steps'] * 1e3 / T:.1f} | "
                     f"{r['host']['steps']:.1f} | {r['host']['steps, CuPy launch']:.1f} | "
                     + " | ".join(f"{r['steps'][k][0]:.1f} / {r['steps'][k][1]:.1f}"
                                  for k in pieces) + f" | {floor:.1f} |")
    if limits:
        lines += ["", "### Fast path limits on this GPU", "",
                  "Largest H for which cugru.gru.fast_plan finds a split (binary search up to "
                  "16384; path='auto' also needs B*3H*H <= FAST_AUTO_MAX_WORK), with the scope "
                  "and block count there, and the largest H it runs at block and at cluster "
                  "scope.", "",
                  "| dtype | directions | B | largest H | scope there | blocks there | "
                  "largest H, block scope | largest H, cluster scope |",
                  "|---|---|---|---|---|---|---|---|"]
        for L in limits:
            lines.append(f"| {L['dtype']} | {L['D']} | {L['B']} | {L['max_H']} | {L['scope']} | "
                         f"{L['blocks']} | {L['block_scope_max_H']} | "
                         f"{L['cluster_scope_max_H']} |")
    mem = [r for r in rows if "memory" in r]
    if mem:
        lines += ["", "### Peak memory of a train step beyond its inputs (MiB, path='auto')", "",
                  "| id | ours (CuPy pool high-water mark) | cuDNN (torch max allocated) |",
                  "|---|---|---|"]
        for r in mem:
            m = r["memory"]
            lines.append(f"| {r['id']} | {m['ours'] / 2**20:.1f} | "
                         + (f"{m['cuDNN'] / 2**20:.1f} |" if "cuDNN" in m else "- |"))
    cpu = [r for r in rows if "cpu" in r]
    if cpu:
        lines += ["", "### CPU fallback: train step on the host CPU (ms)", "",
                  "| id | ours (numpy) | torch CPU nn.GRU | ratio |", "|---|---|---|---|"]
        for r in cpu:
            c = r["cpu"]
            t = c.get("torch CPU")
            lines.append(f"| {r['id']} | {c['ours (numpy)']:.1f} | "
                         + (f"{t:.1f} | {t / c['ours (numpy)']:.2f}x |" if t else "- | - |"))
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ids = [r["id"] for r in rows]
    series = [("train", "cuDNN strict"), ("train", "cuDNN TF32"), ("infer", "cuDNN strict"),
              ("infer", "cuDNN TF32")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(series)
    def ours(r):   # the path path="auto" takes in both passes (else the first of OURS)
        a = r.get("auto") or [None, None]
        return a[0] if a[0] == a[1] and a[0] in r["train"] else next(iter(OURS))
    for k, (kind, base) in enumerate(series):
        vals = [r[kind][base] / r[kind][ours(r)] if base in r[kind] and ours(r) in r[kind]
                else 0 for r in rows]
        ax.bar([i + (k - 1.5) * width for i in range(len(ids))], vals, width,
               label=f"{kind}: {base} / ours (path='auto')")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(ids)), ids)
    ax.set_ylabel("speed-up of ours (log)")
    ax.set_title("cugru against cuDNN, float32 (> 1: ours faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def tile_sweep(shape_ids, repeat):
    """Every tile split (cluster size x rows per group) of each shape, timed: the forward
    pass with history and the backward recurrence (device ms), against the cost model's
    estimate and its choice. Returns markdown lines."""
    import cupy as cp

    from cugru import gru
    from cugru._args import GruSaved
    dev = cp.cuda.runtime.getDevice()
    lines = ["### Tile splits per shape (`python -m bench.gru --sweep`)", "",
             "Forward (history kept) and backward recurrence, device ms, for every built tile "
             "kernel (cluster, packs per thread, gate and unit, most rows, threads, units per "
             "thread) that holds the shape, with one row per group and with the rows "
             "fast_plan's ranking prefers for that kernel; * = fast_plan's choice.", "",
             "| id | cluster | packs | most rows | threads | units per thread | rows | lanes | "
             "blocks | clusters at once | forward | backward |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sid in shape_ids:
        T, B, I, H, bi = SHAPES[sid]
        p = make_problem(T, B, I, H, bi)
        D = 2 if bi else 1
        chosen = gru.fast_plan(B, H, D, np.float32)
        a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
        dims = (T, B, I, H, D)
        for tile in gru.TILES[4]:
            splits = [p for p in (gru._tile_split(B, H, D, tile, r, 4)
                                  for r in range(1, tile[2] + 1)) if p is not None]
            # (grid scope: as many groups at once as the GPU holds)
            splits = [gru._resident(p, D, gru._clusters_at_once(p, "float32", dev))
                      for p in splits]
            splits = [p for p in splits if p is not None]
            if not splits:
                continue
            best = min(splits, key=lambda p: gru._tile_rank(
                p, D, gru._clusters_at_once(p, "float32", dev)))
            for plan in sorted({splits[0], best}, key=lambda p: p.rows):
                fwd = lambda: gru._forward_gpu(a["x"], a["h0"], *w, dims, True, plan)  # noqa
                y, hn, hs, gates = fwd()
                saved = GruSaved(a["x"], a["w_ih"], a["w_hh"], hs, gates, False)
                bwd = lambda: gru._backward_recurrence(a["dy"], None, saved, dims, plan)  # noqa
                tf = suite.gpu_time_us(fwd, n_repeat=repeat) / 1e3
                tb = suite.gpu_time_us(bwd, n_repeat=repeat) / 1e3
                mark = " *" if plan == chosen else ""
                lines.append(f"| {sid} | {plan.cluster}{mark} | {plan.packs} | "
                             f"{plan.max_rows} | {plan.threads} | {plan.per_thread} | "
                             f"{plan.rows} | {plan.lanes} | "
                             f"{plan.blocks * D} | "
                             f"{gru._clusters_at_once(plan, 'float32', dev)} | {tf:.3f} | "
                             f"{tb:.3f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cugru against cuDNN on S1-S10")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=None)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU fallback rows")
    ap.add_argument("--sweep", action="store_true",
                    help="only time every tile split of the shapes (tuning the cost model)")
    args = ap.parse_args(argv)
    import cupy as cp
    if args.sweep:
        table = "\n".join(tile_sweep(args.shapes.split(","), args.repeat)) + "\n"
        print(table)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gru-sweep.md"), "w") as f:
                f.write(table)
        return 0
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    rows = run(args.shapes.split(","), args.repeat, cpu=not args.no_cpu)
    limits = fast_limits()
    table = markdown(rows, dev, limits)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gru-bench.json"), "w") as f:
            json.dump({"device": dev, "rows": rows, "fast_limits": limits}, f, indent=1)
        with open(os.path.join(args.out, "gru-bench.md"), "w") as f:
            f.write(table)
        plot(rows, os.path.join(args.out, "gru-ratios.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
