"""`status` and `list` show a running job's newest step, %, tokens/s, loss and ETA (until now only `logs`
had them), read back from the step lines the loop copies into the job's log; and once a retry runs, the
job's message no longer shows the previous attempt's failure as its current state."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli import app
from scheduler.loop.scheduling import Scheduler
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate
from tests.scheduler.conftest import ml_team, spec_dict
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState


class StepLogs(ScriptedExecutor):
    """Each attempt's log lines are what the test gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, list[str]] = {}

    def logs(self, handle: str, since: int = 0) -> list[str]:
        return self.lines.get(handle, [])[since:]


def test_status_and_list_show_the_running_attempts_newest_step(svc: SchedulerService, store: Store,
                                                               clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict(tokens=64e6)))
    ex = StepLogs()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    assert svc.status(ml, job.id).progress is None  # running, no step reported yet
    ex.lines[ex.handle_of(job.id)] = ["loading the model", "step 8/64 loss 6.0000",
                                      "step 16/64 loss 5.1234 2,000 tokens/s", "step 16: checkpoint saved"]
    loop.tick()
    shown = svc.status(ml, job.id).progress
    assert shown is not None
    assert (shown.step, shown.total_steps, shown.percent, shown.loss, shown.tokens_per_s) == (16, 64, 25.0, 5.1234,
                                                                                              2000.0)
    assert shown.eta_s == pytest.approx(48e6 / 2000)  # the 48M tokens to go at 2,000 tokens/s
    [listed] = svc.list_jobs(ml)
    assert listed.progress == shown


def test_a_retry_shows_its_own_attempt_not_the_previous_failure(svc: SchedulerService, store: Store,
                                                                clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict(tokens=64e6)))
    ex = StepLogs()
    loop = Scheduler(store, ex, clock=clock, backoff_base_s=1.0)
    loop.tick()
    first = ex.handle_of(job.id)
    ex.lines[first] = ["step 32/64 loss 4.0000 2,000 tokens/s"]
    loop.tick()
    ex.finish(first, RunState.FAILED)
    loop.tick()
    assert svc.status(ml, job.id).message.startswith("attempt 1 failed")  # requeued: the failure is the news
    clock.advance(seconds=5)
    loop.tick()
    detail = svc.status(ml, job.id)
    assert detail.state == "running" and detail.attempts == 2
    assert detail.message.startswith("attempt 2 on ") and "(the previous attempt 1 failed" in detail.message
    assert detail.progress is None  # attempt 1's steps are not attempt 2's


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_the_cli_prints_the_progress_in_status_and_list(svc: SchedulerService, store: Store, clock: FakeClock,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict(tokens=64e6)))
    ex = StepLogs()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    ex.lines[ex.handle_of(job.id)] = ["step 16/64 loss 5.1234 2,000 tokens/s"]
    loop.tick()
    for name, value in (("GPUPLAN_DATABASE_URL", store.url), ("GPUPLAN_TEAM", "ml")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    runner = CliRunner()
    line = "step 16/64 (25%), 2,000 tokens/s, loss 5.1234, ETA 6.7 h"
    status = runner.invoke(app, ["status", job.id])
    assert status.exit_code == 0 and f"progress: {line}" in status.stdout, status.output
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0 and f"{job.id} {line}" in listed.stdout, listed.output
    [as_json] = json.loads(runner.invoke(app, ["list", "--json"]).stdout)
    assert as_json["progress"]["eta_s"] == pytest.approx(24_000)
