"""The one home of the benchmarks' timing helpers.

Device times: a CUDA event pair around each call, the calls issued back to back with one
synchronization at the end (as Triton's do_bench does): the host runs ahead, so each
interval is the device time of one call, for ours and the baselines alike, and not the
host's Python overhead. Ours and a baseline are timed in turn over rounds (time_passes):
a host whose pace drifts within a run, as the small calls' hosts do, then weighs on both.
Host times: the wall clock over back-to-back calls. Warm-up calls keep compilation, module
load and handle creation outside every timed region.
"""
from __future__ import annotations

import time

import numpy as np


def _cp():
    import cupy
    return cupy


def require_gpu():
    """Stop with a one-line message where there is no CUDA GPU with CuPy: the benchmarks
    time GPU code (the CPU fallback's rows in bench.gru run beside the GPU's)."""
    try:
        import cupy
        found = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 (no cupy, no driver or no device)
        found = False
    if not found:
        raise SystemExit("the benchmarks need a CUDA GPU with CuPy; this machine has none "
                         "(the tests run the CPU fallback: python3 -m pytest)")
    settle()


#: seconds of work before a benchmark's first measurement (see settle)
SETTLE_SECONDS = 1.0


def settle(seconds=SETTLE_SECONDS):
    """Busy the GPU and the host for `seconds` before the first measurement: a device that
    has idled runs the first case measured at lower clocks (seen: that case alone 1.3-4x
    slower, host-bound calls most). Half the time one kernel keeps the GPU busy; the other
    half, back-to-back tiny launches keep the host's launch path busy too."""
    cp = _cp()
    spin = cp.RawKernel(_SPIN_SOURCE, "spin")
    khz = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["clockRate"]
    spin((1,), (1,), (np.int64(seconds / 2 * khz * 1e3),))
    cp.cuda.Device().synchronize()
    a = cp.zeros(1, cp.float32)
    end = time.perf_counter() + seconds / 2
    while time.perf_counter() < end:
        a += 1
    cp.cuda.Device().synchronize()


def torch_cuda():
    """torch, where it is installed with a CUDA device; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def gpu_time_us(fn, n_repeat=30, n_warmup=5):
    """Median device time of one call of fn in microseconds (events around back-to-back calls)."""
    cp = _cp()
    for _ in range(n_warmup):
        fn()
    cp.cuda.Device().synchronize()
    start = [cp.cuda.Event() for _ in range(n_repeat)]
    end = [cp.cuda.Event() for _ in range(n_repeat)]
    for s, e in zip(start, end):
        s.record()
        fn()
        e.record()
    end[-1].synchronize()
    return float(np.median([cp.cuda.get_elapsed_time(s, e) for s, e in zip(start, end)])) * 1e3


_SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}
"""


def held_times_us(fn, n_repeat=20, n_warmup=3):
    """(host us, device us) per call of a short fn, with the host's issue time hidden.

    A spin kernel holds the GPU while the host queues all n_repeat calls, so the events
    around them measure the device's back-to-back time alone, and the wall clock around
    the queueing measures the host's issue time alone. Valid while one run's launches fit
    in the launch queue (a few per call, n_repeat small).
    """
    cp = _cp()
    for _ in range(n_warmup):
        fn()
    cp.cuda.Device().synchronize()
    spin = cp.RawKernel(_SPIN_SOURCE, "spin")
    clock_khz = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["clockRate"]
    t0 = time.perf_counter()
    fn()
    cp.cuda.Device().synchronize()
    guess_us = (time.perf_counter() - t0) * 1e6
    spin_us = 2000 + 3 * n_repeat * guess_us
    start, end = cp.cuda.Event(), cp.cuda.Event()
    spin((1,), (1,), (np.int64(spin_us * clock_khz / 1e3),))
    t0 = time.perf_counter()
    start.record()
    for _ in range(n_repeat):
        fn()
    end.record()
    host = (time.perf_counter() - t0) / n_repeat * 1e6
    end.synchronize()
    return host, cp.cuda.get_elapsed_time(start, end) * 1e3 / n_repeat


