"""The GRU benchmark's report: its markdown tables and its plot, from the rows that
bench/gru.py measures (the cases and the command line live there)."""
from __future__ import annotations

from .timing import ROUNDS, geomean

#: our implementations: label -> the path= they run (the first is the one ratios are of)
OURS = {"fast": "fast", "steps": "steps"}


def auto_label(r):
    """The label of the times path="auto" has in row `r`: the path it takes in both passes
    where that is a column of OURS, or "auto" (timed itself) where its passes take different
    paths or the small path."""
    fwd, bwd = r.get("auto") or (None, None)
    return fwd if fwd == bwd and fwd in OURS else "auto"


def auto_table(rows, bases):
    """path="auto" against the baselines: per shape the times of what auto runs, the ratios,
    their geomeans, and the shapes below 1x. Every shape has a row; a shape left out of a
    geomean (a time missing) is named under the table with the reason."""
    lines = ["| id | auto takes (forward, backward) | train (ms) | "
             + " | ".join(f"{b} / auto" for b in bases)
             + " | inference (ms) | " + " | ".join(f"{b} / auto" for b in bases) + " |",
             "|---|---|---|" + "---|" * len(bases) + "---|" + "---|" * len(bases)]
    got = {(k, b): [] for k in ("train", "infer") for b in bases}
    below, left_out = [], []
    for r in rows:
        label = auto_label(r)
        fwd, bwd = r.get("auto") or ("?", "?")
        cells = [r["id"], f"{fwd}, {bwd}"]
        for kind in ("train", "infer"):
            ours = r[kind].get(label)
            cells.append("-" if ours is None else f"{ours:.3f}")
            for b in bases:
                t = r[kind].get(b)
                if ours is None or t is None:
                    cells.append("-")
                    left_out.append(f"{r['id']} {kind} against {b} (no "
                                    f"{'time of ours' if ours is None else b + ' time'})")
                    continue
                v = t / ours
                got[kind, b].append(v)
                cells.append(f"{v:.2f}x")
                if v < 1 and b == bases[0]:
                    below.append(f"{r['id']} {'train' if kind == 'train' else 'inference'} "
                                 f"{v:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    cells = ["geomean", ""]
    for kind in ("train", "infer"):
        cells.append("")
        cells += [f"{geomean(got[kind, b]):.2f}x"
                  + ("" if len(got[kind, b]) == len(rows) else
                     f" ({len(got[kind, b])} of {len(rows)} shapes)") for b in bases]
    lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Below 1x against {bases[0]}: " + (", ".join(below) or "none") + "."]
    if left_out:
        lines += ["", "Left out of the geomeans: " + "; ".join(left_out) + "."]
    return lines


def ratios(rows, kind, ours, base):
    return [r[kind][base] / r[kind][ours] if base in r[kind] and ours in r[kind] else None
            for r in rows]


def _table(rows, kind, bases):
    ours = list(OURS)
    head = ("| id | T, B, I, H, bi | " + " | ".join(f"{o} (ms)" for o in ours) + " | "
            + " | ".join(f"{b} (ms) | {b} / {o}" for b in bases for o in ours[:1]) + " | "
            + " | ".join(f"{b} / {o}" for b in bases for o in ours[1:]) + " |")
    n = len(ours) + 2 * len(bases) + len(bases) * (len(ours) - 1)
    lines = [head, "|---|---|" + "---|" * n]
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for r in rows:
        cells = [fmt(r[kind].get(o), ".3f") for o in ours]
        for b in bases:
            t = r[kind].get(b)
            cells += [fmt(t, ".3f"), fmt(t / r[kind][ours[0]] if t and ours[0] in r[kind]
                                         else None, ".2f") + ("x" if t and ours[0] in r[kind] else "")]
        for b in bases:
            for o in ours[1:]:
                t = r[kind].get(b)
                cells.append(fmt(t / r[kind][o] if t and o in r[kind] else None, ".2f")
                             + ("x" if t and o in r[kind] else ""))
        lines.append(f"| {r['id']} | {', '.join(str(v) for v in r['shape'])} | "
                     + " | ".join(cells) + " |")
    cells = ["" for _ in ours]
    for b in bases:
        cells += ["", f"{geomean(ratios(rows, kind, ours[0], b)):.2f}x"]
    for b in bases:
        for o in ours[1:]:
            cells.append(f"{geomean(ratios(rows, kind, o, b)):.2f}x")
    lines.append("| geomean | | " + " | ".join(cells) + " |")
    return lines


def markdown(rows, device, limits=None):
    bases = ["cuDNN strict", "cuDNN TF32", "naive torch loop"]
    lines = [f"Device: {device}. float32. Times in ms: medians of CUDA-event intervals around "
             "back-to-back calls; our paths and cuDNN's strict and TF32 calls timed in turn "
             f"over {ROUNDS} rounds (the median of the rounds). Ratio = baseline time / our "
             "time (> 1: ours is faster). fast = the persistent kernels (path='fast'), "
             "steps = the per-step path.", "",
             "### Train step (forward + backward)", ""]
    lines += _table(rows, "train", bases)
    lines += ["", "### Inference (forward only, no history kept)", ""]
    lines += _table(rows, "infer", bases[:2])
    lines += ["", "### path='auto' (what a user gets by default) against cuDNN", "",
              "Per shape the path path='auto' takes in each pass on this GPU, its times (from "
              "the tables above where both passes take one path; timed as path='auto' where "
              "they differ) and the ratios to cuDNN.", ""]
    lines += auto_table(rows, bases[:2])
    fast = [r for r in rows if r.get("fast")]
    if fast:
        lines += ["", "### The fast path per shape", "",
                  "Scope: block (one block per batch group, __syncthreads), cluster (a thread-"
                  "block cluster per batch group, distributed shared memory and the cluster "
                  "barrier) or grid (all blocks of a direction, a barrier through global "
                  "memory). Time per step = the pass's time / T (the input GEMM, and for the "
                  "train step the weight-gradient GEMMs, included). Barrier = one barrier of the "
                  "scope on the plan's grid, timed alone (the kernels of gru_probes.cu). Floor = the "
                  "barriers alone: one per step forward, one per step backward. h moved per "
                  "step = bytes of h that reach the blocks each forward step (backward moves "
                  "d_gate_h, 3x): through distributed shared memory (block, cluster), or read "
                  "from L2 by every block (grid).", "",
                  "| id | scope | blocks | threads | cluster | units per block | rows | "
                  "lanes per unit | packs per thread | registers fwd / bwd | shared memory (KiB) "
                  "| inference µs/step | train µs/step | barrier µs | train floor µs/step | "
                  "train / floor | h moved per step (KiB) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in fast:
            f, T = r["fast"], r["shape"][0]
            train_step = r["train"]["fast"] * 1e3 / T
            floor = 2 * f.get("barrier_us", float("nan"))
            lines.append(f"| {r['id']} | {f['scope']} | {f['blocks']} | {f['threads']} | "
                         f"{f['cluster']} | {f['units']} | {f['rows']} | {f['lanes']} | "
                         f"{f['packs']} | {f['regs'][0]} / "
                         f"{'-' if f['regs'][1] is None else f['regs'][1]} | "
                         f"{f['smem'] / 1024:.1f} | "
                         f"{r['infer']['fast'] * 1e3 / T:.2f} | {train_step:.2f} | "
                         f"{floor / 2:.3f} | {floor:.3f} | {train_step / floor:.1f}x | "
                         f"{f['h_bytes_per_step'] / 1024:.1f} |")
        phased = [r for r in fast if "phases_ms" in r["fast"]]
        if phased:
            names = list(phased[0]["fast"]["phases_ms"])
            lines += ["", "The fast path's train step by piece (device ms; µs per step in "
                      "brackets): the forward pass keeping the history, the backward "
                      "recurrence (one launch), and the tail (dx and the weight-gradient "
                      "GEMMs).", "",
                      "| id | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
            for r in phased:
                ph, T = r["fast"]["phases_ms"], r["shape"][0]
                lines.append(f"| {r['id']} | " + " | ".join(
                    f"{ph[k]:.3f} ({ph[k] * 1e3 / T:.2f})" for k in names) + " |")
    pieces = list(rows[0]["steps"]) if rows else []
    lines += ["", "### Where a step's time goes (the per-step path, µs)", "",
              "measured µs/step = train step time / T (forward and backward of one step), "
              "with the recurrence of each pass replayed from a CUDA graph (cugru's default "
              "on a repeated call) and with graphs off (every call issued). Host µs/step = "
              "the Python issuing the train step, per step, GPU idle at the start: with "
              "graphs, without, and without with CuPy's RawKernel launch. Each piece of a "
              "step is timed alone as host issue time / device time (the device time with "
              "the host's issue time hidden, bench.timing.held_times_us); their device times "
              "add up to the per-step path's GPU floor.", "",
              "| id | measured µs/step | graphs off | host µs/step | graphs off | "
              "graphs off, CuPy launch | "
              + " | ".join(f"{k}: host / device" for k in pieces) + " | device floor µs/step |",
              "|---|---|---|---|---|---|" + "---|" * (len(pieces) + 1)]
    fmt = lambda v, scale=1.0: "-" if v is None else f"{v * scale:.1f}"  # noqa: E731
    for r in rows:
        T = r["shape"][0]
        floor = sum(r["steps"][k][1] for k in pieces)
        lines.append(f"| {r['id']} | {fmt(r['train']['steps'], 1e3 / T)} | "
                     f"{fmt(r['train'].get('steps, no graphs'), 1e3 / T)} | "
                     f"{fmt(r['host']['steps'])} | {fmt(r['host'].get('steps, no graphs'))} | "
                     f"{fmt(r['host']['steps, CuPy launch'])} | "
                     + " | ".join(f"{r['steps'][k][0]:.1f} / {r['steps'][k][1]:.1f}"
                                  for k in pieces) + f" | {floor:.1f} |")
    if limits:
        lines += ["", "### Fast path limits on this GPU", "",
                  "Largest H for which cugru.plans.fast_plan finds a split (binary search up to "
                  "16384; path='auto' takes the persist kernels for a backward pass of two "
                  "directions alone, with B >= PERSIST_AUTO_MIN_ROWS and B*3H*H <= "
                  "PERSIST_AUTO_MAX_WORK where the per-step product would not be split "
                  "(backward_split), and grid scope up to GRID_AUTO_MAX_WAVES waves), "
                  "with the scope and block count there, and the largest H it runs at block "
                  "and at cluster scope.", "",
                  "| dtype | directions | B | largest H | scope there | blocks there | "
                  "largest H, block scope | largest H, cluster scope |",
                  "|---|---|---|---|---|---|---|---|"]
        for L in limits:
            lines.append(f"| {L['dtype']} | {L['D']} | {L['B']} | {L['max_H']} | {L['scope']} | "
                         f"{L['blocks']} | {L['block_scope_max_H']} | "
                         f"{L['cluster_scope_max_H']} |")
    mem = [r for r in rows if "memory" in r]
    if mem:
        lines += ["", "### Peak memory of a train step beyond its inputs (MiB, path='auto')", "",
                  "| id | ours (CuPy pool high-water mark) | cuDNN (torch max allocated) |",
                  "|---|---|---|"]
        for r in mem:
            m = r["memory"]
            lines.append(f"| {r['id']} | {m['ours'] / 2**20:.1f} | "
                         + (f"{m['cuDNN'] / 2**20:.1f} |" if "cuDNN" in m else "- |"))
    cpu = [r for r in rows if "cpu" in r]
    if cpu:
        lines += ["", "### CPU fallback: train step on the host CPU (ms)", "",
                  "| id | ours (numpy) | torch CPU nn.GRU | ratio |", "|---|---|---|---|"]
        for r in cpu:
            c = r["cpu"]
            t = c.get("torch CPU")
            lines.append(f"| {r['id']} | {c['ours (numpy)']:.1f} | "
                         + (f"{t:.1f} | {t / c['ours (numpy)']:.2f}x |" if t else "- | - |"))
    return "\n".join(lines) + "\n"


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ids = [r["id"] for r in rows]
    series = [("train", "cuDNN strict"), ("train", "cuDNN TF32"), ("infer", "cuDNN strict"),
              ("infer", "cuDNN TF32")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(series)
    for k, (kind, base) in enumerate(series):
        vals = [r[kind][base] / r[kind][auto_label(r)]
                if base in r[kind] and auto_label(r) in r[kind] else 0 for r in rows]
        ax.bar([i + (k - 1.5) * width for i in range(len(ids))], vals, width,
               label=f"{kind}: {base} / ours (path='auto')")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(ids)), ids)
    ax.set_ylabel("speed-up of ours (log)")
    ax.set_title("cugru against cuDNN, float32 (> 1: ours faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
