"""The GRU benchmark: shapes S1-S10, ours against cuDNN (through torch) in the same run.

    python -m bench.gru [--shapes S1,S3] [--out DIR] [--repeat N] [--no-cpu] [--sweep]

For each shape, float32, a train step (forward + backward with a given dy, no dh_n) and a
forward-only inference pass, timed for
  - ours: path="fast" (the persistent kernels), path="steps", and path="auto" where its two
    passes take different paths (elsewhere auto's time is that of the path it takes),
  - cuDNN FP32 strict (torch.backends.cudnn.allow_tf32 = False) and cuDNN with TF32 (torch's
    default), through torch.nn.GRU,
  - the naive per-step loop of torch ops with autograd (unidirectional shapes only).
Device times are medians of CUDA-event intervals around back-to-back calls (bench.timing).
Ratios are baseline time / our time: above 1, ours is faster. Also measured: our host time
per step (the Python issuing one step's launches, GPU idle at the start, no sync), where the
per-step GPU time goes (one recurrent GEMM and one pointwise kernel each way, timed alone),
the fast path's plan per shape and its limits on the device, the peak memory of a train step
for S3, S9 and S10, and the CPU fallback against torch's CPU GRU on S1 and S2. The tables
and the plot are bench/gru_report.py's; writes DIR/gru-bench.json, DIR/gru-bench.md and
DIR/gru-ratios.png.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import numpy as np

from . import gru_report, timing
from .shapes import CPU_SHAPES, MEMORY_SHAPES, SHAPES, id_list, make_problem
from .gru_report import OURS


@contextlib.contextmanager
def _device_setting(name, value):
    from cugru import _device
    old = getattr(_device, name)
    setattr(_device, name, value)
    try:
        yield
    finally:
        setattr(_device, name, old)


def plain_launch():
    """The per-step kernels launched through CuPy's RawKernel call (the reference; never
    from a CUDA graph)."""
    return _device_setting("PLAIN_LAUNCH", True)


def graphs_off():
    """The per-step path issuing every call of every step (no CUDA graph replay)."""
    return _device_setting("GRAPHS", False)


def ours_calls(p, xp, path="auto", math=None):
    """(train step, inference) of problem `p` through the public functions (`math`: the
    calls' math=, where given)."""
    import cugru
    a = {k: xp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in p.items()}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
    kw = {} if xp is np else {"path": path}
    if math is not None:
        kw["math"] = math

    def train():
        y, hn, saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"], **kw)
        return cugru.gru_backward(a["dy"], None, saved, **kw)

    def infer():
        return cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=p["bi"], training=False,
                                 **kw)
    return train, infer


def dims(p):
    T, B, I = p["x"].shape
    D, G, H = p["w_hh"].shape
    return T, B, I, H, D


def fast_info(p, repeat=None):
    """The fast path's plan for a problem, with its kernels' registers and, given `repeat`,
    the measured time of one barrier of its scope on its grid and of its passes (None: no
    plan)."""
    from cugru import plans
    T, B, I, H, D = dims(p)
    plan = plans.fast_plan(B, H, D, np.float32)
    if plan is None:
        return None
    back = plans.fast_plan(B, H, D, np.float32, backward=True)
    # (each pass's own kernel: the backward pass may take another split, or the per-step
    # path, None here)
    regs = [plan.kernels("float")[0].raw.num_regs,
            back.kernels("float")[2].raw.num_regs if back is not None else None]
    if isinstance(plan, plans.TilePlan):
        # every block receives its rows' whole vector (distributed shared memory, or L2 at
        # grid scope)
        moved = D * plan.blocks * plan.rows * H * 4
        info = {"cluster": plan.cluster or f"{plan.group_blocks} per group, {plan.slots} at once",
                "rows": f"{plan.rows} per group", "lanes": plan.lanes,
                "threads": plan.threads, "packs": f"{plan.packs} x {plan.per_thread} units"}
        if isinstance(back, plans.TilePlan) and back.tile != plan.tile:
            info["packs"] += f" (backward {back.packs} x {back.per_thread})"
    else:
        moved = plan.blocks * D * B * H * 4     # every block reads its direction's h from L2
        info = {"cluster": "-", "rows": f"{plan.rows_per_thread} per thread", "lanes": "-",
                "threads": plans.PERSIST_THREADS, "packs": "-"}
    scope = plan.scope if back == plan else \
        f"{plan.scope} (backward: {back.scope if back else 'per step'})"
    info.update({"scope": scope, "blocks": plan.blocks * D, "units": plan.units,
                 "smem": max(plan.smem_fwd, plan.smem_bwd), "regs": regs,
                 "h_bytes_per_step": moved})
    if repeat:
        info["barrier_us"] = barrier_us(plan, D, repeat)
        if back is not None:
            info["phases_ms"] = fast_phases(p, plan, back, repeat)
    return info


