"""On the test cluster's processes only (tests/e2e/test_autoscaler.py puts this folder on their PYTHONPATH):
Ray Train asks the autoscaler for a run's workers through an AutoscalingCoordinator actor that forwards
requests every 20 s; here every second, as AUTOSCALER_UPDATE_INTERVAL_S=1 makes the autoscaler look every
second. The module is patched when something imports it, so no other process pays for importing it."""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any

_MODULE = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"
TICK_S = 1.0


class _FasterTicks(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def patched(module: Any) -> None:
            exec_module(module)
            module._AutoscalingCoordinatorActor.TICK_INTERVAL_S = TICK_S

        spec.loader.exec_module = patched  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _FasterTicks())
