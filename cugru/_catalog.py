"""The GRU's kernel catalogue: its kernel families, every instance it launches and their
names, the tile kernels' table, and the constants it shares with CUDA. Importing it
registers the families with cukernels' runtime, one source file each:

    gru_steps.cu    the per-step pointwise kernels              (StepsPlan)
    gru_persist.cu  W_hh in shared memory, a cooperative grid    (PersistPlan)
    gru_tile.cu     W_hh in registers: block, cluster, grid      (TilePlan)
    gru_tail.cu     the backward tail's sums: chunks, biases      (every backward pass)
    gru_quant.cu    the fake quantizers of weights, x and h0     (quantization-aware calls)
    gru_small.cu    a whole pass in one launch of one block      (SmallPlan)
    gru_resident.cu W_hh over all SMs, a pass a launch, large H   (ResidentPlan)
    gru_cast.cu     float16 and bfloat16 data to float32 and back (cugru/_half.py)
    gru_probes.cu   barriers alone, for the benchmark

Each family compiles as one module per element type, the first time one of its kernels
runs: a per-step call compiles the per-step family alone. Every constant here that a kernel
also uses is rendered into its source as a #define named GRU_<name> (``DEFINES``): one
definition, in Python.
"""
from __future__ import annotations

import functools
import pathlib

from cukernels import runtime

KERNEL_DIR = pathlib.Path(__file__).with_name("kernels")
CTYPES = ("float", "double")
ITEMSIZE = {"float": 4, "double": 8}
CTYPE = {4: "float", 8: "double"}
_BOOL = ("false", "true")

