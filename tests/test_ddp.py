"""cugru.ddp (data-parallel training under torch DistributedDataParallel) on the CPU with
gloo: two processes, each on half of every global batch, end with the weights and losses
of one process on the whole batch; a process that never comes is an error, not a hang."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

try:
    import torch  # noqa: F401
except ImportError:          # (CI installs the test extra, torch included)
    if os.environ.get("CI"):
        raise
    pytest.skip("torch is not installed (pip install torch==2.13.0)", allow_module_level=True)
pytest.importorskip("sklearn")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--device", "cpu", "--dtype", "float64", "--steps", "3", "--global-batch", "8",
        "--hidden", "8", "--every", "1"]


def _start(rank, world, tmp_path, store, *extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "cugru.ddp", *ARGS, "--init-method",
                             f"file://{tmp_path / store}", *extra], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(procs, timeout=240):
    out = [p.communicate(timeout=timeout) for p in procs]
    for p, (o, e) in zip(procs, out):
        assert p.returncode == 0, e
    return out


def test_two_processes_end_with_the_weights_of_one_on_the_whole_batch(tmp_path):
    one = _finish([_start(0, 1, tmp_path, "one", "--save", str(tmp_path / "one.npz"))])
    two = _finish([_start(r, 2, tmp_path, "two", "--save", str(tmp_path / "two.npz"))
                   for r in (0, 1)])
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert sorted(a.files) == sorted(b.files) and "gru.weight_hh_l1_reverse" in a.files
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert not np.array_equal(a["gru.weight_ih_l0"], 0)
    # (rank 0 prints the global loss of each step, the other rank nothing)
    assert [ln.split(" (")[0] for ln in two[0][0].splitlines()] == \
        [ln.split(" (")[0] for ln in one[0][0].splitlines()]
    assert len(one[0][0].splitlines()) == 3 and two[1][0] == ""


def test_one_process_without_a_launcher_runs_as_the_docs_say(tmp_path):
    """`python -m cugru.ddp --device cpu ...` with no launcher's environment (and a folder
    named cupy where it runs, which is not CuPy): one process, its own rendezvous."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    (tmp_path / "cupy").mkdir()
    p = subprocess.run([sys.executable, "-m", "cugru.ddp", "--device", "cpu", "--steps", "2",
                        "--global-batch", "8", "--hidden", "8", "--every", "1"],
                       env=dict(env, PYTHONPATH=ROOT), cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [ln.split(":")[0] for ln in p.stdout.splitlines()] == ["step 1/2", "step 2/2"]
    assert "over 1 process(es)" in p.stdout


def test_a_process_that_never_comes_is_an_error_not_a_hang(tmp_path):
    start = time.perf_counter()
    (out, err), = [p.communicate(timeout=120) for p in
                   [_start(0, 2, tmp_path, "alone", "--timeout", "3")]]
    assert time.perf_counter() - start < 100
    assert "did not come within --timeout 3 s" in err and "Traceback" not in err


def test_a_global_batch_the_processes_cannot_share_is_an_error(tmp_path):
    p = _start(0, 3, tmp_path, "bad")
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "--global-batch 8 is not a multiple of the 3 processes" in err


# ------------------------------------------------- the main job (cugru.train), data-parallel
def _main_job(rank, world, port, tmp_path, *extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONPATH=ROOT)
    if world == 1:
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k)
    return subprocess.Popen([sys.executable, "-m", "cugru.train", "--device", "cpu",
                             "--epochs", "2", "--hidden", "16", "--batch", "32", "--plot", "",
                             "--no-progress", *extra], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_the_main_job_over_two_processes_follows_the_one_process_curve(tmp_path):
    """Each process takes half of every batch, their gradient buffers (FlatGrads) are
    summed through gloo, every process takes the same step: the loss curve and the
    weights are the one-process run's within float32 rounding; rank 0 alone reports."""
    from cugru._dist import free_port
    one = _finish([_main_job(0, 1, 0, tmp_path, "--save", str(tmp_path / "one.npz"))])
    port = free_port()
    two = _finish([_main_job(r, 2, port, tmp_path, "--save", str(tmp_path / "two.npz"))
                   for r in (0, 1)])
    assert two[1][0] == "" and "data-parallel over 2 processes" in two[0][0]

    def curve(out):
        return np.array([[float(ln.split()[i]) for i in (3, 6)] for ln in out.splitlines()
                         if ln.startswith("epoch")])      # (loss, held-out accuracy)
    np.testing.assert_allclose(curve(two[0][0]), curve(one[0][0]), rtol=1e-6)
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-5, err_msg=k)
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a.files) > 0   # (two real runs)


