"""``python -m tests.e2e.autoscale_server GATE_DIR -- gpuplan server ARGS``: the real ``gpuplan server``, whose
Ray executor is given what a CPU-only box needs and a test hold on each job (``JobGate``):

- gloo: the local nodes' GPUs are logical (one CPU stands in for each), so NCCL has nothing to run on;
- one torch thread per worker, and a log line at every step;
- Ray Train's tries to place a waiting run's workers end after ``START_TIMEOUT_S`` (the executor's default is
  10 s): a run stopped while it waits (a cancel, a changeover off a type whose launches fail) stops at the end
  of the try, and until then its request keeps the autoscaler launching for it;
- ``JobGate``: a job's ranks wait before a step the test names in ``GATE_DIR/<job id>.hold``, so the test
  acts at a known step instead of racing a fast job (files: the hook is pickled to every node).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class JobGate:
    """Holds job J's training before step N while ``GATE_DIR/J.hold`` (or ``default.hold``) says N, and writes
    ``J.held`` (the step it waits at); lets go once Ray Train tells the worker of a spot notice, so the notice
    is acted on."""

    path: str

    def __call__(self, step: int, where: str) -> None:
        if where != "forward":
            return
        import ray.train

        job = ray.train.get_context().get_experiment_name()
        hold, held = Path(self.path) / f"{job}.hold", Path(self.path) / f"{job}.held"
        announced = False
        while (target := self._target(hold)) is not None and step >= target:
            if ray.train.get_preemption_info() is not None:
                return
            if not announced:
                tmp = held.with_name(f"{held.name}.{os.getpid()}.tmp")
                tmp.write_text(str(step))
                tmp.replace(held)
                announced = True
            time.sleep(0.05)

    def _target(self, hold: Path) -> int | None:
        """The job's own hold (a step, or anything else for none), else ``default.hold`` (set before a
        submit, so a job that starts at once cannot run past the step)."""
        if hold.exists():
            return _read_int(hold)
        return _read_int(Path(self.path) / "default.hold")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def main(argv: list[str]) -> None:
    gate_dir, rest = argv[0], argv[argv.index("--") + 1:]
    import scheduler.composition as composition

    make_executor = composition.make_executor

    def cpu_box_executor(kind: str, **options: Any) -> Any:
        executor: Any = make_executor(kind, **options)
        executor._backend, executor._cpu_threads, executor._log_every_s = "gloo", 1, 0.0
        executor._step_hook = JobGate(gate_dir)
        executor._start_timeout_s = START_TIMEOUT_S
        return executor

    composition.make_executor = cpu_box_executor
    from cli import app

    sys.argv = ["gpuplan", *rest]
    app()


if __name__ == "__main__":
    main(sys.argv[1:])
