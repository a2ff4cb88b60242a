"""The main job on the CPU: it trains (the loss falls) and classifies digits well."""
import pytest

pytest.importorskip("sklearn")

from cukernels import demo  # noqa: E402


@pytest.mark.parametrize("optimizer", demo.OPTIMIZERS)
def test_demo_trains_on_the_cpu(optimizer):
    r = demo.train(device="cpu", epochs=4, optimizer=optimizer, verbose=False)
    losses = [loss for loss, _ in r["history"]]
    assert losses[-1] < 0.6 * losses[0]
    assert r["accuracy"] > 0.85


def test_demo_is_repeatable():
    a = demo.train(device="cpu", epochs=2, verbose=False)
    b = demo.train(device="cpu", epochs=2, verbose=False)
    assert a["history"] == b["history"]
