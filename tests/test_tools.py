"""The tools on the CPU: the GPU script's reading of compute-sanitizer's output and its
phases (tools/gpu_report.py), the tile diagnostic's patches, the probes' argument and
candidate handling."""

import numpy as np

from tool_module import load as _tool


gpu_report = _tool("gpu_report.py")

_LOG = """========= COMPUTE-SANITIZER
========= Error: Potential WAR hazard detected at __shared__ 0x1f0 in block (13,0,0) :
=========     Read Thread (8,0,0) at void k<float, (int)4>(const T1 *, T1 *)+0x1a0
=========     Write Thread (56,0,0) at void k<float, (int)4>(const T1 *, T1 *)+0x2b0
=========     Current Value : 190, Incoming Value : 190
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: _forward_gpu in gru.py:543
=========
========= Warning: (Warp Level Programming) Potential RAW hazard detected (CUDA barrier operation) at __shared__ 0x20 in block (36,1,0) :
=========     Write Thread (3,0,0) at void j<float>(float *)+0x10
========= Error: Potential WAR hazard detected at __shared__ 0x1f4 in block (2,0,0) :
=========     Read Thread (9,0,0) at void k<float, (int)4>(const T1 *, T1 *)+0x1a0
========= Invalid __global__ write of size 4 bytes
=========     at void planted(float *)+0x70
========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)
========= ERROR SUMMARY: 1 error
"""


def test_finding_kinds_groups_the_reports_by_kind_and_kernel():
    kinds = gpu_report.finding_kinds(_LOG)
    assert kinds == [
        (2, "Error: Potential WAR hazard detected at __shared__ X in block (..) in "
            "k<float, (int)4> (first at 0x1f0)"),
        (1, "Invalid __global__ write of size 4 bytes in planted"),
        (1, "Warning: (Warp Level Programming) Potential RAW hazard detected (CUDA barrier "
            "operation) at __shared__ X in block (..) in j<float> (first at 0x20)"),
    ]
    assert gpu_report.finding_kinds(_LOG, limit=1) == kinds[:1]


def test_finding_kinds_of_a_clean_run_is_empty():
    assert gpu_report.finding_kinds("========= COMPUTE-SANITIZER\n"
                                    "========= ERROR SUMMARY: 0 errors\n") == []
    # (pytest's own banners in the same log are no reports)
    assert gpu_report.finding_kinds("========= COMPUTE-SANITIZER\n"
                                    "=========================== short test summary info "
                                    "============================\n"
                                    "SKIPPED [1] tests/x.py:3: no\n"
                                    "========= 3 passed, 1 skipped in 1.00s =========\n"
                                    "========= ERROR SUMMARY: 0 errors\n") == []


def test_the_tile_diagnostic_s_patches_still_apply_to_the_kernel_source():
    """tools/gru_tile_diag.py patches gru_tile.cu's text in memory; each patch must still
    find its text (it stops with an AssertionError where the kernel changed)."""
    import cugru  # noqa: F401
    from cukernels import runtime
    diag = _tool("gru_tile_diag.py")
    src = runtime.source("gru_tile.cu").text()
    assert len(diag.variants(src)) == 6 and len(diag.grid_variants(src)) == 5
    for kind in ("ieee", "fast"):   # (the float cell's functions renamed out of the way)
        out = diag.cell_variant(src, kind)
        assert "gru_sigmoid<float>(" not in out and "gru_tanh<float>(" not in out
    for marks in (diag.FORWARD_MARKS, diag.BACKWARD_MARKS):
        assert diag.clock_source(src, marks).count("GRU_MARK(") == len(marks) + 1


def test_a_command_past_its_time_is_stopped_with_its_children(tmp_path):
    """The GPU script's sh(): a command that outlives its timeout is stopped together with
    the processes it started (a launcher's workers must not stay on the GPUs)."""
    import sys
    import time
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); p.wait()")
    start = time.time()
    rc, secs = gpu_report.sh([sys.executable, "-c", code], str(tmp_path / "log.txt"), timeout=3)
    assert rc == "timeout" and time.time() - start < 30
    pid = int(pid_file.read_text())
    time.sleep(0.5)
    try:
        with open(f"/proc/{pid}/status") as f:
            state = [ln for ln in f if ln.startswith("State:")][0]
        assert "Z" in state, f"the child {pid} still runs: {state}"
    except FileNotFoundError:
        pass                                    # (gone, and reaped)
    assert "[timed out after 3 s]" in (tmp_path / "log.txt").read_text()


