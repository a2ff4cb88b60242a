"""The project's GPU script: run on a machine with a CUDA GPU, it runs

  1. the whole test suite (GPU tests included, the >2**31-element test too), noting the
     seconds each kernel module took to compile on first use,
  2. the GPU tests again under compute-sanitizer memcheck, racecheck, initcheck and
     synccheck (a smaller grid of sizes, CuPy's memory pool off so that every array is its
     own allocation), and a planted out-of-bounds write as the control,
  3. the benchmarks (bench/run.py, with the cost of a call), the GRU benchmark against
     cuDNN (bench/gru.py), the main job (cugru.train, GPU and CPU),
  4. with --base-tree, an older checkout's cost of a call and its first-use compile of the
     GRU's kernels, measured the same way in the same run (the "before" column),

and writes OUTDIR/gpu-report.md (copy it to docs/gpu-report.md) with the commit, the GPU,
the test counts, the sanitizer's findings and the benchmark tables. Logs go to OUTDIR too.

    python tools/gpu_report.py OUTDIR [--commit SHA] [--only tests,sanitizer,bench,gru,main,scaling,before]
                               [--base-tree DIR --base-commit SHA]
    python tools/gpu_report.py OUTDIR --assemble DIR [DIR ...]

Each phase writes OUTDIR/section-<phase>.md; gpu-report.md is assembled from the sections in
OUTDIR, so phases may run in separate calls (each under a time limit) and be merged with
--assemble, which copies the newest sections found in the DIRs given.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SANITIZER_TOOLS = {
    # tool: (pytest -k selection, extra sanitizer flags)
    "memcheck": ("", []),
    # racecheck is slow on cuBLAS' kernels: the GRU runs one shape per dtype under it
    "racecheck": ("softmax or dense or article or repeatable or (gru and uni and h0) "
                  "or repeated_calls or (each_tile_kernel and f32 and top and (r8 or t512)) "
                  "or (qat_kernels and uni and h0 and f32 and w8_x_h_g) "
                  "or (own_no_units and f32 and c8) or (not_on_16 and f32) "
                  "or (resident_kernel and (beyond or top))",
                  ["--racecheck-report", "all"]),
    "initcheck": ("", []),
    # the persistent GRU kernels' barriers and cluster exchanges. On the cluster tile
    # kernels with several units per thread the tool's count of the barriers it tracks
    # overflows (automatic, or set to 2..64), and it then stops the kernel; set to 16384 it
    # runs out of memory and tracks nothing. Those kernels are left to the other tools.
    "synccheck": ("(gru and not (each_tile_kernel and (u2 or u4) and not (_c1_ or _c0_))) "
                  "or qat", []),
}


def resolve_commit(given, root=ROOT):
    """The commit the report names: `given` (hex, 7 to 40 digits), or git's HEAD where git
    knows the tree and no tracked file differs from it. A ValueError otherwise: a report
    must name the commit it ran at, and a copied tree's HEAD may be an older one."""
    if given is not None:
        if not re.fullmatch(r"[0-9a-f]{7,40}", given):
            raise ValueError(f"--commit {given!r} is not a commit (7 to 40 hex digits)")
        return given
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                 cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        raise ValueError("git cannot say which commit this tree is: pass --commit SHA") from None
    if changed.strip():
        raise ValueError(f"tracked files differ from git's HEAD ({head[:12]}): pass --commit "
                         "SHA, the commit this tree is at")
    return head


def sh(cmd, log, env=None, timeout=900, cwd=ROOT):
    t0 = time.time()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        # (a session of its own, so that a timeout stops the command's children too: the
        # processes a launcher started would otherwise stay on the GPUs)
        p = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            p.wait()
            f.write(f"\n[timed out after {timeout} s]\n")
            rc = "timeout"
    return rc, time.time() - t0


# a report's first line (not the indented lines under it), and the kernel an access under it
# names; the lines that are no report
_REPORT = re.compile(r"^=+ (\S.*?)\s*:?\s*$")
_KERNEL = re.compile(r"^=+\s+.*?\bat (?:void )?(\w+(?:<[^>]*>)?)\(")
_NOT_A_REPORT = ("ERROR SUMMARY", "RACECHECK SUMMARY", "COMPUTE-SANITIZER", "Saved host backtrace",
                 "Target application returned", "LEAK SUMMARY")


