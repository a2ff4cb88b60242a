"""pytest-benchmark entry points: every case of bench/cases.py and the GRU's shapes, ours and
each baseline.

    pytest bench/ --benchmark-group-by=group

pytest-benchmark times with the host clock, so each timed call synchronizes the device;
arrays are built and kernels compiled (one warm-up call) before timing starts.
"""
import pytest

from cukernels import runtime

pytestmark = pytest.mark.skipif(not runtime.gpu_available(), reason="no CUDA GPU with CuPy")


def _cases():
    if not runtime.gpu_available():
        return []
    from bench import cases
    out = []
    for make in cases.GROUPS.values():
        for b in make():
            out.append(pytest.param(b.name, "ours", b.ours, id=f"{b.name}-ours"))
            out += [pytest.param(b.name, label, fn, id=f"{b.name}-{label}")
                    for label, fn in b.baselines.items()]
    return out


@pytest.mark.parametrize("case,impl,fn", _cases())
def test_benchmark(benchmark, case, impl, fn):
    import cupy as cp
    benchmark.group = case
    benchmark.extra_info["impl"] = impl

    def timed():
        fn()
        cp.cuda.get_current_stream().synchronize()
        cp.cuda.Device().synchronize()   # torch launches on the legacy default stream too

    timed()
    benchmark.pedantic(timed, rounds=20, warmup_rounds=2)


def _gru_cases():
    if not runtime.gpu_available():
        return []
    import cupy as cp

    from bench import gru, shapes, timing
    torch = timing.torch_cuda()
    out = []
    for sid, (T, B, I, H, bi) in shapes.SHAPES.items():
        p = shapes.make_problem(T, B, I, H, bi)
        calls = {f"ours {label} {kind}": fn for label, path in gru.OURS.items()
                 if path != "fast" or gru.fast_info(p) is not None
                 for kind, fn in zip(("train", "infer"), gru.ours_calls(p, cp, path))}
        if torch is not None:
            for label, tf32 in (("cuDNN strict", False), ("cuDNN TF32", True)):
                calls.update({f"{label} {kind}": fn for kind, fn in
                              zip(("train", "infer"), gru.torch_gru_calls(torch, p, "cuda", tf32))})
        out += [pytest.param(f"GRU {sid}", label, fn, id=f"gru-{sid}-{label}")
                for label, fn in calls.items()]
    return out


@pytest.mark.parametrize("case,impl,fn", _gru_cases())
def test_gru_benchmark(benchmark, case, impl, fn):
    test_benchmark(benchmark, case, impl, fn)
