"""Changeovers of running attempts, the live zone feed and the server's choice of chooser, on the real
loop and real databases (scripted executor, fake clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import col, select

from planner.calibration import CostCalibration
from scheduler.api.server import loop_chooser
from scheduler.loop import Scheduler
from scheduler.models import Attempt, Job, JobLog, Spend
from scheduler.placement import ObservedZones, Running, SpotChooser, StaticZones, spot_zones
from scheduler.service import SchedulerService
from scheduler.store import Store
from tests.scheduler.conftest import ml_team, spot_job, zone
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executor import RunProgress, RunState


def attempts(store: Store, job_id: str) -> list[Attempt]:
    with store.read() as session:
        return list(session.exec(select(Attempt).where(Attempt.job_id == job_id).order_by(col(Attempt.number))))


def log_lines(store: Store, job_id: str) -> list[str]:
    with store.read() as session:
        return [r.line for r in session.exec(select(JobLog).where(JobLog.job_id == job_id).order_by(col(JobLog.seq)))]


def test_a_spot_attempt_whose_zone_loses_capacity_changes_over_to_the_zone_that_has_it(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = StaticZones({"a": zone(True), "b": zone(False)})
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2, recheck_s=600))
    assert loop.tick().dispatched == [job.id]
    first = ex.handle_of(job.id)
    assert ex.requests[first].zone == "a"
    clock.advance(hours=1)
    assert loop.tick().requeued == [] and ex.cancelled == []  # capacity where it runs: it stays
    # Zone a loses its capacity (the attempt waits there for a node); b has some: the loop moves it.
    feed.zones.update(a=zone(False, outage_age_h=0.1), b=zone(True))
    loop.tick()
    assert ex.cancelled == [first]  # stopped at its next step; the newest checkpoint stands
    report = loop.tick()
    assert report.requeued == [job.id] and report.dispatched == [job.id]
    second = ex.requests[ex.handle_of(job.id)]
    assert (second.market, second.zone, second.attempt) == ("spot", "b", 2)
    old, new = attempts(store, job.id)
    assert (old.zone, old.outcome, new.zone) == ("a", "cancelled", "b")
    assert old.message.startswith("changeover: to spot in b")
    assert svc.status(ml, job.id).state == "running"  # never cancelled: the stop was a changeover
    assert any("changeover: to spot in b" in line for line in log_lines(store, job.id))
    with store.read() as session:
        [spent] = session.exec(select(Spend).where(Spend.attempt_id == old.id)).all()
    assert (spent.market, spent.hours) == ("spot", 1.0)  # the old attempt is charged until it stopped


def test_an_on_demand_attempt_goes_back_to_spot_when_capacity_returns_and_the_slack_allows(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=48.4)  # 0.4 h of slack: no waiting for spot
    feed = StaticZones({"a": zone(False, outage_age_h=5.0), "b": zone(False, outage_age_h=5.0)})
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2, recheck_s=300))
    loop.tick()
    first = ex.handle_of(job.id)
    assert ex.requests[first].market == "on-demand"
    # Long runs of capacity come back in b, but 0.4 h of slack cannot pay a changeover there and back.
    clock.advance(hours=10)
    ex.progress[first] = RunProgress(step=10, total_steps=48)
    feed.zones["b"] = zone(True, up_h=200.0, preemptions=1)
    loop.tick()
    assert ex.cancelled == []
    # Ahead of schedule (it ran faster than planned): back to spot pays its two changeovers.
    ex.progress[first] = RunProgress(step=30, total_steps=48)
    loop.tick()
    assert ex.cancelled == [first]
    loop.tick()
    second = ex.requests[ex.handle_of(job.id)]
    assert (second.market, second.zone, second.attempt) == ("spot", "b", 2)


def test_a_loop_restarted_between_the_decision_and_the_stop_still_stops_the_attempt(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = StaticZones({"a": zone(True), "b": zone(False)})
    ex = ScriptedExecutor()
    Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2)).tick()
    handle = ex.handle_of(job.id)
    feed.zones.update(a=zone(False), b=zone(True))

    class Deaf(ScriptedExecutor):  # the process died before the stop reached the executor
        def cancel(self, handle: str) -> None:
            self.cancelled.append(handle)

    deaf = Deaf()
    deaf.requests, deaf.states = ex.requests, ex.states
    Scheduler(store, deaf, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2)).tick()
    assert deaf.cancelled == [handle] and ex.states[handle] is RunState.RUNNING
    restarted = Scheduler(store, ex, clock=clock, choose_market=lambda j, now: ("on-demand", 1.0))
    restarted.reconcile()
    restarted.tick()  # a plain chooser: no new decision, but the recorded one is carried out
    assert ex.cancelled == [handle]
    restarted.tick()
    assert svc.status(ml, job.id).state == "running" and len(attempts(store, job.id)) == 2


def test_the_loop_feeds_what_it_sees_to_the_zone_feed_and_avoids_a_zone_just_preempted(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=96.0)
    feed = ObservedZones(("a", "b"), probe_s=3600)
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2))
    loop.tick()
    first = ex.handle_of(job.id)
    assert ex.requests[first].zone == "a"  # nothing seen yet: both believed up, ties by name
    clock.advance(hours=2)
    ex.progress[first] = RunProgress(step=5, total_steps=48)
    loop.tick()  # first look at its progress
    ex.progress[first] = RunProgress(step=6, total_steps=48)
    loop.tick()  # work goes on there: capacity seen
    ex.finish(first, RunState.PREEMPTED)
    clock.advance(seconds=1)
    report = loop.tick()
    assert report.requeued == [job.id] and report.dispatched == [job.id]
    assert ex.requests[ex.handle_of(job.id)].zone == "b"  # a just lost its capacity
    seen = feed.seen(clock())
    assert (seen["a"].available, seen["a"].preemptions, seen["b"].available) == (False, 1, True)
    assert seen["a"].up_h == pytest.approx(2.0, rel=0.02)


def test_observed_zones_count_runs_and_offer_a_lost_zone_again_after_the_probe_interval() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    feed = ObservedZones(("x", "y"), probe_s=1800)
    feed.observe("x", True, t0)
    feed.observe("x", False, t0 + timedelta(hours=3))
    feed.observe("elsewhere", False, t0)  # not a zone of the cluster: ignored
    seen = feed.seen(t0 + timedelta(hours=3, minutes=10))
    # Counts decay with the rates' half-life (96 h): minutes and hours later they are still ~1 and ~3.
    assert not seen["x"].available and seen["x"].preemptions == pytest.approx(1, rel=0.01)
    assert seen["x"].up_h == pytest.approx(3.0, rel=0.05)
    assert seen["x"].outage_age_h == pytest.approx(10 / 60) and seen["y"].available
    later = feed.seen(t0 + timedelta(hours=3, minutes=31))
    assert later["x"].available and later["x"].preemptions == pytest.approx(1, rel=0.01)  # still one preemption


def test_reconsider_leaves_a_job_without_another_option_where_it_is(svc: SchedulerService, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=200.0)
    with svc.store.read() as session:
        row = session.get(Job, job.id)
    assert row is not None
    nowhere = SpotChooser(StaticZones({"a": zone(False), "b": zone(False)}), restart_h=0.2)
    # Spot in a zone without capacity, none elsewhere, plenty of slack: wait there for it to return.
    assert nowhere.reconsider(row, Running("spot", "a", 0.0), clock()) is None
    # On-demand with no spot anywhere: stay.
    assert nowhere.reconsider(row, Running("on-demand", "a", 0.0), clock()) is None
    # Spot where there is capacity: stay.
    here = SpotChooser(StaticZones({"a": zone(True), "b": zone(True)}), restart_h=0.2)
    assert here.reconsider(row, Running("spot", "b", 10.0), clock()) is None


def test_the_server_moves_jobs_across_zones_only_when_the_cluster_has_spot_in_several() -> None:
    types = [{"gpuplan-market:spot": 8, "gpuplan-zone:use1-az1": 8},
             {"gpuplan-market:spot": 8, "gpuplan-zone:use1-az2": 8},
             {"gpuplan-market:on-demand": 8, "gpuplan-zone:use1-az3": 8}]
    assert spot_zones(types) == ("use1-az1", "use1-az2")
    chooser = loop_chooser(CostCalibration(), spot_zones(types))
    assert isinstance(chooser, SpotChooser) and isinstance(chooser.feed, ObservedZones)
    assert chooser.feed.names == ("use1-az1", "use1-az2")
    assert chooser.switch_h == pytest.approx(14.8 / CostCalibration().checkpoint_write_gbps / 3600)
    assert not isinstance(loop_chooser(CostCalibration(), spot_zones(types[:1])), SpotChooser)


class Noticing(ScriptedExecutor):
    """An executor that can stop an attempt after a just-in-time checkpoint (as InProcessExecutor.preempt)."""

    def __init__(self) -> None:
        super().__init__()
        self.noticed: list[str] = []

    def preempt(self, handle: str) -> None:
        self.noticed.append(handle)
        self.states[handle] = RunState.PREEMPTED


def test_a_changeover_takes_a_just_in_time_checkpoint_where_the_executor_can_and_is_no_preemption(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    from scheduler.changeover import StopsWithCheckpoint
    from workers.inprocess import InProcessExecutor

    assert issubclass(InProcessExecutor, StopsWithCheckpoint)  # its preempt: checkpoint, then PREEMPTED
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = ObservedZones(("a", "b"))
    ex = Noticing()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2))
    loop.tick()
    first = ex.handle_of(job.id)
    clock.advance(hours=1)
    feed.observe("a", False, clock())  # e.g. a watcher saw the zone's spot requests go unfilled
    loop.tick()
    assert ex.noticed == [first] and ex.cancelled == []
    clock.advance(seconds=1)
    assert loop.tick().dispatched == [job.id]
    assert ex.requests[ex.handle_of(job.id)].zone == "b"
    assert [a.outcome for a in attempts(store, job.id)] == ["preempted", None]
    # The watcher's, not one more for the changeover (counts decay with the rates' half-life).
    assert feed.seen(clock())["a"].preemptions == pytest.approx(1, rel=0.01)


def test_a_spot_attempt_whose_steps_stall_marks_its_zone_down_and_moves_where_capacity_is(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    """Ray keeps a preempted attempt RUNNING while it waits for a node in its zone: stalled steps
    are what the loop sees."""
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = ObservedZones(("a", "b"))
    ex = ScriptedExecutor()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2), stall_s=600)
    loop.tick()
    first = ex.handle_of(job.id)
    assert ex.requests[first].zone == "a"
    for step in (1, 2, 3):
        ex.progress[first] = RunProgress(step=step, total_steps=48)
        clock.advance(minutes=5)
        loop.tick()
    clock.advance(minutes=9)
    loop.tick()
    assert ex.cancelled == [] and feed.seen(clock())["a"].available  # 9 min without a step: not yet
    clock.advance(minutes=1)
    loop.tick()  # 10 min: zone a counts as lost, and the attempt changes over
    assert feed.seen(clock())["a"].preemptions == pytest.approx(1, rel=0.01) and ex.cancelled == [first]
    loop.tick()
    assert ex.requests[ex.handle_of(job.id)].zone == "b"


def test_gpuplan_server_reads_the_spot_zones_from_the_ray_cluster_config(tmp_path: Path) -> None:
    from commands.server import spot_zones_of

    config = tmp_path / "cluster.yaml"
    config.write_text("""
head_node_type: head
available_node_types:
  head: {resources: {}, max_workers: 0}
  p5-spot-use1-az1: {resources: {"gpuplan-market:spot": 8, "gpuplan-zone:use1-az1": 8}, max_workers: 2}
  p5-spot-use1-az2: {resources: {"gpuplan-market:spot": 8, "gpuplan-zone:use1-az2": 8}, max_workers: 2}
  p5-on-demand-use1-az1: {resources: {"gpuplan-market:on-demand": 8, "gpuplan-zone:use1-az1": 8}, max_workers: 2}
""")
    assert spot_zones_of(str(config)) == ("use1-az1", "use1-az2")
    assert spot_zones_of(None) == ()
