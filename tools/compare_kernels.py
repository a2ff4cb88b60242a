"""Compare this tree's kernels with an older checkout's, without a GPU: the PTX of every
kernel instance, and the time nvcc takes to compile each source.

    python tools/compare_kernels.py BASE_TREE [--arch sm_90] [--rename OLD=NEW ...]

BASE_TREE is a checkout of an older commit (e.g. `git archive REV | tar -x -C DIR`). Each
tree's sources are taken as its runtime compiles them (headers pasted, defines rendered,
every registered instance instantiated) and compiled to PTX by nvcc; then every kernel's PTX
is compared, with the names of renamed kernels mapped (--rename, mangled-name fragments) and
the labels and local names that depend on a kernel's place in its file set aside. Equal PTX
means equal machine code (ptxas is deterministic): the kernels compute the same bits. The
compile times are `nvcc -cubin` per source on this machine, the same compiler the runtime's
NVRTC runs on the GPU machine, so they compare first-use compile times.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: dumps {module: its text with its instances instantiated} of the tree on sys.path[0]: a
#: module per source and group where sources have groups, else per source
_DUMP = r"""
import json, sys
try:
    from cukernels import compile_check, runtime
    out = {}
    for n, s in compile_check.load_sources(["cugru"]).items():
        for g, names in s.groups().items():
            refs = ",\n".join(f"    (void*)&{i}" for i in names)
            out[n.replace(".cu", f"-{g}.cu")] = (s.text() + "\nextern void* const ck_i[];\n"
                                f"void* const ck_i[] = {{\n{refs}\n}};\n")
except (ImportError, AttributeError):
    from cukernels import _rt, compile_check
    out = {n: compile_check.instance_source(n) for n in _rt.REGISTRY}
json.dump(out, sys.stdout)
"""
#: the renames of the layout of the house issue (mangled-name fragments, old -> new)
RENAMES = {"16gru_grid_forward": "21gru_tile_grid_forward",
           "17gru_grid_backward": "22gru_tile_grid_backward",
           "17gru_barrier_probe": "25gru_cluster_barrier_probe",
           "22gru_grid_barrier_probe": "25gru_counter_barrier_probe"}


def sources_of(tree):
    env = {**os.environ, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, "-c", _DUMP], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def compile_all(texts, arch, workdir, nvcc):
    """{source: (seconds of nvcc -cubin, PTX text)}"""
    out = {}
    for name, text in texts.items():
        path = os.path.join(workdir, name)
        with open(path, "w") as f:
            f.write(text)
        flags = [f"-arch={arch}", "-std=c++17", "-ftz=true"]
        t0 = time.perf_counter()
        subprocess.run([nvcc, "-cubin", *flags, "-o", os.devnull, path], check=True,
                       capture_output=True)
        seconds = time.perf_counter() - t0
        ptx = path + ".ptx"
        subprocess.run([nvcc, "-ptx", *flags, "-o", ptx, path], check=True,
                       capture_output=True)
        with open(ptx) as f:
            out[name] = (seconds, f.read())
    return out


def entries(ptx):
    """{mangled kernel name: its PTX, labels and local names that depend on its place in
    the file set aside}"""
    out = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\((.*?)\n\}\n", ptx, re.S):
        body = re.sub(r"\$L__BB\d+_", "$L__BB_", m.group(0))
        out[m.group(1)] = re.sub(r"__local_depot\d+", "__local_depot", body)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base_tree")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--rename", action="append", default=[],
                    help="OLD=NEW mangled-name fragment (default: the house issue's renames)")
    args = ap.parse_args(argv)
    renames = dict(r.split("=", 1) for r in args.rename) if args.rename else RENAMES
    with tempfile.TemporaryDirectory() as tmp:
        # (both trees' modules at the same path, one tree after the other: nvcc's PTX for
        # one and the same text was seen to number its registers differently at another
        # path, gru_resident_backward<32,16,64> among 788 kernels)
        base = compile_all(sources_of(os.path.abspath(args.base_tree)), args.arch, tmp,
                           args.nvcc)
        this = compile_all(sources_of(ROOT), args.arch, tmp, args.nvcc)
    old = {k: v for _, (_, ptx) in base.items() for k, v in entries(ptx).items()}
    new = {k: v for _, (_, ptx) in this.items() for k, v in entries(ptx).items()}
    same, differ, missing = 0, [], []
    for name, body in old.items():
        renamed = name
        for a, b in renames.items():
            renamed = renamed.replace(a, b)
        if renamed not in new:
            missing.append(name)
        elif body.replace(name, renamed) == new[renamed]:
            same += 1
        else:
            differ.append(name)
    print(f"PTX ({args.arch}): {same} of {len(old)} kernels of the base tree are the same in "
          f"this tree, {len(differ)} differ, {len(missing)} are gone; this tree has "
          f"{len(new)} kernels")
    for name in differ + missing:
        print(f"  {'differs' if name in differ else 'gone'}: {name}")
    print(f"\nnvcc -cubin -arch={args.arch} seconds per module (what the runtime compiles on "
          "first use):")
    for label, tree in (("base", base), ("this", this)):
        total = sum(s for s, _ in tree.values())
        print(f"  {label}: " + ", ".join(f"{n} {s:.1f}" for n, (s, _) in tree.items())
              + f"; all {total:.1f}")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
