"""Where a fast-path step's time goes: the forward tile kernel of a shape's plan (inference),
timed as built and with parts of its step taken out one after another. Block and cluster
scope: the outputs and the loads ahead; IEEE-exact maths, replaced by fast intrinsics; the
cell's maths; the product; at cluster scope then the exchange (no block waits for or sends
values). Grid scope: the wait at the group's counter; the copy of the vector from L2; the
product; the arrival at the counter.

    python tools/gru_tile_diag.py S1 S7 S8 S7:4,4,1,256,1

A shape id may name the tile kernel to time after a colon (a TILES entry: cluster, packs,
most rows, threads, units per thread), one row per group, in place of fast_plan's choice.

A diagnostic, not part of the package: it patches kernels/gru.cu's text in memory (and
stops with an AssertionError when the text it patches has changed) and compiles each
variant with CuPy. The variants compute wrong results; only their times mean anything.
"""
import sys

import numpy as np


def _patch(src, old, new, count=1):
    out = src.replace(old, new, count)
    assert out != src, old
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
    fast = _patch(no_io, "return T(1) / (T(1) + ck_exp(-v));",
                  "return __fdividef(T(1), T(1) + __expf(-v));")
    fast = _patch(fast, "    n = ck_tanh(x_n + r * hn);",
                  "    { float t; asm(\"tanh.approx.f32 %0, %1;\" : \"=f\"(t)"
                  " : \"f\"(float(x_n + r * hn))); n = t; }")
    out["... and fast math"] = fast
    nopw = _patch(fast, """                h_new = gru_cell(x[0] + bias[0], x[J] + bias[J], x[2 * J] + bias[2 * J],
                                 gh[0] + bias[3 * J], gh[1] + bias[4 * J], hn,
                                 tl.row(s & 1, tl.pi, 1)[j], r, z, n);""",
                  """                h_new = (gh[0] + gh[1]) * 0.001f + hn * 0.001f + x[0];
                r = z = n = h_new;""")
    out["... and no cell maths"] = nopw
    noprod = _patch(nopw, """            if (tl.product)
                gru_tile_product<true, Q, MR, U>""", """            if (false)
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
    noprod = _patch(nocopy, """            if (tl.product)
                gru_tile_product<true, Q, MR, U>""", """            if (false)
                gru_tile_product<true, Q, MR, U>""")
    out["... and no product"] = noprod
    out["... and no arrival"] = _patch(
        noprod, "                gru_group_arrive(counter, tl.G, target);\n", "")
    return out


def main(argv):
    import cupy as cp

    from bench.gru import SHAPES, make_problem
    from cugru import gru
    from cukernels import _rt
    src0 = _rt.load_source("gru.cu")
    for arg in argv:
        sid, _, tile = arg.partition(":")
        T, B, I, H, bi = SHAPES[sid]
        D = 2 if bi else 1
        plan = gru.fast_plan(B, H, D, np.float32)
        if tile:
            plan = gru._tile_split(B, H, D, tuple(int(v) for v in tile.split(",")), 1, 4)
            if plan is None or not plan.cluster:
                raise SystemExit(f"{arg}: that tile kernel does not hold {sid} at block or "
                                 "cluster scope")
        name = plan.forward_kernel("float", False)
        p = make_problem(T, B, I, H, bi)
        a = {k: cp.asarray(v) for k, v in p.items() if isinstance(v, np.ndarray)}
        gi = cp.asarray(np.random.default_rng(0).standard_normal((T, B, D, 3 * H)), np.float32)
        hs = cp.zeros((D, 2, B, H), np.float32)
        y = cp.empty((T, B, D * H), np.float32)
        h_n = cp.empty((D, B, H), np.float32)
        i32 = np.int32
        grid = not plan.cluster
        print(sid, plan, file=sys.stderr)
        for label, src in (grid_variants if grid else variants)(src0).items():
            mod = cp.RawModule(code=src, options=_rt.COMPILE_OPTIONS, name_expressions=[name])
            fn = mod.get_function(name)
            fn.max_dynamic_shared_size_bytes = plan.smem_fwd

            def launch():
                # (fresh counters: each launch's blocks count from zero)
                args = (gi, a["w_hh"], a["b_ih"], a["b_hh"], hs, y, y, h_n, i32(T), i32(B),
                        i32(H), i32(2), i32(plan.units), i32(plan.lanes), i32(plan.rows)
                        ) + plan.launch_args(cp, D)
                with _rt.StepLoop(np.float32) as loop:
                    loop.launch(fn, (plan.blocks, D), (plan.threads,), args,
                                shared_mem=plan.smem_fwd, cooperative=grid)
            for _ in range(3):
                launch()
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            times = []
            for _ in range(15):
                e0.record()
                launch()
                e1.record()
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1))
            ms = float(np.median(times))
            print(f"{sid} {label:28s} {ms:.4f} ms  {ms * 1e3 / T:.3f} us/step  "
                  f"regs {fn.num_regs}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
