"""Accuracy in half precision and TF32: cugru against torch.nn.GRU in the same precision,
both measured against float64 on the same rounded inputs.

    python -m bench.precision [--device cpu|cuda] [--shapes S1,S2]
                              [--dtypes float16,bfloat16,tf32] [--draws N] [--json FILE]

For each shape and dtype the inputs (x, h0, the weights, dy and dh_n) are drawn in float64
and rounded to the dtype, N times (seeds 0 to N-1; 3 unless --draws says); both
implementations take those values, and torch.nn.GRU in float64 on the same values is the
reference (not cugru's own float64 pass, so that our error is not measured against
ourselves). The error of each result (y, h_n, dx, dh0, and the four weight gradients) is
normwise: max |result - reference| / max |reference|. Goal: ours at most 1.5x torch's in
the same dtype, on every result, judged on each implementation's largest error over the
draws (its worst case over the same inputs). The table gives those errors with their ratio,
and each draw's worst ratio alone; the draws whose own ratio is above 1.5x are named below
the verdict, for the record. One draw's ratio is not the measure: where both errors are at
float32's rounding (float32 data, and the results TF32 leaves in float32), each is a unit
or two of float32 at one element, and the ratio of the two moves by tens of percent from
draw to draw and with the order of any sum (docs/performance.md, "The tile kernels'
lane sums, pairwise, and how the accuracy goal is judged").

On the CPU cugru runs its numpy path (computing in float32 from the rounded inputs, each
result rounded once) and torch its CPU kernels in that dtype; on CUDA torch runs cuDNN and
cugru its GPU kernels, where they take the dtype (a row says where they do not yet).
"tf32" (CUDA only) is float32 data with TF32 products: ours with math="tf32" (cuBLAS'
products and the tile kernels' recurrent product on tensor cores), cuDNN with TF32 allowed.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .shapes import SHAPES, id_list, make_problem
from .timing import publish

NAMES = ("y", "h_n", "dx", "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh")
GOAL = 1.5
#: shapes run by default: small enough for the numpy path on a CPU
DEFAULT_SHAPES = ("S1", "S2", "S4", "S6")


def np_dtype(name):
    """The numpy dtype of a float dtype's name, bfloat16 (ml_dtypes') included."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def problem(shape, dtype, seed=0):
    """The inputs rounded to `dtype` (numpy arrays of it), dh_n included."""
    T, B, I, H, bi = shape
    p = make_problem(T, B, I, H, bi, seed=seed, dtype=np.float64)
    D = 2 if bi else 1
    p["dh_n"] = np.random.default_rng(seed + 1).standard_normal((D, B, H))
    return {k: (v.astype(dtype) if isinstance(v, np.ndarray) else v) for k, v in p.items()}


def run_torch(p, torch_dtype, device, tf32=False):
    """torch.nn.GRU on p's values in `torch_dtype` (`tf32`: cuDNN with TF32 allowed): the
    eight results as float64 numpy, the weight gradients in cugru's layout (D, 3H, ...)."""
    import torch
    was = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        return _run_torch(p, torch_dtype, device)
    finally:
        torch.backends.cudnn.allow_tf32 = was


def _run_torch(p, torch_dtype, device):
    import torch
    T, B, I = p["x"].shape
    D, G, H = p["w_hh"].shape
    gru = torch.nn.GRU(I, H, bidirectional=D == 2, device=device, dtype=torch_dtype)
    as_t = lambda a: torch.tensor(np.asarray(a, np.float64), dtype=torch_dtype,  # noqa: E731
                                  device=device)
    names = []
    with torch.no_grad():
        for d in range(D):
            tail = "_reverse" if d else ""
            for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                src = {"weight_ih": "w_ih", "weight_hh": "w_hh", "bias_ih": "b_ih",
                       "bias_hh": "b_hh"}[w]
                getattr(gru, f"{w}_l0{tail}").copy_(as_t(p[src][d]))
                names.append(f"{w}_l0{tail}")
    x = as_t(p["x"]).requires_grad_()
    h0 = as_t(p["h0"]).requires_grad_()
    y, h_n = gru(x, h0)
    torch.autograd.backward([y, h_n], [as_t(p["dy"]), as_t(p["dh_n"])])
    host = lambda t: t.detach().to("cpu", torch.float64).numpy()  # noqa: E731

    def stacked(w):
        return np.stack([host(getattr(gru, f"{w}_l0{'_reverse' if d else ''}").grad)
                         for d in range(D)])
    return (host(y), host(h_n), host(x.grad), host(h0.grad), stacked("weight_ih"),
            stacked("weight_hh"), stacked("bias_ih"), stacked("bias_hh"))


