"""Shared fixtures: the GPU marker, torch for the CPU cross-checks, and the compile report."""
import os
import zlib

import numpy as np
import pytest

import cugru  # noqa: F401  (registers the GRU's kernel sources)
from cukernels import runtime

#: where the compile check's table of registers and spills goes (pytest --compile-report
#: prints it too)
COMPILE_REPORT = os.path.join("build", "compile-report.txt")


def pytest_addoption(parser):
    parser.addoption("--compile-report", action="store_true",
                     help="print the compile check's registers and spills of every kernel")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy; skipped where none is")
    config.addinivalue_line("markers", "slow: long or memory-hungry (GPU > 2**31 elements)")
    config.addinivalue_line("markers", "compile: nvcc compile check of every kernel instance")
    config._ck_compile_rows = []
    if os.environ.get("CK_NO_POOL") and runtime.cupy_module() is not None:
        # under compute-sanitizer: one cudaMalloc per array, so that an access past an
        # array's end is past its allocation too (a pool would hide it inside a larger chunk)
        cupy = runtime.cupy_module()
        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)


def pytest_collection_modifyitems(config, items):
    if runtime.gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU with CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """CK_COMPILE_LOG=FILE: write the seconds each kernel module took to load the first time
    in this run (NVRTC compile, or a read of CuPy's disk cache) as JSON, for the GPU report."""
    path = os.environ.get("CK_COMPILE_LOG")
    if path and runtime.COMPILE_SECONDS:
        import json
        with open(path, "w") as f:
            json.dump({f"{src} [{group}]": s for (src, group), s in
                       runtime.COMPILE_SECONDS.items()}, f, indent=1)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config._ck_compile_rows
    if not rows:
        return
    from cukernels.compile_check import row_line
    lines = [row_line(arch, name, r) for arch, name, r in rows]
    path = os.path.join(str(config.rootpath), COMPILE_REPORT)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    if config.getoption("--compile-report"):
        terminalreporter.section("kernel registers and spills (nvcc -Xptxas -v)")
        for line in lines:
            terminalreporter.write_line(line)
    else:
        terminalreporter.write_line(f"compile check: registers and spills of {len(lines)} "
                                    f"kernel instances in {COMPILE_REPORT} "
                                    "(--compile-report prints them)")


@pytest.fixture
def torch():
    try:
        import torch
    except ImportError:
        if os.environ.get("CI"):
            raise RuntimeError("CI needs torch for the CPU cross-checks: install the test extra")
        pytest.skip("torch is not installed (pip install torch==2.13.0)")
    torch.set_default_dtype(torch.float64)
    return torch


@pytest.fixture
def rng(request):
    # fresh inputs for every test, reproducible from the test's name (crc32: str hashes are
    # salted per process)
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def cp():
    import cupy
    return cupy


@pytest.fixture
def poison(cp, monkeypatch):
    """cupy.empty / empty_like and cukernels.runtime.empty and empty_set return NaN-filled
    arrays, so an unwritten element fails a test; cugru's temporaries are not reused
    between calls (each starts as NaN). Arrays of 16-bit floats (float16, bfloat16) are
    filled through their bits: 0x7fff is a NaN in both formats."""
    from cugru import _device
    monkeypatch.setattr(_device, "SCRATCH_BYTES", 0)
    empty, empty_like = cp.empty, cp.empty_like

    def fill_nan(out):
        if out.dtype.itemsize == 2 and out.dtype.kind in "fV":
            out.view(np.uint16).fill(0x7fff)
        else:
            out.fill(np.nan)
        return out

    def nan_empty(*a, **k):
        return fill_nan(empty(*a, **k))

    def nan_empty_like(*a, **k):
        return fill_nan(empty_like(*a, **k))

    runtime_empty = runtime.empty

    def nan_runtime_empty(*a, **k):     # (keeps a maker the caller set: runtime.made_by)
        return fill_nan(runtime_empty(*a, **k))

    monkeypatch.setattr(cp, "empty", nan_empty)
    monkeypatch.setattr(cp, "empty_like", nan_empty_like)
    runtime_empty_set = runtime.empty_set

    def nan_runtime_empty_set(*a, **k):     # (results on one allocation: each filled)
        return tuple(fill_nan(v) for v in runtime_empty_set(*a, **k))

    monkeypatch.setattr(runtime, "empty", nan_runtime_empty)  # (the fast calls' results)
    monkeypatch.setattr(runtime, "empty_set", nan_runtime_empty_set)
