"""The GRU's GPU plans and the planner that picks one per shape.

A plan is one way to run the recurrence of a pass on the GPU. Each plan class owns its
kernels' names, their launch arguments and its two passes (``forward``, ``backward``); the
passes around the recurrence (the input projection before it, the weight gradients after
it: cugru/_passes.py) and every buffer's layout are shared, so the backward pass may run
another plan than the forward pass did.

    StepsPlan    one pointwise launch and one cuBLAS product per step (gru_steps.cu; the
                 backward product split along its sum: backward_split)
    PersistPlan  one launch per pass; each block keeps a slice of W_hh in shared memory, and
                 the blocks of a direction meet at a counter every step (gru_persist.cu)
    TilePlan     one launch per pass; each thread keeps a tile of W_hh in registers; a group
                 of batch rows runs on one block, a thread-block cluster, or a group of
                 blocks meeting at a counter ("grid" scope) (gru_tile.cu)
    SmallPlan    the whole pass (input projection or gradient tail included) in one launch
                 of one block, for shapes where a call costs its launches (gru_small.cu)
    ResidentPlan each pass in one launch over many SMs, each block keeping its units'
                 columns of W_hh in shared memory and computing a tile of batch rows x
                 units (gru_resident.cu)

The first three plans run the recurrence alone; the passes around it are shared. SmallPlan
runs the whole pass (``whole_pass``).

``choose(path, B, H, D, dtype, backward, T, I, qat, lengths, math)`` gives the plan a call
runs: for path="auto" SMALL where the pass is short enough (``small_takes``), else a
TilePlan or PersistPlan where ``fast_plan`` finds one and the limits below say it beats
the per-step path, else STEPS where its products run in float64 (``wide_auto_takes``),
else a ResidentPlan where ``resident_plan`` finds one and ``resident_auto_takes`` says it
beats the per-step path, else STEPS.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np

from . import _catalog as cat
from . import _device as dev
from .quant import NO_QUANT_ARGS, QUANT_PARAMS

#: path="auto" takes the persist kernels for a backward pass only, and only where the
#: per-step path's product is not split (backward_split; O5, the one shape measured where
#: auto had taken them, ran its split per-step recurrence in 9.9 µs a step against the
#: persist kernels' 34.2 on an H200). Their forward pass took 1.1-3.1x the per-step path's
#: time on every shape measured (B = 1-16, H = 768-1536, tools/persist_probe.py,
#: docs/performance.md). Taken with both directions alone, at least PERSIST_AUTO_MIN_ROWS
#: batch rows and up to PERSIST_AUTO_MAX_WORK recurrent work per step and direction (B *
#: 3H * H multiply-adds): there the per-step path's unsplit backward products (one cuBLAS
#: call over the two directions) took 37-69 µs a step at B = 2-8 where
#: the persist kernels took 24-44; at B = 1, with one direction, and beyond the work bound
#: (S3's 12.6 M tied, S8's 50 M lost) the per-step path won
PERSIST_AUTO_MAX_WORK = 1 << 24
PERSIST_AUTO_MIN_ROWS = 2
#: the per-step path's backward product (per step, dh[d] += W_hh[d]'' @ dgh[d, s]: m = H,
#: n = B, k = 3H, batched over the directions) is split along k where k is at least
#: SPLIT_MIN_K (float32 data, math="strict"): the slices' products (one batched cuBLAS call
#: over directions and slices, on tables of addresses) are written apart and gru_add_chunks
#: adds them into dh in slice order. cuBLAS' strided-batched call likely runs each long sum
#: on one block (not profiled). Slices of about SPLIT_SLICE terms, at most SPLIT_MAX_SLICES
#: of them (backward_split). Measured on an H200 (tools/gemm_probe.py --slices divisors,
#: CUDA graphs of back-to-back products, µs a product with the probe's own sum of the
#: slices; docs/performance.md): the fastest slice count against the rule's and one call,
#: one direction: S9 15.6 (16 slices; the rule's 16) against 19.1, O6 30.3 (24; 24)
#: against 38.9, O3 8.7 (12; the rule's 10: 9.6) against 10.6, O16 10.9 (8; 15: 12.4)
#: against 12.8, S8 9.1 (8; 8) against 9.1; both directions: S10 24.3 (8; 8) against
#: 38.8, O5 7.7 (16; 16) against 47.8, O14 14.5 (6; 10: 15.8) against 38.2. More slices
#: than 24 were slower where the rule would reach them (O6: 32 slices 40.7). Not measured
#: below k = 1536
SPLIT_MIN_K = 1024
SPLIT_SLICE = 192
SPLIT_MAX_SLICES = 24
#: a wide backward pass (wide_products: float64 products on float32 data) splits its
#: per-step product (k = 3H) into this many slices where they divide k (1: one product a
#: step), the slices' float64 products added into the float64 carried gradient as above
#: (wide_split), slices of WIDE_SPLIT_MIN_TERMS terms at least. 1 (off): measured on an
#: H100 (tools/wide_split_probe.py at 5e8f4ba, backward ms, 1/2/3/4/6/8 slices): S10
#: 3.950/3.924/4.231/3.995/4.530/4.356, W1 3.305/3.666/3.531/3.245/3.600/3.341, W2
#: 8.326/9.799/9.289/9.181/9.659/9.699, W3 3.620/3.744/3.731/3.430/3.911/3.603; no count
#: gains on every shape, and S10's best (2 slices) is within the rounds' spread
WIDE_SPLIT_SLICES = 1
WIDE_SPLIT_MIN_TERMS = 64
#: path="auto" takes a grid-scope tile plan up to this many waves of groups (each wave runs
#: the whole recurrence), the per-step path beyond (see docs/performance.md). Measured on an
#: H100 at a6080ba (bench.paths), with the per-step path replaying CUDA graphs: at 3 waves
#: (O3, A3, A4) the per-step path took 0.59-0.70x grid scope's time, at 2 (S8, O16) they
#: tied in train and grid scope won inference by 11-27%, at 1 (O4, A5, A6) grid scope won
GRID_AUTO_MAX_WAVES = 2
#: a backward pass whose per-step product splits (backward_split) runs per step rather than
#: on a grid-scope tile plan of more than this many groups a direction. Measured on an H200
#: (tools/resident_ab.py, the backward recurrence, µs a step, per step with the product
#: split against the grid plan): S8 (8 groups) 11.2 against 14.7, O16 (2 groups) 14.2
#: against 21.0 (with the earlier slices of about 256: 13.0, 14.6); with one group the
#: grid plan won: O4 (B = 1) 5.2 against 5.8 at slices of 256 (and A5, whose product does
#: not split, 5.6 against 8.3)
GRID_AUTO_SPLIT_MAX_GROUPS = 1
#: path="auto" takes a tile plan for float64 data only where its groups run in at most
#: F64_GRID_AUTO_MAX_WAVES waves at grid scope, F64_CLUSTER_AUTO_MAX_WAVES at cluster
#: scope (block scope: any), in a pass of more than one step (f64_tile_auto_takes):
#: float64 products on the per-step path run on the chip's float64 tensor cores, the tile
#: kernels' on its FMA units.
#: Measured on an H200 (tools/resident_ab.py --dtype float64, µs a step, per step against
#: the tile plan, forward / backward): two waves of grid groups lost, S3 6.7 / 8.4 against
#: 8.4 / 10.8, S5 6.9 / 9.7 against 8.6 / 10.7, O1 6.1 / 8.4 against 8.1 / 9.7, A1 5.8 /
#: 7.7 against 8.2 / 9.8, O2 7.8 / 11.7 against 8.5 / 10.5 (its backward alone won), one
#: wave won (A2 6.2 / 8.7 against 4.2 / 5.2, A5, S4's backward), and so did O9 (T = 1: one
#: step) in two, 173 / 94 against 135 / 68; five waves of clusters of 4 lost (O7, O13:
#: 7.8 against 11.3 forward), two won (S4's forward 6.1 against 4.1); O8's blocks won
#: (10.4 against 9.1 forward) in more than two waves on the GPU (bench.paths: inference
#: 0.293 ms against 0.334 per step)
F64_GRID_AUTO_MAX_WAVES = 1
F64_CLUSTER_AUTO_MAX_WAVES = 2
#: path="auto" takes the resident kernel for a forward pass it would otherwise run per step
#: where at most this share of its blocks' batch rows lies beyond B (rows a block computes
#: for nothing), and only on the splits of RESIDENT_AUTO_SPLITS. Measured on an H200
#: (tools/resident_ab.py, docs/performance.md): with every row used the resident forward
#: pass took 8-16% less time than the per-step path's (S9 on 32 x 16, S10 on 64 x 32);
#: with 25% of rows empty (O14) and more (O3, O5) it took 11-31% more; the 64 x 16 split
#: (k split two ways) lost wherever it ran (S9: 40.3 µs a step against 29.2 per step), so a
#: GPU whose SMs hold no other split runs per step
RESIDENT_AUTO_MAX_EMPTY = 0.0
RESIDENT_AUTO_SPLITS = ((64, 32, 1), (32, 16, 4))
# (path="auto" runs no backward pass on the resident kernel: the per-step path's split
# product, backward_split, took less time on every shape measured where the resident kernel
# had won over the unsplit product. Measured on an H200, tools/resident_ab.py, the backward
# recurrence, µs a step, per step with the split against resident: S10 32.8 against 42.6,
# O14 17.4 against 37.8, O5 9.9 against 27.6; with one direction the resident kernel lost
# to the unsplit product: S9 31.6 against 21.7, O16 27.7 against 14.9)
#: shared memory a persist block may use to stage the step's vector (h forward, d_gate_h
#: backward): the whole vector when it fits, else chunks of this size
PERSIST_STAGE_BYTES = 96 * 1024
#: the persist split's cost model, in SM clock cycles per forward step. A block's product is
#: bound by its shared-memory loads (a 16-byte load per warp every PERSIST_LDS_CYCLES), its
#: FMAs (4 warps' instructions per cycle) or the dependent chain of H FMAs per accumulator
#: (PERSIST_FMA_LATENCY each); every block stages its direction's whole vector from L2, at
#: about PERSIST_L2_BYTES_PER_CYCLE for the whole chip; a barrier across blocks costs about
#: PERSIST_BARRIER_CYCLES.
PERSIST_LDS_CYCLES = 4
PERSIST_FMA_LATENCY = 4
PERSIST_L2_BYTES_PER_CYCLE = 3000
PERSIST_BARRIER_CYCLES = 2000


#: float32 passes of the per-step path under math="strict" run their recurrent products in
#: float64 (wide_products): each operand widened exactly, the products and their sums in
#: float64, each result rounded once to float32 where a cell reads it (more accurate than a
#: float32 GEMM, whose sum rounds at every term; the same bits every run). On the GPUs of
#: WIDE_CCS cuBLAS' float64 GEMM runs on tensor cores at about the rate of float32 FMAs,
#: and on the per-step products' shapes it took less time than the float32 GEMM. Measured
#: on an H200 (tools/gemm_probe.py, CUDA graphs of back-to-back products, µs a product,
#: float32 against float64, docs/gpu-report.md): forward S10 32.3 against 17.6, O16 15.5
#: against 9.2, S9 18.0 against 13.7, O3 9.7 against 7.0, O14 17.3 against 16.6, O5 (B = 3)
#: 10.8 against 15.9; backward, against float32's split product (backward_split): S10 24.5
#: against 18.6, and float64 slower on S9, O3, O5, O14 and O16 (B <= 64). So the forward
#: product widens from WIDE_MIN_ROWS batch rows and for WIDE_MIN_H <= H <= WIDE_MAX_H, the
#: backward one from WIDE_BACKWARD_MIN_ROWS (between S9's 64 and S10's 256: not measured).
#: Whole passes (bench.paths, float32 products against float64, ms, train / inference):
#: S10 6.730 / 2.328 (auto on the resident kernel forward) against 6.307 / 2.045, S8 3.559
#: / 1.397 against 3.283 / 1.154, S9 7.472 / 2.654 against 7.333 / 2.566, O16 16.923 /
#: 8.223 against 14.891 / 6.134, O3 1.372 / 0.610 against 1.256 / 0.501; O6 (H = 2048)
#: 5.048 / 2.083 against 5.066 / 2.134, hence WIDE_MAX_H. WIDE: False turns them off
WIDE = True
WIDE_CCS = (90,)
WIDE_MIN_ROWS = 16
WIDE_MIN_H = 512
WIDE_MAX_H = 1024
WIDE_BACKWARD_MIN_ROWS = 128
#: a wide forward pass projects its input in float64 (into a float64 gi) where I is at least
#: WIDE_MIN_INPUTS, else in float32 as other passes do: the float64 product saves time in
#: proportion to I, and a float64 gi costs every step a wider read. Measured on one H200
#: (bench.paths, float32 against float64 projection, inference ms): O3 (I = 128) 0.501
#: against 0.541, O16 (I = 80) 6.134 against 6.390, O14 (I = 90) 2.123 against 2.158; S8 (I
#: = 512) 1.154 against 1.122, S9 (I = 1024) 2.566 against 2.436, S10 (I = 512) 2.045
#: against 1.875. Nothing was measured between I = 128 and 512
WIDE_MIN_INPUTS = 256


def wide_products(B, H, itemsize, math, qat=False, backward=False) -> bool:
    """Whether the per-step path's recurrent products of a pass run in float64 on float32
    data (WIDE's note): float32 data, math="strict", not quantization-aware, at least
    WIDE_MIN_ROWS (backward: WIDE_BACKWARD_MIN_ROWS) batch rows, WIDE_MIN_H to WIDE_MAX_H
    units, on a GPU of WIDE_CCS."""
    if not WIDE or itemsize != 4 or math != "strict" or qat or not \
            WIDE_MIN_H <= H <= WIDE_MAX_H:
        return False
    if B < (WIDE_BACKWARD_MIN_ROWS if backward else WIDE_MIN_ROWS):
        return False
    return dev.device().cc in WIDE_CCS


def wide_projection(I) -> bool:
    """Whether a wide forward pass (wide_products) of I inputs projects them in float64
    (WIDE_MIN_INPUTS)."""
    return I >= WIDE_MIN_INPUTS


def backward_split(H, D, itemsize, math) -> int:
    """How many slices of k = 3H the per-step backward product of D directions (one or
    two alike) is split into (1: one product): with float32 data, math="strict" and k >=
    SPLIT_MIN_K, the divisor S of k up to SPLIT_MAX_SLICES whose slice k/S lies nearest
    SPLIT_SLICE terms (by their ratio; the fewer slices on a tie), slices of 64 terms at
    least; else 1."""
    k = 3 * H
    if itemsize != 4 or math != "strict" or k < SPLIT_MIN_K:
        return 1
    return min((s for s in range(2, min(SPLIT_MAX_SLICES, k // 64) + 1) if k % s == 0),
               key=lambda s: (abs(np.log(k / (s * SPLIT_SLICE))), s), default=1)


def wide_split(H) -> int:
    """How many slices of k = 3H a wide backward pass's per-step product is split into
    (WIDE_SPLIT_SLICES where it divides k into slices of WIDE_SPLIT_MIN_TERMS or more
    terms, else 1)."""
    S = WIDE_SPLIT_SLICES
    return S if S > 1 and 3 * H % S == 0 and 3 * H // S >= WIDE_SPLIT_MIN_TERMS else 1


def convert(loop, src, dst, n, runs=1, stride=0):
    """dst[r*n + k] = src[r*stride + k] converted (float <-> double), r < runs: the wide
    products' operands (gru_steps_convert)."""
    kern = dev.kernel("gru_steps.cu", cat.step_convert(cat.CTYPE[src.dtype.itemsize],
                                                       cat.CTYPE[dst.dtype.itemsize]))
    loop.launch(kern, (min(-(-n // cat.STEP_THREADS), 4096), runs), (cat.STEP_THREADS,),
                {"in": src, "out": dst, "n": n, "in_stride": stride})


#: StepsPlan.streams: a bidirectional pass on the per-step path of at least
#: DIRECTION_STREAMS_MIN_ROWS batch rows runs each direction as its own chain of products and
#: pointwise launches, the two chains on two streams (Loop.fork), so that one direction's
#: memory-bound pointwise launch can run beside the other's product; else (or off) the two
#: run batched, one chain, in lockstep. Measured on an H100 (bench.gru, train ms, same bits
#: as batched): S10 (B = 256, H = 512, its products in float64) 5.787 and 5.786 apart against
#: 5.991 batched; tools/direction_overlap_probe.py, batched / apart: O14 (B = 48, H = 650)
#: 0.97x train, 0.95x inference, O5 (B = 3, H = 1024) 0.96x and 1.00x: one direction's
#: product of few rows leaves the chip idle, and the batched product fills it better
DIRECTION_STREAMS = True
DIRECTION_STREAMS_MIN_ROWS = 128


def _flat(a, start):
    """Contiguous array a's elements from `start` on, flat (a view)."""
    return a.reshape(-1)[start:]


# ----------------------------------------------------------------------------------- steps
#: (StepsPlan.backward_step's default: make the split product's buffers there)
_MAKE_SPLIT = object()

@dataclass(frozen=True)
class StepsPlan:
    """The per-step path: per step one strided-batched cuBLAS product (batch = direction)
    and one pointwise launch (grid axis y = direction), or, with the directions apart
    (streams), one product and one launch a direction, each direction's on its own stream;
    where backward_split splits the backward product, one batched call over directions and
    slices and gru_add_chunks in its place (split_product); in a pass made wide
    (wide_products; the pass's `wide`), the products in float64 on widened operands: the
    forward kernel reads the product (and, from WIDE_MIN_INPUTS inputs, the projection) as
    float64 and also writes the h the next product reads, widened; the backward kernel
    stores the gate gradients as float64, and each step's product reads that step's
    d_gate_h there, split along k where wide_split says so (cugru._passes runs the
    projection and the tail in float64 too)."""
    scope = "steps"
    writes_h_n = False      # (the pass copies h_n from the last slot of hs)
    whole_pass = False      # (the passes project the input and run the tail around it)
    # (whether a forward pass may be captured whole into a CUDA graph by a caller that keys
    # the graph by the pass's buffers: no allocation, no buffer but the pass's. An inference
    # pass whose products are not wide takes its product buffer from the pass (ForwardPass's
    # gh, kept with its other temporaries: _passes.replays); a pass outside such a capture
    # replays its recurrence itself)
    captures = True

    @staticmethod
    def grid(B, H, D):
        return (-(-B * H // cat.STEP_THREADS), D)

    @staticmethod
    def wide(p):
        """Whether pass p's products run in float64: the pass was made so (its buffers are
        float64: cugru._passes.wide_pass)."""
        return p.wide

    @staticmethod
    def forward_args(p, gh, hw=None, d0=0):
        """The forward pointwise kernel's arguments (gh: the step's recurrent product; hw:
        the widened h of the wide products, else None; d0: its first direction)."""
        return {"gi": p.gi, "gh": gh, "b_ih": p.b_ih, "b_hh": p.b_hh, "hs": p.hs, "y": p.y,
                "gates": p.y if p.gates is None else p.gates, "hw": hw,
                "lengths": p.lengths, "steps": p.T, "B": p.B, "H": p.H, "S": p.S, "D": p.D,
                "d0": d0, "s": 0, **p.qargs}

    @staticmethod
    def streams(loop, p, split=None) -> bool:
        """Whether pass p runs its two directions apart, each its own chain of products and
        pointwise launches on a stream of its own (Loop.fork), rather than one chain
        batched over both: DIRECTION_STREAMS, two directions of at least
        DIRECTION_STREAMS_MIN_ROWS rows, one product a step (split:
        split_product's), and a loop that can fork (under a caller's capture, one whose
        fork was made before: a fork's stream and cuBLAS handle are made outside any
        capture)."""
        return DIRECTION_STREAMS and p.D == 2 and p.B >= DIRECTION_STREAMS_MIN_ROWS \
            and split is None and loop.can_fork() \
            and (dev.fork_made() or not dev.capturing(dev.cupy()))

    @staticmethod
    def _buffers(p, wide, backward=False):
        """The pass's temporaries: forward (gh,) or, wide, (gh, hw, w64) in float64;
        backward () or, wide, (dh, w64) in float64 (w64: W_hh widened). A forward pass that
        holds its own gh (ForwardPass's, kept for a captured inference pass) uses that."""
        B, H, D = p.B, p.H, p.D
        G = 3 * H
        if not wide:
            if backward:
                return ()
            return (p.gh,) if p.gh is not None else dev.scratch("steps", p.dtype, (D, B, G))
        shapes = ((D, B, H),) if backward else ((D, B, G), (2, D, B, H))
        return dev.scratch("steps backward" if backward else "steps", np.float64, *shapes,
                           (D * G * H,))

    def forward_step(self, loop, p, bufs=None, dirs=None):
        """(product(s), pointwise(s)): the two calls of forward step s (bufs: _buffers',
        made here where None), for the directions dirs = (d0, n): d0 .. d0 + n - 1 (None:
        all). With wide products, product(0) first widens their W_hh and h0."""
        T, B, H, D, S, it = p.T, p.B, p.H, p.D, p.S, p.dtype.itemsize
        G = 3 * H
        d0, n = dirs or (0, D)
        wide = self.wide(p)
        if bufs is None:
            bufs = self._buffers(p, wide)
        gh = bufs[0]
        hw = bufs[1] if wide else None
        kern = dev.kernel("gru_steps.cu", cat.step_forward(p.ctype, p.training, p.qat, wide,
                                                          p.gi.dtype == p.dtype))
        pointwise = loop.kernel(kern, self.grid(B, H, n), (cat.STEP_THREADS,),
                                self.forward_args(p, gh, hw, d0), step_arg="s")
        ghp = gh.data.ptr + d0 * B * G * gh.dtype.itemsize
        if wide:
            w64 = bufs[2]
            w, h, step = w64.data.ptr + d0 * G * H * 8, hw.data.ptr + d0 * B * H * 8, \
                D * B * H * 8

            def product(s, _keep=bufs):
                if s == 0:
                    convert(loop, _flat(p.w_hh, d0 * G * H), w64[d0 * G * H:], n * G * H)
                    convert(loop, _flat(p.hs, d0 * S * B * H), hw[0, d0:], B * H, n,
                            S * B * H)
                # per direction d: gh[d]' (3H, B) = W_hh[d]' (3H, H) @ hw[s % 2, d]' (H, B)
                loop.gemm(True, False, G, B, H, w, H, G * H, h + (s & 1) * step, H, B * H,
                          0.0, ghp, G, B * G, n, wide=True)
            return product, pointwise
        w_hh, hs = p.w_hh.data.ptr + d0 * G * H * it, p.hs.data.ptr + d0 * S * B * H * it

        def product(s, _keep=gh):
            # per direction d: gh[d]' (3H, B) = W_hh[d]' (3H, H) @ hs[d, s]' (H, B)
            loop.gemm(True, False, G, B, H, w_hh, H, G * H, hs + (s % S) * B * H * it, H,
                      S * B * H, 0.0, ghp, G, B * G, n)
        return product, pointwise

    @staticmethod
    def _issue_chains(into, apart, make, steps):
        """Issue a pass's steps (in the order of `steps`) as one chain over all directions
        in `into`, or (`apart`: streams) one chain a direction, direction 1's in a fork of
        `into`, joined back however the issue ends. make(loop, dirs): a step's two calls,
        each taking the step, in the order they run."""
        side = into.fork() if apart else None
        try:
            chains = [make(into, None)] if side is None else \
                [make(into, (0, 1)), make(side, (1, 1))]
            for s in steps:
                for first, second in chains:
                    first(s)
                    second(s)
        finally:
            if side is not None:
                into.join(side)

    def forward(self, loop, p):
        """The T steps, replayed from a CUDA graph on a repeated call (Loop.replay); the
        directions apart where streams() says so."""
        wide = self.wide(p)
        bufs = self._buffers(p, wide)
        apart = self.streams(loop, p)

        def issue(into):
            self._issue_chains(into, apart, lambda lp, dirs: self.forward_step(
                lp, p, bufs, dirs), range(p.T))
        loop.replay(dev.graph_key("steps forward", p.ctype, p.training, p.qat, p.D, wide,
                                  apart, self.forward_args(p, *bufs[:2]), bufs, p.w_hh),
                    issue)

    @staticmethod
    def backward_args(p, dh, d0=0):
        """The backward pointwise kernel's arguments (dh: the carried gradient; d0: its
        first direction)."""
        return {"dy": p.dy, "gates": p.gates, "hs": p.hs, "dh": dh, "dgi": p.dgi,
                "dgh": p.dgh, "lengths": p.lengths, "steps": p.T, "B": p.B, "H": p.H,
                "D": p.D, "d0": d0, "s": 0, **p.qargs}

    def split_product(self, loop, p, bufs=()):
        """(S, parts, table) for a backward pass whose per-step product is split into S
        slices of k (backward_split, or wide_split for wide products; where the loop has
        cuBLAS' batched GEMM of pointer arrays), else None. `parts` holds the slices'
        products (S, D, B, H), in float64 where wide; `table` their operands' addresses: row
        0 W_hh's slices (wide: its widened copy in bufs, _buffers'), row 1 the parts, row 2 +
        s dgh[d, s]'s slices, D*S columns each (direction-major). Made before the pass is
        issued, outside Loop.replay's capture; None while the caller's stream is being
        captured."""
        wide = self.wide(p)
        S = wide_split(p.H) if wide else backward_split(p.H, p.D, p.dtype.itemsize, p.math)
        if S == 1 or not loop.has_gemm_pointers() or dev.capturing(dev.cupy()):
            # (under a caller's CUDA graph capture, e.g. torch.cuda.graph, the table could
            # neither be uploaded nor kept for the graph's life: one product a step)
            return None
        T, B, H, D = p.T, p.B, p.H, p.D
        it = 8 if wide else p.dtype.itemsize
        G, ks = 3 * H, 3 * H // S
        parts, = dev.scratch("split", np.float64 if wide else p.dtype, (S * D * B * H,))
        w_hh = bufs[1].data.ptr if wide else p.w_hh.data.ptr
        dgh, out = p.dgh.data.ptr, parts.data.ptr

        def build():
            d, j = np.divmod(np.arange(D * S, dtype=np.int64), S)
            steps = np.arange(T, dtype=np.int64)[:, None]
            return np.concatenate([(w_hh + (d * G * H + j * ks * H) * it)[None],
                                   (out + (j * D + d) * B * H * it)[None],
                                   dgh + ((d * T + steps) * B * G + j * ks) * it])
        table = dev.pointer_table(("split", w_hh, dgh, out, T, B, H, D, S, it), build)
        return S, parts, table

    def backward_step(self, loop, p, start=True, split=_MAKE_SPLIT, bufs=None, dirs=None):
        """(pointwise(s), product(s), dh): the two calls of backward step s, and the carried
        gradient they update (p.dh0: dh_n, or zeros, at the start, set here with `start`;
        dh0 after step 0), for the directions dirs = (d0, n) (None: all; a part of them
        only with split None). `split`: split_product's (None: one product a step), made
        here unless the caller made it. With wide products (bufs: _buffers', made here
        where None) the carried gradient is a float64 temporary: pointwise(T - 1) first
        widens their W_hh and p.dh0 into it, and product(0) then rounds it into p.dh0."""
        T, B, H, D, it = p.T, p.B, p.H, p.D, p.dtype.itemsize
        G = 3 * H
        d0, n = dirs or (0, D)
        wide = self.wide(p)
        if start:
            self.start_backward(p)
        if dirs is not None and split is not None:
            if split is not _MAKE_SPLIT:
                raise ValueError("a split product runs every direction at once")
            split = None
        if wide:
            bufs = bufs or self._buffers(p, True, True)
            if split is _MAKE_SPLIT:
                split = self.split_product(loop, p, bufs)
            return self._wide_backward_step(loop, p, bufs, split, d0, n)
        dh = p.dh0
        if split is _MAKE_SPLIT:
            split = self.split_product(loop, p)
        kern = dev.kernel("gru_steps.cu", cat.step_backward(p.ctype, p.qat))
        pointwise = loop.kernel(kern, self.grid(B, H, n), (cat.STEP_THREADS,),
                                self.backward_args(p, dh, d0), step_arg="s")
        if split is not None:
            return pointwise, self._split_product(loop, p, split, dh), dh
        w_hh, dgh, dhp = (a.data.ptr + d0 * size * it for a, size in (
            (p.w_hh, G * H), (p.dgh, T * B * G), (dh, B * H)))

        def product(s):
            # per direction d: dh[d]' (H, B) += W_hh[d]'' (H, 3H) @ dgh[d, s]' (3H, B)
            loop.gemm(False, False, H, B, G, w_hh, H, G * H, dgh + s * B * G * it, G,
                      T * B * G, 1.0, dhp, H, B * H, n)
        return pointwise, product, dh

    def _wide_backward_step(self, loop, p, bufs, split=None, d0=0, n=None):
        """backward_step's calls with wide products (bufs: (dh, w64) in float64; the gate
        gradients p.dgi and p.dgh are float64; `split`: split_product's, or None), for
        directions d0 .. d0 + n - 1 (n None: all)."""
        T, B, H, D = p.T, p.B, p.H, p.D
        G = 3 * H
        n = D if n is None else n
        dh, w64 = bufs
        kern = dev.kernel("gru_steps.cu", cat.step_backward(p.ctype, p.qat, True))
        launch = loop.kernel(kern, self.grid(B, H, n), (cat.STEP_THREADS,),
                             self.backward_args(p, dh, d0), step_arg="s")
        ours = _flat(dh, d0 * B * H)

        def pointwise(s, _keep=bufs):
            if s == T - 1:
                convert(loop, _flat(p.w_hh, d0 * G * H), _flat(w64, d0 * G * H), n * G * H)
                convert(loop, _flat(p.dh0, d0 * B * H), ours, n * B * H)
            launch(s)
        w, dgh, c = (a.data.ptr + d0 * size * 8 for a, size in (
            (w64, G * H), (p.dgh, T * B * G), (dh, B * H)))
        sliced = None if split is None else self._split_product(loop, p, split, dh)

        def product(s, _keep=bufs):
            if sliced is not None:
                sliced(s)
            else:
                # per direction d: dh[d]' (H, B) += W_hh[d]'' (H, 3H) @ dgh[d, s]' (3H, B)
                loop.gemm(False, False, H, B, G, w, H, G * H, dgh + s * B * G * 8, G,
                          T * B * G, 1.0, c, H, B * H, n, wide=True)
            if s == 0:
                convert(loop, ours, _flat(p.dh0, d0 * B * H), n * B * H)
        return pointwise, product, p.dh0

    @staticmethod
    def _split_product(loop, p, split, dh):
        """product(s) of backward step s split along k (split_product's (S, parts, table)):
        per direction d and slice j, parts[j, d]' (H, B) = W_hh[d][:, slice j]'' @
        dgh[d, s, slice j]' in one batched call, then dh += parts[0] + ... + parts[S-1]."""
        S, parts, table = split
        B, H, D = p.B, p.H, p.D
        G, n, row = 3 * H, D * B * H, D * S * 8
        base = table.data.ptr
        wide = parts.dtype != p.dtype       # (float64 slices of a wide pass, into its dh)
        add = dev.kernel("gru_tail.cu", cat.add_chunks(cat.CTYPE[parts.dtype.itemsize]))
        grid = (min(-(-n // cat.STEP_THREADS), 4096),)
        args = {"part": parts, "out": dh, "n": n, "ld": n, "chunks": S}

        def product(s, _keep=split):
            loop.gemm_pointers(False, False, H, B, G // S, base, H, base + (2 + s) * row, G,
                               0.0, base + row, H, D * S, wide=wide)
            loop.launch(add, grid, (cat.STEP_THREADS,), args)
        return product

    @staticmethod
    def start_backward(p):
        """The carried gradient p.dh0 set to dh_n, or zeros."""
        dh = p.dh0
        if p.dh_n is None:
            dev.zero_bytes(dh.data.ptr, dh.nbytes)
        else:
            dev.copy_bytes(dh.data.ptr, p.dh_n.data.ptr, dh.nbytes)

    def backward(self, loop, p):
        """Fills p.dgi, p.dgh and p.dh0: the T steps, replayed from a CUDA graph on a
        repeated call (Loop.replay)."""
        self.start_backward(p)
        wide = self.wide(p)
        bufs = self._buffers(p, wide, True)
        split = self.split_product(loop, p, bufs)
        apart = self.streams(loop, p, split)

        def issue(into):
            self._issue_chains(into, apart, lambda lp, dirs: self.backward_step(
                lp, p, start=False, split=split, bufs=bufs, dirs=dirs)[:2],
                range(p.T - 1, -1, -1))
        args = self.backward_args(p, bufs[0] if wide else p.dh0)
        loop.replay(dev.graph_key("steps backward", p.ctype, p.qat, p.D, wide, apart, args,
                                  p.dh0, bufs, p.w_hh, split), issue)


STEPS = StepsPlan()


# ----------------------------------------------------------------------------------- small
#: the small path holds at most this many units (D*B*H) of a step: its one block keeps them in
#: shared memory (backward: 4 elements a unit, 32 KiB in double, within the default 48 KiB)
SMALL_MAX_UNITS = 1024
#: path="auto" takes the small path for a pass while the longest chain of work one thread of
#: its block does in that pass (``small_chain``, in multiply-adds) stays at most this, per
#: pass: then the pass takes about as long on the GPU as the host takes to issue the
#: launches it replaces. Measured on an H100 (python -m bench.small, docs/performance.md):
#: forward, the small path won at chains up to 840 and tied or lost from 1728; backward, it
#: won up to 6100 (and beyond, unevenly) and lost at 15744
SMALL_AUTO_MAX_CHAIN = {"forward": 1024, "backward": 6144}
#: a forward step's fixed cost in small_chain's units, whatever the shape: the barrier, the
#: cell and its stores (about 1.2 µs a step on an H100, where a turn's product of 2 x 16
#: terms cost about 0.05 µs more)
SMALL_STEP_COST = 16
#: the small forward kernel splits each unit's products over L lanes: where the block's
#: threads hold every unit of a step at once, as many lanes as leave one turn a step (up
#: to the fewest powers of two, up to 32, that cover I and H: each turn costs a full chain
#: of loads, shuffles and the cell); beyond, those that cover I and H, halved while the
#: block would take more than this many turns over a step's units
SMALL_MAX_TURNS = 16


@dataclass(frozen=True)
class SmallPlan:
    """The small path: each pass is one launch of one block of SMALL_THREADS threads
    (gru_small.cu), the input projection, h0 and h_n (forward) and the whole tail (backward)
    included: no cuBLAS call, no copy. For D*B*H <= SMALL_MAX_UNITS."""
    scope = "small"
    writes_h_n = True
    whole_pass = True
    # (its pass is one launch: a graph's launch, with the key and the copies out, cost the
    # host more; a tiny inference call took 67.9 µs through a graph, 21-35 without)
    captures = False

    @staticmethod
    def fits(B, H, D):
        return D * B * H <= SMALL_MAX_UNITS

    def forward(self, loop, p):
        """Fills p.y and p.h_n, and with training p.hs and p.gates (from p.x and p.h0)."""
        name, dims, smem = _small_fixed(p.ctype, p.dtype.itemsize, p.training, p.qat, p.T, p.B,
                                        p.I, p.H, p.D)
        loop.launch_args(dev.kernel("gru_small.cu", name, SMALL_FORWARD_PARAMS), (1,),
                         (cat.SMALL_THREADS,),
                         (p.x, p.h0, p.w_ih, p.w_hh, p.b_ih, p.b_hh, p.hs, p.y, p.gates,
                          p.h_n, p.lengths) + dims + _quant_values(p.qargs),
                         shared_mem=smem)

    def backward(self, loop, p):
        """Fills p.dgi, p.dgh, p.dh0, p.dx and the gradients p.dw."""
        name, dims, smem = _small_fixed(p.ctype, p.dtype.itemsize, None, p.qat, p.T, p.B, p.I,
                                        p.H, p.D)
        loop.launch_args(dev.kernel("gru_small.cu", name, SMALL_BACKWARD_PARAMS), (1,),
                         (cat.SMALL_THREADS,),
                         (p.dy, p.dh_n, p.x, p.w_ih, p.w_hh, p.gates, p.hs, p.dgi, p.dgh,
                          p.dx, p.dh0) + p.dw + (p.lengths,) + dims
                         + _quant_values(p.qargs), shared_mem=smem)


#: the small kernels' parameters in the order of their CUDA declarations (checked when a
#: kernel is first looked up, dev.kernel(..., params)): SmallPlan launches in this order
SMALL_FORWARD_PARAMS = ("x", "h0", "w_ih", "w_hh", "b_ih", "b_hh", "hs", "y", "gates", "h_n",
                        "lengths", "steps", "B", "I", "H", "D", "L") + QUANT_PARAMS
SMALL_BACKWARD_PARAMS = ("dy", "dh_n", "x", "w_ih", "w_hh", "gates", "hs", "dgi", "dgh", "dx",
                         "dh0", "dw_ih", "dw_hh", "db_ih", "db_hh", "lengths", "steps", "B",
                         "I", "H", "D") + QUANT_PARAMS
_NO_QUANT_VALUES = tuple(NO_QUANT_ARGS[k] for k in QUANT_PARAMS)


def _quant_values(qargs):
    """The quantization arguments (cugru.quant.kernel_args) in QUANT_PARAMS' order."""
    if qargs is NO_QUANT_ARGS:
        return _NO_QUANT_VALUES
    return tuple(qargs[k] for k in QUANT_PARAMS)


@functools.lru_cache(maxsize=1024)
def _small_fixed(ctype, itemsize, training, qat, T, B, I, H, D):
    """(kernel name, the shape's values, dynamic shared memory) of a small launch: the
    forward kernel's (training True or False) or the backward's (training None)."""
    units = D * B * H
    if training is None:
        return cat.small_backward(ctype, qat), (T, B, I, H, D), 4 * units * itemsize
    return (cat.small_forward(ctype, training, qat),
            (T, B, I, H, D, small_lanes(I, H, units)), 2 * units * itemsize)


SMALL = SmallPlan()


@functools.lru_cache(maxsize=1024)
def small_lanes(I, H, units):
    """Lanes per unit of the small forward kernel (see SMALL_MAX_TURNS)."""
    lanes = 1
    while lanes < 32 and lanes < max(I, H):
        lanes *= 2
    if units <= cat.SMALL_THREADS:
        while units * lanes > cat.SMALL_THREADS:
            lanes //= 2
        return lanes
    while lanes > 1 and units * lanes > SMALL_MAX_TURNS * cat.SMALL_THREADS:
        lanes //= 2
    return lanes


def small_chain(T, B, I, H, D):
    """{"forward": ..., "backward": ...}: the longest chain of dependent work one thread of
    the small path's block does in each pass, in multiply-adds (a shuffle counted as one):
    forward, T steps of SMALL_STEP_COST and its turns over the units, each ceil(I/L) +
    ceil(H/L) products and log2(L) shuffles; backward, T steps of 3H per unit it takes,
    then its share of the tail's sums (T*B*I + D*3H*(I + H + 2) of them, each over D*3H or
    T*B terms)."""
    units, nt = D * B * H, cat.SMALL_THREADS
    lanes = small_lanes(I, H, units)
    turns = -(-units // (nt // lanes))
    forward = T * (SMALL_STEP_COST
                   + turns * (-(-I // lanes) + -(-H // lanes) + lanes.bit_length() - 1))
    tail = -(-(T * B * I + D * 3 * H * (I + H + 2)) // nt) * max(T * B, D * 3 * H)
    return {"forward": forward, "backward": T * -(-units // nt) * 3 * H + tail}


@functools.lru_cache(maxsize=1024)
def small_takes(T, B, I, H, D, backward=False):
    """Whether path="auto" runs the small path for this shape's forward (or backward) pass.
    The passes decide apart: both share every buffer's layout."""
    kind = "backward" if backward else "forward"
    return SMALL.fits(B, H, D) and small_chain(T, B, I, H, D)[kind] <= SMALL_AUTO_MAX_CHAIN[kind]


# --------------------------------------------------------------------------------- persist
@dataclass(frozen=True)
class PersistPlan:
    """The persist kernels' split of a direction: `blocks` blocks of `units` hidden units
    each, `rows_per_thread` batch rows per thread, the staging chunk (`kc_fwd`, `kc_bwd`
    elements of a vector row) and the dynamic shared memory per block of each kernel (the
    W_hh slice and the staging buffer). Scope "block" (one block per direction:
    __syncthreads) or "grid" (a barrier across the direction's blocks; cooperative launch)."""
    blocks: int
    units: int
    rows_per_thread: int
    kc_fwd: int
    kc_bwd: int
    smem_fwd: int
    smem_bwd: int
    writes_h_n = False
    whole_pass = False
    captures = False        # (each pass allocates its barrier counters)

    @property
    def scope(self):
        return "block" if self.blocks == 1 else "grid"

    def kernel(self, ctype, kind, qat=False):
        """The kernel of `kind` ("train": the forward pass keeping the history, "infer": the
        forward pass without, "backward"), allowed its shared memory; `qat`: its
        quantization-aware instance."""
        r = self.rows_per_thread
        if kind == "backward":
            name, smem = cat.persist_backward(ctype, r, qat), self.smem_bwd
        else:
            name, smem = cat.persist_forward(ctype, r, kind == "train", qat), self.smem_fwd
        return dev.shared(dev.kernel("gru_persist.cu", name), smem)

    def kernels(self, ctype, qat=False):
        """(train, infer, backward): all three kernels (see ``kernel``)"""
        return tuple(self.kernel(ctype, k, qat) for k in ("train", "infer", "backward"))

    def forward(self, loop, p):
        cp = dev.cupy()
        kern = self.kernel(p.ctype, "train" if p.training else "infer", p.qat)
        loop.launch(kern, (self.blocks, p.D), (cat.PERSIST_THREADS,),
                    {"gi": p.gi, "w_hh": p.w_hh, "b_ih": p.b_ih, "b_hh": p.b_hh, "hs": p.hs,
                     "y": p.y, "gates": p.y if p.gates is None else p.gates,
                     "barrier": cp.zeros(p.D, np.uint32), "lengths": p.lengths,
                     "steps": p.T, "B": p.B, "H": p.H, "S": p.S, "J": self.units,
                     "KC": self.kc_fwd, **p.qargs},
                    shared_mem=self.smem_fwd, cooperative=self.blocks > 1)

    def backward(self, loop, p):
        cp = dev.cupy()
        loop.launch(self.kernel(p.ctype, "backward", p.qat), (self.blocks, p.D),
                    (cat.PERSIST_THREADS,),
                    {"dy": p.dy, "gates": p.gates, "hs": p.hs, "w_hh": p.w_hh,
                     "dh_n": cp.zeros((p.D, p.B, p.H), p.dtype) if p.dh_n is None else p.dh_n,
                     "dgi": p.dgi, "dgh": p.dgh, "dh0": p.dh0,
                     "barrier": cp.zeros(p.D, np.uint32), "lengths": p.lengths,
                     "steps": p.T, "B": p.B, "H": p.H, "J": self.units,
                     "KC": self.kc_bwd, **p.qargs},
                    shared_mem=self.smem_bwd, cooperative=self.blocks > 1)


def persist_split(B, H, D, blocks, itemsize, smem_limit):
    """The PersistPlan for `blocks` blocks per direction, or None when a block cannot hold it."""
    units = -(-H // blocks)
    blocks = -(-H // units)                      # no block without units
    if units > cat.PERSIST_THREADS:
        return None
    rows = -(-B // (cat.PERSIST_THREADS // units))
    maxp = next((r for r in cat.PERSIST_ROWS[itemsize] if r >= rows), None)
    if maxp is None:
        return None
    v = 16 // itemsize
    up = lambda n: -(-n // v) * v  # noqa: E731
    w_fwd, w_bwd = 3 * units * (up(H) + v), units * (up(3 * H) + v)
    kcs = []
    for w, length in ((w_fwd, H), (w_bwd, 3 * H)):
        room = min(smem_limit, PERSIST_STAGE_BYTES + w * itemsize) // itemsize - w
        kc = min(up(length), (room // B - v) // v * v)
        if kc < v:
            return None
        kcs.append(kc)
    smem = [(w + B * (kc + v)) * itemsize for w, kc in ((w_fwd, kcs[0]), (w_bwd, kcs[1]))]
    return PersistPlan(blocks, units, maxp, kcs[0], kcs[1], smem[0], smem[1])


def persist_cost(plan, B, H, D, itemsize=4):
    """Estimated cycles per forward step of a persist split (see PERSIST_LDS_CYCLES)."""
    v = 16 // itemsize
    packs = -(-H // v)
    rows = min(cat.PERSIST_THREADS // plan.units, B)
    warps = -(-plan.units * rows // 32)
    p = plan.rows_per_thread
    product = max(warps * packs * (3 + p) * PERSIST_LDS_CYCLES,    # shared-memory loads
                  warps * packs * 3 * v * p / 4,                    # FMA instructions
                  PERSIST_FMA_LATENCY * H)                          # one accumulator's chain
    stage = plan.blocks * D * B * H * itemsize / PERSIST_L2_BYTES_PER_CYCLE
    return product + stage + (PERSIST_BARRIER_CYCLES if plan.blocks > 1 else 0)


# -------------------------------------------------------------------------------- resident
@dataclass(frozen=True)
class ResidentPlan:
    """The resident kernels' split (gru_resident.cu): blocks of `rows` batch rows x `units`
    hidden units, `k_split` groups of threads splitting the forward product's k, `blocks`
    blocks per direction, `smem` bytes of dynamic shared memory a forward block (a backward
    block takes at most as much: catalog.resident_smem). Float32, strict, no quantization,
    no lengths. Each pass is one cooperative launch and keeps the shared layout of the
    history and gate gradients, so either pass may pair with another plan's."""
    rows: int
    units: int
    k_split: int
    blocks: int
    smem: int
    scope = "resident"
    writes_h_n = False
    whole_pass = False
    captures = False        # (each pass allocates its barrier counters)

    @property
    def split(self):
        return (self.rows, self.units, self.k_split)

    def kernel(self, training):
        """The forward kernel (`training`: the one that keeps the history), allowed its
        shared memory."""
        name = cat.resident_forward(self.split, training)
        return dev.shared(dev.kernel("gru_resident.cu", name), self.smem)

    @staticmethod
    def _check(p, pass_):
        if p.dtype.itemsize != 4 or p.qat or p.lengths is not None:
            raise ValueError(f"the resident plan runs float32 data without quant or lengths; "
                             f"this {pass_} pass has {p.dtype}{' with quant' * p.qat}"
                             f"{' with lengths' * (p.lengths is not None)}")

    def forward(self, loop, p):
        self._check(p, "forward")
        if p.w_hh.data.ptr % 16:
            # (the kernel reads W_hh's rows 16 bytes at a time where H is a multiple of 4; a
            # view off 16-byte boundaries runs the per-step recurrence, same buffers)
            STEPS.forward(loop, p)
            return
        loop.launch(self.kernel(p.training), (self.blocks, p.D), (cat.RESIDENT_THREADS,),
                    {"gi": p.gi, "w_hh": p.w_hh, "b_ih": p.b_ih, "b_hh": p.b_hh, "hs": p.hs,
                     "y": p.y, "gates": p.y if p.gates is None else p.gates,
                     "barrier": dev.cupy().zeros(p.D, np.uint32), "steps": p.T, "B": p.B,
                     "H": p.H, "S": p.S},
                    shared_mem=self.smem, cooperative=True)

    def backward(self, loop, p):
        """Fills p.dgi, p.dgh and p.dh0 in one launch (StepsPlan.backward's results)."""
        self._check(p, "backward")
        if (p.w_hh.data.ptr | p.dgh.data.ptr) % 16:
            STEPS.backward(loop, p)     # (as in forward: 16-byte loads of W_hh and dgh)
            return
        STEPS.start_backward(p)
        smem = cat.resident_smem(self.split, p.H, backward=True)
        kern = dev.shared(dev.kernel("gru_resident.cu", cat.resident_backward(self.split)),
                          smem)
        loop.launch(kern, (self.blocks, p.D), (cat.RESIDENT_THREADS,),
                    {"dy": p.dy, "gates": p.gates, "hs": p.hs, "dh": p.dh0, "dgi": p.dgi,
                     "dgh": p.dgh, "w_hh": p.w_hh, "barrier": dev.cupy().zeros(p.D, np.uint32),
                     "steps": p.T, "B": p.B, "H": p.H},
                    shared_mem=smem, cooperative=True)


def resident_splits(B, H, D, sms, smem_limit):
    """[ResidentPlan] of every split of cat.RESIDENT_SPLITS that fits batch B, hidden size H
    and D directions on a GPU of `sms` SMs and `smem_limit` bytes of shared memory a block:
    every block of both directions on an SM of its own (a block takes most of an SM's
    shared memory) at once. In RESIDENT_SPLITS' order."""
    out = []
    for rows, units, k_split in cat.RESIDENT_SPLITS:
        blocks = -(-B // rows) * -(-H // units)
        smem = cat.resident_smem((rows, units, k_split), H)
        if D * blocks <= sms and smem <= smem_limit:
            out.append(ResidentPlan(rows, units, k_split, blocks, smem))
    return out


def resident_split(B, H, D, sms, smem_limit):
    """The ResidentPlan for batch B, hidden size H and D directions on a GPU of `sms` SMs
    and `smem_limit` bytes of shared memory a block, or None where no split fits
    (resident_splits): of those that fit, the least work a thread per step (k over the
    groups splitting it; each split splits k its own number of ways)."""
    fits = resident_splits(B, H, D, sms, smem_limit)
    return max(fits, key=lambda p: p.k_split) if fits else None


def resident_applies(dtype, qat=False, lengths=False, math="strict") -> bool:
    """Whether the resident kernels may run a pass: float32 data (half data computes
    in float32) under math="strict", without quantization or lengths."""
    return np.dtype(dtype).itemsize == 4 and math == "strict" and not qat and not lengths


def resident_empty(plan, B):
    """The share of the plan's blocks' batch rows that lie beyond B."""
    return 1 - B / (-(-B // plan.rows) * plan.rows)


def resident_plan(B, H, D, dtype, qat=False, lengths=False, math="strict"):
    """The resident split of a pass on the current GPU (resident_split), or None
    where the kernel does not apply (resident_applies) or no split fits."""
    if not resident_applies(dtype, qat, lengths, math):
        return None
    d = dev.device()
    return resident_split(int(B), int(H), int(D), d.sms, d.smem_optin)


# ------------------------------------------------------------------------------------ tile
@dataclass(frozen=True)
class TilePlan:
    """How the tile kernels (W_hh in registers) split the work: groups of `cluster` blocks
    (1: a single block, scope "block"; more: a thread-block cluster, scope "cluster",
    distributed shared memory and mbarriers; 0: scope "grid", `group_blocks` blocks that
    exchange through global memory and meet at a counter) of `threads` threads, each group
    one direction and `rows` batch rows (`groups` groups per direction), each block `units`
    hidden units with `lanes` threads per `per_thread` units in the product, each thread
    `packs` 16-byte packs of each gate's weights of each of its units; the kernels are built
    for at most `max_rows` rows (and compute that many). Then the dynamic shared memory per
    block of each kernel. At grid scope `slots` groups per direction run at once (set by
    fast_plan from the GPU's occupancy; all resident, a cooperative launch), each slot's
    blocks taking its groups in turn."""
    cluster: int
    groups: int
    rows: int
    units: int
    lanes: int
    packs: int
    max_rows: int
    threads: int
    per_thread: int
    smem_fwd: int
    smem_bwd: int
    group_blocks: int = 0
    slots: int = 0
    writes_h_n = True
    whole_pass = False

    @property
    def scope(self):
        return {0: "grid", 1: "block"}.get(self.cluster, "cluster")

    @property
    def captures(self):
        """(grid scope allocates its counters in each pass: see StepsPlan.captures)"""
        return self.cluster != 0

    @property
    def per_group(self):
        """blocks per group"""
        return self.cluster or self.group_blocks

    @property
    def blocks(self):
        """blocks per direction launched"""
        return (self.groups if self.cluster else self.slots) * self.per_group

    @property
    def tile(self):
        """the tile kernels' TILES entry"""
        return (self.cluster, self.packs, self.max_rows, self.threads, self.per_thread)

    def kernel(self, ctype, kind, qat=False, lengths=False, mma=False):
        """The kernel of `kind` ("train": the forward pass keeping the history, "infer": the
        forward pass without, "backward"), allowed its shared memory; `qat`: its
        quantization-aware instance; `lengths`: its instance for variable lengths; `mma`: its
        instance with the product on tensor cores (cat.MMA_TILES)."""
        if not cat.tile_has(ctype, self.tile, kind, qat, lengths, mma):
            raise ValueError(
                f"the tile {self.tile} has no {kind} kernel" + " quantization-aware" * qat
                + " for variable lengths" * lengths + " on tensor cores" * mma
                + " (cugru._catalog.QAT_BACKWARD_LEFT_OUT, LENGTHS_LEFT_OUT, MMA_TILES): plan"
                " the pass with fast_plan(..., qat=, lengths=)"
                + ", and ask TilePlan.runs_mma whether a pass runs the MMA kernels" * mma)
        if kind == "backward":
            name = cat.tile_backward(ctype, self.tile, qat, lengths, mma)
        else:
            name = cat.tile_forward(ctype, self.tile, kind == "train", qat, lengths, mma)
        return dev.shared(dev.kernel("gru_tile.cu", name), self.smem(kind == "backward", mma))

    def smem(self, backward, mma=False):
        """The dynamic shared memory of the forward (or backward) kernel, or of its MMA
        instance: the same, with the lane sums' rows in the MMA layout (cat.mma_part_row;
        float32)."""
        size = self.smem_bwd if backward else self.smem_fwd
        if mma:
            sums = self.units * self.lanes
            size += self.max_rows * (cat.mma_part_row(sums) - 3 * sums) * 4
        return size

    def mma_holds(self, ctype):
        """Whether the tile's MMA kernels can run this split: the tile has them (float32,
        cat.MMA_TILES) and the block has the warps their product takes (cat.mma_warps)."""
        return (cat.tile_has(ctype, self.tile, "train", mma=True)
                and cat.mma_warps(self.units, self.lanes, self.per_thread) <= self.threads // 32)

    def runs_mma(self, p):
        """Whether the pass `p` runs the MMA kernels: math="tf32" on float32 data (half
        data runs its float32 pass), no quantization, no variable lengths (mma_applies),
        and a split they can run with its directions on this GPU (mma_fits)."""
        return (mma_applies(p.math, p.ctype, p.qat, p.lengths is not None)
                and self.mma_fits(p.ctype, p.D))

    def mma_fits(self, ctype, D):
        """Whether the MMA kernels can run this split of D directions on this GPU: a split
        they hold (mma_holds), their shared memory within the device's, and at grid scope as
        many of their groups resident at once as the plan launches (a cooperative launch;
        the plan's slots were counted for its FMA kernels)."""
        if not _mma_holds(self, ctype):
            return False
        d = dev.device()
        key = (self, ctype, D, d.id)
        runs = _MMA_RUNS.get(key)
        if runs is None:
            runs = max(self.smem(False, True), self.smem(True, True)) <= d.smem_optin
            if runs and not self.cluster:
                least = min(dev.blocks_per_sm(self.kernel(ctype, kind, mma=True),
                                              self.threads, self.smem(kind == "backward", True))
                            for kind in ("train", "infer", "backward"))
                runs = d.sms * least // self.per_group // D >= self.slots
            _MMA_RUNS[key] = runs
        return runs

    def has_qat_backward(self, ctype):
        return cat.tile_has(ctype, self.tile, "backward", qat=True)

    def kernels(self, ctype, qat=False, lengths=False):
        """(train, infer, backward): all three kernels (see ``kernel``), those that are built
        for `qat` and `lengths` (cugru._catalog.tile_has)."""
        return tuple(self.kernel(ctype, k, qat, lengths) for k in ("train", "infer", "backward")
                     if cat.tile_has(ctype, self.tile, k, qat, lengths))

    def group_args(self, D):
        """the kernels' last arguments: the grid scope's counters (D x slots zeros; else a
        null pointer), blocks per group and groups per direction"""
        counters = None if self.cluster else dev.cupy().zeros(D * self.slots, np.uint32)
        return {"counters": counters, "G": self.per_group, "groups": self.groups}

    def forward_args(self, p):
        """The forward kernels' arguments for the pass `p`."""
        return {"gi": p.gi, "w_hh": p.w_hh, "b_ih": p.b_ih, "b_hh": p.b_hh, "hs": p.hs,
                "y": p.y, "gates": p.y if p.gates is None else p.gates, "h_n": p.h_n,
                "lengths": p.lengths, "steps": p.T, "B": p.B, "H": p.H, "S": p.S,
                "J": self.units, "KS": self.lanes, "R": self.rows, **self.group_args(p.D),
                **p.qargs}

    def backward_args(self, p):
        """The backward kernel's arguments for the pass `p`."""
        return {"dy": p.dy, "gates": p.gates, "hs": p.hs, "w_hh": p.w_hh, "dh_n": p.dh_n,
                "dgi": p.dgi, "dgh": p.dgh, "dh0": p.dh0, "lengths": p.lengths,
                "steps": p.T, "B": p.B, "H": p.H, "J": self.units, "KS": self.lanes,
                "R": self.rows, **self.group_args(p.D), **p.qargs}

    def forward(self, loop, p):
        mma = self.runs_mma(p)
        loop.launch(self.kernel(p.ctype, "train" if p.training else "infer", p.qat,
                                p.lengths is not None, mma),
                    (self.blocks, p.D), (self.threads,), self.forward_args(p),
                    shared_mem=self.smem(False, mma), cooperative=not self.cluster)

    def backward(self, loop, p):
        mma = self.runs_mma(p)
        loop.launch(self.kernel(p.ctype, "backward", p.qat, p.lengths is not None, mma),
                    (self.blocks, p.D), (self.threads,), self.backward_args(p),
                    shared_mem=self.smem(True, mma), cooperative=not self.cluster)


#: whether math="tf32" runs the tile kernels' MMA instances where they hold the split
#: (plans.use_mma; on by default)
MMA = True
#: (plan, ctype, directions, device) -> whether its passes under math="tf32" run its MMA
#: kernels (TilePlan.runs_mma): their shared memory fits, and at grid scope their slots
_MMA_RUNS: dict = {}


def mma_applies(math, ctype, qat=False, lengths=False) -> bool:
    """Whether a pass of `math` on `ctype` data (its compute type: "float" for half data)
    runs the tile kernels' MMA instances where its split has room for them
    (TilePlan.mma_fits): MMA on, math="tf32", float32, neither quantization-aware nor with
    variable lengths."""
    return MMA and math == "tf32" and ctype == "float" and not qat and not lengths


@functools.lru_cache(maxsize=1024)
def _mma_holds(plan, ctype):
    return plan.mma_holds(ctype)


def tile_split(B, H, D, tile, rows, itemsize):
    """The TilePlan of the tile kernels `tile` (a TILES entry) for `rows` rows per group, or
    None where they cannot hold it. At grid scope `slots` is left 0 (fast_plan sets it)."""
    cluster, packs, max_rows, threads, per_thread = tile
    v = 16 // itemsize
    if B * D * 4 * H >= 2 ** 31 or rows > max_rows:
        return None       # (the kernels address a step's rows with 32-bit offsets)
    lanes = 1             # the fewest lanes whose packs cover H
    while lanes * packs * v < H:
        lanes *= 2
    if cluster == 0:
        # as few blocks per group as hold H, each the most units its threads take
        if lanes > cat.GRID_MAX_LANES or threads // lanes == 0:
            return None
        blocks = -(-H // (threads // lanes * per_thread))
        units = -(-H // blocks)                      # then whole units per thread
        units = -(-units // per_thread) * per_thread
        if (blocks - 1) * units >= H or units * rows > threads:
            return None
    else:
        units = -(-H // cluster)
        if cluster > 1:
            # the exchange moves 16-byte packs of units; where the packs leave the last
            # blocks of the cluster no units (H = 130 in float32: 7 x 20 >= 130 in a
            # cluster of 8), those take part in the exchange only, with no pointwise step,
            # and their product is of zero weights
            units = -(-units // v) * v
        if units * rows > threads:
            return None   # more pointwise steps than threads
        if lanes > cat.TILE_MAX_LANES:
            return None
        blocks = cluster
    if units % per_thread or units // per_thread * lanes > threads:
        return None
    hs = lanes * packs * v                  # a vector row in shared memory, zero past H
    part = max_rows * 3 * units * lanes     # the lanes' sums
    # vector buffers and the unused gap before the ring (gru_tile.cu, GruTile): two each,
    # grid scope one and none
    nv, ng = (2, 2) if cluster else (1, 0)
    ahead = cat.TILE_AHEAD
    return TilePlan(cluster, -(-B // rows), rows, units, lanes, packs, max_rows, threads,
                    per_thread,
                    16 + (nv * max_rows * hs + part + ng * rows * units
                          + ahead * rows * 3 * units + 6 * units) * itemsize,
                    16 + (3 * nv * max_rows * hs + part + 3 * ng * rows * units
                          + ahead * rows * 6 * units) * itemsize,
                    0 if cluster else blocks)


def waves(plan, D, groups_at_once):
    """The waves of groups a tile split runs in when the GPU runs `groups_at_once` of its
    groups together: at block and cluster scope over all D directions at once, at grid
    scope over each direction's slots (groups_at_once // D, as resident gives them)."""
    if plan.cluster:
        return -(-(plan.groups * D) // max(1, groups_at_once))
    return -(-plan.groups // max(1, groups_at_once // D))


def tile_rank(plan, D, groups_at_once, backward=False):
    """The order in which fast_plan prefers tile splits for the forward pass (or with
    `backward` the backward pass), from the measurements in docs/performance.md (`python -m
    bench.gru --sweep`, tools/inference_sweep.py): fewest waves of groups (groups run at
    once only as far as the GPU holds their blocks), then the fewest rows the kernel
    computes per group (a step's time grows with them), then the scope: one block of 256
    threads (no exchange), then a cluster, then one block of 512 threads (a cluster of two
    was faster in both passes on S2 and S7: half the product per SM for an exchange through
    st.async), then grid scope. Then most weights per thread (fewer lanes: fewer warps in
    the product and fewer lane sums to add), then two units per thread before one or four (a
    pack loaded from shared memory serves two units; the sweeps put 4 packs x 2 units ahead
    of 2 x 4 on S1 in both passes, and ahead of 8 x 1 in S2's and S7's backward), except in
    a forward pass at cluster scope, which takes one unit per thread first (8 x 1 ran 2-6%
    ahead of 4 x 2 on S7's forward, with history kept and without, and on O7's, O11's and
    O13's inference, on H100s at 552a83b and dac68b3; S2 within noise; O15's train step
    slower after the change, not separated from the host's pace; at block scope S1's
    forward prefers 4 x 2, and S4's inference one or the other run to run). Then fewer threads,
    then the cluster size: 4 blocks first, then the smaller (on S7 the 4-block kernels beat the
    2- and 8-block ones forward, by 6-9%, and, since the warps with pointwise steps leave the
    product to the others, backward too: 0.71-0.76 against 0.79-0.82 µs a step); last, the
    fewest rows per group, so that as many groups run as the same waves hold, each with a
    shorter step (tools/rows_probe.py: S3 and S5 4-5% faster in both passes at 5 rows than at 8,
    O1 and A1 5-9%, A2 10-13%, A5 and A6 15-27% at 2-3 rows against 8; docs/performance.md).
    The tiles of cat.FOUR_ROW_TILES are not ranked: fast_plan puts one in its 8-row
    sibling's place (four_row_in_place)."""
    scope = {0: 3, 1: 0 if plan.threads <= 256 else 2}.get(plan.cluster, 1)
    size = (abs(plan.cluster - 4), plan.cluster)
    units = plan.per_thread if scope == 1 and not backward else abs(plan.per_thread - 2)
    return (waves(plan, D, groups_at_once), plan.max_rows, scope,
            -plan.packs * plan.per_thread, units, plan.threads, size, plan.rows)


def four_row_in_place(chosen, splits, D, mma_ctype=None):
    """The split fast_plan runs for its ranked choice `chosen` (a (plan, groups at once)
    pair of `splits`, tile_splits' pairs): where `chosen` is the 8-row sibling of a tile of
    cat.FOUR_ROW_TILES (the same cluster, packs, threads and units per thread) at 4 rows or
    fewer, that tile's split of the same rows where tile_splits holds it in no more waves
    (it computes 4 of the sibling's 8 rows a step: the same bits, half the product; O7 and
    O13 1.26-1.35x faster in float32 strict, docs/performance.md); else `chosen`'s plan. So
    a 4-row tile runs only where its sibling would have, on any GPU, and takes no other
    split's place. `mma_ctype`: the pass's element type where it runs the MMA kernels
    (mma_applies), else None; the sibling is kept where its MMA kernels run the split
    (mma_fits): the 4-row tiles have no MMA instances, and under math="tf32" the 8-row
    product on tensor cores was 3-7% faster on O7's and O13's inference and O13's train
    step (tools/tiles_ab.py --math tf32, f654e02)."""
    plan, n = chosen
    four = cat.FOUR_ROW_OF.get(plan.tile)
    if four is None or plan.rows > four[2]:
        return plan
    if mma_ctype is not None and plan.mma_fits(mma_ctype, D):
        return plan
    for p, m in splits:
        if p.tile == four and p.rows == plan.rows and waves(p, D, m) <= waves(plan, D, n):
            return p
    return plan


def resident(plan, D, at_once):
    """`plan` ready to launch when the GPU runs `at_once` of its groups together (over all D
    directions): at grid scope with its slots per direction, or None where not even one
    group per direction fits (a cooperative launch would be refused); other scopes as given."""
    if plan.cluster:
        return plan
    slots = min(plan.groups, at_once // D)
    return dataclasses.replace(plan, slots=slots) if slots >= 1 else None


@functools.lru_cache(maxsize=256)
def groups_at_once(plan, dtype, device_id, qat=False, lengths=False):
    """How many groups of the plan's tile kernels the GPU runs at once (over all
    directions): for clusters the driver's occupancy query, or SMs // cluster where it has
    none; else the blocks resident at once // blocks per group. With `qat` (`lengths`), the
    least over the plain kernels and the quantization-aware ones (those for variable
    lengths): those may hold more registers."""
    sms = dev.device().sms
    least = None
    ctype = cat.CTYPE[np.dtype(dtype).itemsize]
    smems = (plan.smem_fwd, plan.smem_fwd, plan.smem_bwd)
    pairs = list(zip(plan.kernels(ctype), smems))
    if qat:
        pairs += list(zip(plan.kernels(ctype, True), smems))
    if lengths:
        pairs += list(zip(plan.kernels(ctype, qat, True), smems))
    for kern, smem in pairs:
        if plan.cluster <= 1:
            n = sms * dev.blocks_per_sm(kern, plan.threads, smem) // plan.per_group
        else:
            n = dev.clusters_at_once(kern, plan.cluster, plan.threads, smem)
            if n is None:
                n = sms // plan.cluster
        least = n if least is None else min(least, n)
    return least


def _persist_resident_blocks(plan, dtype, qat=False):
    """Blocks of the persist kernels (the least of the three, and of their
    quantization-aware instances with `qat`) that fit on one SM."""
    ctype = cat.CTYPE[np.dtype(dtype).itemsize]
    kernels = plan.kernels(ctype) + (plan.kernels(ctype, True) if qat else ())
    return min(dev.blocks_per_sm(k, cat.PERSIST_THREADS, smem)
               for k, smem in zip(kernels, (plan.smem_fwd, plan.smem_fwd, plan.smem_bwd) * 2))


# --------------------------------------------------------------------------------- planner
def fast_plan(B, H, D, dtype, backward=False, qat=False, lengths=False, math="strict"):
    """The persistent split for batch B, hidden size H and D directions on the current GPU,
    for the forward pass (or with `backward` the backward pass; both passes share every
    buffer's layout, so they may take different splits): a TilePlan where the tile kernels
    hold the shape, else a PersistPlan, or None where neither fits (then path="auto" takes
    the per-step path). `qat`: for a quantization-aware pass (occupancy then counts its
    kernels too, and a backward pass leaves out the tiles of cat.QAT_BACKWARD_LEFT_OUT).
    `lengths`: for a pass with variable lengths (likewise, cat.LENGTHS_LEFT_OUT). `math`:
    the pass's (a checked math); where it runs the MMA kernels (mma_applies) a 4-row tile
    does not take its 8-row sibling's place (four_row_in_place)."""
    dtype = np.dtype(dtype)
    mma = mma_applies(math, cat.CTYPE[dtype.itemsize], qat, lengths)
    return _fast_plan(int(B), int(H), int(D), dtype.str, dev.device().id,
                      bool(backward), bool(qat), bool(lengths), mma)


def tile_splits(B, H, D, dtype, backward=False, qat=False, lengths=False):
    """[(plan, groups at once)]: every split of the tile kernels that can run a pass of the
    shape on the current GPU (the forward pass, or with `backward` the backward pass; `qat`
    and `lengths` as for fast_plan): built for this dtype and compute capability, with that
    pass's instance, its shared memory within the device's, and at least one group per
    direction resident at once (grid scope: resident() gives its slots); in the order of
    cat.TILES, then of the rows per group. What fast_plan ranks, and what the benchmark's and
    the tools' sweeps time."""
    itemsize = np.dtype(dtype).itemsize
    ctype = cat.CTYPE[itemsize]
    d = dev.device()
    kind = "backward" if backward else "train"
    out = []
    for tile in cat.TILES[itemsize]:
        if not (cat.tile_runs_on(tile, d.cc) and cat.tile_has(ctype, tile, kind, qat, lengths)):
            continue
        for r in range(1, tile[2] + 1):
            p = tile_split(B, H, D, tile, r, itemsize)
            if p is None or max(p.smem_fwd, p.smem_bwd) > d.smem_optin:
                continue
            n = groups_at_once(p, np.dtype(dtype).str, d.id, qat, lengths)
            p = resident(p, D, n)
            if p is not None:
                out.append((p, n))
    return out


@functools.lru_cache(maxsize=256)
def _fast_plan(B, H, D, dtype, device_id, backward=False, qat=False, lengths=False,
               mma=False):
    splits = tile_splits(B, H, D, dtype, backward, qat, lengths)
    itemsize = np.dtype(dtype).itemsize
    mma_ctype = cat.CTYPE[itemsize] if mma else None
    pool = [pn for pn in splits if pn[0].tile not in cat.FOUR_ROW_TILES]
    # forward: block and cluster scope first, grid scope where neither holds the shape;
    # backward: all ranked together
    for ranked in ([pool] if backward else
                   ([pn for pn in pool if pn[0].cluster],
                    [pn for pn in pool if not pn[0].cluster])):
        if ranked:
            best = min(ranked, key=lambda pn: tile_rank(pn[0], D, pn[1], backward))
            return four_row_in_place(best, splits, D, mma_ctype)
    d = dev.device()
    plans = {p for p in (persist_split(B, H, D, n, itemsize, d.smem_optin)
                         for n in range(1, H + 1)) if p is not None}
    for plan in sorted(plans, key=lambda p: (persist_cost(p, B, H, D, itemsize), p.blocks)):
        if plan.blocks * D <= _persist_resident_blocks(plan, dtype, qat) * d.sms:
            return plan
    return None


def auto_takes(plan, B, H, D=1, backward=False, split=1):
    """Whether path="auto" runs `plan` (from fast_plan) rather than the per-step path, for
    the forward pass (or with `backward` the backward pass) of D directions; `split`: the
    slices the per-step backward product would run in (backward_split). A persist plan for
    a backward pass alone (PERSIST_AUTO_*) whose product does not split; a tile plan at
    block or cluster scope, or at grid scope in up to GRID_AUTO_MAX_WAVES waves, but not for
    a backward pass whose product splits on more than GRID_AUTO_SPLIT_MAX_GROUPS groups.
    (Float64 data has its own limit beside this one: f64_tile_auto_takes.)"""
    if plan is None:
        return False
    if isinstance(plan, PersistPlan):
        return (backward and D > 1 and split == 1 and B >= PERSIST_AUTO_MIN_ROWS
                and B * 3 * H * H <= PERSIST_AUTO_MAX_WORK)
    if plan.cluster > 0:
        return True
    if backward and split > 1 and plan.groups > GRID_AUTO_SPLIT_MAX_GROUPS:
        return False
    return -(-plan.groups // plan.slots) <= GRID_AUTO_MAX_WAVES


_CHOSEN: dict = {}


def choose(path, B, H, D, dtype, backward=False, T=0, I=0, qat=False, lengths=False,
           math="strict"):
    """The plan a call runs (a checked `path`): SMALL, STEPS, a persistent plan or a
    ResidentPlan. Without T and I (the sequence length and input size), path="auto"
    leaves the small path out and plans the pass as one of more than one step (where
    f64_tile_auto_takes limits float64 tile plans' waves; at T = 1 it does not). `qat`: for
    a quantization-aware pass (cugru.QuantSpec); `lengths`: for one with variable lengths;
    `math`: the pass's (a checked math: fast_plan's)."""
    if path == "small" or (path == "auto" and T and small_takes(T, B, I, H, D, backward)):
        if not SMALL.fits(B, H, D):
            raise ValueError(f"path='small': D*B*H = {D * B * H} units (B = {B}, H = {H}, "
                             f"{D} direction(s)) exceed the small path's {SMALL_MAX_UNITS}; "
                             "use path='auto'")
        return SMALL
    mma = mma_applies(math, cat.CTYPE.get(dtype.itemsize), qat, lengths)
    one_step = T == 1
    key = (path, B, H, D, dtype.char, dev.device().id, backward, qat, lengths, mma, math,
           one_step, WIDE)
    plan = _CHOSEN.get(key)
    if plan is None:
        plan = _chosen(path, B, H, D, dtype, backward, qat, lengths, math, one_step)
        _CHOSEN[key] = plan
    return plan


def f64_tile_auto_takes(plan, D, dtype, qat=False, lengths=False, one_step=False) -> bool:
    """Whether path="auto" may run the tile plan `plan` (from fast_plan) of D directions for
    data of `dtype`: any plan but a float64 tile plan whose groups run in more waves
    (waves, groups_at_once) than F64_GRID_AUTO_MAX_WAVES at grid scope or
    F64_CLUSTER_AUTO_MAX_WAVES at cluster scope, in a pass of more than one step."""
    if not isinstance(plan, TilePlan) or np.dtype(dtype).itemsize != 8 or one_step \
            or plan.cluster == 1:
        return True
    at_once = groups_at_once(plan, dtype, dev.device().id, qat, lengths)
    most = F64_CLUSTER_AUTO_MAX_WAVES if plan.cluster else F64_GRID_AUTO_MAX_WAVES
    return waves(plan, D, at_once) <= most


def wide_auto_takes(fast, B, H, dtype, math, qat=False, backward=False) -> bool:
    """Whether path="auto" runs a pass per step with its products in float64
    (wide_products) rather than on fast_plan's plan `fast` or the resident kernel: where the
    products widen and `fast` is none, a persist plan or a grid-scope tile plan (a block or
    cluster plan keeps its place; none holds H >= WIDE_MIN_H)."""
    if not wide_products(B, H, np.dtype(dtype).itemsize, math, qat, backward):
        return False
    return fast is None or isinstance(fast, PersistPlan) or fast.cluster == 0


def _chosen(path, B, H, D, dtype, backward, qat, lengths, math, one_step=False):
    if path == "resident":
        plan = resident_plan(B, H, D, dtype, qat, lengths, math)
        if plan is None:
            raise ValueError(
                f"path='resident': B = {B}, H = {H}, {D} direction(s) in {np.dtype(dtype)} "
                f"under math={math!r}{' with quant' * bool(qat)}"
                f"{' with lengths' * bool(lengths)} do not fit the resident kernel on this "
                "GPU (float32 or half data, math='strict', no quant or lengths, and a split "
                "of cugru.plans.RESIDENT_SPLITS within its SMs); use path='auto' or 'steps'")
        return plan
    if path == "steps":
        return STEPS
    fast = fast_plan(B, H, D, dtype, backward, qat, lengths, math)
    if fast is None and path == "fast":
        raise ValueError(f"path='fast': B = {B}, H = {H}, {D} direction(s) in "
                         f"{np.dtype(dtype)} do not fit the fast path on this GPU "
                         "(docs/gru-design.md lists its limits); use path='auto' or 'steps'")
    split = backward_split(H, D, dtype.itemsize, math) if backward else 1
    if split > 1 and not dev.has_batched_pointers():
        split = 1           # (the per-step pass then runs one product a step)
    if path == "fast" or (auto_takes(fast, B, H, D, backward, split)
                          and f64_tile_auto_takes(fast, D, dtype, qat, lengths, one_step)
                          and not wide_auto_takes(fast, B, H, dtype, math, qat, backward)):
        return fast
    if wide_auto_takes(fast, B, H, dtype, math, qat, backward):
        return STEPS
    plan = resident_plan(B, H, D, dtype, qat, lengths, math)
    if plan is not None and resident_auto_takes(plan, B, H, D, backward):
        return plan
    return STEPS


def resident_auto_takes(plan, B, H, D, backward) -> bool:
    """Whether path="auto" runs a pass on the resident plan `plan` (of batch B, hidden size
    H, D directions) where it would otherwise run it per step: a forward pass on the splits
    of RESIDENT_AUTO_SPLITS whose rows B fills (RESIDENT_AUTO_MAX_EMPTY); never a backward
    pass (the per-step path's split product was faster: the note after
    RESIDENT_AUTO_SPLITS)."""
    if backward:
        return False
    return plan.split in RESIDENT_AUTO_SPLITS and \
        resident_empty(plan, B) <= RESIDENT_AUTO_MAX_EMPTY
