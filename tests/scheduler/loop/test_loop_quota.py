"""The scheduling loop's admission: GPU quotas under a moving clock and concurrent submits, and the spend
it records per team (real databases, a scripted executor)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlmodel import col, select

from errors import LimitExceeded
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, JobCreate, TeamCreate, TeamUpdate
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState


def test_the_gpu_quota_admits_jobs_to_run_and_over_quota_jobs_wait_with_the_reason(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    svc.create_team(ADMIN, TeamCreate(name="ml", gpu_quota=16))
    ml = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    svc.create_team(ADMIN, TeamCreate(name="research", gpu_quota=64))
    other = svc.authenticate(svc.create_token(ADMIN, "research").token)
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    first = svc.submit(ml, JobCreate(spec=spec_dict(gpus=16, name="first")))
    assert loop.tick().dispatched == [first.id]
    # Submitted while the quota is full: queued, not refused, and it says why at once.
    second = svc.submit(ml, JobCreate(spec=spec_dict(gpus=8, name="second")))
    wait = (f"waiting: 16 of 16 GPUs of team ml's quota in use by {first.id}; needs 8, starts when 8 are free")
    assert (second.state, second.message) == ("queued", wait)
    small = svc.submit(ml, JobCreate(spec=spec_dict(gpus=1, name="small"), priority=-1))
    theirs = svc.submit(other, JobCreate(spec=spec_dict(gpus=64, name="theirs")))
    # Another team's job starts; ml's lower-priority small job does not jump the queue.
    assert loop.tick().dispatched == [theirs.id]
    assert loop.tick().dispatched == []
    detail = svc.status(ml, second.id)
    assert (detail.state, detail.message) == ("queued", wait)
    assert svc.list_jobs(ml, state="queued")[0].message.startswith("waiting: ")
    assert svc.status(ml, small.id).message == (f"waiting: behind {second.id}, which team ml's GPU quota holds back "
                                                "(a team's jobs start in priority order)")
    info = svc.get_team(ml)
    assert (info.gpus_in_use, info.gpus_queued) == (16, 9)
    # Said once in the log, not once per tick.
    assert [line for line in svc.logs(ml, second.id).lines if "waiting" in line] == [
        f"{clock():%Y-%m-%dT%H:%M:%SZ} {wait}"]
    ex.finish(ex.handle_of(first.id), RunState.SUCCEEDED)
    assert loop.tick().dispatched == [second.id, small.id]
    started = svc.status(ml, second.id)
    assert (started.state, started.message) == ("running", "")
    assert svc.get_team(ml).gpus_in_use == 9
    late = svc.submit(ml, JobCreate(spec=spec_dict(gpus=8, name="late")))
    assert late.message.startswith("waiting: 9 of 16 GPUs")
    assert svc.cancel(ml, late.id).message == ""  # a cancelled job waits for nothing


def test_lowering_the_quota_under_a_queued_job_says_it_can_never_start(svc: SchedulerService, store: Store,
                                                                        clock: FakeClock) -> None:
    svc.create_team(ADMIN, TeamCreate(name="ml", gpu_quota=16))
    ml = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    job = svc.submit(ml, JobCreate(spec=spec_dict(gpus=16)))
    svc.update_team(ADMIN, "ml", TeamUpdate(gpu_quota=8))
    loop = Scheduler(store, ScriptedExecutor(), clock=clock)
    assert loop.tick().dispatched == []
    assert svc.status(ml, job.id).message == ("waiting: needs 16 GPUs, more than team ml's whole quota of 8; "
                                              "raise the quota (gpuplan team quota) or cancel the job")


def test_spend_since_a_date_and_the_admins_report_of_every_team(svc: SchedulerService, store: Store,
                                                                 clock: FakeClock) -> None:
    from scheduler.store.ledger import since_start

    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=100))
    ml = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    svc.create_team(ADMIN, TeamCreate(name="research"))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    job = svc.submit(ml, JobCreate(spec=spec_dict(spot="always")))
    loop.tick()
    clock.advance(hours=2)
    ex.finish(ex.handle_of(job.id), RunState.SUCCEEDED)
    loop.tick()  # $10/h x 2 h, recorded at 2026-01-01 02:00
    assert since_start("2026-01-01", clock()) == since_start("2h", clock()) == datetime(2026, 1, 1, tzinfo=UTC)
    clock.advance(hours=1)
    for since, total in (("2026-01-01", 20.0), ("2026-01-01T02:00", 20.0), ("2026-01-01T02:00:01", 0.0),
                         ("2026-01-01T03:00+01:00", 20.0), ("30d", 20.0)):
        assert svc.spend_report(ml, since=since_start(since, clock())).total_usd == total, since
    every = svc.spend_report(ADMIN, since=since_start("2026-01-01", clock()))
    assert every.team is None and every.jobs == [] and every.total_usd == 20.0
    assert [(t.team, t.total_usd, t.by_market, t.budget_usd, t.remaining_usd) for t in every.teams] == [
        ("ml", 20.0, {"spot": 20.0}, 100.0, 80.0), ("research", 0.0, {}, None, None)]


def test_concurrent_submits_while_the_loop_runs_never_run_more_than_the_quota(store: Store, tmp_path: Path,
                                                                               clock: FakeClock) -> None:
    # Separate service instances (separate engines) submit like separate API workers, while the
    # loop dispatches in this thread; whatever the interleaving, running GPUs stay within the quota
    # and every job runs in the end.
    services = [SchedulerService(Store(store.url), toy_plan, clock=clock, checkpoint_root=str(tmp_path))
                for _ in range(3)]
    services[0].create_team(ADMIN, TeamCreate(name="ml", gpu_quota=8))
    token = services[0].create_token(ADMIN, "ml").token
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)

    def submitter(i: int) -> None:
        who = services[i].authenticate(token)
        for j in range(6):
            services[i].submit(who, JobCreate(spec=spec_dict(gpus=1 + (i + j) % 4, name=f"w{i}-{j}")))

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()

    def running_gpus() -> int:
        with store.read() as session:
            return sum(job.gpus for attempt, job in session.exec(
                select(Attempt, Job).join(Job, col(Job.id) == col(Attempt.job_id)).where(
                    col(Attempt.ended_at).is_(None))).all())

    def settled() -> bool:
        return not any(t.is_alive() for t in threads) and all(
            j.state == "succeeded" for j in services[0].list_jobs(services[0].authenticate(token), limit=100))

    ticks_after_submits = 0  # ticking goes on while submitters run, however slowly they are scheduled
    while not settled():
        loop.tick()
        assert running_gpus() <= 8
        running = ex.running()
        if running:
            ex.finish(running[0], RunState.SUCCEEDED)
        ticks_after_submits += not any(t.is_alive() for t in threads)
        assert ticks_after_submits <= 3 * 18, "jobs left queued with room to run"
    for t in threads:
        t.join()
    jobs = services[0].list_jobs(services[0].authenticate(token), limit=100)
    assert len(jobs) == 18 and all(j.state == "succeeded" and "waiting" not in j.message for j in jobs)
    for s in services:
        s.store.dispose()


def test_a_cancelled_job_keeps_its_budget_until_the_loop_has_stopped_and_charged_it(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    """Cancelling marks the job; its attempt runs (and is billed) until the loop stops it. Releasing the estimate
    at the cancel let a new job be admitted into money about to be charged: the team went over budget (found by
    tests/scheduler/test_invariants.py)."""
    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=20.0))
    ml = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    loop = Scheduler(store, ScriptedExecutor(), clock=clock)
    running = svc.submit(ml, JobCreate(spec=spec_dict(tokens=12e6, name="running")))  # $12 at $10/h
    assert loop.tick().dispatched == [running.id]
    clock.advance(minutes=60)
    svc.cancel(ml, running.id)
    team = svc.get_team(ml)
    assert (team.spent_usd, team.reserved_usd) == (0.0, 12.0)  # the attempt is still open: still reserved
    with pytest.raises(LimitExceeded, match=r"exceeds team ml's remaining budget \$8\.00"):
        svc.submit(ml, JobCreate(spec=spec_dict(tokens=15e6, name="too-much")))
    loop.tick()  # stops the attempt and charges its hour
    team = svc.get_team(ml)
    assert (team.spent_usd, team.reserved_usd) == (10.0, 0.0)
    assert svc.submit(ml, JobCreate(spec=spec_dict(tokens=9e6, name="fits"))).state == "queued"
    assert svc.get_team(ml).spent_usd + svc.get_team(ml).reserved_usd <= 20.0
