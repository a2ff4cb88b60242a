"""Compile every registered kernel instance without a GPU, and report registers and spills.

    python -m cukernels.compile_check [--arch sm_90 --arch sm_80] [--werror] [--package cugru]

Needs nvcc (about 90 s for every source on two archs). Each registered source (the runtime's
registry, the list the packages launch from, so nothing can be left out: the packages that
declare sources through the `cukernels.kernel_sources` entry points, and any given with
--package) is compiled by nvcc to a cubin for every arch, as the runtime compiles it (rendered
defines, headers pasted) and with the options CuPy's NVRTC build uses (-std=c++17 -ftz=true).
Taking each template instance's address in host code makes nvcc instantiate exactly those.
Exit status 1 on any compile error (and on any warning with --werror), on a spill in an
instance launched on that arch, when a registered instance does not appear in ptxas' report,
or when the parameters the runtime reads from a kernel's declaration are not the types the
compiler mangled into its name.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import import_module

from . import runtime

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(sm_\d+)'")
_REGS = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_ARCH = re.compile(r"sm_(\d{2,3})a?")


def instance_source(src: runtime.Source) -> str:
    refs = ",\n".join(f"    (void*)&{n}" for n in src.names())
    return (src.text()
            + "\n// compile check: instantiate every registered kernel\n"
            "extern void* const ck_registered_instances[];\n"
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


_MANGLED_KIND = [(r"\*", "ptr"), (r"^(unsigned long long|long long)$", "i64"),
                 (r"^unsigned int$", "u32"), (r"^int$", "i32"), (r"^float$", "f32"),
                 (r"^double$", "f64")]


def parameter_kinds(demangled):
    """The kind of each parameter in a demangled kernel name ('float const*' -> 'ptr')."""
    inner = demangled[demangled.rindex("(") + 1:demangled.rindex(")")]
    kinds = []
    for p in (s.strip() for s in inner.split(",") if s.strip()):
        p = re.sub(r"\b(const|volatile|__restrict__)\b", "", p).strip()
        p = re.sub(r"\s+", " ", p.replace(" *", "*"))
        kinds.append(next((k for pat, k in _MANGLED_KIND if re.search(pat, p)), p))
    return kinds


def signature_mismatches(src: runtime.Source, rows):
    """Instances whose parameters, as the runtime reads them from the declaration, are not
    the compiler's (the runtime packs every launch by them)."""
    sigs = runtime.parse_signatures(src.text())
    bad = []
    for r in rows:
        name = r.get("name") or ""
        if "(" not in name:
            continue
        inst = instance_name(name)
        params = sigs.get(inst.split("<", 1)[0])
        elem = {"float": "f32", "double": "f64"}.get(runtime.element_type(inst) or "")
        want = [elem if k == "elem" else k for _, k in params] if params else None
        if want != parameter_kinds(name):
            bad.append(f"{inst}: declared {want}, compiled {parameter_kinds(name)}")
    return bad


def counted_spills(src: runtime.Source, arch: str, rows):
    """The rows of `check` with register spills that count: those of instances launched on
    `arch` (a package may compile instances it launches only on newer GPUs)."""
    cc = int(_ARCH.fullmatch(arch).group(1))
    return [r for r in rows if (r["spill"][1] or r["spill"][2])
            and src.launched_on(instance_name(r.get("name") or r["mangled"]), cc)]


def check(src: runtime.Source, arch: str, nvcc: str, werror: bool, workdir: str):
    """Compile one source for one arch: (nvcc's exit status, its log, a row per kernel)."""
    path = os.path.join(workdir, src.name)
    with open(path, "w") as f:
        f.write(instance_source(src))
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


def row_line(arch, src_name, r):
    st, ss, sl = r["spill"]
    return (f"{arch} {src_name:16s} {r['regs']:>3} regs {r['smem']:>5} B smem "
            f"stack {st:>4} B spill {ss}/{sl} B  {r.get('name', r['mangled'])}")


def load_sources(packages=()):
    """The registered sources, after importing the declared packages and `packages`."""
    for p in packages:
        import_module(p)
    return runtime.discover()


def _arch(value):
    if not _ARCH.fullmatch(value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a GPU architecture; expected "
                                         "sm_XX, e.g. sm_90 or sm_80")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--arch", action="append", type=_arch,
                    help="sm_XX, repeatable (default: sm_90 and sm_80)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"),
                    help="the nvcc to run (or set NVCC)")
    ap.add_argument("--werror", action="store_true", help="treat compiler warnings as errors")
    ap.add_argument("--package", action="append", default=[],
                    help="also check the sources this package registers (repeatable)")
    args = ap.parse_args(argv)
    archs = args.arch or ["sm_90", "sm_80"]
    if shutil.which(args.nvcc) is None:
        ap.error(f"--nvcc {args.nvcc}: not found; install the CUDA toolkit or set NVCC")
    try:
        found = load_sources(["cukernels"] + args.package)
    except ImportError as e:
        ap.error(f"--package: {e}")
    if not runtime.declared_packages() and not args.package:
        print("compile check: no installed package declares kernel sources (entry points "
              "'cukernels.kernel_sources': is this checkout installed, pip install -e .?); "
              "checking cukernels' own; --package NAME adds another's")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            for src in found.values():
                rc, log, rows = check(src, arch, args.nvcc, args.werror, tmp)
                expected = len(src.names())
                ok = rc == 0 and len(rows) == expected
                spills = counted_spills(src, arch, rows)
                wrong = signature_mismatches(src, rows) if ok else []
                print(f"== {src.name} [{arch}]: {'ok' if ok else 'FAILED'}, {len(rows)} of "
                      f"{expected} kernels compiled, {len(spills)} with spills, "
                      f"{len(wrong)} with parameters the runtime reads wrong")
                if not ok:
                    print(log)
                    failures += 1
                for line in wrong:
                    print(f"   PARAMETERS {line}")
                for r in rows:
                    print("   " + row_line(arch, src.name, r))
                failures += len(spills) + len(wrong)
    total = sum(len(s.names()) for s in found.values())
    print(f"compile check: {'FAILED' if failures else 'passed'} ({len(archs)} archs, "
          f"{len(found)} sources: {', '.join(found)}; {total} kernel instances per arch)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
