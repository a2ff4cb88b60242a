"""tools/ scripts loaded as modules by the tests (tools/ is no package)."""
import importlib.util
import os

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


def load(name):
    """tools/`name` (a file name) loaded as a module"""
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(TOOLS, name))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