def fast_phases(p, plan, back, repeat):
    """Device ms of the fast path's train step by piece: the forward pass (history kept),
    the backward recurrence (one launch) and the backward tail (dx and the weight-gradient
    GEMMs)."""
    import cupy as cp

    from cugru import plans
    a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])

    def forward():
        return plans.forward(a["x"], a["h0"], *w, plan, bidirectional=p["bi"])
    y, hn, saved = forward()
    pass_, dh = plans.backward_recurrence(a["dy"], None, saved, back)
    pieces = {"forward": forward,
              "backward recurrence": lambda: plans.backward_recurrence(a["dy"], None, saved,
                                                                       back),
              "backward tail": lambda: plans.backward_tail(pass_)}
    return {k: timing.gpu_time_us(fn, n_repeat=repeat) / 1e3 for k, fn in pieces.items()}


def barrier_us(plan, D, repeat, n=2000):
    """Device time of one barrier of the plan's scope on the plan's grid: a launch of n
    barriers less a launch of none, over n (the kernels of cugru/kernels/gru_probes.cu)."""
    import cupy as cp

    from cugru import _catalog, plans
    from cukernels import runtime
    cluster = isinstance(plan, plans.TilePlan) and plan.cluster > 0
    grid = (plan.group_blocks if isinstance(plan, plans.TilePlan) and not cluster
            else plan.blocks, D)
    block = (plan.threads if isinstance(plan, plans.TilePlan) else plans.PERSIST_THREADS,)
    if cluster:
        k = runtime.kernel("gru_probes.cu", _catalog.cluster_barrier_probe(plan.cluster))

        def call(count):
            k.launch(grid, block, {"n": count})
    else:
        k = runtime.kernel("gru_probes.cu", _catalog.COUNTER_BARRIER_PROBE)
        counters = [cp.zeros(D, np.uint32) for _ in range(2)]

        def call(count):
            counters[count > 0].fill(0)
            k.launch(grid, block, {"barrier": counters[count > 0], "n": count},
                     cooperative=True)
    t_n = timing.gpu_time_us(lambda: call(n), n_repeat=repeat)
    t_0 = timing.gpu_time_us(lambda: call(0), n_repeat=repeat)
    return max(t_n - t_0, 0.0) / n


def torch_gru_calls(torch, p, device, tf32, dtype=None):
    """(train step, inference) of torch.nn.GRU with the problem's weights (float32, or
    `dtype`, a torch dtype; the problem's values are converted to it)."""
    T, B, I, H, D = dims(p)
    dtype = dtype or torch.float32
    gru = torch.nn.GRU(I, H, bidirectional=p["bi"]).to(device=device, dtype=dtype)
    sfx = ["", "_reverse"][:D]
    # (through float64: exact for every dtype of ours, and numpy's bfloat16 is not torch's)
    t = lambda a: torch.tensor(np.asarray(a, np.float64), device=device).to(dtype)  # noqa: E731
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


def step_costs(p, repeat):
    """Host and device time of each piece of one per-step-path step, timed alone on the
    shape's buffers (µs; timing.held_times_us: the device time excludes the host's issue
    time)."""
    from cugru import plans
    pieces = plans.step_pieces(*dims(p))
    return {name: timing.held_times_us(fn, n_repeat=repeat) for name, fn in pieces.items()}


