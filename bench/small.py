"""The small path (cugru/_plan.py, SmallPlan: a whole pass in one launch) on small shapes,
against the plan that path="auto" takes where the small path is left out (the persistent
kernels where they hold the shape, else per step) and torch.nn.GRU on cuDNN (FP32 strict),
all in one run: the wall clock per call of back-to-back calls (what a small model's loop
pays: the host's work and the GPU's together) and the device time of a call.

    python -m bench.small [--json FILE] [--repeat N]

The shapes straddle path="auto"'s limits (SMALL_AUTO_MAX_CHAIN, one per pass): the table says
which plan auto takes in each pass, and times auto itself beside the small path and the
other plan, so that the limits can be read against the times.
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing

#: name -> (T, B, I, H, bidirectional)
SMALL_SHAPES = {
    "tiny": (1, 1, 1, 1, False),
    "s-a": (8, 4, 16, 16, False),
    "s-b": (16, 8, 32, 32, True),
    "s-c": (40, 2, 3, 8, False),
    "s-d": (64, 1, 32, 32, False),
    "s-e": (100, 1, 16, 16, False),
    "s-f": (32, 16, 64, 64, False),
    "s-g": (200, 4, 8, 8, True),
    "s-h": (32, 1, 16, 16, False),
    "s-i": (32, 4, 8, 8, True),
    "s-j": (10, 8, 16, 16, True),
    "s-k": (16, 1, 32, 32, False),
}


def _problem(cp, T, B, I, H, D, seed=0):
    rng = np.random.default_rng(seed)
    k = 1 / np.sqrt(H)
    f = lambda lo, hi, *s: cp.asarray(rng.uniform(lo, hi, s).astype(np.float32))  # noqa: E731
    return (f(-1, 1, T, B, I), f(-1, 1, D, B, H), f(-k, k, D, 3 * H, I), f(-k, k, D, 3 * H, H),
            f(-k, k, D, 3 * H), f(-k, k, D, 3 * H), f(-1, 1, T, B, D * H))


def _ours(x, h0, w, dy, bi, path):
    import cugru

    def infer():
        return cugru.gru_forward(x, h0, *w, bidirectional=bi, training=False, path=path)

    def train():
        y, hn, saved = cugru.gru_forward(x, h0, *w, bidirectional=bi, path=path)
        return cugru.gru_backward(dy, None, saved, path=path)
    return {"inference": infer, "train step": train}


def _cudnn(torch, x, h0, w, dy, bi):
    T, B, I = x.shape
    H = w[1].shape[-1]
    gru = torch.nn.GRU(I, H, bidirectional=bi).cuda()
    with torch.no_grad():
        for d, sfx in enumerate(["", "_reverse"][:2 if bi else 1]):
            for name, a in zip(("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"), w):
                getattr(gru, name + sfx).copy_(torch.as_tensor(a[d]))
    tx, th0, tdy = (torch.as_tensor(a).clone() for a in (x, h0, dy))

    def infer():
        with torch.no_grad():
            return gru(tx, th0)

    def train():
        y, hn = gru(tx, th0)
        torch.autograd.backward(y, tdy)
    return {"inference": infer, "train step": train}


def measure(repeat=100):
    """[{shape, dims, auto_small, other, pass, small/other/cudnn wall and device µs}]."""
    import cupy as cp

    from cugru import plans
    torch = timing.torch_cuda()
    allow = None
    if torch is not None:
        allow = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False

    def sync():
        cp.cuda.Device().synchronize()
        if torch is not None:
            torch.cuda.synchronize()
    rows = []
    try:
        for name, (T, B, I, H, bi) in SMALL_SHAPES.items():
            D = 2 if bi else 1
            x, h0, *w, dy = _problem(cp, T, B, I, H, D)
            w = tuple(w)
            fast = plans.fast_plan(B, H, D, np.float32)
            other = "fast" if plans.auto_takes(fast, B, H, D) else "steps"
            runs = {"auto": _ours(x, h0, w, dy, bi, "auto"),
                    "other": _ours(x, h0, w, dy, bi, other)}
            if plans.SMALL.fits(B, H, D):
                runs["small"] = _ours(x, h0, w, dy, bi, "small")
            if torch is not None:
                runs["cudnn"] = _cudnn(torch, x, h0, w, dy, bi)
            takes = [plans.small_takes(T, B, I, H, D, back) for back in (False, True)]
            for kind in ("inference", "train step"):
                row = {"shape": name, "dims": [T, B, I, H, D], "pass": kind, "other": other,
                       "auto_small": takes[:1] if kind == "inference" else takes}
                for label, fns in runs.items():
                    row[f"{label}_wall_us"] = timing.host_time_us(fns[kind], n_repeat=repeat,
                                                                  sync=sync)
                    row[f"{label}_gpu_us"] = timing.gpu_time_us(fns[kind], n_repeat=30)
                rows.append(row)
                print(f"  {name} {kind}: done", file=sys.stderr, flush=True)
    finally:
        if torch is not None:
            torch.backends.cudnn.allow_tf32 = allow
    return rows


def markdown(rows):
    """The table: per shape and pass, what auto runs and its time, the small path's, the
    other plan's and cuDNN's (wall clock / device time, µs)."""
    f = lambda r, k: "-" if r.get(k) is None else f"{r[k]:.1f}"  # noqa: E731
    lines = ["| shape (T, B, I, H, D) | pass | auto takes (forward, backward) | auto | small | "
             "without it (path) | cuDNN | cuDNN / auto (wall) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = (f"{r['cudnn_wall_us'] / r['auto_wall_us']:.2f}x"
                 if r.get("auto_wall_us") and r.get("cudnn_wall_us") else "-")
        takes = ", ".join("small" if t else r["other"] for t in r["auto_small"])
        cell = lambda k: f"{f(r, k + '_wall_us')} / {f(r, k + '_gpu_us')}"  # noqa: E731
        lines.append(f"| {r['shape']} {tuple(r['dims'])} | {r['pass']} | {takes} | "
                     f"{cell('auto')} | {cell('small')} | ({r['other']}) {cell('other')} | "
                     f"{cell('cudnn')} | {ratio} |")
    return lines


def main(argv=None) -> int:
    return timing.table_main(__doc__, measure, markdown, argv, repeat=100)


if __name__ == "__main__":
    sys.exit(main())
