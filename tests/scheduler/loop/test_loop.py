"""The scheduling loop on real databases with a scripted executor and a clock the test moves."""

from __future__ import annotations

import pytest
from sqlmodel import select

from errors import ExternalServiceError, NotFound
from scheduler.loop.attempt_placement import SpotChooser, StaticZones
from scheduler.loop.scheduling import Scheduler
from scheduler.service import SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import Attempt, JobCreate, Spend
from tests.scheduler.conftest import OFFER, TOY_MTTP_H, ml_team, spec_dict, spot_job, toy_plan, zone
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState


def spends(store: Store) -> list[Spend]:
    with store.read() as session:
        return list(session.exec(select(Spend).order_by(Spend.id)).all())  # type: ignore[arg-type]


def test_runs_a_job_and_charges_price_at_launch_times_duration(svc: SchedulerService, store: Store,
                                                                clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict(spot="always")))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    assert loop.tick().dispatched == [job.id]
    handle = ex.handle_of(job.id)
    request = ex.requests[handle]
    assert request.run_name == job.id and request.checkpoint_uri == job.checkpoint_uri and request.market == "spot"
    assert request.zone == "use1-az6"  # the plan's zone: on a gpuplan cluster the workers ask for its node type
    assert request.mean_time_to_preemption_h == TOY_MTTP_H  # the workers checkpoint for what the plan priced
    assert svc.status(ml, job.id).state == "running"
    clock.advance(hours=1.5)
    ex.finish(handle, RunState.SUCCEEDED)
    loop.tick()
    assert svc.status(ml, job.id).state == "succeeded"
    [row] = spends(store)
    assert (row.market, row.usd_per_h, row.hours, row.usd) == ("spot", 10.0, 1.5, 15.0)
    loop.tick()  # nothing left to do, nothing charged twice
    assert len(spends(store)) == 1
    report = svc.spend_report(ml, since=job.created_at)
    assert report.total_usd == 15.0 and report.jobs[0].job_id == job.id