def fast_limits(batches=(1, 64), h_max=16384):
    """Largest H with a fast-path plan (cugru.plans.fast_plan), per dtype, directions and B."""
    from cugru import plans
    out = []
    for dtype in (np.float32, np.float64):
        for D in (1, 2):
            for B in batches:
                lo, hi = 0, h_max
                while lo < hi:                     # largest H in [0, h_max] that fits
                    mid = (lo + hi + 1) // 2
                    if plans.fast_plan(B, mid, D, dtype) is not None:
                        lo = mid
                    else:
                        hi = mid - 1
                plan = plans.fast_plan(B, lo, D, dtype) if lo else None
                out.append({"dtype": np.dtype(dtype).name, "D": D, "B": B, "max_H": lo,
                            "scope": plan.scope if plan else "-",
                            "blocks": plan.blocks * D if plan else 0,
                            "block_scope_max_H": _scope_limit(B, D, dtype, "block"),
                            "cluster_scope_max_H": _scope_limit(B, D, dtype, "cluster")})
    return out


def _scope_limit(B, D, dtype, scope, h_max=320):
    """Largest H up to h_max that fast_plan runs at `scope` (block: one block per batch
    group; the tile kernels hold at most H = 256 at block and cluster scope)."""
    from cugru import plans
    best = 0
    for H in range(1, h_max + 1):
        plan = plans.fast_plan(B, H, D, dtype)
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
    res = {"ours": pool.total_bytes() - base}
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
    res = {"ours (numpy)": timing.wall_ms(train, repeat)}
    if torch is not None:
        t_train, _ = torch_gru_calls(torch, p, "cpu", False)
        res["torch CPU"] = timing.wall_ms(t_train, repeat)
    return res


def auto_paths(T, B, I, H, D):
    """What path="auto" runs in float32 on this GPU: [forward, backward], each "fast",
    "steps" (the labels of OURS), "small" or "resident" (those two timed as path="auto"
    itself)."""
    from cugru import plans
    f32 = np.dtype(np.float32)
    out = []
    for back in (False, True):
        plan = plans.choose("auto", B, H, D, f32, back, T, I)
        out.append({plans.STEPS: "steps", plans.SMALL: "small"}.get(plan) or (
            "resident" if plan.scope == "resident" else "fast"))
    return out


