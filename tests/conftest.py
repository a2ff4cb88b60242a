"""Shared fixtures: the GPU marker, torch for the CPU cross-checks, and the compile report."""
import os
import zlib

import numpy as np
import pytest

from cukernels import _rt


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy; skipped where none is")
    config.addinivalue_line("markers", "slow: long or memory-hungry (GPU > 2**31 elements)")
    config.addinivalue_line("markers", "compile: nvcc compile check of every kernel instance")
    config._ck_compile_rows = []
    if os.environ.get("CK_NO_POOL") and _rt.cupy_module() is not None:
        # under compute-sanitizer: one cudaMalloc per array, so that an access past an
        # array's end is past its allocation too (a pool would hide it inside a larger chunk)
        cupy = _rt.cupy_module()
        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)


def pytest_collection_modifyitems(config, items):
    if _rt.gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU with CuPy on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = config._ck_compile_rows
    if not rows:
        return
    terminalreporter.section("kernel registers and spills (nvcc -Xptxas -v)")
    for arch, filename, r in rows:
        st, ss, sl = r["spill"]
        terminalreporter.write_line(
            f"{arch} {filename:15s} {r['regs']:>3} regs {r['smem']:>5} B smem "
            f"stack {st} B spill {ss}/{sl} B  {r.get('name', r['mangled'])}")


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
    """cupy.empty / empty_like return NaN-filled arrays, so an unwritten element fails a test."""
    empty, empty_like = cp.empty, cp.empty_like

    def nan_empty(*a, **k):
        out = empty(*a, **k)
        out.fill(np.nan)
        return out

    def nan_empty_like(*a, **k):
        out = empty_like(*a, **k)
        out.fill(np.nan)
        return out

    monkeypatch.setattr(cp, "empty", nan_empty)
    monkeypatch.setattr(cp, "empty_like", nan_empty_like)