def finding_kinds(text, limit=8):
    """The kinds of compute-sanitizer reports in `text`, most frequent first: (count, kind),
    a kind being a report's first line without addresses and block or thread numbers, and
    the kernel of the first access named under it, with the first report's addresses
    after it. Counts only the reports the tool printed (racecheck prints 100 at most)."""
    counts, header, first = {}, None, {}

    def done(kernel):
        key = header + (f" in {kernel}" if kernel else "")
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, addresses)

    for line in text.splitlines():
        m = _KERNEL.match(line)
        if m and header is not None:
            done(m.group(1))
            header = None
            continue
        m = _REPORT.match(line)
        # (pytest's banners, "==== short test summary info ====", end in "=" too)
        if m and not line.startswith("=========  ") and not line.rstrip().endswith("=") \
                and not m.group(1).startswith(_NOT_A_REPORT):
            if header is not None:
                done(None)
            addresses = re.findall(r"0x[0-9a-fA-F]+", m.group(1))
            header = re.sub(r"0x[0-9a-fA-F]+", "X", m.group(1))
            header = re.sub(r"\((\d+,){2}\d+\)", "(..)", header)
    if header is not None:
        done(None)
    kinds = sorted(counts.items(), key=lambda kn: (-kn[1], kn[0]))[:limit]
    return [(n, k + (f" (first at {', '.join(first[k])})" if first[k] else "")) for k, n in kinds]