def test_the_main_job_s_processes_that_cannot_share_or_never_come_are_errors(tmp_path):
    from cugru._dist import free_port
    p = _main_job(0, 3, free_port(), tmp_path)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "--batch 32 is not a multiple of the 3 processes" in err
    start = time.perf_counter()
    p = _main_job(0, 2, free_port(), tmp_path, "--timeout", "3")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1 and "the processes did not all meet" in err
    assert "Traceback" not in err and time.perf_counter() - start < 100
    p = subprocess.Popen([sys.executable, "-m", "cugru.train", "--device", "cpu", "--gpus", "2"],
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "--gpus runs one process per GPU; --device cpu" in err


def test_one_process_on_the_data_parallel_path_is_the_plain_run_bit_for_bit(tmp_path):
    """A launcher's single process (WORLD_SIZE=1, as --gpus 1 starts it) takes the
    data-parallel path (gloo's rendezvous, an all-reduce of the loss and of the gradient
    buffer every step, a sum over one process): the plain run's losses and weights, bit
    for bit."""
    from cugru._dist import FORCE, free_port
    plain = _finish([_main_job(0, 1, 0, tmp_path, "--save", str(tmp_path / "plain.npz"))])
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=ROOT, **{FORCE: "1"})
    q = subprocess.Popen([sys.executable, "-m", "cugru.train", "--device", "cpu", "--epochs",
                          "2", "--hidden", "16", "--batch", "32", "--plot", "",
                          "--no-progress", "--save", str(tmp_path / "one.npz")], env=env,
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    (out, err), = _finish([q])
    assert "data-parallel over 1 processes" in out
    assert [ln for ln in out.splitlines() if ln.startswith("epoch")] == \
        [ln for ln in plain[0][0].splitlines() if ln.startswith("epoch")]
    a, b = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "one.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_the_watchdog_leaves_a_healthy_run_alone_and_stops_a_stalled_one(tmp_path):
    """A data-parallel process that takes a step (or an evaluation) at least every
    --timeout seconds runs to its end however long it trains; one whose peer stalls stops
    with a one-line error once --timeout passes."""
    from cugru._dist import FORCE, free_port
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), PYTHONPATH=ROOT, **{FORCE: "1"})
    start = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "cugru.train", "--device", "cpu", "--epochs",
                          "80", "--hidden", "16", "--plot", "", "--no-progress", "--timeout",
                          "1"], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    (out, err), = _finish([p])
    # (minus about a second of start-up, the training outlasts --timeout 1 by far)
    assert time.perf_counter() - start > 3 and "epoch  80" in out
    code = ("import time, cugru._dist as d; w = d.Watchdog(1, 1.0); w.beat(); "
            "time.sleep(5); print('not stopped')")
    q = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 3 and "rank 1: no progress for 1 s" in q.stderr
    assert "not stopped" not in q.stdout
    # resting (pause) watches nothing; the next beat watches again
    code = ("import time, cugru._dist as d; w = d.Watchdog(2, 1.0); w.pause(); "
            "time.sleep(2.5); print('rested', flush=True); w.beat(); time.sleep(5); "
            "print('not stopped')")
    q = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 3 and "rank 2: no progress for 1 s" in q.stderr
    assert "rested" in q.stdout and "not stopped" not in q.stdout


SLOW_IMPORTS = """import sys, time
class _Slow:
    def find_spec(self, name, path=None, target=None):
        if name in ("torch", "sklearn"):
            time.sleep(3)
sys.meta_path.insert(0, _Slow())
"""


