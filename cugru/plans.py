"""The GRU's GPU plans, for tools, benchmarks and tests: which plan a shape runs, its
kernels and geometry, and its passes run one by one.

    from cugru import plans
    plan = plans.choose("auto", B, H, D, np.dtype(np.float32), T=T, I=I)  # what a call runs
    y, h_n, saved = plans.forward(x, h0, w_ih, w_hh, b_ih, b_hh, plan, training=True)
    p, dh0 = plans.backward_recurrence(dy, None, saved, plans.fast_plan(B, H, D, dtype, True))
    dx, dw_ih, dw_hh, db_ih, db_hh = plans.backward_tail(p)

Everything here is what cugru.gru_forward and gru_backward run; the plan classes and the
planner live in cugru/_plan.py, the kernel catalogue in cugru/_catalog.py, the passes in
cugru/_passes.py.
"""
from __future__ import annotations

import numpy as np

from . import _device, _passes
from ._args import HALF_DTYPES, backward_args, check_math, forward_args
from ._device import clear_graphs  # noqa: F401  (drops the per-step path's CUDA graphs)
from ._catalog import (CLUSTERS, FOUR_ROW_TILES, MMA_TILES, PERSIST_ROWS,  # noqa: F401
                       PERSIST_THREADS, RESIDENT_SPLITS, RESIDENT_THREADS, TILE_AHEAD, TILES,
                       mma_warps, resident_smem, tile_has, tile_runs_on)
from ._plan import (F64_GRID_AUTO_MAX_WAVES, F64_CLUSTER_AUTO_MAX_WAVES,  # noqa: F401
                    GRID_AUTO_MAX_WAVES,
                    GRID_AUTO_SPLIT_MAX_GROUPS,
                    PERSIST_AUTO_MAX_WORK, PERSIST_AUTO_MIN_ROWS,
                    RESIDENT_AUTO_MAX_EMPTY, RESIDENT_AUTO_SPLITS, SMALL,
                    SMALL_AUTO_MAX_CHAIN, SMALL_MAX_UNITS, SPLIT_MAX_SLICES, SPLIT_MIN_K,
                    SPLIT_SLICE, STEPS,
                    PersistPlan, ResidentPlan, SmallPlan, StepsPlan, TilePlan, auto_takes,
                    backward_split, choose, f64_tile_auto_takes, fast_plan,
                    groups_at_once, persist_cost, persist_split, resident, resident_applies,
                    resident_auto_takes, resident_empty, resident_plan, resident_split,
                    resident_splits,
                    small_chain, small_takes,
                    tile_rank, tile_split, tile_splits, waves, WIDE_BACKWARD_MIN_ROWS,
                    WIDE_CCS, WIDE_MAX_H, WIDE_MIN_H, WIDE_MIN_INPUTS, WIDE_MIN_ROWS,
                    wide_auto_takes, wide_products, wide_projection)


__all__ = ["CLUSTERS", "FOUR_ROW_TILES", "MMA_TILES", "mma_warps", "use_mma", "PERSIST_ROWS",
           "PERSIST_THREADS", "TILE_AHEAD", "TILES", "tile_runs_on", "tile_has",
           "GRID_AUTO_MAX_WAVES", "GRID_AUTO_SPLIT_MAX_GROUPS", "F64_GRID_AUTO_MAX_WAVES",
           "F64_CLUSTER_AUTO_MAX_WAVES",
           "f64_tile_auto_takes", "PERSIST_AUTO_MAX_WORK",
           "PERSIST_AUTO_MIN_ROWS", "SMALL",
           "SMALL_AUTO_MAX_CHAIN", "SMALL_MAX_UNITS", "STEPS", "PersistPlan", "SmallPlan",
           "small_chain", "small_takes", "StepsPlan", "SPLIT_MIN_K", "SPLIT_SLICE",
           "SPLIT_MAX_SLICES",
           "backward_split", "ResidentPlan", "RESIDENT_SPLITS",
           "RESIDENT_THREADS", "RESIDENT_AUTO_MAX_EMPTY", "RESIDENT_AUTO_SPLITS",
           "resident_auto_takes",
           "resident_empty", "resident_smem", "resident_applies", "resident_plan",
           "resident_split", "resident_splits",
           "TilePlan", "auto_takes", "choose", "fast_plan", "groups_at_once", "persist_cost",
           "persist_split", "resident", "tile_rank", "tile_split", "tile_splits", "waves",
           "forward", "backward_recurrence", "backward_tail", "backward", "step_pieces",
           "use_graphs",
           "clear_graphs", "WIDE_BACKWARD_MIN_ROWS", "WIDE_CCS", "WIDE_MAX_H", "WIDE_MIN_H",
           "WIDE_MIN_INPUTS", "WIDE_MIN_ROWS", "wide_auto_takes", "wide_products",
           "wide_projection"]