def test_the_report_names_a_commit_or_refuses_to_run(tmp_path):
    """tools/gpu_report.py's commit: the one given (hex), or git's HEAD where the tree is
    git's unchanged; a tree git cannot place, or whose tracked files differ from HEAD (a
    copied tree with an old .git), is an error asking for --commit."""
    import subprocess

    import pytest
    sha = "2c2eb6f344c01c912d35c7040ab0bbcbf398cb62"
    assert gpu_report.resolve_commit(sha) == sha
    with pytest.raises(ValueError, match="is not a commit"):
        gpu_report.resolve_commit("**2c2eb6f**")
    with pytest.raises(ValueError, match="pass --commit"):
        gpu_report.resolve_commit(None, root=str(tmp_path))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(git + ["init", "-q"], check=True)
    (tmp_path / "f.txt").write_text("a")
    subprocess.run(git + ["add", "f.txt"], check=True)
    subprocess.run(git + ["commit", "-qm", "one"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert gpu_report.resolve_commit(None, root=str(tmp_path)) == head
    (tmp_path / "f.txt").write_text("b")
    with pytest.raises(ValueError, match="tracked files differ from git's HEAD"):
        gpu_report.resolve_commit(None, root=str(tmp_path))


def test_every_phase_of_the_gpu_script_runs_its_commands_and_writes_its_section(
        tmp_path, monkeypatch):
    """tools/gpu_report.py end to end on the CPU, every command it runs failing (a stand-in
    for its shell helper, which logs them): each phase still writes its section, saying what
    failed, and each Python command runs this interpreter."""
    import sys
    ran = []

    def sh(cmd, log, env=None, timeout=900, cwd=None):
        ran.append(cmd)
        with open(log, "a") as f:
            f.write(f"\n$ {' '.join(cmd)}\n")
        return 1, 0.0
    monkeypatch.setattr(gpu_report, "sh", sh)
    monkeypatch.setattr(gpu_report, "gpu_info", lambda: "a stand-in GPU")
    phases = [p for p in gpu_report.PHASES if p != "before"]     # (before: a base tree)
    out = tmp_path / "report"
    sha = "92f901ad7ed20b5a0a7eae312b028a0f7cc37676"
    gpu_report.main([str(out), "--commit", sha, "--only", ",".join(phases)])
    for phase in ["header"] + phases:
        assert (out / f"section-{phase}.md").exists(), phase
    assert sha in (out / "section-header.md").read_text()
    assert "failed" in (out / "section-gru.md").read_text()
    python = [c for c in ran if "-m" in c]
    assert python and all(sys.executable in c for c in python)
    assert any("bench.paths" in c for c in python) and any("pytest" in c for c in python)


def test_the_inference_sweep_tries_every_runnable_split_and_the_other_paths():
    """tools/inference_sweep.py's candidates: the splits plans.tile_splits gives (what
    fast_plan ranks; its own test is in test_gru_plan.py), then the per-step plan, and the
    small plan only where it holds the shape."""
    sweep = _tool("inference_sweep.py")
    asked = []

    class Plans:
        STEPS, fits = "steps", False

        class SMALL:
            @staticmethod
            def fits(B, H, D):
                return Plans.fits

        @staticmethod
        def tile_splits(B, H, D, dtype):
            asked.append((B, H, D, np.dtype(dtype).name))
            return [("a", 4), ("b", 2)]

    assert sweep.candidates(Plans, 8, 64, 1) == ["a", "b", "steps"]
    Plans.fits = True
    assert sweep.candidates(Plans, 8, 64, 2) == ["a", "b", "steps", Plans.SMALL]
    assert asked == [(8, 64, 1, "float32"), (8, 64, 2, "float32")]


def test_the_inference_sweep_refuses_an_unknown_shape_id(capsys):
    import pytest
    sweep = _tool("inference_sweep.py")
    with pytest.raises(SystemExit) as e:
        sweep.main(["S1", "Z9"])
    assert e.value.code == 2 and "Z9" in capsys.readouterr().err


def test_the_step_graph_probe_sets_the_whole_pass_capture_and_restores_it():
    """tools/step_graph_probe.py times the per-step plan's inference with its whole pass
    captured and without: each call sees the setting it asked for, and the setting before
    comes back after the call, also where the call raises; an unknown shape id stops with
    argparse's error."""
    import pytest
    from cugru import _plan
    probe = _tool("step_graph_probe.py")
    was = _plan.StepsPlan.captures
    seen = []

    def call():
        seen.append(_plan.StepsPlan.captures)
        return len(seen)
    assert probe.in_setting(False, call)() == 1 and probe.in_setting(True, call)() == 2
    assert seen == [False, True] and _plan.StepsPlan.captures is was

    def fails():
        seen.append(_plan.StepsPlan.captures)
        raise RuntimeError("planted")
    with pytest.raises(RuntimeError, match="planted"):
        probe.in_setting(not was, fails)()
    assert seen[-1] is (not was) and _plan.StepsPlan.captures is was
    with pytest.raises(SystemExit) as e:
        probe.main(["O10", "Z9"])
    assert e.value.code == 2


def test_probe_problems_gives_each_shape_its_arrays_weights_and_repeats(monkeypatch):
    """bench.paths.probe_problems (the probes' loop over shapes): the shape's dimensions
    with D, its arrays on the device (a stand-in for cupy here), the weights in
    gru_forward's order, and a quarter of the timed calls from T = 1000 on."""
    import sys
    import types

    import numpy as np

    from bench import paths
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(asarray=np.array))
    got = list(paths.probe_problems(["S4", "O11"], 20))
    (sid, dims, a, w, n), (sid2, dims2, _, _, n2) = got
    assert (sid, dims, n) == ("S4", (100, 64, 40, 128, True, 2), 20)
    assert (sid2, dims2, n2) == ("O11", (1000, 8, 32, 96, False, 1), 5)
    assert a["x"].shape == (100, 64, 40) and a["w_hh"].shape == (2, 384, 128)
    assert [x is a[k] for x, k in zip(w, ("w_ih", "w_hh", "b_ih", "b_hh"))] == [True] * 4


def test_the_mma_probe_refuses_an_unknown_precision_or_shape_before_any_gpu_work(capsys):
    """tools/mma_probe.py names what it does not know: an unknown precision (a SystemExit
    naming the flag and the choices, before it asks for a GPU) and an unknown shape id
    (argparse's error)."""
    import pytest
    probe = _tool("mma_probe.py")
    with pytest.raises(SystemExit) as e:
        probe.main(["S1", "--precisions", "tf32,fp8"])
    assert "--precisions" in str(e.value) and "fp8" in str(e.value) and "float16" in str(e.value)
    with pytest.raises(SystemExit) as e:
        probe.main(["S1", "Q3"])
    assert e.value.code == 2 and "Q3" in capsys.readouterr().err


def test_the_mma_probe_marks_the_plans_whose_tf32_passes_run_the_mma_kernels(monkeypatch):
    """mma_probe.mma_label: " +mma" after a tile plan whose split the MMA kernels hold (block
    scope: no occupancy query; an H100's shared memory, a stand-in device), nothing after
    one they do not hold or another plan."""
    from cugru import _plan, plans
    from cukernels import runtime
    monkeypatch.setattr(_plan.dev, "device", lambda: runtime.Device(0, 132, 232448, 90))
    monkeypatch.setattr(_plan, "_MMA_RUNS", {})        # (no verdict of the stand-in kept)
    probe = _tool("mma_probe.py")
    mma = plans.tile_split(64, 64, 1, (1, 8, 8, 256, 1), 2, 4)
    fma = plans.tile_split(64, 64, 1, (1, 8, 1, 512, 1), 1, 4)
    assert mma.mma_holds("float") and not fma.mma_holds("float")
    assert probe.mma_label(plans, mma, 1).endswith(" +mma")
    assert not probe.mma_label(plans, fma, 1).endswith("+mma")
    assert probe.mma_label(plans, plans.STEPS, 1) == "steps"


def test_the_precision_paths_tool_refuses_a_bad_shape_or_draw_count_before_gpu_work(capsys):
    """tools/precision_paths.py names an unknown shape id and a draw count below 1 (argparse
    errors, exit 2), before it asks torch for a GPU."""
    import pytest
    tool = _tool("precision_paths.py")
    with pytest.raises(SystemExit) as e:
        tool.main(["S6,Q3"])
    assert e.value.code == 2 and "Q3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        tool.main(["S6", "--draws", "0"])
    assert e.value.code == 2 and "--draws must be at least 1" in capsys.readouterr().err


def test_the_tiles_tool_refuses_an_unknown_shape_or_tile_before_gpu_work(capsys):
    """tools/tiles_ab.py names an unknown shape id, a tile that is no float32 tile and a
    tile that is not five integers (argparse errors, exit 2), before it asks for a GPU; its
    default tiles to leave out are the 4-row ones (plans.FOUR_ROW_TILES)."""
    import pytest

    from cugru import plans
    tool = _tool("tiles_ab.py")
    for argv, named in ((["O13", "Q3"], "Q3"), (["O13", "--tiles", "2,8,3,256,1"],
                                                "(2, 8, 3, 256, 1)"),
                        (["--tiles", "2,8,x,256,1"], "five integers")):
        with pytest.raises(SystemExit) as e:
            tool.parse(argv)
        assert e.value.code == 2 and named in capsys.readouterr().err
    ids, tiles, math = tool.parse([])
    assert tiles == set(plans.FOUR_ROW_TILES) and len(plans.FOUR_ROW_TILES) == 2
    assert ids[:2] == ["S1", "S2"] and "O13" in ids and math == "strict"
    assert tool.parse(["O7", "--tiles", "2,8,4,256,1", "--math", "tf32"]) == (
        ["O7"], {(2, 8, 4, 256, 1)}, "tf32")


def test_the_resident_probe_names_a_shape_it_cannot_hold(capsys):
    """tools/resident_probe.py: S10's shape takes 128 blocks of 256 threads and 209 KiB of
    shared memory each; a batch or hidden size off its tiles, a third direction, no steps,
    more blocks than SMs and more shared memory than a block may take are refused naming
    the flag (argparse, exit 2, before any GPU work for the first four); its float64
    recurrence is cugru's GRU with no input and no biases, W_hh its w transposed."""
    import pytest
    tool = _tool("resident_probe.py")
    assert tool.check_shape(256, 512, 2, 50, 132, 227 * 1024) == 128
    assert tool.threads() == 256 and tool.smem_bytes(512) == 214016
    for args, named in (((100, 512, 2, 50), "--B 100"), ((256, 500, 2, 50), "--H 500"),
                        ((256, 512, 3, 50), "--D 3"), ((256, 512, 2, 0), "--T 0"),
                        ((512, 1024, 2, 50, 132, None), "512 blocks"),
                        ((64, 1024, 1, 50, 132, 227 * 1024), "--H 1024: 410624 bytes")):
        with pytest.raises(ValueError, match=named):
            tool.check_shape(*args)
    for argv, named in ((["--B", "65"], "--B 65"), (["--D", "0"], "--D 0")):
        with pytest.raises(SystemExit) as e:
            tool.main(argv)
        assert e.value.code == 2 and named in capsys.readouterr().err
    # the recurrence is cugru's GRU with no input and no biases, W_hh = w transposed
    import cugru
    rng = np.random.default_rng(1)
    D, B, H, T = 2, 3, 4, 5
    h0, w = rng.uniform(-1, 1, (D, B, H)), rng.uniform(-1, 1, (D, H, 3 * H))
    zeros = np.zeros((D, 3 * H))
    _, h_n, _ = cugru.gru_forward(np.zeros((T, B, 1)), h0, np.zeros((D, 3 * H, 1)),
                                  w.transpose(0, 2, 1).copy(), zeros, zeros,
                                  bidirectional=True, training=False)
    assert np.allclose(tool.reference(h0, w, T), h_n, rtol=0, atol=1e-12)
    text = tool.source(512)
    assert "%(" not in text and "%%" not in text and "#define HH 512" in text
    assert "#define KS 2" in tool.source(512, 8, 2) and tool.threads(8, 2) == 256


def test_the_resident_ab_tool_times_the_splits_that_fit(capsys):
    """tools/resident_ab.py times the splits plans.resident_splits gives, those of
    RESIDENT_SPLITS whose blocks fit the SMs and shared memory (resident_split picks one of
    them), and names an unknown shape id (argparse, exit 2) before any GPU work."""
    import pytest

    from cugru import plans
    tool = _tool("resident_ab.py")
    got = plans.resident_splits(64, 1024, 1, 132, 232448)
    assert [p.split for p in got] == [(64, 16, 2), (32, 16, 4)]
    assert plans.resident_split(64, 1024, 1, 132, 232448) == got[1]
    assert plans.resident_splits(32, 2048, 1, 132, 232448) == []
    with pytest.raises(SystemExit) as e:
        tool.main(["S9", "Q3"])
    assert e.value.code == 2 and "Q3" in capsys.readouterr().err


def test_kernel_table_counts_overlapping_kernels_once():
    """tools/kernel_table.py: a call's span runs from its first start to its last end, and
    its busy time counts the time two kernels on two streams overlap once."""
    table = _tool("kernel_table.py")
    events = [("a", 0.0, 10.0), ("b", 5.0, 12.0), ("c", 20.0, 25.0), ("d", 21.0, 22.0),
              ("e", 1.0, 30.0)]
    assert table.span_busy(events) == (30.0, 30.0)
    assert table.span_busy(events[:4]) == (25.0, 17.0)


def test_the_wide_split_probe_sets_the_slices_and_restores_them():
    """tools/wide_split_probe.py sets cugru._plan.WIDE_SPLIT_SLICES for each slice count it
    times and restores the setting after, also where the block raises; wide_split follows
    the setting (1 where the count does not divide k = 3H into slices of
    WIDE_SPLIT_MIN_TERMS); --slices takes counts of 1 or more; an unknown shape id stops
    with argparse's error."""
    import pytest
    from cugru import _plan
    probe = _tool("wide_split_probe.py")
    was = _plan.WIDE_SPLIT_SLICES
    with probe.wide_slices(6):
        assert _plan.WIDE_SPLIT_SLICES == 6 and _plan.wide_split(512) == 6
        # (k = 1545 is no multiple of 6; k = 300 gives slices of 50 terms)
        assert _plan.wide_split(515) == 1 and _plan.wide_split(100) == 1
    assert _plan.WIDE_SPLIT_SLICES == was
    with pytest.raises(RuntimeError, match="planted"):
        with probe.wide_slices(4):
            raise RuntimeError("planted")
    assert _plan.WIDE_SPLIT_SLICES == was
    assert probe.slice_counts("1,3, 8") == [1, 3, 8]
    for bad in ("", "0,2", "-1"):
        with pytest.raises(ValueError, match="--slices"):
            probe.slice_counts(bad)
    for argv in (["S10", "Z9"], ["S10", "--slices", "0"]):
        with pytest.raises(SystemExit) as e:
            probe.main(argv)
        assert e.value.code == 2


def test_the_direction_overlap_probe_splits_a_problem_into_its_two_directions():
    """tools/direction_overlap_probe.py's halves: each direction's weights, h0 and its half
    of dy, contiguous, the same x; the two halves' shapes are those of a unidirectional
    problem of the same sizes. Its arguments: unknown ids, unidirectional shapes and
    --repeat 0 stop with argparse's error."""
    import pytest

    from bench.shapes import make_problem
    probe = _tool("direction_overlap_probe.py")
    prob = make_problem(3, 2, 4, 5, True)
    uni = make_problem(3, 2, 4, 5, False)
    parts = probe.halves(prob)
    assert len(parts) == 2
    for d, part in enumerate(parts):
        assert {k: v.shape for k, v in part.items()} == \
            {k: v.shape for k, v in uni.items() if k != "bi"}
        assert all(v.flags.c_contiguous for v in part.values())
        for k in ("h0", "w_ih", "w_hh", "b_ih", "b_hh"):
            assert np.array_equal(part[k][0], prob[k][d])
        assert np.array_equal(part["dy"], prob["dy"][..., d * 5:(d + 1) * 5])
        assert part["x"] is prob["x"]
    for argv in (["S10", "Z9"], ["S1"], ["S10", "--repeat", "0"]):
        with pytest.raises(SystemExit) as e:
            probe.main(argv)
        assert e.value.code == 2