#: threads per block of the per-step pointwise kernels
STEP_THREADS = 256
#: threads of the small path's one block
SMALL_THREADS = 256
#: threads per block of the quantizers (gru_quant.cu): a block per weight row
QUANT_THREADS = 128
#: threads per block of the persist kernels (GRU_PERSIST_THREADS)
PERSIST_THREADS = 256
#: batch rows per thread that the persist kernels are built for, per element size (double
#: with 8 rows spills registers)
PERSIST_ROWS = {4: (1, 2, 4, 8), 8: (1, 2, 4)}
#: cluster sizes (blocks per cluster; 1: one block) of the tile kernels at block and cluster
#: scope; 8 is the largest every cluster-capable GPU runs
CLUSTERS = (1, 2, 4, 8)
#: float32 tile kernels of 4 rows at cluster 2: 64 units a block take at most 4 rows (a
#: pointwise thread per unit and row of 256), so the 8-row kernels of 64 units computed 8
#: rows a step for 4; these compute 4, half the product where the product sets a step's
#: time (B = 512, H = 128: O7 and O13 of bench.offtable, docs/performance.md). They have no
#: MMA instances (an mma computes 8 rows): a pass that runs the MMA kernels keeps the
#: 8-row sibling where they fit its split (cugru._plan.four_row_in_place).
FOUR_ROW_TILES = ((2, 8, 4, 256, 1), (2, 4, 4, 256, 2))
#: each 4-row tile by its 8-row sibling (the same cluster, packs, threads and units per
#: thread), whose place it takes (cugru._plan.four_row_in_place)
FOUR_ROW_OF = {(c, q, 8, t, u): (c, q, r, t, u) for c, q, r, t, u in FOUR_ROW_TILES}
#: the tile kernels built (W_hh in registers), per element size: (cluster size, 16-byte packs
#: of each gate's weights per thread, most batch rows per group, threads per block, units per
#: thread). Cluster size 1 is one block, 0 grid scope (a group of blocks that meet at a
#: counter in global memory, as many as H needs). A thread holds 3 x packs x units packs of
#: weights: 96 registers in float, so 512 threads hold H = 128 in one block; double with 8
#: rows, or 4 units per thread with 8 rows, run out of registers, and so would 512 threads
#: with 8 rows. A kernel computes its most rows every step, however many its group holds;
#: the float clusters of 2 also come in 4 rows (FOUR_ROW_TILES).
TILES = {
    4: tuple((c, q, r, 256, u) for c in CLUSTERS
             for (q, u), rows in (((4, 1), (1, 8)), ((8, 1), (1, 8)), ((4, 2), (1, 8)),
                                  ((2, 4), (1,)))
             for r in rows)
    + ((1, 8, 1, 512, 1), (1, 4, 1, 512, 2)) + FOUR_ROW_TILES + ((0, 4, 8, 256, 2),),
    8: tuple((c, 8, r, 256, 1) for c in CLUSTERS for r in (1, 4)) + ((0, 8, 4, 256, 1),),
}
#: tiles built without a quantization-aware backward kernel (cugru.QuantSpec): one block
#: of 512 threads with 2 units per thread holds 96 registers of weights of its 128, and the
#: straight-through estimator's state mask does not fit beside them (it spilled); the
#: planner gives a quantization-aware backward pass another split
QAT_BACKWARD_LEFT_OUT = {4: ((1, 4, 1, 512, 2),), 8: ()}
#: tiles built without instances for variable lengths (the LEN instances, taken by calls
#: with lengths): one block of 512 threads holds 96 registers of weights of its 128, and
#: the length check (one more value held per step) spilled there; the planner gives such a
#: call another split
LENGTHS_LEFT_OUT = {4: ((1, 8, 1, 512, 1), (1, 4, 1, 512, 2)), 8: ()}
#: the tile kernels that also have MMA instances, the product on tensor cores (float32 data
#: under math="tf32"; gru_tile.cu, GruTileMma<float, ..., true>): float32 tiles of 8 rows
#: a group (mma.m16n8k8 computes 8 rows at once) whose lanes hold whole blocks of 16 k (packs
#: a multiple of 4); plain instances only (no quantization-aware, no variable lengths ones)
MMA_TILES = tuple(t for t in TILES[4] if t[2] == 8 and t[1] % 4 == 0)
#: the MMA kernels' lane sums: each batch row's stride rounded up to MMA_ROW_ALIGN elements,
#: plus MMA_ROW_PAD (4 mod 16: the rows 2t of a warp's lanes start 8 banks apart, so a
#: store of one mma result register meets 32 banks; GRU_MMA_ROW_ALIGN, GRU_MMA_ROW_PAD)
MMA_ROW_ALIGN = 16
MMA_ROW_PAD = 4
#: the most lanes per unit of the tile kernels at block and cluster scope (GRU_TILE_MAX_LANES)
#: and at grid scope (GRU_GRID_MAX_LANES)
TILE_MAX_LANES = 8
GRID_MAX_LANES = 64
#: steps ahead that the tile kernels copy their inputs (GRU_TILE_AHEAD)
TILE_AHEAD = 8
#: the most threads a tile kernel's block has (GRU_TILE_MAX_THREADS)
TILE_MAX_THREADS = max(t[3] for tiles in TILES.values() for t in tiles)

#: the resident kernels (gru_resident.cu): threads per block, the k of a chunk of h (forward)
#: or of d_gate_h (backward) staged in shared memory, the padding of a chunk's rows there (a
#: multiple of 4 floats: 16-byte loads), batch rows per thread (GRU_RESIDENT_THREADS, _CHUNK,
#: _ROW_PAD, _THREAD_ROWS)
RESIDENT_THREADS = 256
RESIDENT_CHUNK = 32
RESIDENT_ROW_PAD = 4
RESIDENT_THREAD_ROWS = 4
#: the resident kernels built: (batch rows, units, groups of threads splitting k) a block;
#: the forward kernel fills RESIDENT_THREADS threads of RESIDENT_THREAD_ROWS rows x 2 units
#: per group; the backward kernel, of the same blocks, its own groups of threads of 4 rows x
#: 4 units (resident_backward_split)
RESIDENT_SPLITS = ((64, 32, 1), (64, 16, 2), (32, 16, 4))
#: each split's chunk of j (the k of the product dgh_s W_hh) in the resident backward kernel:
#: one wait on L2 and one __syncthreads a chunk. Measured on an H200 (docs/gpu-report.md,
#: chunks of 32, 64 and 96): 64 was fastest on 32 x 16 blocks, 32 on the blocks of 64 rows
#: (whose wider chunks hold more loads in registers). A backward block never takes more
#: shared memory than the forward one (resident_smem), so it fits wherever the plan does.
RESIDENT_BACKWARD_CHUNK = {(64, 32, 1): 32, (64, 16, 2): 32, (32, 16, 4): 64}