def run_ours(p, xp, math=None, path="auto"):
    """cugru on p's values (numpy or cupy, in their dtype; `math`: its math=, where given;
    `path`: both passes'): the eight results as float64."""
    import cugru
    v = {k: (xp.asarray(a) if isinstance(a, np.ndarray) else a) for k, a in p.items()}
    kw = {} if math is None else {"math": math}
    y, h_n, saved = cugru.gru_forward(v["x"], v["h0"], v["w_ih"], v["w_hh"], v["b_ih"],
                                      v["b_hh"], bidirectional=p["bi"], path=path, **kw)
    grads = cugru.gru_backward(v["dy"], v["dh_n"], saved, path=path)
    host = (lambda a: a) if xp is np else (lambda a: xp.asnumpy(a))
    return tuple(np.asarray(host(a), np.float64) for a in (y, h_n) + tuple(grads))


def normwise(a, ref):
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-300))


#: draws of the inputs by default (seeds 0 to DRAWS - 1)
DRAWS = 3


def run(ids, dtypes, device, draws=DRAWS):
    """A row per shape, dtype and result: each implementation's largest error over `draws`
    draws of the inputs ("ours", "torch"), and each draw's ("ours_draws", "torch_draws")."""
    rows = {}
    for seed in range(draws):
        for r in _run_draw(ids, dtypes, device, seed):
            key = (r["id"], r["dtype"], r["result"])
            if key not in rows:
                rows[key] = dict(r, ours_draws=[r["ours"]], torch_draws=[r["torch"]])
                continue
            row = rows[key]
            row["ours_draws"].append(r["ours"])
            row["torch_draws"].append(r["torch"])
            row["torch"] = max(row["torch"], r["torch"])
            if r["ours"] is not None and row["ours"] is not None:
                row["ours"] = max(row["ours"], r["ours"])
    return list(rows.values())


def _run_draw(ids, dtypes, device, seed):
    import torch
    if device == "cuda":
        import cupy as xp
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        xp = np
    rows = []
    for sid in ids:
        for name in dtypes:
            tf32 = name == "tf32"
            p = problem(SHAPES[sid], np.float32 if tf32 else np_dtype(name), seed=seed)
            ref = run_torch(p, torch.float64, device)
            theirs = run_torch(p, torch.float32 if tf32 else getattr(torch, name), device, tf32)
            try:
                ours, why = run_ours(p, xp, "tf32" if tf32 else None), None
            except TypeError as e:      # (a dtype the GPU kernels do not take yet)
                if xp is np or "on the GPU cugru takes" not in str(e):
                    raise
                ours, why = None, str(e).split(";")[0]
            for k, out in enumerate(NAMES):
                rows.append({"id": sid, "shape": list(SHAPES[sid]), "dtype": name,
                             "result": out, "torch": normwise(theirs[k], ref[k]),
                             "ours": None if ours is None else normwise(ours[k], ref[k]),
                             "why": why})
    return rows


