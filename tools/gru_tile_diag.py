"""Where a fast-path step's time goes: the forward tile kernel of a shape's plan (inference),
timed as built and with parts of its step taken out one after another. Block and cluster
scope: the outputs and the loads ahead; IEEE-exact maths, replaced by fast intrinsics; the
cell's maths; the product; at cluster scope then the exchange (no block waits for or sends
values). Grid scope: the wait at the group's counter; the copy of the vector from L2; the
product; the arrival at the counter.

    python tools/gru_tile_diag.py S1 S7 S8 S7:4,4,1,256,1

A shape id (bench.paths' ids: S1-S10, O1-O16, A1-A6) may name the tile kernel to time
after a colon (a TILES entry: cluster, packs, most rows, threads, units per thread), one
row per group, in place of fast_plan's choice.

A diagnostic, not part of the package: it patches kernels/gru_tile.cu's text in memory (and
stops with an AssertionError when the text it patches has changed) and compiles each
variant with CuPy. The variants compute wrong results; only their times mean anything.
"""
import os
import sys

import numpy as np

# (run as a script: the repository root holds the bench package)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _patch(src, old, new, count=1):
    out = src.replace(old, new, count)
    assert out != src, old
    return out


#: the float cell's sigmoid and tanh as built (gru_common.cuh), to be renamed out of the way
_SIGMOID = "template <> __device__ __forceinline__ float gru_sigmoid<float>(float v) {"
_TANH = "template <> __device__ __forceinline__ float gru_tanh<float>(float v) {"


def cell_variant(src, kind):
    """`src` with the float cell's sigmoid and tanh replaced: "ieee", by expf and a division
    and by tanhf (the generic templates); "fast", by __expf and __fdividef and by
    tanh.approx (134 ulp off)"""
    off = "__device__ __forceinline__ float gru_{}_off(float v) {{"
    out = _patch(_patch(src, _SIGMOID, off.format("sigmoid")), _TANH, off.format("tanh"))
    if kind == "fast":
        out = _patch(out, "return T(1) / (T(1) + ck_exp(-v));",
                     "return __fdividef(T(1), T(1) + __expf(-v));")
        out = _patch(out, "T gru_tanh(T v) { return ck_tanh(v); }",
                     "T gru_tanh(T v) { float t; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(t)"
                     " : \"f\"(float(v))); return t; }")
    else:
        assert kind == "ieee", kind
    return out


def variants(src):
    """block and cluster scope"""
    out = {"as built": src}
    no_io = _patch(src, """            if (tl.mine) {   // the outputs
                (y + (long long)gru_time""", """            if (false) {   // the outputs
                (y + (long long)gru_time""")
    no_io = _patch(no_io, "            if (C > 0) fetch(s + GRU_TILE_AHEAD);",
                   "            if (C > 0) gru_copy_commit();")
    out["no outputs, no loads"] = no_io
    fast = cell_variant(no_io, "fast")
    out["... and fast math"] = fast
    nopw = _patch(fast, """                h_new = gru_cell<QAT>(x[0] + bias[0], x[J] + bias[J], x[2 * J] + bias[2 * J],
                                      gh[0] + bias[3 * J], gh[1] + bias[4 * J], hn,
                                      tl.row(s & 1, tl.pi, 1)[j], r, z, n, q, run);""",
                  """                h_new = (gh[0] + gh[1]) * 0.001f + hn * 0.001f + x[0];
                r = z = n = h_new;""")
    out["... and no cell maths"] = nopw
    noprod = _patch(nopw, """            else if (tl.product)
                gru_tile_product<true, Q, MR, U>""", """            else if (false)
                gru_tile_product<true, Q, MR, U>""")
    out["... and no product"] = noprod
    # (cluster scope only; at block scope the kernel is the same as the one before)
    noxch = _patch(noprod, "                gru_exchange_wait<C>(bars, s & 1, s, xbytes);",
                   "                ;")
    out["... and no exchange (clusters)"] = _patch(
        noxch, "            } else if (C == 1 || s < steps - 1) {", "            } else if (C == 1) {")
    return out


def grid_variants(src):
    """grid scope"""
    out = {"as built": src}
    nowait = _patch(src, "                if (s > 0) gru_group_wait(counter, target);",
                    "                __syncthreads();")
    out["no wait at the counter"] = nowait
    nocopy = _patch(nowait, """                gru_tile_stage<T, MR, NT>(tl.vec, HS, 1,
                                          hs + ((long long)d * S + s % S) * BH
                                             + (long long)tl.b0 * H, H, H, tl.rows);""",
                    """                asm volatile("cp.async.wait_all;" ::: "memory");""")
    out["... and no copy of the vector"] = nocopy
    noprod = _patch(nocopy, """            else if (tl.product)
                gru_tile_product<true, Q, MR, U>""", """            else if (false)
                gru_tile_product<true, Q, MR, U>""")
    out["... and no product"] = noprod
    out["... and no arrival"] = _patch(
        noprod, "                gru_group_arrive(counter, tl.G, target);\n", "")
    return out


