"""Every Python example of the README and docs/ runs: on numpy in CI (the oracle), and with
cupy on a GPU (the kernels). The examples of one file run in order in one namespace, as a
reader would type them."""
import pathlib
import re

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def examples(path):
    return _BLOCK.findall(path.read_text())


def run(path, numpy_to="numpy"):
    namespace = {"__name__": f"example of {path.name}"}
    for k, code in enumerate(examples(path)):
        if numpy_to != "numpy":
            code = code.replace("import numpy as xp", f"import {numpy_to} as xp")
        try:
            exec(compile(code, f"{path.name}, example {k + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"{path.name}, example {k + 1} fails: {e!r}\n{code}") from e
    return namespace


def test_the_readme_and_the_api_have_examples():
    assert len(examples(ROOT / "README.md")) >= 2
    assert len(examples(ROOT / "docs" / "api.md")) >= 2
    for path in FILES:
        for code in examples(path):
            assert not re.search(r"^\s*import cupy", code, re.M), \
                f"{path.name}: examples start from numpy (import numpy as xp)"


@pytest.mark.parametrize("path", [p for p in FILES if examples(p)], ids=lambda p: p.name)
def test_examples_run_on_numpy(path):
    ns = run(path)
    if "y" in ns and hasattr(ns["y"], "dtype"):
        assert isinstance(ns["y"], np.ndarray)


@pytest.mark.gpu
@pytest.mark.parametrize("path", [p for p in FILES if examples(p)], ids=lambda p: p.name)
def test_examples_run_on_the_gpu(path):
    import cupy
    ns = run(path, "cupy")
    if "y" in ns and hasattr(ns["y"], "dtype"):
        assert isinstance(ns["y"], cupy.ndarray)