def markdown(data):
    """The table of `data` ({"device": name, "rows": run's rows})."""
    rows, device_name = data["rows"], data["device"]
    draws = max(len(r.get("torch_draws", [0])) for r in rows) if rows else 1
    out = [f"Normwise error against torch.nn.GRU in float64 on the same rounded inputs "
           f"(max |result - reference| / max |reference|), the largest of {draws} draw"
           f"{'s' if draws > 1 else ''} of the inputs for each, {device_name}; torch = "
           f"torch.nn.GRU in the dtype; ratio = ours / torch (goal <= {GOAL}); the last "
           f"column: each draw's worst ratio alone.", "",
           "| id | dtype | " + " | ".join(NAMES) + " | worst ratio | per draw |",
           "|---|---|" + "---|" * (len(NAMES) + 2)]
    missed, single, absent = [], [], []
    keys = sorted({(r["id"], r["dtype"]) for r in rows},
                  key=lambda k: (list(SHAPES).index(k[0]), k[1]))
    for sid, dt in keys:
        sel = {r["result"]: r for r in rows if r["id"] == sid and r["dtype"] == dt}
        if any(r["ours"] is None or None in r.get("ours_draws", ()) for r in sel.values()):
            cells = [f"torch {sel[n]['torch']:.1e}" for n in NAMES]
            out.append(f"| {sid} | {dt} | " + " | ".join(cells) + " | ours: not built | - |")
            absent.append(f"{sid} {dt} ({next(iter(sel.values()))['why']})")
            continue
        ratios = {n: sel[n]["ours"] / max(sel[n]["torch"], 1e-300) for n in NAMES}
        cells = [f"{sel[n]['ours']:.1e} / {sel[n]['torch']:.1e}" for n in NAMES]
        worst = max(ratios, key=ratios.get)
        missed += [f"{sid} {dt} {n} {ratios[n]:.2f}x" for n in NAMES if ratios[n] > GOAL]
        each = []
        for k in range(len(sel[NAMES[0]].get("ours_draws", ()))):
            r_k = {n: sel[n]["ours_draws"][k] / max(sel[n]["torch_draws"][k], 1e-300)
                   for n in NAMES}
            w_k = max(r_k, key=r_k.get)
            each.append(f"{r_k[w_k]:.2f} ({w_k})")
            single += [f"{sid} {dt} {n} {r_k[n]:.2f}x in draw {k}" for n in NAMES
                       if r_k[n] > GOAL]
        out.append(f"| {sid} | {dt} | " + " | ".join(cells)
                   + f" | {ratios[worst]:.2f} ({worst}) | {', '.join(each) or '-'} |")
    ran = any(r["ours"] is not None for r in rows)
    out += ["", "Cells: ours / torch. " + (
        f"Above the goal: {', '.join(missed)}." if missed else
        "No result of ours to judge." if not ran else
        f"Every result within the goal ({GOAL}x torch's error)" + (
            "" if not absent else " where ours ran") + " on the largest error over the draws.")]
    if single:
        out.append(f"Single draws above {GOAL}x on their own (not the goal's measure): "
                   + ", ".join(single) + ".")
    if absent:
        out.append("Not run: " + "; ".join(absent) + ".")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.precision",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--shapes", type=id_list(SHAPES), default=list(DEFAULT_SHAPES),
                    help="comma-separated ids of S1-S10")
    ap.add_argument("--dtypes", default="float16,bfloat16",
                    help="float16, bfloat16 and/or tf32 (float32 data, TF32 products; CUDA)")
    ap.add_argument("--draws", type=int, default=DRAWS,
                    help="draws of the inputs (seeds 0 to N-1); the goal is judged on each "
                         "side's largest error over them")
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args(argv)
    if args.draws < 1:
        ap.error(f"--draws must be at least 1, got {args.draws}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or any(d not in ("float16", "bfloat16", "tf32") for d in dtypes):
        ap.error(f"--dtypes must name float16, bfloat16 and/or tf32, got {args.dtypes!r}")
    if "tf32" in dtypes and args.device != "cuda":
        ap.error("--dtypes tf32 needs --device cuda (the CPU computes TF32 products in float32)")
    if "bfloat16" in dtypes:
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            ap.error("--dtypes bfloat16 needs ml_dtypes (pip install ml_dtypes)")
    try:
        import torch
    except ImportError:
        ap.error("bench.precision compares with torch.nn.GRU: pip install torch")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA GPU")
    rows = run(args.shapes, dtypes, args.device, args.draws)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    data = {"device": name, "rows": rows}
    publish(markdown(data), data, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