#: the bias sums of few rows (gru_bias_sums): a block takes BIAS_COLS columns of the gate
#: gradients, and BIAS_LANES threads share each column's rows (GRU_BIAS_COLS, GRU_BIAS_LANES)
BIAS_COLS = 32
BIAS_LANES = 8

#: the defines of each family: constant name -> value, rendered as GRU_<name>
DEFINES = {
    "gru_steps.cu": (),
    "gru_persist.cu": ("PERSIST_THREADS",),
    "gru_tile.cu": ("TILE_AHEAD", "TILE_MAX_LANES", "GRID_MAX_LANES", "MMA_ROW_ALIGN",
                    "MMA_ROW_PAD"),
    "gru_tail.cu": ("BIAS_COLS", "BIAS_LANES"),
    "gru_quant.cu": ("QUANT_THREADS",),
    "gru_small.cu": (),
    "gru_resident.cu": ("RESIDENT_THREADS", "RESIDENT_CHUNK", "RESIDENT_ROW_PAD",
                        "RESIDENT_THREAD_ROWS"),
    "gru_cast.cu": ("CAST_ARRAYS",),
    "gru_probes.cu": ("PERSIST_THREADS", "TILE_MAX_THREADS"),
}


def _defines(source):
    return lambda: {f"GRU_{k}": globals()[k] for k in DEFINES[source]}


# --------------------------------------------------------------------------- instance names
# (qat: the quantization-aware instance, cugru.QuantSpec; its own module, compiled on the
# first quantization-aware call)
# (wide: the instance whose products run in float64, float data alone; cugru._plan's
# wide_products)
@functools.lru_cache(maxsize=None)
def step_forward(ctype, train, qat=False, wide=False, narrow_gi=False):
    # (the last two: the products' and the projection's element types; narrow_gi: the wide
    # instance that reads the projection in `ctype`, _plan's wide_projection)
    return (f"gru_forward_step<{ctype},{_BOOL[bool(train)]},{_BOOL[bool(qat)]},"
            f"{'double' if wide else ctype},{'double' if wide and not narrow_gi else ctype}>")


@functools.lru_cache(maxsize=None)
def step_backward(ctype, qat=False, wide=False):
    return f"gru_backward_step<{ctype},{_BOOL[bool(qat)]},{'double' if wide else ctype}>"


def step_convert(from_ctype, to_ctype):
    """The per-step path's conversion of an array of `from_ctype` to `to_ctype` (the wide
    products' float <-> double)."""
    return f"gru_steps_convert<{from_ctype},{to_ctype}>"


#: the module (group) of the wide products' instances
WIDE_GROUP = "float-wide"


@functools.lru_cache(maxsize=None)
def small_forward(ctype, train, qat=False):
    return f"gru_small_forward<{ctype},{_BOOL[bool(train)]},{_BOOL[bool(qat)]}>"


@functools.lru_cache(maxsize=None)
def small_backward(ctype, qat=False):
    return f"gru_small_backward<{ctype},{_BOOL[bool(qat)]}>"


@functools.lru_cache(maxsize=None)
def persist_forward(ctype, rows, train, qat=False):
    return f"gru_persist_forward<{ctype},{rows},{_BOOL[bool(train)]},{_BOOL[bool(qat)]}>"


@functools.lru_cache(maxsize=None)
def persist_backward(ctype, rows, qat=False):
    return f"gru_persist_backward<{ctype},{rows},{_BOOL[bool(qat)]}>"


