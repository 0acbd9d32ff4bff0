"""What the workers run: the catalog's support record (``catalog/data/support.yaml``), the one value
the planner is also given, so a plan never holds a strategy the workers refuse.

The record names kinds of planner.strategies' registry (checked when it is read); a kind the registry defines
and the record does not list as run is refused here with the record's reason, or "no code path" for a kind
it does not name at all. :func:`strategy_problem` is the workers' own refusal, independent of the device; the
run-time checks of the device itself (fp8 units, CUDA for 4-bit and 8-bit paths) stay in workers.train.setup.
"""

from __future__ import annotations

import functools

from catalog.loader import load_support
from catalog.schema import StackSupport
from errors import CatalogError
from planner.capability import registry_problems
from planner.types import Strategy


@functools.cache
def supported() -> StackSupport:
    """The packaged record (read once), refused when it names a kind the registry does not define."""
    record = load_support()
    problems = registry_problems(record)
    if problems:
        raise CatalogError(f"catalog/data/support.yaml: {'; '.join(problems)}",
                           hint="name the kinds of planner/strategies.py, or add the kind there first")
    return record


def strategy_problem(strategy: Strategy, support: StackSupport | None = None) -> tuple[str, str] | None:
    """``(spec path, why)`` when the workers do not run ``strategy``; None when they do."""
    record = support or supported()
    if strategy.task == "infer":
        inf = record.workers.infer
        checks = [("infer.weights", inf.weights.problem("weights", strategy.weights)),
                  ("train.tensor_parallel", inf.tensor_parallel.problem("tensor_parallel", strategy.tensor_parallel)),
                  ("resources.accelerators", inf.gpus.problem("gpus", strategy.gpu_count))]
    else:
        t = record.workers.train
        checks = [("train.sharding", t.sharding.problem("sharding", strategy.sharding)),
                  ("train.precision", t.precision.problem("precision", strategy.precision)),
                  ("train.optimizer", t.optimizer.problem("optimizer", strategy.optimizer)),
                  ("train.finetune", t.finetune.problem("finetune", strategy.finetune)),
                  ("train.tensor_parallel", t.tensor_parallel.problem("tensor_parallel", strategy.tensor_parallel)),
                  ("train.pipeline_parallel",
                   t.pipeline_parallel.problem("pipeline_parallel", strategy.pipeline_parallel))]
    for path, problem in checks:
        if problem is not None:
            return path, problem
    return None
