"""Data-parallel training of a GRU classifier with cugru.torch.GRU under torch's
DistributedDataParallel, one process per GPU (or per CPU worker, with gloo):

    torchrun --nproc-per-node N -m cugru.ddp [--steps 200] [--global-batch 256] ...
    python -m cugru.ddp                       (one process, the same run on one device)

The model: a cugru.torch.GRU (2 layers, bidirectional, H = 256 by default) over the digits
(8 rows of 8 features), and a linear head on its final states. Every process draws the
same global batches (one seed) and trains on its own slice of each (global batch / N
rows); DDP averages the gradients across the processes while backward runs, so each step
is the step one process takes on the whole global batch, and every process applies the
same Adam update. Progress and results are printed by rank 0 only. A rank that fails or
hangs stops the job: torchrun ends the other processes when one exits with an error, and
a collective that waits longer than --timeout seconds raises (NCCL's watchdog, gloo's
timeout) instead of hanging.

CUDA processes use the NCCL backend, each on the GPU of its local rank; CPU processes use
gloo and cugru's numpy oracle (slow: for checks, not for training).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import numpy as np


def parser():
    ap = argparse.ArgumentParser(prog="python -m cugru.ddp", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps")
    ap.add_argument("--global-batch", type=int, default=256,
                    help="rows per step over all processes (a multiple of their number)")
    ap.add_argument("--hidden", type=int, default=256, help="GRU hidden size")
    ap.add_argument("--layers", type=int, default=2, help="GRU layers")
    ap.add_argument("--lr", type=float, default=2e-3, help="Adam's learning rate")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                    help="auto: CUDA where torch has it, else the CPU")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds a collective may wait for the other processes")
    ap.add_argument("--init-method", default="env://",
                    help="torch.distributed's rendezvous (torchrun sets env://)")
    ap.add_argument("--save", default=None, help="rank 0 writes the final weights to this .npz")
    ap.add_argument("--every", type=int, default=20, help="print the loss every this many steps")
    return ap


def classifier(inputs, hidden, layers, classes, device, dtype, gru=None):
    """A torch module: cugru.torch.GRU (bidirectional; or `gru`, a class that takes
    torch.nn.GRU's arguments) and a linear head on the final states of its last layer,
    from (T, B, inputs) to (B, classes)."""
    import torch
    from torch import nn

    from .torch import GRU
    GRU = gru or GRU

    class GRUClassifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = GRU(inputs, hidden, num_layers=layers, bidirectional=True,
                           device=device, dtype=dtype)
            self.head = nn.Linear(2 * hidden, classes, device=device, dtype=dtype)

        def forward(self, x):
            _, h_n = self.gru(x)
            return self.head(torch.cat((h_n[-2], h_n[-1]), dim=1))
    return GRUClassifier()


def _env_int(name, default):
    value = os.environ.get(name)
    return default if value is None else int(value)


def run(args):
    """Train (see the module's doc); returns (the losses rank 0 printed, the final state as
    numpy arrays by parameter name) on every rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from .train import load_digits

    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local = _env_int("LOCAL_RANK", rank)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of the "
                         f"{world} processes")
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU")
    device = torch.device("cuda", local % torch.cuda.device_count()) if cuda else \
        torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    if world == 1 and args.init_method == "env://" and "MASTER_ADDR" not in os.environ:
        # (one process started without a launcher: a rendezvous of its own, on this host)
        from ._dist import free_port
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=args.init_method,
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        X, labels = load_digits()
        torch.manual_seed(args.seed)                  # (the same initial weights everywhere)
        model = classifier(X.shape[2], args.hidden, args.layers, int(labels.max()) + 1,
                           device, dtype)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
        opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
        rng = np.random.default_rng(args.seed)        # (the same global batches everywhere)
        share = args.global_batch // world
        X_all = torch.as_tensor(X, dtype=dtype).to(device)
        y_all = torch.as_tensor(labels).to(device)
        losses, start = [], time.perf_counter()
        for step in range(1, args.steps + 1):
            rows = rng.choice(len(X), args.global_batch, replace=False)
            mine = torch.as_tensor(rows[rank * share:(rank + 1) * share], device=device)
            x = X_all.index_select(0, mine).transpose(0, 1).contiguous()     # (T, B, I)
            loss = torch.nn.functional.cross_entropy(ddp(x), y_all.index_select(0, mine))
            opt.zero_grad(set_to_none=True)
            loss.backward()                           # (DDP averages the gradients here)
            opt.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            total = float(total) / world
            losses.append(total)
            if rank == 0 and (step % args.every == 0 or step == args.steps):
                rate = step * args.global_batch / (time.perf_counter() - start)
                print(f"step {step}/{args.steps}: loss {total:.9g} ({rate:.0f} samples/s over "
                      f"{world} process(es))", flush=True)
        state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        if rank == 0 and args.save:
            np.savez(args.save, losses=np.array(losses), **state)
        # (every process done before the group goes, and DDP's reducer gone before it: a
        # process that leaves with the backend's threads still running aborts at exit)
        dist.barrier(device_ids=[device.index]) if cuda else dist.barrier()
        del ddp, opt
        return losses, state
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    for name in ("steps", "global_batch", "hidden", "layers", "every"):
        if getattr(args, name) < 1:
            parser().error(f"--{name.replace('_', '-')} must be at least 1")
    if args.timeout <= 0:
        parser().error("--timeout must be positive")
    if args.save and not os.path.isdir(os.path.dirname(os.path.abspath(args.save))):
        parser().error(f"--save {args.save}: its folder does not exist")
    try:
        run(args)
    except RuntimeError as e:   # (torch.distributed's timeouts, a peer that went away)
        print(f"cugru.ddp, rank {os.environ.get('RANK', '0')}: {str(e).strip()} (a process "
              f"failed, or did not come within --timeout {args.timeout:g} s)", file=sys.stderr)
        return 1
    return 0


def _exit_now(code):
    """Leave without the interpreter's teardown: with DDP on gloo, a backend thread still
    finishing at teardown aborts the process now and then (std::terminate) after the work
    is done and saved; every result is written and flushed before this."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
