"""Every registered kernel instance compiles for sm_90 and sm_80 with nvcc, without spills,
with the parameters the runtime reads from its declaration (no GPU needed)."""
import os
import pathlib
import shutil
import tempfile

import pytest

import cugru  # noqa: F401  (registers the GRU's kernel sources)
from cugru import _catalog
from cukernels import compile_check, runtime

NVCC = os.environ.get("NVCC", "nvcc")
SOURCES = sorted(runtime.sources())


@pytest.mark.compile
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("name", SOURCES)
def test_kernel_source_compiles(name, arch, request):
    if shutil.which(NVCC) is None:
        if os.environ.get("CI"):
            pytest.fail("CI needs nvcc for the compile check")
        pytest.skip("nvcc is not installed")
    src = runtime.source(name)
    with tempfile.TemporaryDirectory() as tmp:
        rc, log, rows = compile_check.check(src, arch, NVCC, True, tmp)
    assert rc == 0, log
    request.config._ck_compile_rows += [(arch, name, r) for r in rows]
    compiled = {compile_check.instance_name(r["name"]) for r in rows}
    assert compiled == {n.replace(" ", "") for n in src.names()}
    spills = [r["name"] for r in compile_check.counted_spills(src, arch, rows)]
    assert not spills, f"register spills in {spills}"
    assert compile_check.signature_mismatches(src, rows) == []


def test_tile_kernels_launched_per_arch():
    """Spills count only where an instance is launched: the GRU's cluster and 512-thread tile
    kernels from sm_90 on, every other kernel everywhere."""
    tile = runtime.source("gru_tile.cu")
    name = "gru_tile_backward<float,{},8,1,{},1,false,false>"
    assert tile.launched_on(name.format(1, 256), 80)
    assert not tile.launched_on(name.format(1, 512), 80)
    assert not tile.launched_on(name.format(2, 256), 80)
    assert tile.launched_on(name.format(2, 256), 90)
    assert tile.launched_on(name.format(1, 512), 90)
    assert tile.launched_on("gru_tile_backward<float,2,8,1,256,1,true,true>", 90)
    assert not tile.launched_on("gru_tile_backward<float,2,8,1,256,1,true,false>", 80)
    assert runtime.source("gru_steps.cu").launched_on(
        "gru_forward_step<float,true,false,float,float>", 80)
    rows = [{"name": "void " + name.format(1, 512).replace(",", ", ") + "(float*)",
             "spill": (8, 4, 4)}]
    assert compile_check.counted_spills(tile, "sm_90", rows) == rows
    assert compile_check.counted_spills(tile, "sm_80", rows) == []


def test_a_parameter_the_runtime_reads_wrong_is_reported():
    """The compile check compares the runtime's reading of a declaration with the types the
    compiler mangled into the name: a parameter read as int where the kernel takes a
    long long (a launch would pack 4 bytes of an 8-byte argument) is a failure."""
    src = runtime.source("activations.cu")
    good = ("void line_activation<float>(float const*, float const*, float const*, float*, "
            "long long, float, float, int, int)")
    assert compile_check.signature_mismatches(src, [{"name": good}]) == []
    bad = good.replace("long long", "int")
    (line,) = compile_check.signature_mismatches(src, [{"name": bad}])
    assert "line_activation<float>" in line and "'i64'" in line


def test_every_source_on_disk_is_registered_and_compiles_as_the_runtime_renders_it():
    """Nothing escapes the compile check: every .cu file of both packages is a registered
    source; headers are pasted (CuPy's cache keys on the text) and the Python constants are
    rendered as #defines at the top."""
    dirs = {runtime.source(n).directory for n in SOURCES}
    on_disk = {p.name for d in dirs for p in pathlib.Path(d).glob("*.cu")}
    assert on_disk == set(SOURCES)
    for name in SOURCES:
        text = runtime.source(name).text()
        assert "#include" not in text
        assert "ck_exp" in text   # a definition from cukernels' common header
    tile = runtime.source("gru_tile.cu").text()
    assert f"#define GRU_TILE_AHEAD {_catalog.TILE_AHEAD}\n" in tile
    assert f"#define GRU_TILE_MAX_LANES {_catalog.TILE_MAX_LANES}\n" in tile
    assert "#define CK_UNROLL" in tile and "#define CK_STREAM" in tile   # the header's own
    for name in SOURCES:   # no constant is also defined by hand in a kernel file
        raw = "".join(p.read_text() for p in pathlib.Path(runtime.source(name).directory)
                      .glob("*.cu*"))
        for macro in ("GRU_TILE_AHEAD", "GRU_TILE_MAX_LANES", "GRU_GRID_MAX_LANES",
                      "GRU_PERSIST_THREADS", "GRU_TILE_MAX_THREADS", "CK_UNROLL", "CK_STREAM",
                      "CK_COL_UNROLL", "CK_GEMV_UNROLL"):
            assert f"#define {macro}" not in raw, (name, macro)


def test_a_call_compiles_only_the_family_it_runs():
    """The per-step path's kernels are one module of 3 instances per element type, not part
    of the tile kernels' 99 (float32): the families compile apart; the quantization-aware
    instances (cugru.QuantSpec) are modules of their own, compiled only by such calls, and
    so are the float32 instances with float64 products and their conversions
    (wide_products)."""
    steps = dict(runtime.source("gru_steps.cu").groups())
    wide = steps.pop(_catalog.WIDE_GROUP)
    assert steps == {g: (_catalog.step_forward(c, False, q), _catalog.step_forward(c, True, q),
                         _catalog.step_backward(c, q))
                     for c in ("float", "double")
                     for q, g in ((False, c), (True, _catalog.qat_group(c)))}
    # (the QAT flag: the third argument forward, the second backward)
    assert all(n.split(",")[2 if n.startswith("gru_forward") else 1] == "false"
               for c in ("float", "double") for n in steps[c])
    assert wide == ("gru_forward_step<float,false,false,double,double>",
                    "gru_forward_step<float,true,false,double,double>",
                    "gru_forward_step<float,false,false,double,float>",
                    "gru_forward_step<float,true,false,double,float>",
                    "gru_backward_step<float,false,double>",
                    "gru_steps_convert<float,double>", "gru_steps_convert<double,float>")
    tile = runtime.source("gru_tile.cu").groups()
    assert len(tile["float"]) == 3 * len(_catalog.TILES[4]) == 99
    assert len(tile["double"]) == len(tile["double-qat"]) == 3 * len(_catalog.TILES[8])
    # (the quantization-aware module lacks the backward kernels that would spill)
    left_out = {_catalog.tile_backward("float", t, True) for t in _catalog.QAT_BACKWARD_LEFT_OUT[4]}
    assert left_out and not left_out & set(tile["float-qat"])
    assert len(tile["float-qat"]) == 99 - len(left_out)
    # the instances for variable lengths: modules of their own, without the 512-thread tiles
    no_len = len(_catalog.LENGTHS_LEFT_OUT[4])
    assert len(tile["float-len"]) == 99 - 3 * no_len
    assert len(tile["double-len"]) == len(tile["double-qat-len"]) == len(tile["double"])
    assert all(n.endswith("true>") for g in ("float-len", "float-qat-len") for n in tile[g])
    assert all(n.endswith("false>") for g in ("float", "float-qat") for n in tile[g])
    every = [n for s in SOURCES for n in runtime.source(s).names()]
    assert len(every) == len(set(every))
