"""Test doubles at the scheduler's boundaries: a clock the test moves and an executor whose
attempts end when the test says (the real executors are exercised in tests/workers and e2e)."""

from __future__ import annotations

import itertools
import threading
import uuid
from datetime import UTC, datetime, timedelta

from errors import ExecutionError, Infeasible, NotFound
from workers.executors.protocol import BootState, RunProgress, RunRequest, RunState, RunStatus


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
        self.progress: dict[str, RunProgress] = {}  # what status() reports per handle (default: none yet)
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
                         progress=self.progress.get(handle, RunProgress()),
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



class BootingExecutor(ScriptedExecutor):
    """A ScriptedExecutor that boots ahead (``workers.executors.protocol.BootsAhead``): a boot stays BOOTING until the
    test sets ``boots[token]``; records every boot request and every release."""

    def __init__(self) -> None:
        super().__init__()
        self.boots: dict[str, BootState] = {}
        self.boot_requests: dict[str, RunRequest] = {}
        self.unbooted: list[str] = []
        self.unreadable = 0  # boot_state raises ExecutionError this many more times (a cluster that did not answer)

    def boot(self, request: RunRequest) -> str:
        token = f"boot{len(self.boot_requests) + 1}-{request.job_id}"
        self.boot_requests[token] = request
        self.boots[token] = BootState.BOOTING
        return token

    def boot_state(self, token: str) -> BootState:
        if self.unreadable > 0:
            self.unreadable -= 1
            raise ExecutionError(f"boot {token}: the cluster did not answer")
        return self.boots.get(token, BootState.GONE)

    def unboot(self, token: str) -> None:
        self.unbooted.append(token)
        self.boots.pop(token, None)