def main(argv):
    from bench.paths import ALL
    from cugru import plans
    from cukernels import runtime
    src0 = runtime.source("gru_tile.cu").text()
    for arg in argv:
        sid, _, tile = arg.partition(":")
        (T, B, I, H, bi), _ = ALL[sid]
        D = 2 if bi else 1
        plan = plans.fast_plan(B, H, D, np.float32)
        if tile:
            plan = plans.tile_split(B, H, D, tuple(int(v) for v in tile.split(",")), 1, 4)
            if plan is None or not plan.cluster:
                raise SystemExit(f"{arg}: that tile kernel does not hold {sid} at block or "
                                 "cluster scope")
        if not isinstance(plan, plans.TilePlan):
            raise SystemExit(f"{arg}: {sid} runs no tile kernel on this GPU ({plan})")
        print(sid, plan, file=sys.stderr)
        from cugru import _catalog
        for label, src in (variants if plan.cluster else grid_variants)(src0).items():
            launch, mod = tile_launcher(src, sid, plan, False)
            us = step_us(launch, T)
            regs = mod.get_function(_catalog.tile_forward("float", plan.tile, False)).num_regs
            print(f"{sid} {label:28s} {us * T / 1e3:.4f} ms  {us:.3f} us/step  regs {regs}",
                  flush=True)


#: the clock marks (--clock): per kernel, (text the mark goes right after, label of the
#: segment that ends at the mark); the first thread of the pointwise warps of each block of
#: direction 0 records them
FORWARD_MARKS = [
    ("        for (int s = 0; s < steps; ++s) {\n", "loop top"),
    ("                gru_exchange_wait<C>(bars, s & 1, s, xbytes);\n", "wait for the values"),
    ("                                                 KS, tl.wu * KS + tl.ks, tl.JK);\n",
     "product"),
    ("            gru_copy_wait();\n            __syncthreads();\n", "copy wait, barrier"),
    ("                else tl.row((s + 1) & 1, tl.pi, 1)[j] = h_new;\n",
     "lane sums, cell, value stored"),
    ("                                             tl.row((s + 1) & 1, 0, 1), 0, 1, xoff, xok);\n"
     "            }\n", "values sent, arrival"),
    ("            if (C > 0) fetch(s + GRU_TILE_AHEAD);   // into the slot just read (by this thread)\n",
     "outputs, loads ahead"),
]
BACKWARD_MARKS = [
    ("        for (int s = steps - 1; s >= 0; --s) {\n", "loop top"),
    ("                gru_exchange_wait<C>(bars, (s + 1) & 1, steps - 1 - s,\n"
     "                                     gru_exchange_bytes<T>(tl.rows, 3, J, tl.j0, HP));\n",
     "wait for the values"),
    ("                                                  HS, tl.ks, KS, tl.wu * KS + tl.ks, tl.JK);\n",
     "product"),
    ("            gru_copy_wait();\n            __syncthreads();\n            if (!tl.mine) return T(0);\n",
     "copy wait, barrier"),
    ("                    out[2 * HS] = dn * r;\n", "lane sums, cell, values stored"),
    ("                gh_row[2 * H] = dn * r;\n", "outputs"),
    ("                                             3, xoff, xok);\n            }\n",
     "values sent, arrival"),
    ("            if (C > 0) fetch(s - GRU_TILE_AHEAD);   // into the slot just read (by this thread)\n",
     "loads ahead"),
]
CLOCK_STEPS = 1024
_CLOCK_HEAD = f"""
__device__ long long gru_clock[64 * {CLOCK_STEPS} * 8];
#define GRU_MARK(k) if ((int)threadIdx.x == tl.p0 && blockIdx.y == 0 && blockIdx.x < 64) {{ \\
    long long t_; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t_) :: "memory"); \\
    gru_clock[((long long)blockIdx.x * {CLOCK_STEPS} + (s & {CLOCK_STEPS - 1})) * 8 + (k)] = t_; }}
"""


def clock_source(src, marks):
    """`src` with the marks in; the kernels' results are unchanged"""
    out = _CLOCK_HEAD + src
    for k, (after, _) in enumerate(marks):
        out = _patch(out, after, after + f"GRU_MARK({k});\n")
    return out


