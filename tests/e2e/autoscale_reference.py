"""What tests/e2e/test_autoscaler.py compares a stopped and resumed job's final weights with: the same training
run in the test's own process, never stopped.

The scenarios' jobs differ from one another in name only, which no batch or initial weight depends on, so one
run serves them all: it is trained once, in a background thread from the moment the cluster is up (its seconds
of CPU falls in the cluster's waits instead of after a scenario). A job whose spec or strategy differs in
anything else gets a run of its own when asked.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any


class Uninterrupted:
    def __init__(self, spec: dict[str, Any], strategy: dict[str, Any], folder: Path) -> None:
        self._folder = folder
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-run")
        self._runs: dict[str, Future[tuple[int, dict[str, Any]]]] = {}
        self._start(spec, strategy)

    def weights(self, job: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(step, model state) of the last checkpoint of an uninterrupted run of ``job`` (the API's job: its spec
        and plan)."""
        return self._start(job["spec"], job["plan"]["chosen"]["estimate"]["strategy"]).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _start(self, spec: dict[str, Any], strategy: dict[str, Any]) -> Future[tuple[int, dict[str, Any]]]:
        from planner.spec import spec_from_dict

        spec = {**spec_from_dict(spec).model_dump(mode="json"), "name": "reference"}  # as the server stores it
        key = json.dumps([spec, strategy], sort_keys=True)
        if key not in self._runs:
            self._runs[key] = self._pool.submit(self._train, spec, strategy, self._folder / f"run-{len(self._runs)}")
        return self._runs[key]

    @staticmethod
    def _train(spec: dict[str, Any], strategy: dict[str, Any], folder: Path) -> tuple[int, dict[str, Any]]:
        from planner.spec import spec_from_dict
        from planner.types import Strategy
        from workers.checkpoint.local import open_store
        from workers.train.loop import TrainJob, run_training
        from workers.train.state_load import read_checkpoint_state

        job = TrainJob(job_id="reference", spec=spec_from_dict(spec), strategy=Strategy.model_validate(strategy),
                       checkpoint_uri=str(folder), cpu_threads=1, log_every_s=0.0)
        run_training(job)
        found = read_checkpoint_state(open_store(str(folder)))
        assert found is not None, "the reference run left no checkpoint"
        return found[0], dict(found[1])
