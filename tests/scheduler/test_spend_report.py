"""The spend report the API, the CLI and the dashboard's Spend page share (SchedulerService.spend_report):
totals summed in the database, the top-N lines the page asks for, the remaining budget."""

from __future__ import annotations

import pytest

from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate
from tests.scheduler.conftest import ml_team, spec_dict
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState


def test_the_top_jobs_report_lists_the_costliest_and_keeps_every_jobs_totals(svc: SchedulerService, store: Store,
                                                                             clock: FakeClock) -> None:
    # The Spend page asks for the 10 costliest jobs' lines; its totals and remaining budget must
    # stay those of `gpuplan report spend` (every job), and what an active job reserves is its
    # estimate less what it already spent.
    ml = ml_team(svc, budget=1000)
    start = clock()
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    short, mid, long = (svc.submit(ml, JobCreate(spec=spec_dict(name=n))) for n in ("short", "mid", "long"))
    live = svc.submit(ml, JobCreate(spec=spec_dict(tokens=1e8, name="live")))  # estimated $100
    loop.tick()
    for job in (short, live, mid, long):  # at $10/h, ending an hour apart: $10, $20, $30, $40
        clock.advance(hours=1)
        ex.finish(ex.handle_of(job.id), RunState.PREEMPTED if job is live else RunState.SUCCEEDED)
        loop.tick()  # live is requeued and runs again: still active, with $20 spent
    full = svc.spend_report(ml, since=start)
    top = svc.spend_report(ml, since=start, top=2)
    assert full.total_usd == pytest.approx(100.0) and len(full.jobs) == 4
    assert [line.job_id for line in top.jobs] == [long.id, mid.id]
    assert (top.total_usd, top.by_market, top.remaining_usd) == (full.total_usd, full.by_market, full.remaining_usd)
    estimate = svc.status(ml, live.id).estimated_usd
    assert estimate > 20.0 and svc.status(ml, live.id).state in ("queued", "running")
    info = svc.get_team(ADMIN, "ml")
    assert info.reserved_usd == pytest.approx(estimate - 20.0) and info.spent_usd == pytest.approx(100.0)
    assert full.remaining_usd == pytest.approx(1000.0 - 100.0 - (estimate - 20.0)) == info.remaining_usd
    clock.advance(minutes=1)
    every = svc.spend_report(ADMIN, since=clock())  # an empty window: nothing in it, the budget still counts
    [only] = every.teams
    assert (only.team, only.total_usd, only.by_market) == ("ml", 0.0, {})
    assert only.remaining_usd == pytest.approx(info.remaining_usd)
