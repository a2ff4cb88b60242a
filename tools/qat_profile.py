"""Where a quantization-aware call's time goes, against the float call, on S1-S10 shapes:
the plans each pass takes, and the host's issue time and the device's time per call held
apart (bench.timing.held_times_us), for inference and the train step.

    python tools/qat_profile.py [--shapes S1,S2,S6]
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="S1,S2,S3,S6")
    args = ap.parse_args(argv)
    import cupy as cp

    import cugru
    from bench import qat, timing
    from bench.shapes import SHAPES, make_problem
    from cugru import plans
    spec = cugru.QuantSpec(**qat.SPEC_ARGS)
    f32 = np.dtype(np.float32)
    for sid in args.shapes.split(","):
        T, B, I, H, bi = SHAPES[sid]
        D = 2 if bi else 1
        p = make_problem(T, B, I, H, bi)
        print(f"{sid} {T, B, I, H, bi}")
        for label, q in (("float", False), ("qat", True)):
            chosen = [plans.choose("auto", B, H, D, f32, back, T, I, q) for back in (0, 1)]
            print(f"  {label} plans: forward {chosen[0]}, backward {chosen[1]}")
        for label, quant in (("float", None), ("qat", spec)):
            train, infer = qat._ours(p, cp, quant)
            for kind, fn in (("infer", infer), ("train", train)):
                host, device = timing.held_times_us(fn, n_repeat=10)
                print(f"  {label:5s} {kind}: host {host:8.1f} us, device {device:8.1f} us, "
                      f"events {timing.gpu_time_us(fn, n_repeat=20):8.1f} us")


if __name__ == "__main__":
    sys.exit(main())
