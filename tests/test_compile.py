"""Every registered kernel instance compiles for sm_90 and sm_80 with nvcc, without spills."""
import os
import re
import shutil
import tempfile

import pytest

from cukernels import _rt, compile_check

NVCC = os.environ.get("NVCC", "nvcc")


def _instance_name(demangled):
    """'void k<float, (bool)1>(float*, ...)' -> 'k<float,true>' (c++filt and cu++filt differ);
    'k(int)' -> 'k' for a kernel that is not a template."""
    head = (demangled[:demangled.index(">(") + 1] if ">(" in demangled
            else demangled.split("(", 1)[0])
    head = head.replace("void ", "", 1).replace(" ", "")
    head = head.replace("(bool)1", "true").replace("(bool)0", "false")
    return re.sub(r"\((?:unsigned|signed|int|long|short|char)+\)", "", head)


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
    compiled = {_instance_name(r["name"]) for r in rows}
    expected = {n.replace(" ", "") for n in _rt.REGISTRY[filename]}
    assert compiled == expected
    spills = [r["name"] for r in rows if r["spill"][1] or r["spill"][2]]
    assert not spills, f"register spills in {spills}"


def test_header_is_inlined_and_every_source_includes_it():
    for filename in _rt.REGISTRY:
        text = _rt.load_source(filename)
        assert '#include "common.cuh"' not in text
        assert "ew_map" in text  # a definition from the header
    # every .cu file on disk is registered (nothing escapes the compile check)
    on_disk = {p.name for d in (_rt.KERNEL_DIR, _rt.GRU_KERNEL_DIR) for p in d.glob("*.cu")}
    assert on_disk == set(_rt.REGISTRY)
