"""bench/ scripts as modules, for the tests of their own machinery (bench/ is scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_script(name: str, as_module: str) -> ModuleType:
    """``bench/<name>.py`` imported as ``as_module`` (registered in sys.modules, as its dataclasses need); ``name``
    includes the group folder, e.g. ``spot/spot``."""
    spec = importlib.util.spec_from_file_location(as_module, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[as_module] = module
    spec.loader.exec_module(module)
    return module