def run(shape_ids, repeat, cpu=True):
    import cupy as cp
    torch = timing.torch_cuda()
    rows = []
    for sid in shape_ids:
        T, B, I, H, bi = SHAPES[sid]
        p = make_problem(T, B, I, H, bi)
        row = {"id": sid, "shape": [T, B, I, H, bi], "train": {}, "infer": {}, "host": {}}
        row["fast"] = fast_info(p, repeat)
        row["auto"] = auto_paths(T, B, I, H, 2 if bi else 1)
        labels = dict(OURS)
        if gru_report.auto_label(row) == "auto":   # the passes differ, or the small path
            labels["auto"] = "auto"
        calls = {}
        for label, path in labels.items():
            if path == "fast" and row["fast"] is None:
                continue
            calls[label] = ours_calls(p, cp, path)
            row["host"][label] = timing.host_us_per_call_issued(calls[label][0], T)
        if torch is not None:
            for label, tf32 in (("cuDNN strict", False), ("cuDNN TF32", True)):
                calls[label] = torch_gru_calls(torch, p, "cuda", tf32)
        # (ours and cuDNN's in turn, over rounds: a host whose pace drifts weighs on both)
        timed = {}
        timing.time_passes(timed, calls, repeat)
        for label in calls:
            for kind in ("train", "infer"):
                row[kind][label] = timed[f"{label} {kind} ms"]
        plain_train, plain_infer = ours_calls(p, cp, "steps")
        with graphs_off():
            row["train"]["steps, no graphs"] = timing.gpu_time_us(plain_train,
                                                                  n_repeat=repeat) / 1e3
            row["infer"]["steps, no graphs"] = timing.gpu_time_us(plain_infer,
                                                                  n_repeat=repeat) / 1e3
            row["host"]["steps, no graphs"] = timing.host_us_per_call_issued(plain_train, T)
        with plain_launch():
            row["host"]["steps, CuPy launch"] = timing.host_us_per_call_issued(plain_train, T)
        if torch is not None:
            if not bi:
                row["train"]["naive torch loop"] = timing.gpu_time_us(
                    naive_train_call(torch, p), n_repeat=max(5, repeat // 4)) / 1e3
        row["steps"] = step_costs(p, repeat)
        if sid in MEMORY_SHAPES:
            row["memory"] = peak_memory(p, torch)
        if cpu and sid in CPU_SHAPES:
            row["cpu"] = cpu_fallback(p, torch)
        rows.append(row)
        print(f"  {sid}: {row['train']}", file=sys.stderr, flush=True)
    return rows


def tile_sweep(shape_ids, repeat):
    """Every tile split (cluster size x rows per group) of each shape, timed: the forward
    pass with history and the backward recurrence (device ms), against fast_plan's
    ranking and its choice. Returns markdown lines."""
    import cupy as cp

    from cugru import plans
    lines = ["### Tile splits per shape (`python -m bench.gru --sweep`)", "",
             "Forward (history kept) and backward recurrence, device ms, for every built tile "
             "kernel (cluster, packs per thread, gate and unit, most rows, threads, units per "
             "thread) that holds the shape, with one row per group and with the rows "
             "fast_plan's ranking prefers for that kernel; * = fast_plan's choice for the "
             "forward pass, b = for the backward pass.", "",
             "| id | cluster | packs | most rows | threads | units per thread | rows | lanes | "
             "blocks | groups at once | forward | backward |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for sid in shape_ids:
        T, B, I, H, bi = SHAPES[sid]
        p = make_problem(T, B, I, H, bi)
        D = 2 if bi else 1
        chosen = plans.fast_plan(B, H, D, np.float32)
        chosen_back = plans.fast_plan(B, H, D, np.float32, backward=True)
        a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
        at_once = dict(plans.tile_splits(B, H, D, np.float32))    # {split: groups at once}
        for tile in plans.TILES[4]:
            splits = [s for s in at_once if s.tile == tile]
            if not splits:
                continue
            best = {min(splits, key=lambda s: plans.tile_rank(s, D, at_once[s], backward))
                    for backward in (False, True)}
            for plan in sorted({splits[0], *best}, key=lambda s: s.rows):
                def fwd(plan=plan):
                    return plans.forward(a["x"], a["h0"], *w, plan, bidirectional=bi)
                saved = fwd()[2]

                def bwd(plan=plan, saved=saved):
                    return plans.backward_recurrence(a["dy"], None, saved, plan)
                tf = timing.gpu_time_us(fwd, n_repeat=repeat) / 1e3
                tb = timing.gpu_time_us(bwd, n_repeat=repeat) / 1e3
                mark = (" *" if plan == chosen else "") + (" b" if plan == chosen_back else "")
                lines.append(f"| {sid} | {plan.cluster}{mark} | {plan.packs} | "
                             f"{plan.max_rows} | {plan.threads} | {plan.per_thread} | "
                             f"{plan.rows} | {plan.lanes} | {plan.blocks * D} | "
                             f"{at_once[plan]} | {tf:.3f} | {tb:.3f} |")
                print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="cugru against cuDNN on S1-S10",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--shapes", type=id_list(SHAPES), default=list(SHAPES),
                    help="comma-separated shape ids")
    ap.add_argument("--out", default=None, help="folder for gru-bench.{json,md} and the plot")
    ap.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU fallback rows")
    ap.add_argument("--sweep", action="store_true",
                    help="only time every tile split of the shapes (tuning the ranking)")
    args = ap.parse_args(argv)
    timing.require_gpu()
    import cupy as cp
    if args.sweep:
        table = "\n".join(tile_sweep(args.shapes, args.repeat)) + "\n"
        print(table)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "gru-sweep.md"), "w") as f:
                f.write(table)
        return 0
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    rows = run(args.shapes, args.repeat, cpu=not args.no_cpu)
    limits = fast_limits()
    table = gru_report.markdown(rows, dev, limits)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gru-bench.json"), "w") as f:
            json.dump({"device": dev, "rows": rows, "fast_limits": limits}, f, indent=1)
        with open(os.path.join(args.out, "gru-bench.md"), "w") as f:
            f.write(table)
        gru_report.plot(rows, os.path.join(args.out, "gru-ratios.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