def junit_counts(path):
    if not os.path.exists(path):
        return None
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    tot["passed"] = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    failed = [f"{c.get('classname')}::{c.get('name')}" for s in suites for c in s.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return tot, failed


def gpu_info():
    try:
        import cupy as cp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
        drv = cp.cuda.runtime.driverGetVersion()
        return (f"{props['name'].decode()} ({props['multiProcessorCount']} SMs, "
                f"{props['totalGlobalMem'] / 2**30:.0f} GiB), driver CUDA {drv // 1000}.{drv % 1000 // 10}, "
                f"CuPy {cp.__version__}")
    except Exception as e:  # noqa: BLE001
        return f"unknown ({e})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--commit", default=None,
                    help="the commit the tree is at (hex, 7 to 40 digits; the full one is "
                         "best); default: git's HEAD, where git has this tree unchanged")
    ap.add_argument("--only", default=",".join(PHASES))
    ap.add_argument("--assemble", nargs="*", default=None)
    ap.add_argument("--base-tree", default=None,
                    help="an older checkout, measured in the 'before' phase")
    ap.add_argument("--base-commit", default="the base tree",
                    help="what to call the base tree in the report")
    args = ap.parse_args(argv)
    out = os.path.abspath(args.outdir)
    os.makedirs(out, exist_ok=True)
    if args.assemble is not None:
        for d in args.assemble:
            for name in ["section-header.md"] + [f"section-{p}.md" for p in PHASES]:
                src, dst = os.path.join(d, name), os.path.join(out, name)
                same = os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst)
                if os.path.exists(src) and not same:   # (a DIR may be OUTDIR itself)
                    with open(src) as f, open(dst, "w") as g:
                        g.write(f.read())
        return assemble(out)
    skip = set(PHASES) - set(filter(None, args.only.split(",")))
    try:
        commit = resolve_commit(args.commit)
    except ValueError as e:
        ap.error(str(e))
    header = [f"- commit: {commit}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- GPU: {gpu_info()}",
             f"- made by: `python tools/gpu_report.py OUTDIR --commit {commit[:12]}`", ""]
    write(out, "header", header)
    py = sys.executable

    if "tests" not in skip:
        xml = os.path.join(out, "junit.xml")
        compile_log = os.path.join(out, "compile-seconds.json")
        rc, secs = sh([py, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider",
                       "-m", "not compile", f"--junitxml={xml}"],
                      os.path.join(out, "tests-log.txt"), env={"CK_COMPILE_LOG": compile_log},
                      timeout=540)
        lines = ["## Tests (the whole suite, GPU tests included; the nvcc compile check, which "
                 "needs no GPU, runs in CI)", ""]
        counts = junit_counts(xml)
        if counts:
            c, failed = counts
            lines.append(f"{c['passed']} passed, {c['failures'] + c['errors']} failed, "
                         f"{c['skipped']} skipped in {secs:.0f} s (pytest exit {rc}).")
            lines += [f"- FAILED {f}" for f in failed[:50]]
        else:
            lines.append(f"no junit report (pytest exit {rc}); see tests-log.txt")
        if os.path.exists(xml):
            os.remove(xml)
        if os.path.exists(compile_log):
            with open(compile_log) as f:
                seconds = json.load(f)
            lines += ["", "Seconds each kernel module took to load the first time in the test "
                      "run (a module per source and element type; on a machine whose CuPy "
                      "cache is empty this is the NVRTC compile, else a read of the cache):",
                      "", "| module | seconds |", "|---|---|"]
            lines += [f"| {k} | {v:.1f} |" for k, v in sorted(seconds.items())]
        write(out, "tests", lines)

    if "sanitizer" not in skip:
        lines = ["## compute-sanitizer", "",
                  "GPU tests of tests/test_gpu.py, tests/test_multi.py, tests/test_gru_gpu.py, "
                  "tests/test_gru_precision_gpu.py and tests/test_qat_gpu.py (`CK_QUICK=1`: sizes 5 and 1001, fewer and shorter "
                  "GRU shapes, two quantization specs; CuPy's pool off; not the cuDNN "
                  "comparison) under each tool.", "",
                  "| tool | tests | sanitizer summary | exit |", "|---|---|---|---|"]
        log = os.path.join(out, "sanitizer-log.txt")
        found = []
        # CK_SANITIZER_TOOLS=memcheck,initcheck: those tools alone (a run split over calls
        # with a time limit each; their sections' tables are then merged). Each tool may
        # take 560 s: memcheck took 398 s at ee66e85, so it needs a call of its own soon.
        chosen = os.environ.get("CK_SANITIZER_TOOLS")
        for tool, (sel, flags) in SANITIZER_TOOLS.items():
            if chosen and tool not in chosen.split(","):
                continue
            xml = os.path.join(out, f"san-{tool}.xml")
            cmd = ["compute-sanitizer", "--tool", tool, "--error-exitcode", "99", *flags,
                   py, "-m", "pytest", "tests/test_gpu.py", "tests/test_multi.py",
                   "tests/test_gru_gpu.py", "tests/test_gru_precision_gpu.py",
                   "tests/test_qat_gpu.py", "-q",
                   "-p", "no:cacheprovider", "-m", "gpu and not slow", f"--junitxml={xml}",
                   # cuDNN's own kernels are not ours to check
                   "-k", f"({sel}) and not cudnn" if sel else "not cudnn"]
            start = os.path.getsize(log) if os.path.exists(log) else 0
            rc, secs = sh(cmd, log, env={"CK_QUICK": "1", "CK_NO_POOL": "1"}, timeout=560)
            with open(log) as f:
                f.seek(start)
                text = f.read()
            summ = re.findall(r"(ERROR SUMMARY: \d+ errors?|RACECHECK SUMMARY: \d+ hazards? displayed.*)",
                              text)
            counts = junit_counts(xml)
            tests = (f"{counts[0]['passed']} passed, {counts[0]['failures'] + counts[0]['errors']} failed"
                     if counts else "no report")
            lines.append(f"| {tool} | {tests} ({secs:.0f} s) | {'; '.join(summ[-2:]) or 'none printed'} | {rc} |")
            found += [f"- {tool}: {n} x {kind}" for n, kind in finding_kinds(text)]
            if os.path.exists(xml):
                os.remove(xml)
        # the sanitizer must see a planted out-of-bounds write, or its zeros prove nothing
        start = os.path.getsize(log)
        rc, _ = sh(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99", py,
                    "tools/planted_oob.py"], log, timeout=120)
        with open(log) as f:
            f.seek(start)
            seen = re.findall(r"ERROR SUMMARY: (\d+) error", f.read())
        caught = rc == 99 and seen and int(seen[-1]) > 0
        if found:
            lines += ["", "What the tools printed, by kind (the most frequent first; racecheck prints "
                      "at most 100 reports per run):", ""] + found
        lines += ["", f"Control: a planted out-of-bounds write (tools/planted_oob.py) under memcheck "
                  f"{'was reported' if caught else 'was NOT reported: the runs above prove nothing'} "
                  f"({seen[-1] if seen else 'no'} errors, exit {rc})."]
        write(out, "sanitizer", lines)

    if "before" not in skip and args.base_tree:
        write(out, "before", before(py, os.path.abspath(args.base_tree), args.base_commit,
                                    out))

    if "bench" not in skip:
        rc, secs = sh([py, "-m", "bench.run", "--out", out], os.path.join(out, "bench-log.txt"),
                      timeout=900)
        lines = ["## Benchmarks (float32)", ""]
        md = os.path.join(out, "bench.md")
        lines.append(open(md).read() if os.path.exists(md) else f"benchmarks failed (exit {rc}); see bench-log.txt")
        if os.path.exists(md):
            os.remove(md)
        # the updates over lists of tensors against torch's fused Adam and per-tensor calls
        lines += json_bench(py, out, "multi", "bench-log.txt", 300,
                            "Updates over lists of tensors")
        write(out, "bench", lines)

    if "gru" not in skip:
        rc, secs = sh([py, "-m", "bench.gru", "--out", out], os.path.join(out, "gru-log.txt"),
                      timeout=900)
        lines = ["## GRU benchmark (bench/gru.py: S1-S10 against cuDNN)", ""]
        md = os.path.join(out, "gru-bench.md")
        lines.append(open(md).read() if os.path.exists(md)
                     else f"GRU benchmark failed (exit {rc}); see gru-log.txt")
        if os.path.exists(md):
            os.remove(md)
        # every tile split of the small shapes, against fast_plan's choice
        rc, secs = sh([py, "-m", "bench.gru", "--sweep", "--shapes", "S1,S2,S3,S4,S5,S6,S7",
                       "--repeat", "5", "--out", out], os.path.join(out, "gru-log.txt"),
                      timeout=300)
        sweep = os.path.join(out, "gru-sweep.md")
        lines += ["", open(sweep).read() if os.path.exists(sweep)
                  else f"Tile sweep failed (exit {rc}); see gru-log.txt"]
        if os.path.exists(sweep):
            os.remove(sweep)
        # the small path on small shapes, against the plan auto takes without it and cuDNN
        small = os.path.join(out, "small.json")
        rc, secs = sh([py, "-m", "bench.small", "--json", small],
                      os.path.join(out, "gru-log.txt"), timeout=300)
        lines += ["", "### The small path on small shapes (bench/small.py)", "",
                  "Wall clock per call of back-to-back calls, and device time per call "
                  "(CUDA events; where the host is the bound the events measure its pace), "
                  "float32, µs; 'without it' is the plan path='auto' takes where the small "
                  "path is left out; cuDNN in FP32 strict.", ""]
        if rc == 0 and os.path.exists(small):
            sys.path.insert(0, ROOT)
            from bench import small as small_bench
            lines += small_bench.markdown(json.load(open(small)))
        else:
            lines.append(f"Small-path benchmark failed (exit {rc}); see gru-log.txt")
        # quantization-aware training against our float step, cuDNN and torch's fake-quant loop
        qat = os.path.join(out, "qat.json")
        rc, secs = sh([py, "-m", "bench.qat", "--json", qat], os.path.join(out, "gru-log.txt"),
                      timeout=400)
        lines += ["", "### Quantization-aware training (bench/qat.py)", ""]
        if rc == 0 and os.path.exists(qat):
            sys.path.insert(0, ROOT)
            from bench import qat as qat_bench
            lines += [qat_bench.__doc__.split("\n\n")[0].replace("\n", " "), ""]
            lines += qat_bench.markdown(json.load(open(qat)))
        else:
            lines.append(f"QAT benchmark failed (exit {rc}); see gru-log.txt")
        # the torch drop-in against nn.GRU, its own cost, and variable lengths
        lines += json_bench(py, out, "torch_gru", "gru-log.txt", 400,
                            "cugru.torch.GRU and variable lengths")
        # the shapes off the table, fixed before tuning for them
        lines += json_bench(py, out, "offtable", "gru-log.txt", 300,
                            "Shapes off the S1-S10 table")
        # every path of ours per shape: does path="auto" take the fastest?
        lines += json_bench(py, out, "paths", "gru-log.txt", 400,
                            "Every path of ours per shape, and path='auto'")
        # accuracy against torch.nn.GRU (cuDNN) in the same precision: half data and TF32
        # (every shape of S1-S10: the goal is per shape; the CPU's default takes four)
        lines += json_bench(py, out, "precision", "gru-log.txt", 300,
                            "Accuracy in float16, bfloat16 and TF32",
                            ("--device", "cuda", "--shapes", "S1,S2,S3,S4,S5,S6,S7,S8,S9,S10",
                             "--dtypes", "float16,bfloat16,tf32"))
        # speed in TF32, float16 and bfloat16 against cuDNN in the same precision
        lines += json_bench(py, out, "dtypes", "gru-log.txt", 500,
                            "Speed in TF32, float16 and bfloat16",
                            ("--shapes", "S1,S2,S3,S4,S5,S6,S7,S8,S9,S10,O1,O2,O3,O4,O5,O6,O7,"
                             "O8,O9,O10,O11,O12,O13,O14,O15,O16"))
        write(out, "gru", lines)

    if "main" not in skip:
        log = os.path.join(out, "main-log.txt")
        lines = ["## Main job (`python -m cugru.train`: bidirectional GRU on the digits, "
                 "default settings)", ""]
        curves = {}
        for dev in ("gpu", "cpu"):
            start = os.path.getsize(log) if os.path.exists(log) else 0
            rc, secs = sh([py, "-m", "cugru.train", "--device", dev, "--no-progress", "--plot",
                           os.path.join(out, f"training-curves-{dev}.png")], log, timeout=150)
            with open(log) as f:
                f.seek(start)
                text = f.read().splitlines()
            last = [ln for ln in text if ln.startswith(f"device {dev}")]
            curves[dev] = [float(m.group(1)) for ln in text
                           if (m := re.match(r"epoch\s+\d+\s+loss (\S+)", ln))]
            lines.append(f"- {dev}: {last[-1] if last else f'failed (exit {rc})'}; wall {secs:.1f} s "
                         "with start-up")
        if curves["gpu"] and len(curves["gpu"]) == len(curves["cpu"]):
            rel = [abs(g - c) / c for g, c in zip(curves["gpu"], curves["cpu"])]
            lines.append(f"- loss per epoch, GPU against CPU (same seed and data order; the "
                         f"printed losses, 9 significant digits): relative difference "
                         f"{rel[0]:.1e} after epoch 1, at most {max(rel):.1e} over "
                         f"{len(rel)} epochs")
        # the other precisions (--dtype, --math): the held-out accuracy of each
        for dev, dtype, math in (("gpu", "float16", "strict"), ("gpu", "bfloat16", "strict"),
                                 ("gpu", "float32", "tf32"), ("gpu", "float16", "tf32"),
                                 ("gpu", "bfloat16", "tf32"), ("cpu", "float16", "strict"),
                                 ("cpu", "bfloat16", "strict")):
            start = os.path.getsize(log)
            rc, secs = sh([py, "-m", "cugru.train", "--device", dev, "--no-progress", "--plot",
                           "", "--dtype", dtype, "--math", math], log, timeout=150)
            with open(log) as f:
                f.seek(start)
                text = f.read().splitlines()
            last = [ln for ln in text if ln.startswith(f"device {dev}")]
            lines.append(f"- {dev} with `--dtype {dtype} --math {math}`: "
                         f"{last[-1] if last else f'failed (exit {rc})'}; wall {secs:.1f} s "
                         "with start-up")
        # the quantization-aware main job (float epochs, then QAT; the int8 export checked)
        for dev in ("gpu", "cpu"):
            start = os.path.getsize(log)
            rc, secs = sh([py, "-m", "cugru.train", "--device", dev, "--no-progress", "--plot",
                           "", "--qat"], log, timeout=150)
            with open(log) as f:
                f.seek(start)
                text = f.read().splitlines()
            last = [ln for ln in text if ln.startswith("QAT:")]
            lines.append(f"- {dev} with `--qat`: {last[-1] if last else f'failed (exit {rc})'}; "
                         f"wall {secs:.1f} s with start-up")
        write(out, "main", lines)

    if "scaling" not in skip:
        write(out, "scaling", scaling(py, out))
    return assemble(out)


