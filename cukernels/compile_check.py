"""Compile every registered kernel instance without a GPU, and report registers and spills.

    python -m cukernels.compile_check [--arch sm_90 --arch sm_80] [--werror]

Each source in the registry (cukernels._rt.REGISTRY, the list the runtime launches from, so
nothing can be left out) is compiled by nvcc to a cubin for every arch, with the header pasted
in as at run time and with the options CuPy's NVRTC build uses (-std=c++17 -ftz=true).
Taking each template instance's address in host code makes nvcc instantiate exactly those.
Exit status 1 on any compile error (and on any warning with --werror), on a spill in an
instance launched on that arch (cugru's cluster and 512-thread tile kernels are compiled for
sm_80 but launched from sm_90 on), or when a registered instance does not appear in ptxas'
report.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from . import _rt

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


def instance_source(filename: str) -> str:
    names = _rt.REGISTRY[filename]
    refs = ",\n".join(f"    (void*)&{n}" for n in names)
    return (_rt.load_source(filename)
            + f"\n// compile check: instantiate every registered kernel\n"
            f"extern void* const ck_registered_instances[];\n"
            f"void* const ck_registered_instances[] = {{\n{refs}\n}};\n")


def demangle(names):
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return out.strip().splitlines() if out.strip() else list(names)


def instance_name(demangled):
    """'void k<float, (bool)1>(float*, ...)' -> 'k<float,true>' (c++filt and cu++filt differ);
    'k(int)' -> 'k' for a kernel that is not a template."""
    head = (demangled[:demangled.index(">(") + 1] if ">(" in demangled
            else demangled.split("(", 1)[0])
    head = head.replace("void ", "", 1).replace(" ", "")
    head = head.replace("(bool)1", "true").replace("(bool)0", "false")
    return re.sub(r"\((?:unsigned|signed|int|long|short|char)+\)", "", head)


def counted_spills(filename: str, arch: str, rows):
    """The rows of `check` with register spills that count: those of instances launched on
    `arch` (cugru's cluster and 512-thread tile kernels run from sm_90 on)."""
    cc = int(arch.split("_")[1])
    return [r for r in rows if (r["spill"][1] or r["spill"][2])
            and _rt.launched_on(filename, instance_name(r.get("name") or r["mangled"]), cc)]


def check(filename: str, arch: str, nvcc: str, werror: bool, workdir: str):
    path = os.path.join(workdir, filename)
    with open(path, "w") as f:
        f.write(instance_source(filename))
    cmd = [nvcc, "-cubin", f"-arch={arch}", "-std=c++17", "-ftz=true", "-Xptxas", "-v",
           "-o", os.devnull, path]
    if werror:
        cmd[1:1] = ["-Werror", "all-warnings"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    rows, current = [], None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = {"mangled": m.group(1), "regs": None, "spill": (0, 0, 0), "smem": 0}
            rows.append(current)
            continue
        if current is None:
            continue
        if (m := _SPILL.search(line)):
            current["spill"] = tuple(int(v) for v in m.groups())
        if (m := _REGS.search(line)):
            current["regs"] = int(m.group(1))
            if (s := _SMEM.search(line)):
                current["smem"] = int(s.group(1))
    for row, name in zip(rows, demangle([r["mangled"] for r in rows])):
        row["name"] = name
    return proc.returncode, log, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", help="sm_XX (default: sm_90 and sm_80)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--werror", action="store_true", help="treat compiler warnings as errors")
    args = ap.parse_args(argv)
    archs = args.arch or ["sm_90", "sm_80"]
    if shutil.which(args.nvcc) is None:
        print(f"compile check: nvcc not found ({args.nvcc}); set NVCC or add it to PATH")
        return 1
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            for filename in _rt.REGISTRY:
                rc, log, rows = check(filename, arch, args.nvcc, args.werror, tmp)
                expected = len(_rt.REGISTRY[filename])
                ok = rc == 0 and len(rows) == expected
                spills = counted_spills(filename, arch, rows)
                print(f"== {filename} [{arch}]: {'ok' if ok else 'FAILED'}, {len(rows)} of "
                      f"{expected} kernels compiled, {len(spills)} with spills")
                if rc != 0 or len(rows) != expected:
                    print(log)
                    failures += 1
                for r in rows:
                    st, ss, sl = r["spill"]
                    print(f"   {r['regs']:>3} regs  {r['smem']:>5} B smem  stack {st:>4} B  "
                          f"spill {ss}/{sl} B  {r.get('name', r['mangled'])}")
                failures += len(spills)
    print(f"compile check: {'FAILED' if failures else 'passed'} ({len(archs)} archs, "
          f"{sum(len(v) for v in _rt.REGISTRY.values())} kernel instances per arch)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
