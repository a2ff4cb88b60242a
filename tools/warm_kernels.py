"""Compile every registered kernel module into CuPy's disk cache, one process per module,
several at once: after a kernel source changed, the first calls (and a test run) then read
the cache instead of waiting for NVRTC. Prints each module's seconds and the wall clock.

    python tools/warm_kernels.py [--jobs N]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

_ONE = """
import sys, time
import cugru, cukernels  # noqa: F401  (their sources register on import)
from cukernels import runtime
t0 = time.perf_counter()
runtime.kernel(sys.argv[1], sys.argv[2])
print(f"{time.perf_counter() - t0:.1f}")
"""


def modules():
    """(source, a kernel of each of its modules) for every registered source."""
    import cugru  # noqa: F401
    import cukernels  # noqa: F401
    from cukernels import runtime
    return [(name, names[0]) for name, src in runtime.sources().items()
            for names in src.groups().values()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    args = ap.parse_args(argv)
    todo, running, failed = modules(), [], 0
    t0 = time.time()
    while todo or running:
        while todo and len(running) < max(1, args.jobs):
            src, name = todo.pop(0)
            # (output into a file, not a pipe: a compile's warnings may fill a pipe's buffer
            # while nothing reads it)
            log = tempfile.TemporaryFile("w+")
            running.append((src, name, log, subprocess.Popen(
                [sys.executable, "-c", _ONE, src, name], cwd=ROOT, stdout=log,
                stderr=subprocess.STDOUT, text=True)))
        time.sleep(0.2)
        for item in [r for r in running if r[3].poll() is not None]:
            running.remove(item)
            src, name, log, p = item
            log.seek(0)
            out = log.read()
            log.close()
            if p.returncode:
                failed += 1
                print(f"{src} {name}: FAILED\n{out[-2000:]}")
            else:
                print(f"{src} {name}: {out.strip().splitlines()[-1]} s")
    print(f"all modules in {time.time() - t0:.0f} s, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
