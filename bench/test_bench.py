"""pytest-benchmark entry points: every case of bench/suite.py, ours and each baseline.

    pytest bench/ --benchmark-group-by=group

pytest-benchmark times with the host clock, so each timed call synchronizes the device;
arrays are built and kernels compiled (one warm-up call) before timing starts.
"""
import pytest

from cukernels import _rt

pytestmark = pytest.mark.skipif(not _rt.gpu_available(), reason="no CUDA GPU with CuPy")


def _cases():
    if not _rt.gpu_available():
        return []
    from bench import suite
    out = []
    for make in suite.GROUPS.values():
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
