"""Rows per batch group, varied within the tile kernel fast_plan takes for a shape: the data
behind tile_rank's last key (cugru._plan.tile_rank).

    python tools/rows_probe.py S3 S5 A5 ...   (GPU needed; bench.paths' ids: S1-S10, O1-O16,
                                               A1-A6; default S3 S5 O1 A2 A5)

For each shape and pass, with the tile kernel fast_plan chooses held fixed, every number
of rows per group it takes: the groups, the waves of groups the GPU runs them in, and the
device ms of the forward pass without history and with it (forward), or of the backward
recurrence (backward, after a per-step forward pass).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
    from bench.paths import probe_args, probe_problems
    args = probe_args(__doc__, ["S3", "S5", "O1", "A2", "A5"], argv)
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    from cugru import plans
    device = cp.cuda.runtime.getDevice()
    print("| id | pass | tile | chosen rows | rows: groups, waves, ms |")
    print("|---|---|---|---|---|")
    for sid, (T, B, I, H, bi, D), a, w, n in probe_problems(args.ids, args.repeat):
        saved = plans.forward(a["x"], a["h0"], *w, plans.STEPS, bidirectional=bi)[2]
        for backward in (False, True):
            chosen = plans.fast_plan(B, H, D, np.float32, backward=backward)
            if not isinstance(chosen, plans.TilePlan):
                print(f"| {sid} | {'backward' if backward else 'forward'} | - | "
                      f"{chosen} | no tile split |")
                continue
            cells = []
            for rows in range(1, chosen.tile[2] + 1):
                split = plans.tile_split(B, H, D, chosen.tile, rows, 4)
                at_once = split and plans.groups_at_once(split, "<f4", device)
                split = split and plans.resident(split, D, at_once)
                if split is None:
                    continue
                waves = plans.waves(split, D, at_once)
                if backward:
                    ms = [timing.gpu_time_us(lambda s=split: plans.backward_recurrence(
                        a["dy"], None, saved, s), n) / 1e3]
                else:
                    ms = [timing.gpu_time_us(lambda s=split, tr=tr: plans.forward(
                        a["x"], a["h0"], *w, s, bidirectional=bi, training=tr), n) / 1e3
                        for tr in (False, True)]
                cells.append(f"{rows}: {split.groups}, {waves}, "
                             + " / ".join(f"{t:.3f}" for t in ms))
            print(f"| {sid} | {'backward' if backward else 'forward (infer / train)'} | "
                  f"{chosen.tile} | {chosen.rows} | {'; '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
