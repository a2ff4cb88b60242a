"""How much a bidirectional pass on the per-step path could gain by running its two
directions on two streams, each its own chain of product and pointwise launches, rather than
one chain of calls batched over both.

    python tools/direction_overlap_probe.py [ids] [--repeat N]
        (GPU needed; ids of bench.paths (S1-S10, O1-O16, A1-A6); bidirectional shapes only)

A direction's step is a product (compute-bound where the products are wide) then a
pointwise launch (bound by memory): batched over both directions, the two run one after the
other every step. Two unidirectional passes of the same sizes on two streams of their own
can overlap one direction's pointwise launch with the other's product. For each shape, path
"steps" (float32, math="strict"), device ms a call by CUDA events on the caller's stream:
the bidirectional train step (forward, backward) and inference; the two directions as two
unidirectional calls one after the other on that stream; and the two on two streams at
once (forked from the caller's stream by an event, joined by two); and the bidirectional
call with its directions apart (cugru._plan.DIRECTION_STREAMS: each direction's chain of
products and pointwise launches on its own stream, inside the one graph), with whether its
results have the batched call's bits. Each call's recurrence
replays its CUDA graph (the per-stream scratch and graphs of cugru keep the two streams'
calls apart). The rounds time the forms in turn; the median of ROUNDS rounds.

An estimate of the lever, not a bound: the unidirectional calls overlap their projection
and tail too (large products, little to gain), and the split into two calls issues twice
the host calls (the apart form beat it on four of six rows on an H100).
"""
import os
import statistics
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

from large_h_probe import event_ms  # noqa: E402  (events around back-to-back calls)

ROUNDS = 5


def parse(argv):
    import argparse

    from bench.paths import ALL
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ids", nargs="*", default=["S10", "O14", "O5", "S5"])
    ap.add_argument("--repeat", type=int, default=10, help="timed calls per measurement")
    args = ap.parse_args(argv)
    bad = [i for i in args.ids if i not in ALL]
    if bad:
        ap.error(f"unknown shape id(s) {bad}; choose from {', '.join(ALL)}")
    uni = [i for i in args.ids if not ALL[i][0][4]]
    if uni:
        ap.error(f"{uni}: not bidirectional; the probe splits two directions")
    if args.repeat < 1:
        ap.error("--repeat takes 1 or more")
    return args


def halves(prob):
    """The bidirectional problem's two directions as unidirectional problems (inputs of
    one direction each, contiguous; the second reads x forwards too: the same work)."""
    H = prob["w_hh"].shape[2]
    out = []
    for d in (0, 1):
        one = {k: np.ascontiguousarray(prob[k][d:d + 1])
               for k in ("h0", "w_ih", "w_hh", "b_ih", "b_hh")}
        one["x"] = prob["x"]
        one["dy"] = np.ascontiguousarray(prob["dy"][..., d * H:(d + 1) * H])
        out.append(one)
    return out


def main(argv=None):
    args = parse(argv)
    from bench import timing
    timing.require_gpu()
    import cupy as cp

    import cugru
    from bench.paths import ALL
    from bench.shapes import make_problem

    from cugru import _plan
    # (the apart form on every shape given, whatever its rows: the default rule,
    # DIRECTION_STREAMS_MIN_ROWS, came from this probe's shapes)
    _plan.DIRECTION_STREAMS_MIN_ROWS = 1

    def step(a, bi, training, apart=False):
        _plan.DIRECTION_STREAMS = apart
        w = (a["w_ih"], a["w_hh"], a["b_ih"], a["b_hh"])
        if not training:
            return cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi, training=False,
                                     path="steps")
        saved = cugru.gru_forward(a["x"], a["h0"], *w, bidirectional=bi, path="steps")[2]
        return cugru.gru_backward(a["dy"], None, saved, path="steps")

    sides = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

    def on_two_streams(parts, training):
        main_stream = cp.cuda.get_current_stream()
        fork = cp.cuda.Event()
        fork.record(main_stream)
        joins = []
        for s, a in zip(sides, parts):
            s.wait_event(fork)
            with s:
                step(a, False, training)
            joins.append(cp.cuda.Event())
            joins[-1].record(s)
        for e in joins:
            main_stream.wait_event(e)

    def flat(out):
        return [cp.asnumpy(a) for a in (out[:2] if len(out) == 3 else out)]

    print("| id | T, B, I, H | pass | bidirectional ms | two directions, one stream ms | "
          "two directions, two streams ms | bidirectional / two streams | directions apart "
          "ms | bidirectional / apart | apart's bits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for sid in args.ids:
        T, B, I, H, _ = ALL[sid][0]
        prob = make_problem(T, B, I, H, True)
        both = {k: cp.asarray(v) for k, v in prob.items() if k != "bi"}
        parts = [{k: cp.asarray(v) for k, v in h.items()} for h in halves(prob)]
        for training in (True, False):
            forms = {
                "bi": lambda t=training: step(both, True, t),
                "serial": lambda t=training: [step(a, False, t) for a in parts],
                "streams": lambda t=training: on_two_streams(parts, t),
                "apart": lambda t=training: step(both, True, t, apart=True)}
            same = all(np.array_equal(a, b) for a, b in zip(
                flat(step(both, True, training)), flat(step(both, True, training, True))))
            times = {k: [] for k in forms}
            for _ in range(ROUNDS):
                for k, fn in forms.items():
                    times[k].append(event_ms(cp, fn, args.repeat))
            ms = {k: statistics.median(v) for k, v in times.items()}
            print(f"| {sid} | {T}, {B}, {I}, {H} | {'train' if training else 'inference'} | "
                  f"{ms['bi']:.3f} | {ms['serial']:.3f} | {ms['streams']:.3f} | "
                  f"{ms['bi'] / ms['streams']:.2f}x | {ms['apart']:.3f} | "
                  f"{ms['bi'] / ms['apart']:.2f}x | {'equal' if same else 'differ'} |")


if __name__ == "__main__":
    main(sys.argv[1:])