def test_preempted_attempt_is_requeued_and_resumes_with_the_same_run_name(svc: SchedulerService, store: Store,
                                                                          clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    first = ex.handle_of(job.id)
    clock.advance(minutes=30)
    ex.finish(first, RunState.PREEMPTED)
    report = loop.tick()  # follow requeues, dispatch starts attempt 2 in the same tick
    assert report.requeued == [job.id] and report.dispatched == [job.id]
    second = ex.handle_of(job.id)
    assert second != first and ex.requests[second].run_name == job.id and ex.requests[second].attempt == 2
    assert ex.requests[second].checkpoint_uri == ex.requests[first].checkpoint_uri
    clock.advance(minutes=30)
    ex.finish(second, RunState.SUCCEEDED)
    loop.tick()
    detail = svc.status(ml, job.id)
    assert detail.state == "succeeded" and [a.outcome for a in detail.attempt_list] == ["preempted", "succeeded"]
    assert [s.hours for s in spends(store)] == [0.5, 0.5]
    states = [e.to_state for e in detail.events]
    assert states == ["pending", "planned", "queued", "running", "preempted", "queued", "running", "succeeded"]


def test_failures_retry_with_exponential_backoff_then_fail(svc: SchedulerService, store: Store,
                                                           clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, backoff_base_s=60)
    loop.tick()
    for delay_s in (60, 120):
        ex.finish(ex.handle_of(job.id), RunState.FAILED)
        report = loop.tick()
        assert report.requeued == [job.id] and report.dispatched == []  # waits out the backoff
        clock.advance(seconds=delay_s - 1)
        assert loop.tick().dispatched == []
        clock.advance(seconds=1)
        assert loop.tick().dispatched == [job.id]
    ex.finish(ex.handle_of(job.id), RunState.FAILED)
    loop.tick()
    detail = svc.status(ml, job.id)
    assert detail.state == "failed" and "gave up after 3 failed attempts" in detail.events[-1].reason
    assert len(detail.attempt_list) == 3 and len(spends(store)) == 3


def test_every_closed_attempt_keeps_what_it_measured_next_to_the_prediction(svc: SchedulerService, store: Store,
                                                                            clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, backoff_base_s=0)
    loop.tick()
    # a failure keeps what it measured up to the failure; a success its whole run and its OOM back-off
    ex.finish(ex.handle_of(job.id), RunState.FAILED, {"measured_peak_allocated_bytes": 3e9, "steps": 7.0})
    loop.tick()
    loop.tick()
    backoff = {"step": 3, "from_micro_batch": 4, "to_micro_batch": 2, "from_grad_accum": 1, "to_grad_accum": 2}
    ex.finish(ex.handle_of(job.id), RunState.SUCCEEDED,
              {"measured_peak_allocated_bytes": 2e9, "measured_peak_reserved_bytes": 2.1e9,
               "measured_tokens_per_s": 900.0, "checkpoint_save_s": 1.5, "micro_batch": 2.0, "grad_accum": 2.0,
               "oom_backoffs": 1.0}, [backoff])
    loop.tick()
    failed, done = svc.status(ml, job.id).attempt_list
    assert failed.outcome == "failed" and failed.metrics is not None
    assert failed.metrics["measured"]["peak_allocated_bytes"] == 3e9 and failed.metrics["measured"]["steps"] == 7.0
    assert failed.metrics["measured"]["tokens_per_s"] is None
    assert failed.metrics["predicted"]["peak_allocated_bytes"] == 1  # toy_plan's chosen estimate
    assert failed.metrics["predicted"]["tokens_per_s"] == 1000.0
    assert done.metrics is not None and done.metrics["oom_backoffs"] == [backoff]
    assert done.metrics["measured"]["tokens_per_s"] == 900.0 and done.metrics["measured"]["micro_batch"] == 2.0
    assert done.metrics["measured"]["checkpoint_save_s"] == 1.5


def test_cancel_stops_the_live_attempt_and_charges_it(svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    clock.advance(minutes=6)
    svc.cancel(ml, job.id, "wrong data")
    loop.tick()
    assert ex.cancelled == [ex.handle_of(job.id)]
    [row] = spends(store)
    assert row.hours == pytest.approx(0.1)
    assert svc.status(ml, job.id).state == "cancelled"


def test_restart_reconciles_lost_attempts_and_orphans(svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    a = svc.submit(ml, JobCreate(spec=spec_dict(name="a")))
    b = svc.submit(ml, JobCreate(spec=spec_dict(name="b")))
    dead = ScriptedExecutor()
    Scheduler(store, dead, clock=clock).tick()
    clock.advance(minutes=3)
    Scheduler(store, dead, clock=clock).tick()  # both alive: their last heartbeat
    clock.advance(minutes=12)
    # The process died: a fresh executor knows nothing of a or b, but runs an orphan nobody owns.
    fresh = ScriptedExecutor()
    orphan = fresh.submit(dead.requests[dead.handle_of(a.id)])
    loop = Scheduler(store, fresh, clock=clock)
    report = loop.reconcile()
    assert sorted(report.lost) == sorted([a.id, b.id]) and report.orphans_cancelled == [orphan]
    assert sorted(loop.tick().dispatched) == sorted([a.id, b.id])
    for job in (a, b):
        fresh.finish(fresh.handle_of(job.id), RunState.SUCCEEDED)
    loop.tick()
    with store.read() as session:
        attempts = session.exec(select(Attempt).order_by(Attempt.job_id, Attempt.number)).all()  # type: ignore[arg-type]
    assert [(x.number, x.outcome) for x in attempts] == [(1, "lost"), (2, "succeeded")] * 2
    rows = spends(store)
    assert len(rows) == 4 and len({r.attempt_id for r in rows}) == 4
    by_attempt = {x.id: x.outcome for x in attempts}
    # lost attempts are charged up to their last heartbeat (3 min), not through the 12 min the scheduler was
    # down; the new ones for their own (zero) time
    assert sorted((by_attempt[r.attempt_id], round(r.hours, 6)) for r in rows) == (
        [("lost", 0.05)] * 2 + [("succeeded", 0.0)] * 2)


def test_infeasible_job_fails_with_the_reason(svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    Scheduler(store, ScriptedExecutor(infeasible="needs 1 H100, cluster has none"), clock=clock).tick()
    detail = svc.status(ml, job.id)
    assert detail.state == "failed" and "needs 1 H100" in detail.message
    # No attempt was started (and none charged) for a job no node can ever run.
    assert detail.attempt_list == [] and spends(store) == []
    assert (detail.events[-1].from_state, detail.events[-1].to_state) == ("queued", "failed")


def test_priority_and_max_running(svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    low = svc.submit(ml, JobCreate(spec=spec_dict(name="low"), priority=0))
    high = svc.submit(ml, JobCreate(spec=spec_dict(name="high"), priority=5))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, max_running=1)
    assert loop.tick().dispatched == [high.id]
    assert loop.tick().dispatched == []
    ex.finish(ex.handle_of(high.id), RunState.SUCCEEDED)
    assert loop.tick().dispatched == [low.id]


class GrowingLogs(ScriptedExecutor):
    """Log lines appear when the test says; a forgotten attempt's logs are gone (a released Ray actor)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, list[str]] = {}
        self.forgotten: set[str] = set()

    def say(self, handle: str, *lines: str) -> None:
        self.lines.setdefault(handle, []).extend(lines)

    def logs(self, handle: str, since: int = 0) -> list[str]:
        if handle in self.forgotten:
            raise NotFound(f"unknown handle {handle}")
        return self.lines.get(handle, [])[since:]


def test_executor_logs_are_copied_once_survive_a_loop_restart_and_outlive_the_executor(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = GrowingLogs()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    handle = ex.handle_of(job.id)
    ex.say(handle, "step 1", "step 2")
    loop.tick()
    loop.tick()  # nothing new: nothing copied twice
    ex.say(handle, "step 3")
    restarted = Scheduler(store, ex, clock=clock)  # resumes the copy from what the database holds
    restarted.tick()
    seen = svc.logs(ml, job.id)  # a follower's last page while the job runs
    ex.say(handle, "done")  # written just before the end: copied before the attempt is closed
    ex.finish(handle, RunState.SUCCEEDED)
    restarted.tick()
    assert svc.status(ml, job.id).state == "succeeded"
    ex.forgotten.add(handle)
    # svc has no executor, as an API worker in another process: everything comes from the database
    lines = svc.logs(ml, job.id).lines
    header = next(i for i, line in enumerate(lines) if line.startswith("--- attempt 1 "))
    assert lines[header + 1:-1] == ["step 1", "step 2", "step 3", "done"]
    assert lines[-1].endswith("running -> succeeded: attempt 1 succeeded: scripted succeeded")
    transitions = [line.split(": ", 1)[0].split(" ", 1)[1] for line in lines[:header]]
    assert transitions == ["- -> pending", "pending -> planned", "planned -> queued", "queued -> running"]
    # Lines never move: the follower gets exactly what was written after its page, nothing twice.
    follow = svc.logs(ml, job.id, seen.next)
    assert follow.lines == lines[seen.next:] == ["done", lines[-1]] and follow.state == "succeeded"


class KeepsOutcomes(ScriptedExecutor):
    """Keeps finished attempts until released (as RayExecutor); releases fail while ``down``."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: set[str] = set()
        self.down = False

    def finish(self, handle: str, state: RunState) -> None:
        super().finish(handle, state)
        self.kept.add(handle)

    def release(self, handle: str) -> None:
        if self.down:
            raise ExternalServiceError("the cluster did not answer")
        self.kept.discard(handle)

    def held(self) -> list[str]:
        return sorted(self.kept)


def test_reconcile_releases_finished_attempts_whose_rows_are_closed_and_keeps_unread_ones(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    first = svc.submit(ml, JobCreate(spec=spec_dict(name="first")))
    second = svc.submit(ml, JobCreate(spec=spec_dict(name="second")))
    ex = KeepsOutcomes()
    loop = Scheduler(store, ex, clock=clock)
    loop.tick()
    h1, h2 = ex.handle_of(first.id), ex.handle_of(second.id)
    ex.finish(h1, RunState.SUCCEEDED)
    ex.down = True  # the row is closed, the release fails: as a crash between the two would leave it
    loop.tick()
    assert svc.status(ml, first.id).state == "succeeded" and ex.held() == [h1]
    ex.finish(h2, RunState.SUCCEEDED)  # finished, but its outcome is not recorded yet
    ex.down = False
    restarted = Scheduler(store, ex, clock=clock)
    assert restarted.reconcile().released == [h1]
    assert ex.held() == [h2]  # still needed: its row is open
    restarted.tick()
    assert svc.status(ml, second.id).state == "succeeded" and ex.held() == []


def test_a_cancelled_jobs_log_is_complete_only_once_its_attempt_is_closed_with_its_last_lines(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    queued = svc.submit(ml, JobCreate(spec=spec_dict(name="never-ran")))
    ex = GrowingLogs()
    loop = Scheduler(store, ex, clock=clock, max_running=1)
    loop.tick()
    handle = ex.handle_of(job.id)
    svc.cancel(ml, queued.id)  # never had an attempt (max_running=1): complete at once
    assert svc.logs(ml, queued.id).complete
    ex.say(handle, "step 1")
    svc.cancel(ml, job.id)
    ex.say(handle, "step 2")  # the run goes on until the loop stops it
    page = svc.logs(ml, job.id)
    assert page.state == "cancelled" and not page.complete  # a follower keeps going
    loop.tick()
    page = svc.logs(ml, job.id)
    assert page.complete and page.lines[-2:] == ["step 1", "step 2"]
    assert page.lines[-3].endswith("running -> cancelled: cancelled by team ml")


# ---------------------------------------------------------------- the spot policy in the loop

def test_spot_chooser_starts_in_a_zone_with_capacity_waits_while_none_and_moves_after_a_preemption(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)  # 22 h of slack
    feed = StaticZones({"us-east-1a": zone(False), "us-east-1b": zone(True)})
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2, recheck_s=600))
    assert loop.tick().dispatched == [job.id]
    first = ex.requests[ex.handle_of(job.id)]
    assert (first.market, first.zone) == ("spot", "us-east-1b")
    # Checkpoints for the zone's online mean time to preemption: (20 h up + 12.5 h prior) / (2 + 1).
    assert first.mean_time_to_preemption_h == pytest.approx(32.5 / 3)
    assert svc.status(ml, job.id).usd_per_h == pytest.approx(14.25)  # the offer's spot price, one node
    # Preempted; no zone has capacity and the slack affords waiting: the job stays queued.
    clock.advance(hours=1)
    feed.zones["us-east-1b"] = zone(False)
    ex.finish(ex.handle_of(job.id), RunState.PREEMPTED)
    report = loop.tick()
    assert report.requeued == [job.id] and report.dispatched == []
    status = svc.status(ml, job.id)
    assert status.state == "queued" and "waiting for spot capacity" in status.message
    # With what the policy weighed: 22 h of slack less the hour gone, no work checkpointed, no capacity.
    assert status.message.endswith("21.0 h of slack for 48.0 h of work; no spot capacity for 0.0 h; "
                                   "runs last 10.8 h and outages 1.9 h on average")
    assert loop.tick().dispatched == []  # not due again before the recheck
    # Due again, still nothing anywhere: the message has the new numbers, the log still one line of it.
    clock.advance(seconds=600)
    assert loop.tick().dispatched == []
    assert "20.8 h of slack" in svc.status(ml, job.id).message
    lines = svc.logs(ml, job.id).lines
    assert len([line for line in lines if "waiting for spot capacity" in line]) == 1
    assert any(line.endswith("attempt 1 on spot in us-east-1b at $14.25/h (22.0 h of slack for 48.0 h of work; "
                             "spot capacity for 3.0 h; runs last 10.8 h and outages 1.9 h on average)")
               for line in lines)
    # Capacity comes back in the other zone: the job moves there when it is due.
    feed.zones["us-east-1a"] = zone(True)
    clock.advance(seconds=600)
    assert loop.tick().dispatched == [job.id]
    second = ex.requests[ex.handle_of(job.id)]
    assert (second.market, second.zone, second.attempt) == ("spot", "us-east-1a", 2)


def test_spot_chooser_takes_on_demand_when_the_deadline_cannot_wait(svc: SchedulerService, store: Store,
                                                                    clock: FakeClock) -> None:
    ml = ml_team(svc)
    tight = spot_job(svc, ml, deadline=48.25)  # slack 0.25 h: under one restart and a recheck
    feed = StaticZones({"us-east-1a": zone(False, outage_age_h=2.0)})
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2, recheck_s=300))
    assert loop.tick().dispatched == [tight.id]
    request = ex.requests[ex.handle_of(tight.id)]
    # no zone from the policy: the attempt is pinned to the zone the plan priced (gpuplan cluster node types)
    assert (request.market, request.zone) == ("on-demand", OFFER.zone)
    assert svc.status(ml, tight.id).usd_per_h == pytest.approx(55.04)
    # No deadline: spot or wait, never on-demand.
    free = spot_job(svc, ml, deadline=None)
    assert loop.tick().dispatched == []
    assert svc.status(ml, free.id).state == "queued"


def test_the_loop_still_takes_plain_market_and_price_pairs(svc: SchedulerService, store: Store,
                                                         clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = svc.submit(ml, JobCreate(spec=spec_dict()))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=lambda j, now: ("on-demand", 7.0))
    assert loop.tick().dispatched == [job.id]
    assert ex.requests[ex.handle_of(job.id)].zone == OFFER.zone and svc.status(ml, job.id).usd_per_h == 7.0


def test_only_spot_attempts_carry_the_planned_mean_time_to_preemption() -> None:
    from planner.plan_record import planned_run
    from planner.spec import spec_from_dict

    assert planned_run(toy_plan(spec_from_dict(spec_dict(spot="always")))).spot_mttp_h == TOY_MTTP_H
    assert planned_run(toy_plan(spec_from_dict(spec_dict()))).spot_mttp_h is None  # on-demand plan