@functools.lru_cache(maxsize=None)
def tile_forward(ctype, tile, train, qat=False, lengths=False, mma=False):
    """The forward tile kernel of `tile` (a TILES entry); grid scope (cluster 0) has its own.
    `lengths`: its instance for variable lengths (LEN); `mma`: its MMA instance (MMA_TILES)."""
    cluster, rest = tile[0], ",".join(map(str, tile[1:]))
    if mma:
        scope = f"mma_forward<{ctype}," if cluster else f"grid_mma_forward<{ctype},"
        return f"gru_tile_{scope}{f'{cluster},' * bool(cluster)}{rest},{_BOOL[bool(train)]}>"
    flags = f"{_BOOL[bool(train)]},{_BOOL[bool(qat)]},{_BOOL[bool(lengths)]}"
    if cluster == 0:
        return f"gru_tile_grid_forward<{ctype},{rest},{flags}>"
    return f"gru_tile_forward<{ctype},{cluster},{rest},{flags}>"


@functools.lru_cache(maxsize=None)
def tile_backward(ctype, tile, qat=False, lengths=False, mma=False):
    cluster, rest = tile[0], ",".join(map(str, tile[1:]))
    if mma:
        scope = f"mma_backward<{ctype}," if cluster else f"grid_mma_backward<{ctype},"
        return f"gru_tile_{scope}{f'{cluster},' * bool(cluster)}{rest}>"
    flags = f"{_BOOL[bool(qat)]},{_BOOL[bool(lengths)]}"
    if cluster == 0:
        return f"gru_tile_grid_backward<{ctype},{rest},{flags}>"
    return f"gru_tile_backward<{ctype},{cluster},{rest},{flags}>"


