"""Test doubles at the scheduler's boundaries: a clock the test moves and an executor whose
attempts end when the test says (the real executors are exercised in tests/workers and e2e)."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import UTC, datetime, timedelta

from catalog.errors import Infeasible, NotFound
from workers.executor import RunRequest, RunState, RunStatus


class FakeClock:
    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, **kwargs: float) -> None:
        with self._lock:
            self.now += timedelta(**kwargs)


class ScriptedExecutor:
    """Attempts stay RUNNING until ``finish(handle, state)``; records every submit and cancel."""

    def __init__(self, infeasible: str | None = None) -> None:
        self.requests: dict[str, RunRequest] = {}
        self.states: dict[str, RunState] = {}
        self.cancelled: list[str] = []
        self.infeasible = infeasible
        self.metrics: dict[str, dict[str, float]] = {}
        self.backoffs: dict[str, list[dict[str, int]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def feasibility(self, request: RunRequest) -> str | None:
        return self.infeasible

    def submit(self, request: RunRequest) -> str:
        if self.infeasible:
            raise Infeasible(self.infeasible)
        with self._lock:
            handle = f"h{next(self._ids)}-{uuid.uuid4().hex[:6]}-{request.job_id}"
            self.requests[handle] = request
            self.states[handle] = RunState.RUNNING
        return handle

    def status(self, handle: str) -> RunStatus:
        if handle not in self.states:
            raise NotFound(f"unknown handle {handle}")
        return RunStatus(handle=handle, state=self.states[handle], message=f"scripted {self.states[handle]}",
                         metrics=self.metrics.get(handle, {}), oom_backoffs=self.backoffs.get(handle, []))

    def logs(self, handle: str, since: int = 0) -> list[str]:
        return [f"{handle} line {i}" for i in range(3)][since:]

    def cancel(self, handle: str) -> None:
        self.cancelled.append(handle)
        if handle in self.states and not self.states[handle].finished:
            self.states[handle] = RunState.CANCELLED

    def active(self) -> list[str]:
        return [h for h, s in self.states.items() if not s.finished]

    def finish(self, handle: str, state: RunState, metrics: dict[str, float] | None = None,
               oom_backoffs: list[dict[str, int]] | None = None) -> None:
        self.metrics[handle] = metrics or {}
        self.backoffs[handle] = oom_backoffs or []
        self.states[handle] = state

    def running(self) -> list[str]:
        return self.active()

    def handle_of(self, job_id: str) -> str:
        return next(h for h, r in reversed(self.requests.items()) if r.job_id == job_id)


class SleepExecutor:
    """Runs each attempt as a thread that 'works' ``seconds`` of wall time and checkpoints its
    progress (seconds done) under the job's checkpoint_uri, so a later attempt resumes. Attempts
    die with the process, as in-process runs do; each start is appended to ``journal``.

    ``hold``: a file listing job names, one a line. An attempt of a job listed there, once it has
    checkpointed ``seconds / 4``, waits while its name is listed, and appends its handle to
    ``<hold>.held`` as it starts to wait: a test holds attempts mid-run instead of racing them."""

    def __init__(self, seconds: float, journal: str, hold: str | None = None) -> None:
        self.seconds = seconds
        self.journal = journal
        self.hold = hold
        self._runs: dict[str, tuple[RunRequest, threading.Thread, list[str]]] = {}
        self._states: dict[str, RunState] = {}
        self._stop: set[str] = set()
        self._lock = threading.Lock()

    def feasibility(self, request: RunRequest) -> str | None:
        return None

    def submit(self, request: RunRequest) -> str:
        import os

        handle = f"{request.job_id}.{request.attempt}.{uuid.uuid4().hex[:6]}"
        logs: list[str] = []
        thread = threading.Thread(target=self._run, args=(handle, request, logs), daemon=True)
        with self._lock:
            self._runs[handle] = (request, thread, logs)
            self._states[handle] = RunState.RUNNING
            with open(self.journal, "a") as f:
                f.write(f"{os.getpid()} {request.job_id} {request.attempt} {handle}\n")
        thread.start()
        return handle

    def _run(self, handle: str, request: RunRequest, logs: list[str]) -> None:
        import os
        import time
        from pathlib import Path

        ckpt = Path(request.checkpoint_uri)
        ckpt.mkdir(parents=True, exist_ok=True)
        marker = ckpt / "progress"
        done = float(marker.read_text()) if marker.exists() else 0.0
        logs.append(f"attempt {request.attempt} resumes at {done:.1f}s of {self.seconds}s")
        announced = False
        while done < self.seconds:
            if handle in self._stop:
                self._states[handle] = RunState.CANCELLED
                return
            if done >= self.seconds / 4 and self._held(request.spec.name):
                if not announced:
                    with open(f"{self.hold}.held", "a") as f:
                        f.write(f"{handle}\n")
                    announced = True
                time.sleep(0.05)
                continue
            time.sleep(0.1)
            done += 0.1
            tmp = ckpt / f"progress.{os.getpid()}"
            tmp.write_text(f"{done:.3f}")
            tmp.replace(marker)
        logs.append("done")
        self._states[handle] = RunState.SUCCEEDED

    def _held(self, name: str) -> bool:
        from pathlib import Path

        if self.hold is None or not Path(self.hold).exists():
            return False
        return name in Path(self.hold).read_text().split()

    def status(self, handle: str) -> RunStatus:
        if handle not in self._states:
            raise NotFound(f"unknown handle {handle}")
        return RunStatus(handle=handle, state=self._states[handle])

    def logs(self, handle: str, since: int = 0) -> list[str]:
        if handle not in self._runs:
            raise NotFound(f"unknown handle {handle}")
        return list(self._runs[handle][2][since:])

    def cancel(self, handle: str) -> None:
        self._stop.add(handle)

    def active(self) -> list[str]:
        return [h for h, s in self._states.items() if not s.finished]
