"""The main job (cugru.train and run-main-job.sh): it learns, its gradients are torch
autograd's, its CLI and its --data checks give one-line errors naming the flag. The GPU test
compares a GPU run's loss curve with the CPU run's."""
import os
import subprocess

import numpy as np
import pytest

from cugru import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import sklearn  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise RuntimeError("CI needs scikit-learn for the main job's tests: install the test "
                           "extra") from None
    pytest.skip("scikit-learn is not installed (the main job's digits)", allow_module_level=True)


def _digits_batch(B, dtype):
    X, y = train.load_digits()
    return np.ascontiguousarray(X[:B].transpose(1, 0, 2)).astype(dtype), y[:B]


def test_whole_model_gradients_equal_torch_autograd(torch, rng):
    H, C, B = 5, 10, 6
    model = train.Model(np, rng, 8, H, C, dtype=np.float64)
    x, labels = _digits_batch(B, np.float64)
    targets = np.eye(C)[labels]
    p, cache = model.probabilities(x, training=True)
    model.backward(p, targets, cache)

    gru = torch.nn.GRU(8, H, bidirectional=True).double()
    params = {n: torch.tensor(model.params[n].w) for n in ("w_ih", "w_hh", "b_ih", "b_hh")}
    with torch.no_grad():
        for name, key in (("weight_ih_l0", "w_ih"), ("weight_hh_l0", "w_hh"),
                          ("bias_ih_l0", "b_ih"), ("bias_hh_l0", "b_hh")):
            getattr(gru, name).copy_(params[key][0])
            getattr(gru, name + "_reverse").copy_(params[key][1])
    dense = torch.tensor(model.params["dense"].w, requires_grad=True)
    _, h_n = gru(torch.tensor(x))
    features = torch.cat([h_n[0], h_n[1]], dim=1)
    logits = features @ dense[:, :-1].T + dense[:, -1]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(labels), reduction="sum")
    loss.backward()

    np.testing.assert_allclose(p, torch.softmax(logits, 1).detach().numpy(), rtol=1e-12)
    # the accumulators hold the descent direction -dL/dw, summed over the batch
    np.testing.assert_allclose(-model.params["dense"].d, dense.grad.numpy(), rtol=1e-10,
                               atol=1e-12)
    for name, key in (("weight_ih_l0", "w_ih"), ("weight_hh_l0", "w_hh"),
                      ("bias_ih_l0", "b_ih"), ("bias_hh_l0", "b_hh")):
        want = np.stack([getattr(gru, name).grad.numpy(),
                         getattr(gru, name + "_reverse").grad.numpy()])
        np.testing.assert_allclose(-model.params[key].d, want, rtol=1e-10, atol=1e-12,
                                   err_msg=key)


