"""A database written by an earlier gpuplan keeps working: jobs whose plans were stored by the previous schema
version (tests/data/plans, captured from that code) are shown, run and recorded as the code that stored them
would have, on SQLite and PostgreSQL; new jobs are stored with the current version."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from planner.plan_record import PLAN_SCHEMA_VERSION
from scheduler.loop.scheduling import Scheduler
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate
from tests.scheduler.conftest import ml_team, spec_dict
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState

PLANS = Path(__file__).resolve().parents[1] / "data" / "plans"
# the job table as any version wrote it: the plan column as plain JSON, bypassing the typed column
RAW_JOB = sa.table("job", sa.column("id", sa.String), sa.column("plan", sa.JSON))


def _v1(case: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((PLANS / f"v1_{case}.json").read_text())
    return doc


def _raw_plan(store: Store, job_id: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        plan: dict[str, Any] = conn.execute(sa.select(RAW_JOB.c.plan).where(RAW_JOB.c.id == job_id)).scalar_one()
    return plan


@pytest.mark.parametrize("case", ["train_spot_auto", "train_two_nodes"])
def test_a_job_stored_by_the_previous_version_is_shown_run_and_recorded(store: Store, svc: SchedulerService,
                                                                         clock: FakeClock, case: str) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict(spot="always")))
    assert _raw_plan(store, job.id)["schema_version"] == PLAN_SCHEMA_VERSION
    v1 = _v1(case)
    with store.engine.begin() as conn:  # the row as the previous version left it
        conn.execute(sa.update(RAW_JOB).where(RAW_JOB.c.id == job.id).values(plan=v1["plan"]))
    assert "schema_version" not in _raw_plan(store, job.id)

    assert svc.status(ml, job.id).plan == v1["plan"]  # the API's JSON: what that version showed
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    assert loop.tick().dispatched == [job.id]
    request = ex.requests[ex.handle_of(job.id)]
    expected = v1["expected"]
    assert request.strategy.model_dump(mode="json") == v1["plan"]["chosen"]["estimate"]["strategy"]
    assert (request.market, request.zone) == ("spot", expected["zone"])
    assert request.mean_time_to_preemption_h == expected["mttp_h"]

    clock.advance(hours=1)
    ex.finish(ex.handle_of(job.id), RunState.SUCCEEDED, {"measured_tokens_per_s": 1000.0})
    loop.tick()
    [attempt] = svc.status(ml, job.id).attempt_list
    assert attempt.metrics is not None
    predicted = attempt.metrics["predicted"]
    assert {k: predicted[k] for k in expected["predicted"]} == expected["predicted"]
    assert _raw_plan(store, job.id) == v1["plan"]  # read, never rewritten: no data migration
