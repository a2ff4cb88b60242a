"""Sweep the kernels' tuning knobs on the benchmark sizes and print one line per variant.

    python -m bench.tune [--part ew,adam,dense,softmax]

Knobs: the constants the sources render as #defines (cukernels/_launch.py UNROLL and STREAM,
cukernels/dense.py COL_UNROLL), the launch shapes (_launch.EW_THREADS, EW_PACKS_PER_THREAD,
GRID_BLOCKS_PER_SM; dense.DENSE_BLOCKS_PER_SM; activations.SOFTMAX_SHAPES and
SOFTMAX_GROUP_THREADS). The default variant is timed twice, first and last, so the spread
between runs is visible. The winners become the defaults in those modules.
"""
from __future__ import annotations

import argparse

from cukernels import _launch, activations, dense, runtime

from . import cases, timing

#: knob -> (module, attribute), and each knob's default
KNOBS = {"unroll": (_launch, "UNROLL"), "stream": (_launch, "STREAM"),
         "ew_threads": (_launch, "EW_THREADS"), "ew_packs": (_launch, "EW_PACKS_PER_THREAD"),
         "grid": (_launch, "GRID_BLOCKS_PER_SM"), "blocks": (dense, "DENSE_BLOCKS_PER_SM"),
         "col": (dense, "COL_UNROLL"), "ff": (dense, "FF_PACKS_PER_THREAD"),
         "shapes": (activations, "SOFTMAX_SHAPES"),
         "smt": (activations, "SOFTMAX_GROUP_THREADS")}
DEFAULTS = {k: getattr(m, a) for k, (m, a) in KNOBS.items()}


def variant(**knobs):
    """Set the knobs given (the others to their defaults) and drop the compiled modules."""
    for k, (module, attr) in KNOBS.items():
        setattr(module, attr, knobs.get(k, DEFAULTS[k]))
    runtime.rebuild()


def label(**knobs):
    return " ".join(f"{k}={v}" for k, v in knobs.items()) or "default"


def measure(name, groups, names, copy, repeat=40):
    cells = []
    for g in groups:
        for b in cases.GROUPS[g]():
            if names and not any(b.name.startswith(n) for n in names):
                continue
            us = timing.gpu_time_us(b.ours, n_repeat=repeat)
            frac = f" {b.bytes / us / 1e3 / copy:.0%}" if b.bytes else ""
            cells.append(f"{b.name}={us:.1f}us{frac}")
            for lab, fn in b.baselines.items():
                if "torch" in lab:
                    cells.append(f"[{lab}={timing.gpu_time_us(fn, n_repeat=repeat):.1f}us]")
    print(f"{name:42s} " + "  ".join(cells), flush=True)


def sweep(settings, groups, names, copy, **kw):
    for knobs in settings:
        variant(**knobs)
        measure(label(**knobs), groups, names, copy, **kw)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="ew,adam,dense,softmax")
    parts = ap.parse_args(argv).part.split(",")
    timing.require_gpu()
    copy = timing.copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s")
    if "ew" in parts:
        sweep([{}, {"unroll": 1}, {"grid": 8}, {"grid": 16}, {"grid": 4096},
               {"unroll": 4, "grid": 8}, {"stream": 1}, {}], ["elementwise", "update"],
              ["sigmoid_activation", "swish_activation", "mask_mult", "lrelu_derivative",
               "sgd_update", "adam_update"], copy)
    if "adam" in parts:
        sweep([{}, {"ew_threads": 512}, {"ew_threads": 128}, {"ew_packs": 2}, {"stream": 1},
               {"ew_threads": 1024}, {}], ["update"], ["adam_update", "sgd_update"], copy,
              repeat=60)
    if "dense" in parts:
        sweep([{}, {"blocks": 8}, {"blocks": 32}, {"col": 8}, {"col": 24}, {"blocks": 16,
                                                                            "col": 24}, {}],
              ["dense"], ["calc_hidden_gradient B=1"], copy)
    if "softmax" in parts:
        four = ((4, 2), (4, 4), (4, 8), (32, 4), (32, 8), (128, 8), (256, 8), (512, 8))
        sweep([{}, {"smt": 128}, {"smt": 64}, {"shapes": four, "smt": 128},
               {"shapes": four, "smt": 64}, {"smt": 512}, {}], ["softmax"], [], copy)
    variant()


if __name__ == "__main__":
    main()
