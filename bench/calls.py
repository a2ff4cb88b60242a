"""What a call costs: back-to-back calls on tiny inputs (the GRU at T = B = I = H = 1, 64
elements for cukernels), where the GPU's work is negligible and the wall clock measures the
host's work per call; ours beside torch's own call in the same run.

    python -m bench.calls [--json FILE] [--repeat N]

Each call's figure is the median of seven rounds of N back-to-back calls (200 unless
--repeat says), ours and torch's in turn in every round. Two rows without goals follow: a
bare CuPy RawKernel launch on the same 64 elements, into a kept array and into a new one,
timed in the elementwise call's rounds: what plain CuPy pays for such a call on this host
at this moment.

It calls the public API only, so that it measures an older tree as well: tools/gpu_report.py
copies this file and bench/timing.py into a package beside an older checkout and runs it
there (the "before" column of the report).
"""
from __future__ import annotations

import sys

import numpy as np

from . import timing

ELEMENTWISE = "sigmoid_activation (elementwise)"
#: the goals of each call, in µs of wall clock per call on an H100 host
GOALS = {"gru_forward(training=False)": 40.0, "GRU train step (forward + backward)": 120.0,
         ELEMENTWISE: 10.0, "adam_update": 15.0}
#: reference rows (no goal): a bare CuPy RawKernel launch of an elementwise kernel, into a
#: kept array and into a new one from cupy.empty, timed in the rounds of ours and torch's
#: elementwise calls (the host's pace moves within seconds)
FLOORS = ("plain CuPy: RawKernel launch, kept output",
          "plain CuPy: cupy.empty + RawKernel launch")
_FLOOR_SOURCE = r"""
extern "C" __global__ void calls_floor(float* out, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f / (1.0f + expf(-x[i]));
}
"""


def cases():
    """[(name, our call, torch's call or None)] on tiny inputs."""
    import cupy as cp

    import cugru
    import cukernels as ck
    T, B, I, H = 1, 1, 1, 1
    rng = np.random.default_rng(0)
    f32 = lambda *s: cp.asarray(rng.uniform(-0.5, 0.5, s).astype(np.float32))  # noqa: E731
    x, h0, dy = f32(T, B, I), f32(1, B, H), f32(T, B, H)
    w = (f32(1, 3 * H, I), f32(1, 3 * H, H), f32(1, 3 * H), f32(1, 3 * H))
    v = f32(64)
    D, wt, m, s = f32(64), f32(64), f32(64), cp.abs(f32(64))

    def infer():
        return cugru.gru_forward(x, h0, *w, training=False)

    def train():
        y, hn, saved = cugru.gru_forward(x, h0, *w)
        return cugru.gru_backward(dy, None, saved)

    def adam():
        # (D holds zeros after the first call: the update does the same work on any values)
        ck.adam_update(D, wt, m, s, 4, 1e-3, t=3)

    ours = {"gru_forward(training=False)": infer, "GRU train step (forward + backward)": train,
            ELEMENTWISE: lambda: ck.sigmoid_activation(v),
            "adam_update": adam}
    theirs = dict.fromkeys(ours)
    torch = timing.torch_cuda()
    if torch is not None:
        gru = torch.nn.GRU(I, H).cuda()
        tx, th0 = torch.as_tensor(x).clone(), torch.as_tensor(h0).clone()
        tdy = torch.as_tensor(dy).clone()
        tv = torch.as_tensor(v).clone()
        p = torch.nn.Parameter(torch.as_tensor(wt).clone())
        opt = torch.optim.Adam([p], lr=1e-3, fused=True)

        def t_infer():
            with torch.no_grad():
                return gru(tx, th0)

        def t_train():
            y, hn = gru(tx, th0)
            torch.autograd.backward(y, tdy)

        def t_adam():
            p.grad = tv           # (a fresh gradient each step, as ours gets)
            opt.step()

        theirs = {"gru_forward(training=False)": t_infer,
                  "GRU train step (forward + backward)": t_train,
                  ELEMENTWISE: lambda: torch.sigmoid(tv),
                  "adam_update": t_adam}
    return [(name, fn, theirs[name]) for name, fn in ours.items()]


def floors():
    """{FLOORS name: call}: a bare CuPy RawKernel on 64 elements, into a kept array and into
    a new one."""
    import cupy as cp
    kern = cp.RawKernel(_FLOOR_SOURCE, "calls_floor")
    x = cp.asarray(np.random.default_rng(1).uniform(-0.5, 0.5, 64).astype(np.float32))
    n, out = np.int32(x.size), cp.empty_like(x)

    def kept():
        kern((1,), (64,), (out, x, n))

    def allocating():
        o = cp.empty(x.shape, x.dtype)
        kern((1,), (64,), (o, x, n))
        return o
    return dict(zip(FLOORS, (kept, allocating)))


def measure(repeat=200):
    """[{case, ours_us, torch_us, goal_us}], wall clock per call of back-to-back calls, ours
    and torch's in turn over rounds (timing.interleaved_host_us)."""
    torch = timing.torch_cuda()

    def sync():
        import cupy as cp
        cp.cuda.Device().synchronize()
        if torch is not None:
            torch.cuda.synchronize()
    rows, extra = [], []
    for name, ours, theirs in cases():
        fns = {"ours_us": ours} if theirs is None else {"ours_us": ours, "torch_us": theirs}
        if name == ELEMENTWISE:
            fns.update(floors())        # (in the elementwise call's rounds)
        got = timing.interleaved_host_us(fns, n_repeat=repeat, sync=sync)
        rows.append({"case": name, "goal_us": GOALS[name], "ours_us": got["ours_us"],
                     "torch_us": got.get("torch_us")})
        extra += [{"case": f, "goal_us": None, "ours_us": got[f], "torch_us": None}
                  for f in FLOORS if f in got]
    return rows + extra


def markdown(rows, before=None, before_label="before"):
    """The table: ours, the goal, torch's call, and an earlier tree's where given; a row
    without a goal (FLOORS) shows "-" for it."""
    old = {r["case"]: r["ours_us"] for r in (before or [])}
    head = "| call | ours (µs) | goal (µs) | met | torch's call (µs) |"
    sep = "|---|---|---|---|---|"
    if before:
        head += f" {before_label} (µs) |"
        sep += "---|"
    lines = [head, sep]
    for r in rows:
        t = "-" if r["torch_us"] is None else f"{r['torch_us']:.1f}"
        goal = r.get("goal_us")
        judged = "-" if goal is None else ("yes" if r["ours_us"] <= goal else "NO")
        line = (f"| {r['case']} | {r['ours_us']:.1f} | "
                f"{'-' if goal is None else f'{goal:.0f}'} | {judged} | {t} |")
        if before:
            line += f" {old[r['case']]:.1f} |" if r["case"] in old else " - |"
        lines.append(line)
    return lines


def main(argv=None) -> int:
    return timing.table_main(__doc__, measure, markdown, argv, repeat=200)


if __name__ == "__main__":
    sys.exit(main())