def scaling(py, out):
    """The data-parallel phase: bench.scaling on 1 and 2 GPUs, and the torchrun example
    (cugru.ddp) on 2; skipped, saying so, on a machine of one GPU."""
    lines = ["## Data-parallel training on several GPUs (bench/scaling.py, cugru.ddp)", ""]
    try:
        import cupy
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001
        gpus = 0
    if gpus < 2:
        return lines + [f"Not run: this machine has {gpus} GPU(s)."]
    log = os.path.join(out, "scaling-log.txt")
    path = os.path.join(out, "scaling.json")
    if os.path.exists(path):
        os.remove(path)
    rc, secs = sh([py, "-m", "bench.scaling", "--gpus", "1,2", "--json", path], log,
                  timeout=600)
    if os.path.exists(path):
        sys.path.insert(0, ROOT)
        from bench import scaling as scaling_bench
        with open(path) as f:
            got = json.load(f)
        lines += scaling_bench.markdown(got["rows"], got["shape"]) + [""]
        os.remove(path)
    else:
        lines += [f"bench.scaling failed (exit {rc}); see scaling-log.txt", ""]
    start = os.path.getsize(log)
    rc, secs = sh([py, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "cugru.ddp",
                   "--steps", "100"], log, timeout=300)
    with open(log) as f:
        f.seek(start)
        last = [ln for ln in f.read().splitlines() if ln.startswith("step 100/")]
    lines.append(f"- `torchrun --nproc-per-node 2 -m cugru.ddp --steps 100`: "
                 f"{last[-1] if last else f'failed (exit {rc})'}; wall {secs:.1f} s with start-up")
    return lines