@pytest.mark.parametrize("optimizer", train.OPTIMIZERS)
def test_training_lowers_the_loss_with_every_optimizer(optimizer):
    r = train.train("cpu", optimizer, epochs=2, hidden=16, progress=False)
    losses = r["batch_losses"]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert r["history"][1][0] < r["history"][0][0]
    assert r["accuracy"] > 0.6
    # the epoch time reported is the median after the first (here: the second epoch's)
    assert len(r["epoch_seconds"]) == 2 and min(r["epoch_seconds"]) > 0
    assert r["seconds_per_epoch"] == r["epoch_seconds"][1]
    assert r["seconds"] >= sum(r["epoch_seconds"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mixed_precision_learns_and_rounds_the_gru_s_data(dtype):
    """--dtype float16 / bfloat16: the GRU on rounded copies of float32 weights learns as
    float32 does, and its losses are not float32's (the rounding took effect)."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    ours = train.train("cpu", epochs=2, hidden=16, progress=False, dtype=dtype)
    f32 = train.train("cpu", epochs=2, hidden=16, progress=False)
    assert ours["accuracy"] > 0.6 and abs(ours["accuracy"] - f32["accuracy"]) <= 0.05
    a, b = np.array(ours["batch_losses"]), np.array(f32["batch_losses"])
    assert not np.array_equal(a, b)
    np.testing.assert_allclose(a[:20], b[:20], rtol=0.05)
    assert all(p.w.dtype == np.float32 for p in ours["model"].params.values())


def test_tf32_on_the_cpu_trains_the_strict_bits_and_bad_pairs_are_errors(capsys):
    strict = train.train("cpu", epochs=1, hidden=8, progress=False)
    tf32 = train.train("cpu", epochs=1, hidden=8, progress=False, math="tf32")
    assert strict["batch_losses"] == tf32["batch_losses"]
    with pytest.raises(ValueError, match="--qat trains in float32"):
        train.train("cpu", epochs=1, hidden=8, progress=False, qat_epochs=1, dtype="float16")
    with pytest.raises(ValueError, match="math must be one of"):
        train.train("cpu", epochs=1, hidden=8, progress=False, math="fp8")
    assert "--dtype" in _error(capsys, ["--qat", "--dtype", "bfloat16", "--plot", ""])
    assert "--math" in _error(capsys, ["--math", "fast", "--plot", ""])


def test_training_is_repeatable():
    a = train.train("cpu", epochs=1, hidden=8, progress=False)
    b = train.train("cpu", epochs=1, hidden=8, progress=False)
    assert a["batch_losses"] == b["batch_losses"]


def test_cli_trains_on_user_data_and_saves_weights(tmp_path, capsys):
    rng = np.random.default_rng(3)
    X = rng.standard_normal((60, 5, 3)).astype(np.float32)
    y = (X[:, :, 0].sum(axis=1) > 0).astype(np.int64)      # a learnable rule
    data, weights, curves = tmp_path / "d.npz", tmp_path / "w.npz", tmp_path / "c.png"
    np.savez(data, X=X, y=y)
    assert train.main(["--device", "cpu", "--data", str(data), "--epochs", "3", "--hidden", "4",
                       "--batch", "8", "--save", str(weights), "--plot", str(curves),
                       "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "ms per epoch" in out
    with np.load(weights) as w:
        assert w["w_ih"].shape == (2, 12, 3) and w["w_hh"].shape == (2, 12, 4)
        assert w["dense"].shape == (2, 9)
    assert curves.stat().st_size > 1000


BAD_DATA = [
    ("no such file", None, "no such file"),
    ("huge label", {"X": np.zeros((4, 2, 3)), "y": np.array([0, 1, 10**9, 0])}, "below 4096"),
    ("X overflows float32", {"X": np.full((4, 2, 3), 1e39), "y": np.zeros(4, int)},
     "beyond float32's range"),
    ("missing y", {"X": np.zeros((4, 2, 3))}, "missing array"),
    ("X rank", {"X": np.zeros((4, 6)), "y": np.zeros(4, int)}, "X must have shape"),
    ("y length", {"X": np.zeros((4, 2, 3)), "y": np.zeros(3, int)}, "y must have shape"),
    ("nan", {"X": np.full((4, 2, 3), np.nan), "y": np.zeros(4, int)}, "finite"),
    ("labels", {"X": np.zeros((4, 2, 3)), "y": np.array([0, 1, -1, 0])}, ">= 0"),
    ("fractional", {"X": np.zeros((4, 2, 3)), "y": np.array([0, 0.5, 1, 0])}, "integer"),
    ("one sample", {"X": np.zeros((1, 2, 3)), "y": np.zeros(1, int)}, "at least 2"),
]


@pytest.mark.parametrize("case", BAD_DATA, ids=[c[0] for c in BAD_DATA])
def test_malformed_data_file_is_a_clear_error(tmp_path, capsys, case):
    _, arrays, message = case
    path = tmp_path / "bad.npz"
    if arrays is not None:
        np.savez(path, **arrays)
    with pytest.raises(SystemExit) as exc:
        train.main(["--device", "cpu", "--data", str(path), "--no-progress", "--plot", ""])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--data" in err and message in err


def _error(capsys, argv):
    """The one-line error (exit status 2) of the CLI for argv, before any training."""
    with pytest.raises(SystemExit) as exc:
        train.main(["--device", "cpu", "--no-progress"] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return err[-1]


def test_not_an_npz_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "text.npz"
    path.write_text("not a zip file")
    assert "not a readable .npz" in _error(capsys, ["--data", str(path), "--plot", ""])
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((4, 2, 3)))
    assert "a single array (.npy)" in _error(capsys, ["--data", str(npy), "--plot", ""])
    assert "a directory" in _error(capsys, ["--data", str(tmp_path), "--plot", ""])


def test_outputs_are_checked_before_training(tmp_path, capsys, monkeypatch):
    """--save and --plot into a folder that does not exist, or --plot to a file type no
    plot can be written as, are errors before any training (a trained model is never lost)."""
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("trained first"))
    missing = tmp_path / "no" / "such"
    assert "--save" in (e := _error(capsys, ["--save", str(missing / "w.npz")])) and \
        "does not exist" in e
    assert "--plot" in (e := _error(capsys, ["--plot", str(missing / "c.png")])) and \
        "does not exist" in e
    assert "--plot" in (e := _error(capsys, ["--plot", str(tmp_path / "c.txt")])) and \
        ".png" in e
    assert "--save" in (e := _error(capsys, ["--save", str(tmp_path / "w.txt")])) and \
        ".npz" in e


@pytest.mark.parametrize("argv,flag", [(["--lr", "-1"], "--lr"), (["--lr", "nan"], "--lr"),
                                       (["--lr", "inf"], "--lr"), (["--seed", "-3"], "--seed"),
                                       (["--epochs", "0"], "--epochs"),
                                       (["--hidden", "0"], "--hidden"),
                                       (["--optimizer", "lbfgs"], "--optimizer")])
def test_bad_options_name_the_flag(capsys, monkeypatch, argv, flag):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("trained first"))
    assert flag in _error(capsys, argv + ["--plot", ""])


def test_help_shows_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit) as exc:
        train.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for action in train.parser()._actions:
        for opt in action.option_strings:
            assert opt in out
    assert "(default: 15)" in out and "(default: training-curves.png)" in out
    readme = open(os.path.join(ROOT, "README.md")).read()
    for action in train.parser()._actions:
        if action.option_strings and action.dest != "help":
            assert action.option_strings[-1] in readme, action.option_strings


def test_main_job_script_runs_where_it_is_called_and_installs_once(tmp_path):
    """run-main-job.sh from another folder: --data, --save and --plot are paths of that
    folder, and with the package installed it runs no pip (a stand-in pip that fails is
    first on the path)."""
    rng = np.random.default_rng(5)
    X = rng.standard_normal((40, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "mine.npz", X=X, y=(X[:, :, 0].sum(axis=1) > 0).astype(np.int64))
    fake = tmp_path / "fakepip" / "pip"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("raise SystemExit('pip was run')\n")
    # (the package importable from anywhere, as an install makes it)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fakepip"), ROOT]),
           "CK_REINSTALL": "0"}
    proc = subprocess.run([os.path.join(ROOT, "run-main-job.sh"), "--device", "cpu",
                           "--data", "mine.npz", "--epochs", "1", "--hidden", "4",
                           "--no-progress", "--save", "w.npz", "--plot", "c.png"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pip was run" not in proc.stderr
    assert (tmp_path / "w.npz").is_file() and (tmp_path / "c.png").is_file()
    assert not os.path.exists(os.path.join(ROOT, "w.npz"))


@pytest.mark.gpu
def test_gpu_run_follows_the_cpu_loss_curve():
    cpu = train.train("cpu", epochs=1, progress=False)
    gpu = train.train("gpu", epochs=1, progress=False)
    a, b = np.array(cpu["batch_losses"]), np.array(gpu["batch_losses"])
    assert a.shape == b.shape
    # float32 on both sides; only rounding differs (and grows slowly over the steps)
    np.testing.assert_allclose(b, a, rtol=1e-3)
    assert abs(gpu["accuracy"] - cpu["accuracy"]) <= 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,math", [("float16", "strict"), ("bfloat16", "strict"),
                                        ("float32", "tf32"), ("float16", "tf32")])
def test_a_gpu_run_in_another_precision_follows_the_cpu_run(dtype, math):
    """The GPU's mixed precision and TF32 against the CPU run of the same dtype (which
    computes strict): the losses agree to the precision's rounding, the accuracy too."""
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    cpu = train.train("cpu", epochs=1, progress=False, dtype=dtype)
    gpu = train.train("gpu", epochs=1, progress=False, dtype=dtype, math=math)
    a, b = np.array(cpu["batch_losses"]), np.array(gpu["batch_losses"])
    np.testing.assert_allclose(b, a, rtol=3e-2 if dtype == "bfloat16" else 1e-2)
    assert abs(gpu["accuracy"] - cpu["accuracy"]) <= 0.03


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_gradients_lie_in_one_buffer_packed_and_unpacked_by_name(rng, dtype):
    """FlatGrads (what a data-parallel step reduces in one call): each parameter's
    gradient is a view of one flat buffer, starting on a 16-byte boundary, the views
    disjoint; pack copies arrays in and unpack gives them back, of any buffer of the
    layout; a wrong name, shape or buffer is an error naming it. The main job's model
    keeps its accumulators there (and its QAT twin in a buffer of its own)."""
    shapes = {"a": (2, 3, 5), "b": (7,), "c": (3, 1), "d": (4, 4)}
    fg = train.FlatGrads(np, shapes, dtype)
    item = np.dtype(dtype).itemsize
    starts = sorted(o for o, _ in fg.layout.values())
    assert all(o * item % 16 == 0 for o in starts)
    arrays = {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}
    flat = fg.pack(arrays)
    assert flat is fg.flat and flat.size >= sum(a.size for a in arrays.values())
    used = np.zeros(flat.size, bool)
    for name, (o, shape) in fg.layout.items():
        n = int(np.prod(shape))
        assert not used[o:o + n].any()
        used[o:o + n] = True
        assert np.shares_memory(fg.views[name], flat)
    assert (flat[~used] == 0).all()
    other = flat * 2                              # (a buffer from elsewhere, same layout)
    for name, view in fg.unpack(other).items():
        assert np.array_equal(view, 2 * arrays[name]) and np.shares_memory(view, other)
    fg.views["b"][3] = 9.0
    assert flat[fg.layout["b"][0] + 3] == 9.0
    with pytest.raises(ValueError, match="arrays must name"):
        fg.pack({"a": arrays["a"]})
    with pytest.raises(ValueError, match=r"arrays\['c'\] has shape \(1, 3\)"):
        fg.pack({**arrays, "c": arrays["c"].reshape(1, 3)})
    with pytest.raises(ValueError, match="flat has shape"):
        fg.unpack(flat[:-1])
    model = train.Model(np, rng, 8, 5, 10, dtype=dtype)
    for name, p in model.params.items():
        assert np.shares_memory(p.d, model.grads.flat) and p.d.shape == p.w.shape
    model.params["dense"].d[...] = 1.0
    twin = model.copy()
    assert np.array_equal(twin.params["dense"].d, model.params["dense"].d)
    assert not np.shares_memory(twin.grads.flat, model.grads.flat)
    assert all(np.shares_memory(p.d, twin.grads.flat) for p in twin.params.values())
