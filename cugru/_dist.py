"""The main job's data-parallel processes (cugru.train): which process this is, one
all-reduce of its gradient buffer per step, a watchdog, and the launcher of --gpus N.

A process learns its place from the launcher's environment, as torchrun sets it: RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT. GPU processes reduce through NCCL
(cupyx.distributed's NCCL backend, on the current stream); CPU processes (the numpy
oracle, for checks) through torch.distributed's gloo, on the arrays' own memory.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import threading
import time


#: set by `launch` (so that one process of --gpus 1 takes the data-parallel path too)
FORCE = "CUGRU_DATA_PARALLEL"


def launched() -> bool:
    """Whether this process is one of a launcher's data-parallel processes."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get(FORCE) == "1"


class Group:
    """This process's place among the data-parallel processes, and their all-reduce."""

    def __init__(self, rank, world, local):
        self.rank, self.world, self.local = rank, world, local

    def all_reduce(self, a):
        """Sum `a` (a contiguous array) over the processes, in place."""
        raise NotImplementedError

    def close(self):
        pass


class _Gloo(Group):
    def __init__(self, rank, world, local, timeout):
        super().__init__(rank, world, local)
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise SystemExit("data-parallel training on the CPU reduces through torch's gloo "
                             "backend: pip install torch") from None
        self._torch, self._dist = torch, dist
        # (env://: the launcher's store where it has one, as torchrun's agent does)
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))

    def all_reduce(self, a):
        self._dist.all_reduce(self._torch.from_numpy(a))

    def close(self):
        self._dist.destroy_process_group()


class _Nccl(Group):
    def __init__(self, rank, world, local, addr, port):
        super().__init__(rank, world, local)
        import cupy
        import cupyx.distributed as cd
        cupy.cuda.Device(local % cupy.cuda.runtime.getDeviceCount()).use()
        self._comm = cd.init_process_group(world, rank, backend="nccl", host=addr,
                                           port=int(port))

    def all_reduce(self, a):
        self._comm.all_reduce(a, a, "sum")

    def close(self):
        stop = getattr(self._comm, "stop", None)    # (rank 0's rendezvous server)
        if stop is not None:
            stop()


def preload(device):
    """Import what from_env's group will use (torch.distributed on the CPU, cupyx.distributed
    on GPUs), so that the time an import takes is not counted as a wait for the others."""
    if device == "gpu":
        import cupyx.distributed  # noqa: F401
    else:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            pass                  # (_Gloo says what to install)


def from_env(device, timeout):
    """The Group the launcher's environment describes (None for one process): NCCL for
    device "gpu", gloo for "cpu"."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and os.environ.get(FORCE) != "1":
        return None
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if device != "gpu":
        return _Gloo(rank, world, local, timeout)
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    # (cupyx.distributed's rank 0 serves its own rendezvous; under torchrun the agent's
    # store holds MASTER_PORT, so it takes the next port, or CUGRU_NCCL_PORT)
    port = int(os.environ.get("MASTER_PORT", "29500"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        port += 1
    return _Nccl(rank, world, local, addr, int(os.environ.get("CUGRU_NCCL_PORT", port)))


class Watchdog:
    """Stops the process with a one-line error when `beat` has not been called for
    `timeout` seconds (a peer that failed or hangs would otherwise leave the others
    waiting in a collective for ever)."""

    def __init__(self, rank, timeout):
        self.rank, self.timeout, self.last = rank, timeout, time.monotonic()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def beat(self, extra=0.0):
        """A step was taken; `extra` seconds more than `timeout` may pass before the next."""
        self.last = time.monotonic() + extra

    def pause(self):
        """Work of this process's own follows (loading, building), no wait for the others:
        nothing is watched until the next `beat`."""
        self.last = float("inf")

    def stop(self):
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            if time.monotonic() - self.last > self.timeout:
                print(f"cugru-train, rank {self.rank}: no progress for {self.timeout:g} s (another "
                      "process failed, hangs or never came); stopping", file=sys.stderr,
                      flush=True)
                os._exit(3)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv, n, module="cugru.train"):
    """Run `python -m <module> argv` as n processes (ranks 0 .. n-1, one per GPU), rank
    0's output on this console; if one fails, stop the others; if this process is stopped
    (Ctrl-C, SIGTERM) or fails, stop them all. Returns the exit code (128 + the signal for
    a process a signal ended)."""
    import signal

    def stop_here(signum, frame):
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, stop_here)
    env = dict(os.environ, WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), CUGRU_NCCL_PORT=str(free_port()),
               **{FORCE: "1"})
    procs, code = [], 0
    try:
        for rank in range(n):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", module, *argv],
                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                stdout=None if rank == 0 else subprocess.DEVNULL))
        running = list(procs)
        while running:
            for p in list(running):
                rc = p.poll()
                if rc is None:
                    continue
                running.remove(p)
                if rc != 0 and code == 0:
                    code = rc if rc > 0 else 128 - rc
                    print(f"{module}: a process exited with code {code}; stopping the "
                          "others", file=sys.stderr, flush=True)
                    for q in running:
                        q.terminate()
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    return code