def tile_launcher(src, sid, plan, backward, mod=None):
    """(launch, module): one launch of `plan`'s forward (inference) or backward tile kernel,
    compiled from `src` (or taken from `mod`), on inputs of shape `sid` (random: only times
    mean anything), with the arguments the plan gives its kernels"""
    import cupy as cp

    from bench.paths import ALL
    from bench.shapes import make_problem
    from cugru import _args, _catalog, _device, _passes
    from cukernels import runtime
    (T, B, I, H, bi), _ = ALL[sid]
    name = (_catalog.tile_backward("float", plan.tile) if backward
            else _catalog.tile_forward("float", plan.tile, False))
    if mod is None:
        mod = cp.RawModule(code=src, options=runtime.COMPILE_OPTIONS, name_expressions=[name])
    kern = runtime.Kernel(name, mod.get_function(name),
                          runtime.parse_signatures(src)[name.split("<")[0]])
    smem = plan.smem_bwd if backward else plan.smem_fwd
    kern.allow_shared(smem)
    p = {k: cp.asarray(v) if isinstance(v, np.ndarray) else v
         for k, v in make_problem(T, B, I, H, bi).items()}
    a = _args.forward_args(p["x"], p["h0"], p["w_ih"], p["w_hh"], p["b_ih"], p["b_hh"], bi,
                           backward)
    fwd = _passes.ForwardPass(a)
    rng = np.random.default_rng(0)
    fwd.gi[...] = cp.asarray(rng.standard_normal(fwd.gi.shape) * 0.5, np.float32)
    fwd.hs[...] = cp.asarray(rng.standard_normal(fwd.hs.shape) * 0.5, np.float32)
    if backward:
        fwd.gates[...] = cp.asarray(rng.uniform(0.1, 0.9, fwd.gates.shape), np.float32)
        saved = _passes.GruSaved(a.x, a.w_ih, a.w_hh, fwd.hs, fwd.gates, False)
        pas = _passes.BackwardPass(p["dy"], None, saved)

    def launch():
        # (the plan's arguments each launch: at grid scope fresh counters, counted from zero)
        args = plan.backward_args(pas) if backward else plan.forward_args(fwd)
        with _device.Loop(np.float32) as loop:
            loop.launch(kern, (plan.blocks, a.dims[4]), (plan.threads,), args,
                        shared_mem=smem, cooperative=not plan.cluster)
    return launch, mod


def step_us(launch, T, repeat=15):
    """median µs per step of `launch` (after three warm-up launches)"""
    import cupy as cp
    for _ in range(3):
        launch()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(repeat):
        e0.record()
        launch()
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    return float(np.median(times)) * 1e3 / T


def clock_main(argv):
    """--clock: the cycles between the marks of the forward (inference) and the backward
    tile kernels, median over the steps and over the blocks of a group (the first pointwise
    thread of each),
    and the cycles per step with the clock rate they imply."""
    import cupy as cp

    from bench.paths import ALL
    from cugru import plans
    from cukernels import runtime
    src0 = runtime.source("gru_tile.cu").text()
    for arg in argv:
        sid, _, tile = arg.partition(":")
        (T, B, I, H, bi), _ = ALL[sid]
        D = 2 if bi else 1
        for backward in (False, True):
            plan = plans.fast_plan(B, H, D, np.float32, backward=backward)
            if tile:
                plan = plans.tile_split(B, H, D, tuple(int(v) for v in tile.split(",")), 1, 4)
            if not isinstance(plan, plans.TilePlan) or not plan.cluster or T > CLOCK_STEPS:
                raise SystemExit(f"{arg}: --clock takes block and cluster scope, T <= "
                                 f"{CLOCK_STEPS}")
            marks = BACKWARD_MARKS if backward else FORWARD_MARKS
            launch, mod = tile_launcher(clock_source(src0, marks), sid, plan, backward)
            us = step_us(launch, T, repeat=1)
            clk = cp.asnumpy(cp.ndarray((64, CLOCK_STEPS, 8), np.int64,
                                        memptr=mod.get_global("gru_clock")))
            nb = min(plan.cluster, 64)
            order = list(range(T)) if not backward else list(range(T - 1, -1, -1))
            c = clk[:nb][:, order[8:-8]]            # (the first and last steps left out)
            nm = len(marks)
            seg = np.diff(c[:, :, :nm], axis=2)      # mark k-1 .. k
            step = c[:, 1:, 0] - c[:, :-1, 0]
            kind = "backward" if backward else "forward"
            print(f"{sid} {kind} {plan.tile}: {us:.3f} us/step (events), "
                  f"{np.median(step):.0f} cycles/step -> {np.median(step) / us / 1e3:.2f} GHz")
            for k in range(1, nm):
                v = seg[:, :, k - 1]
                print(f"    {marks[k][1]:32s} median {np.median(v):6.0f}  "
                      f"p90 {np.percentile(v, 90):6.0f}  by block "
                      + " ".join(f"{np.median(v[b]):.0f}" for b in range(nb)))
            rest = step - (c[:, :-1, nm - 1] - c[:, :-1, 0])
            print(f"    {'last mark to next loop top':32s} median {np.median(rest):6.0f}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--clock"]:
        clock_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