def mma_warps(units, lanes, per_thread):
    """The warps of a block that the MMA product of `units` units with `lanes` slices of k
    takes, each warp 2 x per_thread jobs of 16 units of one slice (gru_tile.cu's split:
    chunks of 16 units, a warp's chunks the least power of two that covers them, at most its
    jobs, and its jobs' slices the rest). The MMA kernels run only where it is at most the
    block's warps."""
    chunks, jobs = -(-units // 16), 2 * per_thread
    cw = 1
    while cw < jobs and cw < chunks:
        cw *= 2
    return -(-chunks // cw) * -(-lanes // (jobs // cw))


def mma_part_row(lane_sums):
    """The row stride, in elements, of the MMA kernels' lane sums (gru_tile.cu's
    gru_mma_part_row) for a block of `lane_sums` = units x lanes: the three gates' sums
    rounded up to MMA_ROW_ALIGN, plus MMA_ROW_PAD, so that the 8 rows a warp's mma results
    go to start 8 banks apart."""
    return -(-3 * lane_sums // MMA_ROW_ALIGN) * MMA_ROW_ALIGN + MMA_ROW_PAD


def qat_group(ctype):
    """The module (group) of a family's quantization-aware instances of `ctype`."""
    return f"{ctype}-qat"


def tile_group(ctype, qat=False, lengths=False, mma=False):
    """The module (group) of the tile instances of `ctype`: plain, quantization-aware, and
    each of those for variable lengths, four modules, and the MMA instances (float), each
    compiled on its first call."""
    if mma:
        return ctype + "-tf32"
    return ctype + "-qat" * bool(qat) + "-len" * bool(lengths)


def tile_has(ctype, tile, kind, qat=False, lengths=False, mma=False):
    """Whether the tile kernels of `tile` include the instance of `kind` ("train", "infer"
    or "backward") for `qat` and `lengths` (see QAT_BACKWARD_LEFT_OUT, LENGTHS_LEFT_OUT), or
    with `mma` its MMA instance (MMA_TILES: plain float32 instances)."""
    if mma:
        return ctype == "float" and tile in MMA_TILES and not qat and not lengths
    it = ITEMSIZE[ctype]
    if lengths and tile in LENGTHS_LEFT_OUT[it]:
        return False
    return not (qat and kind == "backward" and tile in QAT_BACKWARD_LEFT_OUT[it])


@functools.lru_cache(maxsize=None)
def resident_forward(split, train):
    """The resident forward kernel of `split` (a RESIDENT_SPLITS entry): float32 only."""
    rows, units, k_split = split
    return f"gru_resident_forward<{rows},{units},{k_split},{_BOOL[bool(train)]}>"


@functools.lru_cache(maxsize=None)
def resident_backward(split):
    """The resident backward kernel of `split`'s blocks (rows x units), summing its product
    in chunks of RESIDENT_BACKWARD_CHUNK[split] of j: float32 only. Its threads take 4 rows x
    4 units each, so it splits the product its own number of ways (resident_backward_split)."""
    rows, units, _ = split
    return f"gru_resident_backward<{rows},{units},{RESIDENT_BACKWARD_CHUNK[split]}>"


def resident_backward_split(split):
    """The groups of threads the resident backward kernel of `split` splits its product's
    sum over 3H into: a group of (rows / RESIDENT_THREAD_ROWS) x (units / 4) threads fills
    the tile."""
    rows, units, _ = split
    return RESIDENT_THREADS // (rows // RESIDENT_THREAD_ROWS * (units // 4))


def resident_smem(split, H, backward=False):
    """Bytes of shared memory a block of the resident kernel of `split` takes at hidden size
    H. Forward: its W_hh columns (k rounded up to a chunk), two chunks of h and groups 1..'s
    sums. Backward: its W_hh columns (3H rows rounded up to its chunk), then two chunks of
    d_gate_h or, in the same place, every group's sums, whichever is larger."""
    rows, units, k_split = split
    if backward:
        chunk = RESIDENT_BACKWARD_CHUNK[split]
        jk = -(-3 * H // chunk) * chunk
        chunks = 2 * chunk * (rows + RESIDENT_ROW_PAD)
        return (jk * units + max(chunks, resident_backward_split(split) * rows * units)) * 4
    hk = -(-H // RESIDENT_CHUNK) * RESIDENT_CHUNK
    group = RESIDENT_THREADS // k_split
    chunks = 2 * RESIDENT_CHUNK * (rows + RESIDENT_ROW_PAD)
    floats = hk * 3 * units + chunks + (k_split - 1) * RESIDENT_THREAD_ROWS * 6 * group
    return floats * 4


@functools.lru_cache(maxsize=None)
def sum_chunks(ctype):
    return f"gru_sum_chunks<{ctype}>"


@functools.lru_cache(maxsize=None)
def add_chunks(ctype):
    return f"gru_add_chunks<{ctype}>"


def bias_sums(ctype):
    return f"gru_bias_sums<{ctype}>"


@functools.lru_cache(maxsize=None)
def quant_operands(ctype):
    return f"gru_quant_operands<{ctype}>"


@functools.lru_cache(maxsize=None)
def quant_masks(ctype):
    return f"gru_quant_masks<{ctype}>"


#: the half-precision formats of gru_cast.cu (its template argument FMT)
HALF_FORMATS = ("float16", "bfloat16")
#: the arrays one launch of gru_cast.cu's kernels converts (GRU_CAST_ARRAYS; their
#: parameters in0..in5, out0..out5, n0..n5 are spelled out for it)
CAST_ARRAYS = 6


@functools.lru_cache(maxsize=None)
def widen(fmt):
    """The kernel that widens data of format `fmt` (a HALF_FORMATS name) to float32."""
    return f"gru_widen<{HALF_FORMATS.index(fmt)}>"


@functools.lru_cache(maxsize=None)
def narrow(fmt):
    """The kernel that rounds float32 to format `fmt` (a HALF_FORMATS name)."""
    return f"gru_narrow<{HALF_FORMATS.index(fmt)}>"


def cluster_barrier_probe(cluster):
    return f"gru_cluster_barrier_probe<{cluster}>"


COUNTER_BARRIER_PROBE = "gru_counter_barrier_probe"
#: the cell's float sigmoid and tanh against double (tools/cell_probe.py, a GPU test)
CELL_ERROR_PROBE = "gru_cell_error_probe"


def tile_runs_on(tile, cc: int) -> bool:
    """Whether cugru launches the tile kernels of `tile` on a GPU of compute capability `cc`
    (90 for sm_90): clusters, 512 threads (whose registers the sm_90 compiler fits without
    spilling) and grid scope (sm_80's compiler spills its backward) from sm_90 on; one block
    of 256 threads everywhere."""
    cluster, packs, rows, threads, units = tile
    return cc >= 90 or (cluster == 1 and threads <= 256)


# ---------------------------------------------------------------------------- the families
@functools.lru_cache(maxsize=None)
def _tile_instances():
    """{group: names} of the tile family (tile_group), and {name: tile} (for launched_on)."""
    groups, tiles = {}, {}
    for c in CTYPES:
        for qat in (False, True):
            for lengths in (False, True):
                names = []
                for tile in TILES[ITEMSIZE[c]]:
                    for kind in ("infer", "train", "backward"):
                        if not tile_has(c, tile, kind, qat, lengths):
                            continue
                        name = tile_backward(c, tile, qat, lengths) if kind == "backward" \
                            else tile_forward(c, tile, kind == "train", qat, lengths)
                        names.append(name)
                        tiles[name] = tile
                groups[tile_group(c, qat, lengths)] = tuple(names)
        if ITEMSIZE[c] == 4:
            names = []
            for tile in MMA_TILES:
                for name in (tile_forward(c, tile, False, mma=True),
                             tile_forward(c, tile, True, mma=True),
                             tile_backward(c, tile, mma=True)):
                    names.append(name)
                    tiles[name] = tile
            groups[tile_group(c, mma=True)] = tuple(names)
    return groups, tiles


def _tile_launched_on(name, cc):
    return tile_runs_on(_tile_instances()[1][name], cc)


def _with_qat(names):
    """{group: names} of a family from `names(ctype, qat)`: one module per element type, and
    one for its quantization-aware instances."""
    return {g: tuple(names(c, qat)) for c in CTYPES
            for qat, g in ((False, c), (True, qat_group(c)))}


INSTANCES = {
    "gru_steps.cu": lambda: {**_with_qat(lambda c, q: (
        step_forward(c, False, q), step_forward(c, True, q), step_backward(c, q))),
        WIDE_GROUP: (step_forward("float", False, wide=True),
                     step_forward("float", True, wide=True),
                     step_forward("float", False, wide=True, narrow_gi=True),
                     step_forward("float", True, wide=True, narrow_gi=True),
                     step_backward("float", wide=True),
                     step_convert("float", "double"), step_convert("double", "float"))},
    "gru_persist.cu": lambda: _with_qat(lambda c, q: (
        n for r in PERSIST_ROWS[ITEMSIZE[c]]
        for n in (persist_forward(c, r, False, q), persist_forward(c, r, True, q),
                  persist_backward(c, r, q)))),
    "gru_tile.cu": lambda: _tile_instances()[0],
    "gru_tail.cu": lambda: {c: (sum_chunks(c), add_chunks(c), bias_sums(c)) for c in CTYPES},
    "gru_quant.cu": lambda: {c: (quant_operands(c), quant_masks(c)) for c in CTYPES},
    "gru_small.cu": lambda: _with_qat(lambda c, q: (
        small_forward(c, False, q), small_forward(c, True, q), small_backward(c, q))),
    "gru_resident.cu": lambda: {"float": tuple(n for s in RESIDENT_SPLITS for n in (
        resident_forward(s, False), resident_forward(s, True), resident_backward(s)))},
    "gru_cast.cu": lambda: {"cast": tuple(n for f in HALF_FORMATS
                                          for n in (widen(f), narrow(f)))},
    "gru_probes.cu": lambda: {"probes": tuple(cluster_barrier_probe(n) for n in CLUSTERS)
                              + (COUNTER_BARRIER_PROBE, CELL_ERROR_PROBE)},
}

SOURCES = {
    name: runtime.register(runtime.Source(
        name, KERNEL_DIR, instances, defines=_defines(name),
        **({"launched_on": _tile_launched_on} if name == "gru_tile.cu" else {})))
    for name, instances in INSTANCES.items()
}