def host_time_us(fn, n_repeat=200, n_warmup=10, sync=None):
    """Wall time of one call of fn in microseconds: back-to-back calls, one synchronization
    at the end (`sync`, default CuPy's device), the median of five such runs."""
    return interleaved_host_us({0: fn}, n_repeat, 5, sync, n_warmup)[0]


def interleaved_host_us(fns, n_repeat=200, rounds=7, sync=None, n_warmup=10):
    """{name: wall µs of one call} of several callables (a dict): n_warmup calls of each,
    then in each of `rounds` rounds every callable runs n_repeat back-to-back calls in turn
    (one synchronization after each run, `sync`, default CuPy's device), and each one's
    result is the median of its rounds. A host whose pace moves by 1.5x within seconds
    (docs/performance.md) then weighs on ours and on the baseline alike, and one slow
    stretch moves neither median."""
    sync = sync or _cp().cuda.Device().synchronize
    got = {name: [] for name in fns}
    for fn in fns.values():
        for _ in range(n_warmup):
            fn()
    sync()
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(n_repeat):
                fn()
            sync()
            got[name].append((time.perf_counter() - t0) / n_repeat * 1e6)
    return {name: float(np.median(v)) for name, v in got.items()}


def host_us_per_call_issued(fn, calls, repeat=5):
    """Median wall time of issuing fn (GPU idle at the start, no sync inside), over `calls`."""
    cp = _cp()
    fn()
    times = []
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    cp.cuda.Device().synchronize()
    return float(np.median(times)) / calls * 1e6


def wall_ms(fn, repeat=3):
    """Median wall time of fn in ms after one warm-up call (CPU code)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def copy_bandwidth_gbs():
    """Device-to-device copy bandwidth, bytes read plus bytes written, in GB/s."""
    cp = _cp()
    src = cp.ones(2**28, dtype=cp.float32)
    dst = cp.empty_like(src)
    us = gpu_time_us(lambda: cp.copyto(dst, src), n_repeat=20)
    return 2 * src.nbytes / us / 1e3


def table_main(doc, measure, markdown, argv=None, repeat=200):
    """The command line of a benchmark module: measure (calls per timed run: --repeat), print
    its markdown table, and with --json write the rows to a file."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the measurements to this file")
    ap.add_argument("--repeat", type=int, default=repeat, help="calls per timed run")
    args = ap.parse_args(argv)
    require_gpu()
    rows = measure(args.repeat)
    publish(markdown(rows), rows, args.json)
    return 0


def publish(lines, data, path):
    """Print a benchmark's markdown `lines`; with `path`, also write `data` there as JSON."""
    import json
    print("\n".join(lines))
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


def repeats_for(T, repeat):
    """Timed calls per measurement for a sequence of T steps: a quarter (at least 3) from
    T = 1000 on, where one call takes long enough."""
    return max(3, repeat // 4) if T >= 1000 else repeat


def interleaved_gpu_us(fns, n_repeat=30, rounds=3):
    """{name: median device µs of one call} of several callables (a dict), timed in turn
    over `rounds` rounds of gpu_time_us (n_repeat calls each, at least 3 per round) and the
    median of the rounds taken: a host whose pace drifts within a run (host-bound calls)
    then weighs on each callable alike, not on whichever ran in a slow stretch."""
    per = max(3, n_repeat // rounds)
    got = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            got[name].append(gpu_time_us(fn, n_repeat=per))
    return {name: float(np.median(v)) for name, v in got.items()}


#: rounds over which the benchmarks time ours and the baselines in turn (interleaved_gpu_us)
ROUNDS = 3


def time_passes(row, calls, n, rounds=ROUNDS):
    """row["<who> train ms"] and row["<who> infer ms"] for each `who` of `calls` (a dict of
    (train step, inference) pairs of callables): the device time in ms, ours and the
    baselines timed in turn over `rounds` rounds of n // rounds calls each, at least 3
    (interleaved_gpu_us; each round warms up as gpu_time_us does)."""
    fns = {f"{who} {kind} ms": fn for who, pair in calls.items()
           for kind, fn in zip(("train", "infer"), pair)}
    for key, us in interleaved_gpu_us(fns, n, rounds).items():
        row[key] = us / 1e3


def geomean(values):
    values = [v for v in values if v]
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")
