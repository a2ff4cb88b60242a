"""Every registered kernel instance compiles for sm_90 and sm_80 with nvcc, without spills."""
import os
import shutil
import tempfile

import pytest

from cukernels import _rt, compile_check

NVCC = os.environ.get("NVCC", "nvcc")


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("filename", sorted(_rt.REGISTRY))
def test_kernel_source_compiles(filename, arch, request):
    if shutil.which(NVCC) is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs nvcc for the compile check")
        pytest.skip("nvcc is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        rc, log, rows = compile_check.check(filename, arch, NVCC, True, tmp)
    assert rc == 0, log
    request.config._ck_compile_rows += [(arch, filename, r) for r in rows]
    compiled = {compile_check.instance_name(r["name"]) for r in rows}
    expected = {n.replace(" ", "") for n in _rt.REGISTRY[filename]}
    assert compiled == expected
    spills = [r["name"] for r in compile_check.counted_spills(filename, arch, rows)]
    assert not spills, f"register spills in {spills}"


def test_tile_kernels_launched_per_arch():
    """Spills count only where an instance is launched: the GRU's cluster and 512-thread tile
    kernels from sm_90 on, every other kernel everywhere."""
    name = "gru_tile_backward<float,{},8,1,{},1>"
    assert _rt.launched_on("gru.cu", name.format(1, 256), 80)
    assert not _rt.launched_on("gru.cu", name.format(1, 512), 80)
    assert not _rt.launched_on("gru.cu", name.format(2, 256), 80)
    assert _rt.launched_on("gru.cu", name.format(2, 256), 90)
    assert _rt.launched_on("gru.cu", name.format(1, 512), 90)
    assert _rt.launched_on("gru.cu", "gru_forward_step<float,true>", 80)
    rows = [{"name": "void " + name.format(1, 512).replace(",", ", ") + "(float*)",
             "spill": (8, 4, 4)}]
    assert compile_check.counted_spills("gru.cu", "sm_90", rows) == rows
    assert compile_check.counted_spills("gru.cu", "sm_80", rows) == []


def test_header_is_inlined_and_every_source_includes_it():
    for filename in _rt.REGISTRY:
        text = _rt.load_source(filename)
        assert '#include "common.cuh"' not in text
        assert "ew_map" in text  # a definition from the header
    # every .cu file on disk is registered (nothing escapes the compile check)
    on_disk = {p.name for d in (_rt.KERNEL_DIR, _rt.GRU_KERNEL_DIR) for p in d.glob("*.cu")}
    assert on_disk == set(_rt.REGISTRY)