def test_slow_imports_are_not_waits_for_the_others(tmp_path):
    """On a host where torch and sklearn take seconds to import (as on some GPU machines),
    the watchdog neither stops a healthy run with --timeout 1 nor beats gloo's own error to
    a process that never comes: the imports and the loading are this process's own work."""
    from cugru._dist import FORCE, free_port
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SLOW_IMPORTS)
    base = dict(os.environ, PYTHONPATH=f"{slow}{os.pathsep}{ROOT}", MASTER_ADDR="127.0.0.1")
    run = [sys.executable, "-m", "cugru.train", "--device", "cpu", "--hidden", "16", "--plot",
           "", "--no-progress"]
    p = subprocess.Popen(run + ["--epochs", "2", "--timeout", "1"], env=dict(
        base, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_PORT=str(free_port()),
        **{FORCE: "1"}), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    (out, err), = _finish([p])
    assert "epoch   2" in out
    q = subprocess.Popen(run + ["--timeout", "3"], env=dict(
        base, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_PORT=str(free_port())),
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = q.communicate(timeout=120)
    assert q.returncode == 1 and "the processes did not all meet" in err


def _gpu_run(tmp_path, name, epochs, hidden, *extra):
    """The main job on the GPU (--epochs, --hidden, more flags), its weights saved to
    tmp_path/<name>.npz; returns what it printed."""
    p = subprocess.Popen([sys.executable, "-m", "cugru.train", "--device", "gpu", "--epochs",
                          epochs, "--hidden", hidden, "--plot", "", "--no-progress", "--save",
                          str(tmp_path / f"{name}.npz"), *extra],
                         env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    (out, err), = _finish([p])
    return out


@pytest.mark.gpu
def test_the_nccl_path_with_one_gpu_is_the_plain_run(tmp_path):
    """--gpus 1: one process through NCCL (cupyx.distributed: its rendezvous and an
    all-reduce of the loss and of the gradient buffer every step) on the GPU gives the
    plain GPU run's bits (a sum over one process is an identity)."""
    runs = {}
    for name, extra in (("plain", []), ("nccl", ["--gpus", "1"])):
        out = _gpu_run(tmp_path, name, "2", "16", *extra)
        runs[name] = [ln for ln in out.splitlines() if ln.startswith("epoch")]
    assert runs["nccl"] == runs["plain"]
    a, b = np.load(tmp_path / "plain.npz"), np.load(tmp_path / "nccl.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


# ------------------------------------------------------------------ two GPUs or more, NCCL
def _gpu_count():
    from cukernels import runtime
    cupy = runtime.cupy_module()
    return cupy.cuda.runtime.getDeviceCount() if runtime.gpu_available() else 0


two_gpus = pytest.mark.skipif("_gpu_count() < 2", reason="needs two CUDA GPUs")


@pytest.mark.gpu
@two_gpus
def test_ddp_on_two_gpus_ends_with_the_weights_of_one_gpu_on_the_whole_batch(tmp_path):
    """cugru.ddp under NCCL, float64: two GPUs, each on half of every global batch, end
    where one GPU on the whole batch ends (DDP averages the two halves' gradients)."""
    gpu_args = ["--device", "cuda", "--dtype", "float64", "--steps", "5", "--global-batch",
                "64", "--hidden", "32", "--every", "1"]
    saved = {}
    for world in (1, 2):
        path = tmp_path / f"w{world}.npz"
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       PYTHONPATH=ROOT)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "cugru.ddp", *gpu_args, "--init-method",
                 f"file://{tmp_path / f'store{world}'}", "--save", str(path)], env=env,
                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out = _finish(procs)
        assert len(out[0][0].splitlines()) == 5 and (world == 1 or out[1][0] == "")
        saved[world] = np.load(path)
    a, b = saved[1], saved[2]
    assert "gru.weight_hh_l1_reverse" in a.files
    for k in a.files:       # (the losses among them: the same curve, step by step)
        np.testing.assert_allclose(b[k], a[k], rtol=1e-10, atol=1e-12, err_msg=k)
    assert len(set(a["losses"].tolist())) == 5          # (five steps that trained)


@pytest.mark.gpu
@two_gpus
def test_the_main_job_on_two_gpus_follows_the_one_gpu_curve(tmp_path):
    """cugru.train --gpus 2 (two processes, NCCL, one gradient buffer all-reduced a step)
    against the plain run on one GPU, same seed and global batch: the loss curve and the
    weights within float32 rounding, and the two runs are not the same computation."""
    runs = {}
    for name, extra in (("one", []), ("two", ["--gpus", "2"])):
        out = _gpu_run(tmp_path, name, "3", "32", *extra)
        runs[name] = np.array([[float(ln.split()[i]) for i in (3, 6)] for ln in
                               out.splitlines() if ln.startswith("epoch")])
        assert len(runs[name]) == 3
        if name == "two":
            assert "data-parallel over 2 processes" in out
    np.testing.assert_allclose(runs["two"], runs["one"], rtol=1e-5)
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-4, err_msg=k)
    assert max(float(np.abs(a[k] - b[k]).max()) for k in a.files) > 0


# --------------------------------------------------------------------------- bench.scaling
def test_the_scaling_benchmark_runs_every_engine_on_one_and_two_cpu_processes(tmp_path):
    """bench.scaling on the CPU (gloo, the oracle), tiny: a row for every engine and
    process count, each trained (finite losses, a rate), and the table says what it
    measured; its bad flags are one-line errors."""
    import json
    out = tmp_path / "scaling.json"
    p = subprocess.run([sys.executable, "-m", "bench.scaling", "--device", "cpu", "--gpus",
                        "1,2", "--hidden", "8", "--inputs", "4", "--seq", "3", "--batch", "4",
                        "--steps", "2", "--warmup", "6", "--json", str(out)],
                       env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    rows = json.load(open(out))["rows"]
    assert [(r["engine"], r["gpus"]) for r in rows] == [
        (e, n) for e in ("cugru-ddp", "cudnn-ddp", "cugru-cupy") for n in (1, 2)]
    for r in rows:
        assert r["batch"] == 4 and r["steps"] == 2 and r["seconds"] > 0
        # (every process's rows count: N x B rows a step)
        assert r["samples_per_s"] == pytest.approx(r["gpus"] * 4 * 2 / r["seconds"])
        assert len(r["losses"]) == 7 and all(np.isfinite(r["losses"]))
        assert r["losses"][-1] < r["losses"][0], r        # (it trains)
    # each process draws rows of its own: the CuPy path's loss, a sum over the processes,
    # is not twice the one-process loss
    cupy = {r["gpus"]: r["losses"][0] for r in rows if r["engine"] == "cugru-cupy"}
    assert abs(cupy[2] - 2 * cupy[1]) > 1e-3 * cupy[1]
    assert "| cugru-cupy | 2 | 8 |" in p.stdout and "Goal: >= 1.8x" in p.stdout
    for flags, msg in ((["--engines", "nope"], "--engines: unknown nope"),
                       (["--gpus", "0"], "every count must be >= 1"),
                       (["--gpus", "a"], "--gpus must be counts"),
                       (["--timeout", "0"], "--timeout must be > 0"),
                       (["--json", str(tmp_path / "no" / "x.json")], "its folder does not exist")):
        q = subprocess.run([sys.executable, "-m", "bench.scaling", "--device", "cpu", *flags],
                           env=dict(os.environ, PYTHONPATH=ROOT), cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 2 and msg in q.stderr


def test_the_scaling_table_says_what_failed_and_claims_no_goal_it_did_not_measure():
    from bench.scaling import markdown
    ok = {"engine": "cugru-ddp", "batch": 4, "ms_per_step": 1.0, "device_name": "cpu"}
    rows = [dict(ok, gpus=1, samples_per_s=100.0), dict(ok, gpus=2, samples_per_s=190.0),
            {"engine": "cudnn-ddp", "gpus": 1, "error": "exit 1"},
            {"engine": "cudnn-ddp", "gpus": 2, "error": "exit 1"},
            {"engine": "cugru-cupy", "gpus": 1, "error": "exit 3"},
            dict(ok, engine="cugru-cupy", gpus=2, samples_per_s=150.0)]
    text = "\n".join(markdown(rows, "tiny"))
    assert "| cudnn-ddp | 2 | failed (exit 1) |" in text
    assert text.endswith("Goal: >= 1.8x the one-device rate on 2 devices: met by cugru-ddp "
                         "1.90x; not measured for cudnn-ddp (failed on 2), cugru-cupy (no "
                         "1-device rate).")
    rows[1]["samples_per_s"] = 150.0
    assert "missed by cugru-ddp 1.50x" in markdown(rows, "tiny")[-1]
    assert markdown(rows[:1], "tiny")[-1].endswith("no 2-device row.")
