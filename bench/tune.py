"""Sweep the kernels' tuning knobs on the benchmark sizes and print one line per variant.

    python -m bench.tune [--part ew,dense,softmax]

Knobs: the -D macros of the kernel sources (CK_UNROLL, CK_STREAM, CK_GEMV_UNROLL,
CK_ROW_UNROLL), _rt.DENSE_BLOCKS_PER_SM and the order of _rt.SOFTMAX_SHAPES. The default
variant is timed twice, first and last, so the spread between runs is visible. The winners
become the defaults in kernels/common.cuh, kernels/dense.cu and cukernels/_rt.py.
"""
from __future__ import annotations

import argparse

from cukernels import _rt

from . import suite

BASE_OPTIONS = _rt.COMPILE_OPTIONS
BASE_SHAPES = _rt.SOFTMAX_SHAPES
BASE_BLOCKS = _rt.DENSE_BLOCKS_PER_SM
BASE_GRID = _rt.GRID_BLOCKS_PER_SM
BASE_FF = _rt.FF_PACKS_PER_THREAD
BASE_SMT = _rt.SOFTMAX_GROUP_THREADS


BASE_EWT, BASE_EWP = _rt.EW_THREADS, _rt.EW_PACKS_PER_THREAD


def variant(opts=(), shapes=None, blocks=None, grid=None, ff=None, smt=None, col=None, ewt=None,
            ewp=None):
    _rt.COMPILE_OPTIONS = BASE_OPTIONS + tuple(opts)
    _rt.SOFTMAX_SHAPES = shapes or BASE_SHAPES
    _rt.DENSE_BLOCKS_PER_SM = blocks or BASE_BLOCKS
    _rt.GRID_BLOCKS_PER_SM = grid or BASE_GRID
    _rt.FF_PACKS_PER_THREAD = ff or BASE_FF
    _rt.EW_THREADS, _rt.EW_PACKS_PER_THREAD = ewt or BASE_EWT, ewp or BASE_EWP
    _rt.SOFTMAX_GROUP_THREADS = smt or BASE_SMT
    _rt.COL_UNROLL = col or 32
    if col:
        _rt.COMPILE_OPTIONS += (f"-DCK_COL_UNROLL={col}",)
    _rt.rebuild_registry()


def measure(label, groups, names, copy, repeat=40):
    cells = []
    for g in groups:
        for b in suite.GROUPS[g]():
            if names and not any(b.name.startswith(n) for n in names):
                continue
            us = suite.gpu_time_us(b.ours, n_repeat=repeat)
            frac = f" {b.bytes / us / 1e3 / copy:.0%}" if b.bytes else ""
            cells.append(f"{b.name}={us:.1f}us{frac}")
            for lab, fn in b.baselines.items():
                if "torch" in lab:
                    cells.append(f"[{lab}={suite.gpu_time_us(fn, n_repeat=repeat):.1f}us]")
    print(f"{label:42s} " + "  ".join(cells), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", default="ew,adam,dense,softmax")
    parts = ap.parse_args(argv).part.split(",")
    copy = suite.copy_bandwidth_gbs()
    print(f"copy bandwidth {copy:.0f} GB/s")
    if "ew" in parts:
        names = ["sigmoid_activation", "swish_activation", "mask_mult", "lrelu_derivative",
                 "sgd_update", "adam_update"]
        for opts, grid in (([], None), (["-DCK_UNROLL=1"], None), ([], 8), ([], 16), ([], 4096),
                           (["-DCK_UNROLL=4"], 8), (["-DCK_STREAM=1"], None), ([], None)):
            variant(opts, grid=grid)
            measure(f"{' '.join(opts) or 'default'} grid/SM={grid or BASE_GRID}",
                    ["elementwise", "update"], names, copy)
    if "adam" in parts:
        for opts, ewt, ewp in (([], None, None), ([], 512, None), ([], 128, None), ([], None, 2),
                               (["-DCK_STREAM=1"], None, None), ([], 1024, None), ([], None, None)):
            variant(opts, ewt=ewt, ewp=ewp)
            measure(f"{' '.join(opts) or 'default'} threads={ewt or BASE_EWT} packs={ewp or BASE_EWP}",
                    ["update"], ["adam_update", "sgd_update"], copy, repeat=60)
    if "dense" in parts:
        names = ["calc_hidden_gradient B=1"]
        for blocks, col in ((None, None), (8, None), (32, None), (None, 8), (None, 32), (16, 24),
                            (None, None)):
            variant(blocks=blocks, col=col)
            measure(f"hidden: blocks/SM={blocks or BASE_BLOCKS} col_unroll={col or 32}",
                    ["dense"], names, copy)
    if "softmax" in parts:
        four = ((4, 2), (4, 4), (4, 8), (32, 4), (32, 8), (128, 8), (256, 8), (512, 8))
        for shapes, smt in ((None, None), (None, 128), (None, 64), (four, 128), (four, 64),
                            (None, 512), (None, None)):
            variant(shapes=shapes, smt=smt)
            measure(f"softmax {'4-lane' if shapes else 'default'} threads={smt or BASE_SMT}",
                    ["softmax"], [], copy)
    variant()


if __name__ == "__main__":
    main()
