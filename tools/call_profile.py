"""Where a call's host time goes: each call of bench/calls.py (tiny inputs, where a call
costs its host time) run many times under cProfile, the functions that took the most time
of their own first.

    python tools/call_profile.py [--calls N] [--top K]
"""
import argparse
import cProfile
import os
import pstats
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=18)
    args = ap.parse_args(argv)
    import cupy as cp

    from bench import calls
    for name, ours, _ in calls.cases():
        for _ in range(20):
            ours()
        cp.cuda.Device().synchronize()
        prof = cProfile.Profile()
        prof.runcall(lambda: [ours() for _ in range(args.calls)])
        cp.cuda.Device().synchronize()
        print(f"==== {name}: {args.calls} calls under cProfile")
        st = pstats.Stats(prof)
        st.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
