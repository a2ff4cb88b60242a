"""Data-parallel scaling: samples per second of a GRU train step on 1, 2, ... GPUs.

One process per GPU; every engine and every GPU count in one run.

    python -m bench.scaling [--gpus 1,2] [--engines cugru-ddp,cudnn-ddp,cugru-cupy]
                            [--steps 20] [--json FILE] [--device cuda|cpu] [shape flags]

The workload (defaults): 2 layers, bidirectional, H = 512, I = 512, T = 100, B = 256 rows
per GPU, float32. Weak scaling, as data-parallel training is used: every GPU takes B rows,
so N GPUs train on N x B rows a step. The engines:
- cugru-ddp: cugru.torch.GRU and a linear head under torch's DistributedDataParallel
  (NCCL; gloo on the CPU), cross-entropy on random labels, torch.optim.Adam (fused on CUDA).
- cudnn-ddp: the same model with torch.nn.GRU (cuDNN, FP32 strict): the baseline.
- cugru-cupy: the main job's reduction scheme (cugru.train --gpus N) on this model, in
  CuPy: cugru.gru_forward and gru_backward layer by layer, every gradient in one
  FlatGrads buffer, one all-reduce of it after backward (cupyx.distributed's NCCL; gloo on
  the CPU; one process reduces too, as --gpus 1 does), cukernels.multi's Adam in one launch
  (the main job calls cukernels.adam_update per tensor). Its loss is half the squared error
  of the last layer's outputs against random targets, summed over the processes (no head:
  the head is a rounding error of this step's time), so its "over cudnn-ddp" column
  compares a step of another loss and optimizer call.
Each process runs --warmup steps, then --steps steps timed between two barriers with the
device synchronised; samples/s = GPUs x B x steps / seconds (rank 0's clock); the losses
kept are rank 0's (its own mean for the DDP engines). Scaling is
samples/s on N GPUs over samples/s on 1, per engine; goal: >= 1.8 on 2 GPUs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
import time

import numpy as np

from .timing import publish

ENGINES = ("cugru-ddp", "cudnn-ddp", "cugru-cupy")
GOAL = 1.8


def parser():
    ap = argparse.ArgumentParser(prog="python -m bench.scaling",
                                 description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--gpus", default="1,2", help="process counts to run, comma-separated")
    ap.add_argument("--engines", default=",".join(ENGINES), help="engines to run")
    ap.add_argument("--layers", type=int, default=2, help="GRU layers (each bidirectional)")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size H")
    ap.add_argument("--inputs", type=int, default=512, help="input size I")
    ap.add_argument("--seq", type=int, default=100, help="sequence length T")
    ap.add_argument("--batch", type=int, default=256, help="rows per process (per GPU)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the timing")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: processes on the CPU (gloo, the numpy oracle), for checks: give "
                         "it tiny shapes (the defaults take many minutes there); cudnn-ddp is "
                         "then torch.nn.GRU's CPU kernels")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds a process may wait for the others")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--worker", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    return ap


# ------------------------------------------------------------------------------- workers
def _place():
    rank = int(os.environ.get("RANK", "0"))
    return rank, int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", rank))


def _ddp_worker(args, engine):
    """One process of cugru-ddp or cudnn-ddp; returns rank 0's measurement."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from cugru.ddp import classifier

    rank, world, local = _place()
    cuda = args.device == "cuda"
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.allow_tf32 = False      # (FP32 strict, as cugru computes)
        torch.backends.cuda.matmul.allow_tf32 = False
    dist.init_process_group("nccl" if cuda else "gloo", init_method="env://", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=args.timeout))
    try:
        torch.manual_seed(0)
        model = classifier(args.inputs, args.hidden, args.layers, 10, device, torch.float32,
                           gru=torch.nn.GRU if engine == "cudnn-ddp" else None)
        ddp = DistributedDataParallel(model, device_ids=[local] if cuda else None)
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, **({"fused": True} if cuda else {}))
        g = torch.Generator(device=device).manual_seed(1000 + rank)   # (each its own rows)
        x = torch.randn(args.seq, args.batch, args.inputs, generator=g, device=device)
        labels = torch.randint(0, 10, (args.batch,), generator=g, device=device)
        barrier = (lambda: dist.barrier(device_ids=[local])) if cuda else dist.barrier
        sync = torch.cuda.synchronize if cuda else (lambda: None)

        def step():
            loss = torch.nn.functional.cross_entropy(ddp(x), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.detach()
        losses = [float(step()) for _ in range(args.warmup)]
        sync()
        barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            last = step()
        sync()
        barrier()
        seconds = time.perf_counter() - start
        losses.append(float(last))
        name = torch.cuda.get_device_name(device) if cuda else "cpu"
        barrier()
        del ddp, opt
        return {"seconds": seconds, "losses": losses, "device_name": name}
    finally:
        dist.destroy_process_group()


def _cupy_worker(args):
    """One process of cugru-cupy; returns rank 0's measurement."""
    from cugru import _dist, gru_backward, gru_forward
    from cugru.train import FlatGrads
    from cukernels import multi

    rank, world, local = _place()
    os.environ.setdefault(_dist.FORCE, "1")        # (one process reduces too, as --gpus 1)
    group = _dist.from_env("gpu" if args.device == "cuda" else "cpu", args.timeout)
    if args.device == "cuda":
        import cupy as xp
        sync = xp.cuda.Device().synchronize
        name = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"].decode()
    else:
        xp, sync, name = np, (lambda: None), "cpu"
    try:
        H, D = args.hidden, 2
        rng = np.random.default_rng(0)                # (the same weights everywhere)
        k = 1 / np.sqrt(H)
        shapes, values = {}, {}
        for layer in range(args.layers):
            width = args.inputs if layer == 0 else D * H
            for name_, shape in (("w_ih", (D, 3 * H, width)), ("w_hh", (D, 3 * H, H)),
                                 ("b_ih", (D, 3 * H)), ("b_hh", (D, 3 * H))):
                shapes[f"{name_}{layer}"] = shape
                values[f"{name_}{layer}"] = xp.asarray(
                    rng.uniform(-k, k, shape).astype(np.float32))
        grads = FlatGrads(xp, shapes, np.float32)
        names = list(shapes)
        moments = [[xp.zeros_like(values[n]) for n in names] for _ in range(2)]
        lists = multi.TensorLists([grads.views[n] for n in names], [values[n] for n in names],
                                  *moments)
        mine = np.random.default_rng(1000 + rank)     # (each its own rows)
        x = xp.asarray(mine.standard_normal((args.seq, args.batch, args.inputs),
                                            dtype=np.float32))
        target = xp.asarray(mine.standard_normal((args.seq, args.batch, D * H),
                                                 dtype=np.float32))
        loss_buf = xp.zeros(1, np.float32)

        def step(t):
            inp, saved = x, []
            for layer in range(args.layers):
                w = [values[f"{n}{layer}"] for n in ("w_ih", "w_hh", "b_ih", "b_hh")]
                inp, _, s = gru_forward(inp, None, *w, bidirectional=True)
                saved.append(s)
            err = inp - target
            loss_buf[...] = 0.5 * (err * err).sum()
            dy = err
            for layer in reversed(range(args.layers)):
                dy, _, *g = gru_backward(dy, None, saved[layer])
                for n, gn in zip(("w_ih", "w_hh", "b_ih", "b_hh"), g):
                    xp.negative(gn, out=grads.views[f"{n}{layer}"])   # (descent direction)
            group.all_reduce(grads.flat)
            group.all_reduce(loss_buf)
            lists.adam_update(world * args.batch, 1e-3, t=t)
            return loss_buf

        def barrier():
            sync()
            group.all_reduce(xp.zeros(1, np.float32))
            sync()
            dog.beat()
        # (NCCL has no timeout of its own here: a peer that hangs stops this process)
        dog = _dist.Watchdog(rank, args.timeout)
        losses = []
        for t in range(1, args.warmup + 1):
            losses.append(float(step(t)[0]))
            dog.beat()
        barrier()
        start = time.perf_counter()
        for t in range(args.warmup + 1, args.warmup + args.steps + 1):
            last = step(t)
            dog.beat()
        barrier()
        seconds = time.perf_counter() - start
        losses.append(float(last[0]))
        dog.stop()
        return {"seconds": seconds, "losses": losses, "device_name": name}
    finally:
        group.close()


def worker(args):
    rank, world, _ = _place()
    r = _cupy_worker(args) if args.worker == "cugru-cupy" else _ddp_worker(args, args.worker)
    if rank == 0:
        r.update(engine=args.worker, gpus=world, batch=args.batch, steps=args.steps,
                 samples_per_s=world * args.batch * args.steps / r["seconds"],
                 ms_per_step=r["seconds"] / args.steps * 1e3)
        with open(args.result, "w") as f:
            json.dump(r, f)
    return 0


# ------------------------------------------------------------------------------ launcher
def _forwarded(args):
    """The workload's flags, as a worker takes them."""
    out = []
    for flag in ("layers", "hidden", "inputs", "seq", "batch", "steps", "warmup", "device",
                 "timeout"):
        out += [f"--{flag}", str(getattr(args, flag))]
    return out


def run(args):
    """Every engine on every process count; the rows (one per engine and count)."""
    from cugru import _dist
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            for n in args.counts:
                result = os.path.join(tmp, f"{engine}-{n}.json")
                code = _dist.launch(["--worker", engine, "--result", result, *_forwarded(args)],
                                    n, module="bench.scaling")
                if code != 0 or not os.path.exists(result):
                    rows.append({"engine": engine, "gpus": n, "error": f"exit {code}"})
                    continue
                with open(result) as f:
                    rows.append(json.load(f))
    return rows


def markdown(rows, shape):
    """The scaling table: per engine and process count, the step time, the rate, the
    scaling over that engine's one-process rate, and cugru against cuDNN at that count."""
    one = {r["engine"]: r["samples_per_s"] for r in rows if r.get("gpus") == 1 and "error" not in r}
    base = {r["gpus"]: r["samples_per_s"] for r in rows
            if r.get("engine") == "cudnn-ddp" and "error" not in r}
    name = next((r["device_name"] for r in rows if "device_name" in r), "?")
    cpu = " (no cuDNN there: cudnn-ddp is torch.nn.GRU on the CPU)" if name == "cpu" else ""
    lines = [f"Workload: {shape}; device: {name}, one process per device{cpu}.", "",
             "| engine | devices | rows a step | ms a step | samples/s | scaling over 1 | "
             "over cudnn-ddp |", "|---|---|---|---|---|---|---|"]
    missed, met, unmeasured = [], [], []
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['engine']} | {r['gpus']} | failed ({r['error']}) | | | | |")
            if r["gpus"] == 2:
                unmeasured.append(f"{r['engine']} (failed on 2)")
            continue
        s = r["samples_per_s"]
        scale = s / one[r["engine"]] if r["engine"] in one else None
        vs = s / base[r["gpus"]] if r["gpus"] in base else None
        lines.append(f"| {r['engine']} | {r['gpus']} | {r['gpus'] * r['batch']} | "
                     f"{r['ms_per_step']:.2f} | {s:,.0f} | "
                     f"{'' if scale is None else f'{scale:.2f}x'} | "
                     f"{'' if vs is None else f'{vs:.2f}x'} |")
        if r["gpus"] == 2:
            if scale is None:
                unmeasured.append(f"{r['engine']} (no 1-device rate)")
            else:
                (missed if scale < GOAL else met).append(f"{r['engine']} {scale:.2f}x")
    verdict = [f"met by {', '.join(met)}" if met else "",
               f"missed by {', '.join(missed)}" if missed else "",
               f"not measured for {', '.join(unmeasured)}" if unmeasured else ""]
    lines += ["", f"Goal: >= {GOAL}x the one-device rate on 2 devices: "
              + ("; ".join(v for v in verdict if v) or "no 2-device row") + "."]
    return lines


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    for flag in ("layers", "hidden", "inputs", "seq", "batch", "steps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be >= 1")
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    bad = [e for e in args.engines.split(",") if e not in ENGINES]
    if bad:
        ap.error(f"--engines: unknown {', '.join(bad)} (choose from {', '.join(ENGINES)})")
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        ap.error(f"--json {args.json}: its folder does not exist")
    if not args.timeout > 0:
        ap.error(f"--timeout must be > 0, got {args.timeout}")
    try:
        args.counts = [int(v) for v in args.gpus.split(",")]
    except ValueError:
        ap.error(f"--gpus must be counts separated by commas, got {args.gpus!r}")
    if min(args.counts) < 1:
        ap.error("--gpus: every count must be >= 1")
    if args.device == "cuda":
        try:
            import cupy
        except ImportError:
            ap.error("--device cuda needs CuPy (pip install cupy-cuda12x), or --device cpu")
        counts = args.counts
        have = cupy.cuda.runtime.getDeviceCount()
        if max(counts) > have:
            ap.error(f"--gpus {args.gpus}: this machine has {have} GPU(s)")
    rows = run(args)
    shape = (f"{args.layers} layers, bidirectional, H = {args.hidden}, I = {args.inputs}, "
             f"T = {args.seq}, B = {args.batch} per device, float32, {args.steps} timed steps "
             f"after {args.warmup}")
    publish(markdown(rows, shape), {"shape": shape, "rows": rows}, args.json)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    from cugru.ddp import _exit_now
    _exit_now(main())       # (without the interpreter's teardown, as cugru.ddp leaves)
