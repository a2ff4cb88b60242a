"""Which shapes' plans a set of tile kernels moves, and the plans before and after timed in
turn beside cuDNN.

    python tools/tiles_ab.py [--tiles "2,8,4,256,1;2,4,4,256,2"] [--math tf32] [ids ...]

For every shape of bench.paths' table (S1-S10, O1-O16, A1-A6, or the ids given), float32:
path="auto"'s forward and backward plans with cugru._catalog.TILES as built and with the
tiles named left out. Each shape whose plans differ is then timed: the train step and the
inference call on the plans without the tiles ("old"), with them ("new"), and torch.nn.GRU
on cuDNN (FP32 strict; with --math tf32 our passes run math="tf32", where the tile
kernels of 8 rows a group run their MMA instances, and cuDNN runs with TF32 allowed), the
three in turn over 5 rounds (bench.timing.time_passes, device ms). The plans are the
strict passes' (under math="tf32" path="auto" keeps an 8-row tile whose MMA kernels run in
place of its 4-row sibling, cugru._plan.four_row_in_place: --math tf32 times that choice).
The default tiles are plans.FOUR_ROW_TILES. (GPU and torch with CUDA needed.)
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _tile_list(value):
    """An argparse type: tiles as "c,q,r,t,u;c,q,r,t,u", each a float32 tile built."""
    from cugru import _catalog as cat
    try:
        tiles = [tuple(int(v) for v in t.split(",")) for t in value.split(";") if t]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: tiles are five integers each, "
                                         "comma-separated, tiles separated by ;") from None
    unknown = [t for t in tiles if t not in cat.TILES[4]]
    if unknown or not tiles:
        raise argparse.ArgumentTypeError(f"{unknown or value!r}: not float32 tiles of "
                                         "cugru._catalog.TILES")
    return set(tiles)


def parse(argv=None):
    """(shape ids, set of tiles, math) from the command line; argparse errors name what is
    wrong."""
    from bench.paths import ALL
    from cugru import _catalog as cat
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=list(ALL))
    ap.add_argument("--tiles", type=_tile_list, default=set(cat.FOUR_ROW_TILES),
                    help="the tiles to leave out for the 'old' plans (default: the 4-row "
                         "tiles, plans.FOUR_ROW_TILES)")
    ap.add_argument("--math", choices=("strict", "tf32"), default="strict")
    args = ap.parse_args(argv)
    bad = [i for i in args.ids if i not in ALL]
    if bad:
        ap.error(f"unknown shape id(s) {bad}; choose from {', '.join(ALL)}")
    return args.ids, args.tiles, args.math


def main(argv=None):
    from bench.paths import ALL
    from cugru import _catalog as cat
    ids, tiles, math = parse(argv)

    from bench import timing
    timing.require_gpu()
    import cupy as cp

    from bench.gru import torch_gru_calls
    from bench.paths import plan_name
    from bench.shapes import make_problem
    from cugru import _plan, plans
    full = cat.TILES[4]
    cat._tile_instances()   # (the family's instance list, cached, from every tile built)

    def plans_with(tile_set, T, B, I, H, D):
        cat.TILES[4] = tile_set
        _plan._fast_plan.cache_clear()
        _plan._CHOSEN.clear()
        try:
            return tuple(plans.choose("auto", B, H, D, np.dtype(np.float32), bw, T, I)
                         for bw in (False, True))
        finally:
            cat.TILES[4] = full
            _plan._fast_plan.cache_clear()
            _plan._CHOSEN.clear()

    def name(p):
        return plan_name(p) + (f", {p.rows} rows" if hasattr(p, "rows") else "")
    changed = []
    for sid in ids:
        (T, B, I, H, bi), _ = ALL[sid]
        D = 2 if bi else 1
        new = plans_with(full, T, B, I, H, D)
        old = plans_with(tuple(t for t in full if t not in tiles), T, B, I, H, D)
        if new != old:
            changed.append((sid, old, new))
            print(f"{sid}: {' | '.join(map(name, old))} -> {' | '.join(map(name, new))}",
                  flush=True)
    print("plans changed on:", ", ".join(c[0] for c in changed) or "none", flush=True)
    torch = timing.torch_cuda()
    if torch is None:
        return 0
    tf32 = math == "tf32"
    for sid, old, new in changed:
        (T, B, I, H, bi), _ = ALL[sid]
        p = make_problem(T, B, I, H, bi)
        a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])

        def calls(pf, pb):
            def train():
                y, hn, s = plans.forward(a["x"], a["h0"], *w, pf, bidirectional=bi,
                                         math=math)
                return plans.backward(a["dy"], None, s, pb)

            def infer():
                return plans.forward(a["x"], a["h0"], *w, pf, bidirectional=bi,
                                     training=False, math=math)
            return train, infer
        row = {}
        timing.time_passes(row, {"old": calls(*old), "new": calls(*new),
                                 "cudnn": torch_gru_calls(torch, p, "cuda", tf32)},
                           timing.repeats_for(T, 30), 5)
        print(f"{sid}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items())
              + "; " + "; ".join(
                  f"{k}: old/new {row[f'old {k} ms'] / row[f'new {k} ms']:.2f}x, "
                  f"cuDNN/new {row[f'cudnn {k} ms'] / row[f'new {k} ms']:.2f}x"
                  for k in ("train", "infer")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
