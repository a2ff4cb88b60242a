"""cugru.qat (observers, the states before the state quantizer, the int8 export and its
integer-only inference) and the main job's --qat, on the CPU. Runs in CI."""
import numpy as np
import pytest

from cugru import QuantSpec, oracle, qat, train
from cugru.quant import fake_quant
from gru_cases import problem, weights


def test_observer_gives_torch_observer_qparams(torch, rng):
    """torch's observer keeps its range in the default dtype (float32 unless a program sets
    another; the torch fixture sets float64, so it is set back here): ours is float32's."""
    from torch.ao.quantization import MovingAverageMinMaxObserver
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:
        ours = qat.Observer(-128, 127, averaging_constant=0.05)
        ref = MovingAverageMinMaxObserver(averaging_constant=0.05, dtype=torch.qint8,
                                          quant_min=-128, quant_max=127)
        for k in range(200):
            v = (rng.standard_normal(300) * (1 + k / 4) + 0.3).astype(np.float32)
            ours.observe(v)
            ref(torch.tensor(v, dtype=torch.float32))
            s, zp, lo, hi = ours.qparams()
            ts, tzp = ref.calculate_qparams()
            assert ts.dtype == torch.float32
            assert s == float(ts) and zp == int(tzp)       # to the bit
            assert (lo, hi) == (-128, 127)
    finally:
        torch.set_default_dtype(old)


def test_observer_range_holds_zero_and_rejects_bad_input():
    o = qat.Observer(-128, 127)
    o.observe(np.array([0.5, 2.0]))
    s, zp, *_ = o.qparams()                 # the range [0, 2]: 0 is a level
    assert zp == -128 and s == pytest.approx(2 / 255)
    with pytest.raises(ValueError, match="not finite"):
        o.observe(np.array([np.nan]))
    with pytest.raises(ValueError, match="seen nothing"):
        qat.Observer().qparams()
    with pytest.raises(ValueError, match="qmin < 0 < qmax"):
        qat.Observer(0, 255)
    assert qat.Observer(np.int64(-8), np.int32(7)).qmin == -8


def test_states_before_quant_are_what_the_state_quantizer_saw(rng):
    p = problem(rng, 5, 3, 4, 6, True)
    spec = QuantSpec(8, None, (1 / 64, 0, -64, 63), gates=True)
    _, _, saved = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True,
                                     quant=spec)
    pre = qat.states_before_quant(saved)
    assert pre.shape == saved.hs[:, 1:].shape
    assert np.array_equal(fake_quant(pre, spec.h_qparams)[0], saved.hs[:, 1:])
    _, _, plain = oracle.gru_forward(p["x"], p["h0"], *weights(p), bidirectional=True)
    with pytest.raises(ValueError, match="without quant"):
        qat.states_before_quant(plain)


def test_integer_gru_matches_the_fake_quant_gru(rng):
    """int8 operands and int32 accumulation give the fake-quant model's states, up to float
    rounding (a state may land on the neighbouring level where it lies on a tie)."""
    p = problem(rng, 7, 16, 5, 12, True, with_h0=False)
    p["x"] = rng.uniform(0, 1, p["x"].shape)
    spec = QuantSpec(8, (1 / 255, -128, -128, 127), (1 / 128, 0, -128, 127), gates=True)
    _, h_n, _ = oracle.gru_forward(p["x"], None, *weights(p), bidirectional=True, quant=spec)
    exported = qat.export(spec, *weights(p))
    assert exported["w_ih_int8"].dtype == np.int8 and exported["w_ih_scale"].dtype == np.float32
    last, levels = qat.integer_gru(exported, p["x"])
    assert levels.dtype == np.int32 and levels.min() >= -128 and levels.max() <= 127
    off = np.abs(last - h_n) > 1e-9
    assert off.mean() <= 0.01 and np.abs(last - h_n).max() <= 3 / 128


def test_export_needs_int8_grids(rng):
    p = problem(rng, 2, 1, 2, 3, False)
    with pytest.raises(ValueError, match="x_qparams and h_qparams"):
        qat.export(QuantSpec(8), *weights(p))
    with pytest.raises(ValueError, match="do not fit int8"):
        qat.export(QuantSpec(8, (0.1, 0, -300, 300), (0.1, 0, -128, 127)), *weights(p))


def test_main_job_qat_reports_both_accuracies_and_the_agreement(tmp_path, capsys):
    export = tmp_path / "q.npz"
    assert train.main(["--device", "cpu", "--epochs", "3", "--hidden", "16", "--qat",
                       "--qat-epochs", "2", "--freeze-epochs", "1", "--no-progress",
                       "--plot", "", "--export", str(export)]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("QAT:"))
    assert "float 0." in line and "QAT 0." in line and "agrees" in line
    agree = float(line.split("model on ")[1].split("%")[0])
    assert agree >= 99.0
    with np.load(export) as e:
        assert e["w_hh_int8"].dtype == np.int8 and e["w_hh_scale"].shape == (2, 48)
        assert "dense" in e.files and e["h_qparams"].shape == (4,)


@pytest.mark.parametrize("argv,flag", [
    (["--export", "q.npz"], "--export needs --qat"),
    (["--qat", "--qat-epochs", "0"], "--qat-epochs"),
    (["--qat", "--qat-epochs", "2", "--freeze-epochs", "3"], "--freeze-epochs"),
])
def test_bad_qat_options_name_the_flag(capsys, monkeypatch, argv, flag):
    monkeypatch.setattr(train, "train", lambda *a, **k: pytest.fail("trained first"))
    with pytest.raises(SystemExit) as exc:
        train.main(["--device", "cpu", "--no-progress", "--plot", ""] + argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err.strip().splitlines()[-1]


def test_export_takes_one_direction_without_its_axis(rng):
    p = problem(rng, 5, 4, 3, 6, False, with_h0=False)
    spec = QuantSpec(8, (1 / 64, 0, -128, 127), (1 / 128, 0, -128, 127), gates=True)
    flat = [w[0] for w in weights(p)]                 # (3H, I), (3H, H), (3H,), (3H,)
    e = qat.export(spec, *flat)
    assert e["w_ih_int8"].shape == (1, 18, 3) and e["b_hh"].shape == (1, 18)
    last, _ = qat.integer_gru(e, p["x"])
    same, _ = qat.integer_gru(qat.export(spec, *weights(p)), p["x"])
    assert np.array_equal(last, same)