PHASES = ("tests", "sanitizer", "bench", "gru", "main", "scaling", "before")

#: times the first load of the base tree's GRU kernel module(s), in a fresh CuPy cache
_BASE_COMPILE = r"""
import json, sys, time
import cupy
t0 = time.perf_counter()
try:
    from cukernels import _rt
    _rt._module("gru.cu", cupy.cuda.runtime.getDevice()).get_function(_rt.REGISTRY["gru.cu"][0])
except ImportError:
    from cukernels import runtime
    import cugru
    for n, s in runtime.sources().items():
        if n.startswith("gru"):
            for g, names in s.groups().items():
                runtime.kernel(n, names[0])
print(json.dumps(time.perf_counter() - t0))
"""


#: runs of each tree's call costs in the "before" phase, in turn
ROUNDS = int(os.environ.get("CK_CALL_ROUNDS", "3"))


def median_rows(runs):
    """bench/calls.py's rows, each number the median over the runs."""
    import statistics
    out = []
    for rows in zip(*runs):
        row = dict(rows[0])
        for key in ("ours_us", "torch_us"):
            vals = [r[key] for r in rows if r[key] is not None]
            row[key] = statistics.median(vals) if vals else None
        out.append(row)
    return out


def before(py, tree, label, out):
    """The base tree's first-use compile of the GRU's kernels (a fresh CuPy cache) and its
    cost of a call (bench/calls.py of this tree, run on the base tree's packages)."""
    log = os.path.join(out, "before-log.txt")
    lines = [f"## Before: {label}, measured in this run", ""]
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "cache")
        env = {"PYTHONPATH": tree, "CUPY_CACHE_DIR": cache}
        t0 = time.time()
        p = subprocess.run([py, "-c", _BASE_COMPILE], cwd=tree, env={**os.environ, **env},
                           capture_output=True, text=True, timeout=400)
        with open(log, "a") as f:
            f.write(p.stdout + p.stderr)
        if p.returncode == 0:
            lines.append(f"- First use of the GRU's kernels, {label}, in an empty CuPy cache: "
                         f"{float(p.stdout.strip().splitlines()[-1]):.1f} s of compile "
                         f"({time.time() - t0:.0f} s with the start-up).")
        else:
            lines.append(f"- The base tree's compile failed (exit {p.returncode}); see "
                         "before-log.txt")
        pkg = os.path.join(tmp, "callbench")
        os.makedirs(pkg)
        for name in ("__init__.py", "timing.py", "calls.py"):
            src = os.path.join(ROOT, "bench", name)
            if name == "__init__.py":
                open(os.path.join(pkg, name), "w").close()
            else:
                shutil.copy(src, pkg)
        # the two trees in turn, ROUNDS times each (a host's speed drifts within a run): the
        # median of each call over the rounds. Each runs in its own tree: `python -m` puts the
        # working directory first on sys.path, ahead of PYTHONPATH
        runs = {"base": [], "this": []}
        rc = 0
        base_env = {**env, "PYTHONPATH": os.pathsep.join([tree, tmp])}
        where = subprocess.run([py, "-c", "import cugru, cukernels; print(cugru.__file__); "
                                "print(cukernels.__file__)"], cwd=tree, capture_output=True,
                               text=True, env={**os.environ, **base_env}).stdout.split()
        base = os.path.realpath(tree)
        if len(where) != 2 or not all(
                os.path.commonpath([os.path.realpath(w), base]) == base for w in where):
            raise RuntimeError(f"the base tree's run imports {where}, not {tree}'s packages")
        for k in range(ROUNDS):
            for which, cmd, env_k, cwd in (
                    ("base", [py, "-m", "callbench.calls"], base_env, tree),
                    ("this", [py, "-m", "bench.calls"], {}, ROOT)):
                result = os.path.join(tmp, f"calls-{which}-{k}.json")
                rc, _ = sh(cmd + ["--json", result], log, env=env_k, timeout=300, cwd=cwd)
                if os.path.exists(result):
                    with open(result) as f:
                        runs[which].append(json.load(f))
        if runs["base"] and runs["this"]:
            sys.path.insert(0, ROOT)
            from bench import calls
            lines += ["", f"Cost of a call (bench/calls.py): {label} on its packages and this "
                      f"tree in turn, {len(runs['this'])} runs each on this machine, the median "
                      "of each (the torch column: this tree's runs); the benchmarks measure "
                      "this tree's again:", ""]
            lines += calls.markdown(median_rows(runs["this"]), median_rows(runs["base"]), label)
        else:
            lines.append(f"- The call costs failed (exit {rc}); see before-log.txt")
    return lines


def json_bench(py, out, name, log, timeout, title, args=()):
    """A section's lines for bench/<name>.py: run with --json (and `args`; its output into
    `log`), then its own markdown of the JSON, under `title`."""
    import importlib
    path = os.path.join(out, f"{name}.json")
    rc, _ = sh([py, "-m", f"bench.{name}", "--json", path, *args], os.path.join(out, log),
               timeout=timeout)
    lines = ["", f"### {title} (bench/{name}.py)", ""]
    if rc != 0 or not os.path.exists(path):
        return lines + [f"bench/{name}.py failed (exit {rc}); see {log}"]
    sys.path.insert(0, ROOT)
    lines += importlib.import_module(f"bench.{name}").markdown(json.load(open(path)))
    os.remove(path)
    return lines


def write(out, phase, lines):
    with open(os.path.join(out, f"section-{phase}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def assemble(out):
    parts = ["# GPU report", "", "Written by the project's GPU script, tools/gpu_report.py.", ""]
    for name in ["header"] + list(PHASES):
        path = os.path.join(out, f"section-{name}.md")
        if os.path.exists(path):
            parts.append(open(path).read())
    text = "\n".join(parts)
    with open(os.path.join(out, "gpu-report.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
