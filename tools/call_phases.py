"""How much the cost of a call moves within one process: bench/calls.py's four calls of
ours, timed as bench.calls times them (bench.timing.host_time_us), again and again while
the process's state changes around them: before torch is imported, after torch's CUDA
start-up, after torch's own calls have run, with the garbage collector off, with this
thread pinned to one CPU. Each line: µs per call of the four calls, the process's CPU
time over the wall time of the line (above 1: other threads of the process were busy),
and its thread count.

    python tools/call_phases.py      (GPU needed; torch with CUDA for the later lines)

Then bench.calls' own table, in the same process.
"""
import gc
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
    from bench import calls, timing

    def line(label, cases, sync=None):
        t0, c0 = time.perf_counter(), os.times()
        us = [timing.host_time_us(fn, n_repeat=200, sync=sync) for _, fn, _ in cases]
        t1, c1 = time.perf_counter(), os.times()
        busy = (c1.user + c1.system - c0.user - c0.system) / (t1 - t0)
        threads = len(os.listdir("/proc/self/task"))
        print(f"{label:34s}" + "".join(f"{v:8.1f}" for v in us)
              + f"   cpu/wall {busy:.2f}, {threads} threads", flush=True)

    real = timing.torch_cuda
    timing.torch_cuda = lambda: None       # (our calls alone, torch not imported)
    try:
        ours = calls.cases()
    finally:
        timing.torch_cuda = real
    print(f"{'µs per call:':34s}" + "".join(f"{n.split()[0][:7]:>8s}" for n, _, _ in ours))
    line("torch not imported", ours)
    line("the same, again", ours)
    torch = timing.torch_cuda()
    if torch is None:
        print("(no torch with CUDA: the lines after torch's calls are left out)")
        return
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    line("torch imported, CUDA started", ours)
    both = calls.cases()
    for _, _, theirs in both:
        for _ in range(200):
            theirs()
    torch.cuda.synchronize()
    line("after torch's calls ran", ours)

    def sync():
        import cupy as cp
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()
    line("bench.calls' cases and sync", both, sync)
    gc.disable()
    try:
        line("garbage collector off", both, sync)
    finally:
        gc.enable()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    line("this thread on one CPU", both, sync)
    line("the same, again", both, sync)
    print("\n".join(calls.markdown(calls.measure())))


if __name__ == "__main__":
    main()
