"""The updates over lists of tensors (cukernels.multi) against torch's fused optimizers and
against one single-tensor call per tensor, all in one run.

    python -m bench.multi [--json FILE] [--repeat N]

Two kinds of rows, float32:
- many tensors: a model's worth of parameter tensors (200 of 64K elements, the goal's size;
  and 50 of 256K, 1000 of 4K, untuned on), one Adam step. The wall clock per step of
  back-to-back steps (what a training loop sees: the host's work and the device's, whichever
  bounds) of our TensorLists (checked once), our list function (checked every call), one
  cukernels.adam_update per tensor, and torch.optim.Adam(fused=True) over the same tensors
  (its .grad set once); plus our device time per step alone (CUDA events). Goal:
  TensorLists at 200 x 64K in at most 0.25 ms.
- bandwidth: 2^26 elements in all (64 tensors of 2^20, and 1000 tensors of ~67K), every
  rule, device time; the rate counts each array read and written once (Adam: D, w, m, v read
  and written, 8 x 4 bytes per element) against a device-to-device copy's rate in the same
  run. Goal: at least 90% of copy at 2^26 elements.
Our updates also zero D (one more array written than torch's, which leaves .grad as it is).
The chunk sweep times TensorLists' Adam at 200 x 64K and at 2^26 for each chunk size.
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing

GOAL_MS = 0.25
GOAL_COPY = 0.90
#: (label, tensors, elements per tensor): the many-tensor rows (the first is the goal's)
MANY = (("200 x 64K", 200, 65536), ("50 x 256K", 50, 262144), ("1000 x 4K", 1000, 4096))
#: (label, tensors, elements per tensor): 2^26 elements in all (the second, ragged, ~)
BIG = (("64 x 2^20", 64, 2**20), ("1000 x ~67K", 1000, None))
CHUNKS = (4096, 16384, 65536)
#: arrays each rule reads and writes per element (D, w and its moments)
ARRAYS = {"sgd_update": 2, "momentum_update": 3, "adagrad_update": 3, "rmsprop_update": 3,
          "adadelta_update": 4, "adam_update": 4}


def _sizes(count, each):
    """Tensor sizes: `each` apiece, or for None 2^26 in all split unevenly (odd sizes)."""
    if each is not None:
        return [each] * count
    rng = np.random.default_rng(1)
    w = rng.uniform(0.5, 1.5, count)
    sizes = np.floor(w / w.sum() * 2**26).astype(int) | 1
    sizes[-1] += 2**26 - sizes.sum()
    return [int(s) for s in sizes]


def _tensors(cp, sizes, moments):
    """D, w and the moment lists for tensors of `sizes` (float32; moments >= 0)."""
    rng = cp.random.default_rng(0)
    D = [rng.standard_normal(n, dtype=cp.float32) for n in sizes]
    W = [rng.standard_normal(n, dtype=cp.float32) for n in sizes]
    M = [[cp.abs(rng.standard_normal(n, dtype=cp.float32)) for n in sizes]
         for _ in range(moments)]
    return D, W, M


def _adam_calls(cp, sizes):
    import cukernels as ck
    from cukernels import multi
    D, W, (M, V) = _tensors(cp, sizes, 2)
    tl = multi.TensorLists(D, W, M, V)
    calls = {
        "TensorLists": lambda: tl.adam_update(4, 1e-3, t=3),
        "list function": lambda: multi.adam_update(D, W, M, V, 4, 1e-3, t=3),
        "a call per tensor": lambda: [ck.adam_update(d, w, m, v, 4, 1e-3, t=3)
                                      for d, w, m, v in zip(D, W, M, V)],
    }
    torch = timing.torch_cuda()
    if torch is not None:
        params = [torch.nn.Parameter(torch.as_tensor(w).clone()) for w in W]
        for p, d in zip(params, D):
            p.grad = torch.as_tensor(d).clone()
        opt = torch.optim.Adam(params, lr=1e-3, fused=True)
        calls["torch Adam(fused)"] = opt.step
    return tl, calls


def many(repeat):
    cp = timing._cp()
    rows = []
    for label, count, each in MANY:
        tl, calls = _adam_calls(cp, _sizes(count, each))
        row = {"shape": label, "tensors": count, "elements": count * each}
        for name, fn in calls.items():
            row[f"{name} ms"] = timing.host_time_us(fn, n_repeat=max(5, repeat // 10)) / 1e3
        row["TensorLists device ms"] = timing.gpu_time_us(calls["TensorLists"],
                                                          n_repeat=20) / 1e3
        rows.append(row)
    return rows


def bandwidth(copy_gbs):
    from cukernels import multi
    cp = timing._cp()
    rows = []
    for label, count, each in BIG:
        sizes = _sizes(count, each)
        D, W, M = _tensors(cp, sizes, 2)
        n = sum(sizes)
        row = {"shape": label, "tensors": count, "elements": n}
        for rule, arrays in ARRAYS.items():
            tl = multi.TensorLists(D, W, *M[:arrays - 2])
            args = {"adam_update": {"t": 3}}.get(rule, {})
            us = timing.gpu_time_us(lambda: getattr(tl, rule)(4, 1e-3, **args), n_repeat=10)
            gbs = 2 * arrays * 4 * n / us / 1e3
            row[rule] = {"us": us, "GB/s": gbs, "of copy": gbs / copy_gbs}
        rows.append(row)
        del D, W, M
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def chunk_sweep():
    from cukernels import multi
    cp = timing._cp()
    rows = []
    saved = multi.CHUNK
    try:
        for label, sizes in (("200 x 64K", [65536] * 200), ("64 x 2^20", [2**20] * 64)):
            D, W, (M, V) = _tensors(cp, sizes, 2)
            row = {"shape": label}
            for chunk in CHUNKS:
                multi.CHUNK = chunk
                tl = multi.TensorLists(D, W, M, V)
                row[str(chunk)] = timing.gpu_time_us(lambda: tl.adam_update(4, 1e-3, t=3),
                                                n_repeat=20)
            rows.append(row)
    finally:
        multi.CHUNK = saved
    return rows


def measure(repeat):
    timing.require_gpu()
    copy = timing.copy_bandwidth_gbs()
    return {"copy GB/s": copy, "many": many(repeat), "bandwidth": bandwidth(copy),
            "chunks": chunk_sweep()}


def markdown(res):
    from cukernels import multi
    out = ["Adam over many tensors, float32: wall clock per step of back-to-back steps, ms "
           "(ratio: torch Adam(fused) time / ours)", "",
           "| tensors | TensorLists | list function | a call per tensor | torch Adam(fused) | "
           "torch / TensorLists | TensorLists, device only |", "|---|---|---|---|---|---|---|"]
    for r in res["many"]:
        t = r.get("torch Adam(fused) ms")
        ours = r["TensorLists ms"]
        out.append(f"| {r['shape']} | {ours:.3f} | {r['list function ms']:.3f} | "
                   f"{r['a call per tensor ms']:.3f} | {f'{t:.3f}' if t else '-'} | "
                   f"{f'{t / ours:.2f}x' if t else '-'} | {r['TensorLists device ms']:.3f} |")
    out += ["", f"Bandwidth at 2^26 elements, device time (copy: {res['copy GB/s']:.0f} GB/s, "
            "read + written); goal >= 90% of copy:", "",
            "| tensors | " + " | ".join(ARRAYS) + " |", "|---|" + "---|" * len(ARRAYS)]
    for r in res["bandwidth"]:
        out.append(f"| {r['shape']} | " + " | ".join(
            f"{r[k]['us']:.0f} µs, {100 * r[k]['of copy']:.0f}%" for k in ARRAYS) + " |")
    out += ["", "Goals:"] + goals(res)
    out += ["", f"Chunk sweep (TensorLists Adam, device µs per step; CHUNK = {multi.CHUNK}):", "",
            "| tensors | " + " | ".join(f"chunk {c}" for c in CHUNKS) + " |",
            "|---|" + "---|" * len(CHUNKS)]
    for r in res["chunks"]:
        out.append(f"| {r['shape']} | " + " | ".join(f"{r[str(c)]:.1f}" for c in CHUNKS) + " |")
    return out


def goals(res):
    """The goals' lines: Adam over 200 x 64K (TensorLists, wall clock) and Adam's share of
    copy bandwidth at 2^26 elements (the lowest over the layouts)."""
    goal_row = next((r for r in res["many"] if r["shape"] == MANY[0][0]), None)
    lines = []
    if goal_row is not None:
        ms = goal_row["TensorLists ms"]
        lines.append(f"- Adam over {MANY[0][0]} in <= {GOAL_MS} ms a step: "
                     f"{'met' if ms <= GOAL_MS else 'NOT met'} ({ms:.3f} ms)")
    if res["bandwidth"]:
        low = min(r["adam_update"]["of copy"] for r in res["bandwidth"])
        lines.append(f"- Adam at 2^26 elements >= {100 * GOAL_COPY:.0f}% of copy: "
                     f"{'met' if low >= GOAL_COPY else 'NOT met'} (lowest {100 * low:.1f}%)")
    return lines


def main(argv=None):
    return timing.table_main(__doc__, measure, markdown, argv, repeat=200)


if __name__ == "__main__":
    sys.exit(main())