def use_graphs(on: bool) -> bool:
    """Turn the per-step path's CUDA graphs on or off (on by default; docs/api.md): with them
    a call that repeats an earlier one's buffers replays its recurrence from one graph.
    Returns the setting before; off also drops the graphs kept."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be True or False, got {on!r}")
    was = _device.GRAPHS
    _device.GRAPHS = on
    if not on:
        _device.clear_graphs()
    return was


def use_mma(on: bool) -> bool:
    """Let math="tf32" run the tile kernels' instances with the product on tensor cores
    (MMA_TILES; on by default), or keep it to their FMA instances (the products outside the
    recurrence still on tensor cores), for a benchmark's comparison. Off, the planner plans
    TF32 passes as strict ones (a 4-row tile then takes its 8-row sibling's place, as in
    four_row_in_place). Returns the setting before; a change drops the CUDA graphs kept
    (they name the kernels they launch), so set it between calls, not while another thread
    runs one."""
    if not isinstance(on, bool):
        raise TypeError(f"on must be True or False, got {on!r}")
    from . import _plan
    was = _plan.MMA
    _plan.MMA = on
    if on != was:
        _device.clear_graphs()
    return was


def forward(x, h0, w_ih, w_hh, b_ih, b_hh, plan, *, bidirectional=False, training=True,
            quant=None, lengths=None, math=None):
    """gru_forward on cupy arrays (float32 or float64) with the recurrence on `plan`:
    (y, h_n, saved or None). With `quant` (a QuantSpec), plan with fast_plan(..., qat=True)."""
    a = forward_args(x, h0, w_ih, w_hh, b_ih, b_hh, bidirectional, training, quant, lengths)
    _float_data(a.x.dtype, "forward")
    return _passes.forward(a, plan, check_math(math, a.x.dtype))


def _float_data(dtype, name):
    """plans' passes run float32 or float64 data (a TypeError naming x otherwise)."""
    if dtype in HALF_DTYPES:
        raise TypeError(f"plans.{name} takes float32 or float64 data, x is "
                        f"{np.dtype(dtype).name}: cugru.gru_forward and gru_backward run "
                        "half-precision data")


def backward_recurrence(dy, dh_n, saved, plan):
    """The backward pass's recurrence alone on `plan`: (the pass, with its gate gradients
    dgi and dgh filled, for backward_tail; dh0). The gate gradients are temporaries kept for
    reuse (cugru._device.scratch) where small: valid until the next backward pass of the
    same shape on this stream and thread."""
    if plan.whole_pass:
        raise ValueError(f"the {plan.scope} plan runs the whole backward pass in one launch; "
                         "use plans.backward")
    backward_args(dy, dh_n, saved)
    _float_data(saved.x.dtype, "backward_recurrence")
    T, B, I, H, D = saved.dims
    p = _passes.BackwardPass(dy, dh_n, saved, wide=_passes.wide_pass(
        plan, B, H, dy.dtype, "strict", saved.quant is not None, backward=True))
    return p, _passes.run_recurrence(p, plan)


def backward_tail(p):
    """The backward pass's tail: (dx, dw_ih, dw_hh, db_ih, db_hh) with the direction axis.
    After a quantization-aware forward pass, dx and dh0 here lack the straight-through
    estimator's masks at x and h0 (gru_backward and plans.backward apply them)."""
    return _passes.tail(p)


def backward(dy, dh_n, saved, plan, *, math=None):
    """gru_backward on cupy arrays (float32 or float64) with the recurrence on `plan`
    (math=None: the forward pass's)."""
    backward_args(dy, dh_n, saved)
    _float_data(saved.x.dtype, "backward")
    math = saved.math if math is None else check_math(math, saved.x.dtype)
    return _passes.backward(dy, dh_n, saved, plan, math)


def step_pieces(T, B, I, H, D, dtype=np.float32, seed=1):
    """The calls of one step of the per-step path on random buffers of a shape, each
    callable alone (a benchmark times them): {name: call}."""
    cp = _device.cupy()
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    r = lambda *s: cp.asarray(rng.uniform(-0.5, 0.5, s).astype(dt))  # noqa: E731
    a = forward_args(r(T, B, I), None, r(D, 3 * H, I), r(D, 3 * H, H), r(D, 3 * H),
                     r(D, 3 * H), D == 2, True)
    fwd = _passes.ForwardPass(a, wide=_passes.wide_pass(STEPS, B, H, dt, "strict"))
    fwd.hs[...] = r(D, T + 1, B, H)
    fwd.gi[...] = r(T, B, D, 3 * H)
    fwd.gates[...] = cp.asarray(rng.uniform(0.1, 0.9, (D, T, B, 4 * H)).astype(dt))
    saved = _passes.GruSaved(a.x, a.w_ih, a.w_hh, fwd.hs, fwd.gates, False)
    bwd = _passes.BackwardPass(r(T, B, D * H), None, saved,
                               wide=_passes.wide_pass(STEPS, B, H, dt, "strict", backward=True))
    loop = _device.Loop(dt)      # (its pointer mode stays host, cuBLAS' default)
    f_product, f_pointwise = STEPS.forward_step(loop, fwd)
    b_pointwise, b_product, _ = STEPS.backward_step(loop, bwd)
    # (wide products: step 0 widens W_hh and h0, T - 1 W_hh and the carried gradient, so
    # that the timed steps run on converted operands)
    f_product(0)
    b_pointwise(T - 1)
    keep = (a, fwd, bwd, saved, loop)     # the calls hold raw addresses of these buffers
    return {"recurrent GEMM (forward)": lambda _k=keep: f_product(1),
            "pointwise (forward)": lambda _k=keep: f_pointwise(1),
            "pointwise (backward, gate gradients)": lambda _k=keep: b_pointwise(1),
            "recurrent GEMM (backward)": lambda _k=keep: b_product(1)}
