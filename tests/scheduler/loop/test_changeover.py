"""Changeovers of running attempts, the live zone feed and the server's choice of chooser, on the real
loop and real databases (scripted executor, fake clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import col, select

from planner.calibration import CostCalibration
from scheduler.composition import loop_chooser
from scheduler.loop.attempt_placement import MarketChoice, ObservedZones, Running, SpotChooser, StaticZones, spot_zones
from scheduler.loop.scheduling import Scheduler
from scheduler.service import Principal, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, JobLog, Spend
from tests.scheduler.conftest import ml_team, spot_job, zone
from tests.scheduler.fakes import BootingExecutor, FakeClock, ScriptedExecutor
from tests.waits import RUN_END_S
from workers.executors.protocol import BootsAhead, BootState, RunProgress, RunState


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
    assert "h of slack for 48.0 h of work; spot capacity" in old.message  # what the policy weighed
    assert svc.status(ml, job.id).state == "running"  # never cancelled: the stop was a changeover
    assert any("changeover: to spot in b" in line for line in log_lines(store, job.id))
    with store.read() as session:
        [spent] = session.exec(select(Spend).where(Spend.attempt_id == old.id)).all()
    assert (spent.market, spent.hours) == ("spot", 1.0)  # the old attempt is charged until it stopped


def on_demand_when_spot_returns(svc: SchedulerService, store: Store, clock: FakeClock, ex: ScriptedExecutor,
                                progress: RunProgress, *, make_before_break: bool = False,
                                ) -> tuple[Principal, str, str, StaticZones, Scheduler]:
    """A job (0.25 h of slack: below the safety net, no waiting for spot) started on on-demand, 10 h later at
    ``progress`` when long runs of spot capacity come back in zone b: (team, job id, its attempt's handle, the
    feed, the loop)."""
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=48.25)
    feed = StaticZones({"a": zone(False, outage_age_h=5.0), "b": zone(False, outage_age_h=5.0)})
    chooser = SpotChooser(feed, restart_h=0.2, recheck_s=300, make_before_break=make_before_break)
    loop = Scheduler(store, ex, clock=clock, choose_market=chooser, boot_timeout_s=1800.0)
    loop.tick()
    first = ex.handle_of(job.id)
    assert ex.requests[first].market == "on-demand"
    clock.advance(hours=10)
    ex.progress[first] = progress
    feed.zones["b"] = zone(True, up_h=200.0, preemptions=1)
    return ml, job.id, first, feed, loop


def test_an_on_demand_attempt_goes_back_to_spot_when_capacity_returns_and_the_slack_allows(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ex = ScriptedExecutor()
    # 0.25 h of slack cannot pay a changeover there and back.
    _, job_id, first, _, loop = on_demand_when_spot_returns(svc, store, clock, ex, RunProgress(step=10, total_steps=48))
    loop.tick()
    assert ex.cancelled == []
    # Ahead of schedule (it ran faster than planned): back to spot pays its two changeovers.
    ex.progress[first] = RunProgress(step=30, total_steps=48)
    loop.tick()
    assert ex.cancelled == [first]
    loop.tick()
    second = ex.requests[ex.handle_of(job_id)]
    assert (second.market, second.zone, second.attempt) == ("spot", "b", 2)


def booting_loop(svc: SchedulerService, store: Store, clock: FakeClock,
                 ex: ScriptedExecutor) -> tuple[Principal, str, str, StaticZones, Scheduler]:
    """The same, 0.35 h ahead of plan: 0.6 h of slack, which a return that stops on-demand first cannot pay and
    one booted beside it can."""
    return on_demand_when_spot_returns(svc, store, clock, ex, RunProgress(step=1035, total_steps=4800),
                                       make_before_break=True)


def test_a_return_to_spot_boots_beside_on_demand_and_moves_only_once_its_nodes_are_up(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ex = BootingExecutor()
    _, job_id, first, _, loop = booting_loop(svc, store, clock, ex)
    loop.tick()
    [(token, request)] = ex.boot_requests.items()
    assert (request.market, request.zone, request.attempt) == ("spot", "b", 2)
    assert ex.cancelled == []  # on-demand works on through the boot
    clock.advance(minutes=10)
    loop.tick()
    assert ex.cancelled == [] and len(ex.boot_requests) == 1  # still booting: nothing moves, nothing re-asked
    ex.unreadable = 1
    loop.tick()  # the cluster did not answer: the boot is still under way
    assert ex.cancelled == [] and ex.unbooted == []
    ex.boots[token] = BootState.READY
    loop.tick()
    assert ex.cancelled == [first] and ex.unbooted == [token]
    report = loop.tick()
    assert report.requeued == [job_id] and report.dispatched == [job_id]
    second = ex.requests[ex.handle_of(job_id)]
    assert (second.market, second.zone, second.attempt) == ("spot", "b", 2)
    assert any("boots beside it (make-before-break" in line for line in log_lines(store, job_id))
    old, _ = attempts(store, job_id)
    assert old.message.startswith("changeover: to spot in b")


def test_a_boot_that_does_not_come_up_is_given_back_and_the_attempt_stays(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ex = BootingExecutor()
    ml, job_id, first, feed, loop = booting_loop(svc, store, clock, ex)
    loop.tick()
    [token] = ex.boot_requests
    clock.advance(seconds=1801)  # no capacity came: the nodes never joined
    ex.progress[first] = RunProgress(step=1086, total_steps=4800)  # on-demand worked on: the same slack
    loop.tick()
    assert ex.unbooted == [token] and ex.cancelled == []
    assert any("the spot boot in b was given up (it was not up within 1801 s)" in line
               for line in log_lines(store, job_id))
    # Its nodes lost on the way: given back too.
    feed.zones["b"] = zone(True, up_h=200.0, preemptions=1)
    loop.tick()
    second = list(ex.boot_requests)[-1]
    assert second != token
    ex.boots[second] = BootState.GONE
    loop.tick()
    assert ex.unbooted == [token, second] and ex.cancelled == []
    # An attempt that ends while its boot is under way gives the boot back.
    loop.tick()
    third = list(ex.boot_requests)[-1]
    ex.finish(first, RunState.SUCCEEDED)
    loop.tick()
    assert ex.unbooted[-1] == third and svc.status(ml, job_id).state == "succeeded"


def test_an_attempt_lost_while_its_boot_is_under_way_gives_the_boot_back(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    """A lost attempt (the executor forgot it: its driver died) gives back the nodes booted beside it: kept,
    they would stay up and billed with no attempt to move onto them."""
    ex = BootingExecutor()
    _, job_id, first, _, loop = booting_loop(svc, store, clock, ex)
    loop.tick()
    [token] = ex.boot_requests
    del ex.states[first]  # the executor no longer knows the attempt
    report = loop.tick()
    assert job_id in report.lost and ex.unbooted == [token]
    assert [a.outcome for a in attempts(store, job_id)] == ["lost", None]  # and the job runs again


def test_without_an_executor_that_boots_a_boot_decision_moves_nothing(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ex = ScriptedExecutor()
    assert not isinstance(ex, BootsAhead)
    _, _, _, _, loop = booting_loop(svc, store, clock, ex)
    loop.tick()
    assert ex.cancelled == []  # the slack that affords a boot does not afford a restart: nothing is broken


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


class Stopping(ScriptedExecutor):
    """An executor that can checkpoint and stop an attempt (as RayExecutor and InProcessExecutor);
    ``answers``: whether the attempt does so (else it keeps running, as a worker that never hears it)."""

    def __init__(self, answers: bool = True) -> None:
        super().__init__()
        self.answers = answers
        self.asked: list[str] = []

    def checkpoint_stop(self, handle: str) -> None:
        self.asked.append(handle)
        if self.answers and not self.states[handle].finished:
            at = self.progress.get(handle, RunProgress()).step
            self.progress[handle] = RunProgress(step=at, total_steps=48, checkpoint_step=at)
            self.states[handle] = RunState.STOPPED


def test_a_changeover_checkpoints_and_stops_the_attempt_and_the_next_resumes_at_that_step_no_preemption(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    from workers.executors.inprocess import InProcessExecutor
    from workers.executors.protocol import StopsForChangeover

    assert issubclass(InProcessExecutor, StopsForChangeover)  # RayExecutor too: tests/workers/test_changeover_ray.py
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = ObservedZones(("a", "b"))
    ex = Stopping()
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2))
    loop.tick()
    first = ex.handle_of(job.id)
    ex.progress[first] = RunProgress(step=7, total_steps=48, checkpoint_step=5)  # periodic checkpoint at 5
    clock.advance(hours=1)
    feed.observe("a", False, clock())  # e.g. a watcher saw the zone's spot requests go unfilled
    loop.tick()
    assert ex.asked == [first] and ex.cancelled == []
    clock.advance(seconds=1)
    assert loop.tick().dispatched == [job.id]
    assert ex.requests[ex.handle_of(job.id)].zone == "b"
    old, new = attempts(store, job.id)
    assert (old.outcome, new.outcome) == ("stopped", None)
    assert old.message.endswith("nothing lost: the next attempt resumes from the checkpoint of step 7")
    assert old.metrics is not None and old.metrics["changeover"] == {"resumes_at_step": 7, "lost_steps": 0}
    # The watcher's, not one more for the changeover (counts decay with the rates' half-life).
    assert feed.seen(clock())["a"].preemptions == pytest.approx(1, rel=0.01)
    assert svc.status(ml, job.id).state == "running"
    with store.read() as session:
        [spent] = session.exec(select(Spend).where(Spend.attempt_id == old.id)).all()
    assert spent.hours == pytest.approx(1.0 + 1 / 3600)  # charged until the loop saw it stop


def test_an_attempt_that_does_not_answer_the_checkpoint_and_stop_is_stopped_without_one_and_the_loss_recorded(
        svc: SchedulerService, store: Store, clock: FakeClock) -> None:
    ml = ml_team(svc)
    job = spot_job(svc, ml, deadline=70.0)
    feed = StaticZones({"a": zone(True), "b": zone(False)})
    ex = Stopping(answers=False)
    loop = Scheduler(store, ex, clock=clock, choose_market=SpotChooser(feed, restart_h=0.2),
                     changeover_timeout_s=120)
    loop.tick()
    first = ex.handle_of(job.id)
    ex.progress[first] = RunProgress(step=9, total_steps=48, checkpoint_step=6)
    feed.zones.update(a=zone(False, outage_age_h=0.1), b=zone(True))
    loop.tick()
    assert ex.asked == [first] and ex.cancelled == []
    clock.advance(seconds=119)
    loop.tick()
    assert ex.cancelled == []  # still within the deadline: it may yet answer
    clock.advance(seconds=1)
    loop.tick()  # no answer in 120 s: today's stop (the run stops at its next step, no checkpoint)
    assert ex.cancelled == [first]
    assert any("did not checkpoint and stop within 120 s" in line for line in log_lines(store, job.id))
    report = loop.tick()
    assert report.requeued == [job.id] and report.dispatched == [job.id]
    assert ex.requests[ex.handle_of(job.id)].zone == "b"
    old, _ = attempts(store, job.id)
    assert old.outcome == "cancelled"
    assert old.message.endswith("it did not answer the checkpoint-and-stop in time: 3 step(s) after the checkpoint "
                                "of step 6 are lost and done again")
    assert old.metrics is not None and old.metrics["changeover"] == {"resumes_at_step": 6, "lost_steps": 3}
    assert svc.status(ml, job.id).state == "running"  # never cancelled: the stop was a changeover


class MoveOnce:
    """A chooser that starts every attempt on-demand and changes the job over once, when told to (``boot``:
    made before it breaks)."""

    def __init__(self, boot: bool = False) -> None:
        self.move = False
        self.boot = boot

    def __call__(self, job: Job, now: datetime) -> MarketChoice:
        return MarketChoice("on-demand", 1.0)

    def reconsider(self, job: Job, running: Running, now: datetime) -> MarketChoice | None:
        if not self.move:
            return None
        self.move = False
        return MarketChoice("on-demand", 2.0, zone="elsewhere", boot=self.boot)


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
@pytest.mark.parametrize("boot", [False, True], ids=["break-before-make", "make-before-break"])
def test_a_changeover_of_real_training_loses_no_step_and_ends_as_an_uninterrupted_run(
        store: Store, tmp_path: Path, boot: bool) -> None:
    """The real loop on SQLite, the real training loop (InProcessExecutor): the decision is recorded, the
    attempt checkpoints and stops at the step it finishes, the next attempt resumes from exactly that
    step, and the final weights equal an uninterrupted run's. Made before it breaks, the executor first boots
    the target (this machine: at once) while the attempt works on. (tests/workers/test_changeover_ray.py: Ray.)"""
    from scheduler.service import ADMIN
    from scheduler.store.models import JobCreate, TeamCreate
    from tests.scheduler.loop.test_loop_inprocess import cpu_plan
    from tests.workers.tiny import Gate, assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
    from workers.executors.inprocess import InProcessExecutor
    from workers.executors.protocol import RunRequest

    svc = SchedulerService(store, cpu_plan, checkpoint_root=str(tmp_path / "ckpt"))
    svc.create_team(ADMIN, TeamCreate(name="ml"))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    config = write_config(tmp_path / "m")
    reference = tiny_spec(config, steps=8, interval=3)
    job = svc.submit(me, JobCreate(spec=reference.model_dump(mode="json")))
    gate = Gate(str(tmp_path / "gate"))
    chooser = MoveOnce(boot=boot)
    ex = InProcessExecutor(step_hook=gate)
    loop = Scheduler(store, ex, choose_market=chooser)
    gate.hold(4)  # held before step 5: 4 done, the periodic checkpoint of step 3 the newest
    assert loop.tick().dispatched == [job.id]
    gate.wait_held(4)
    chooser.move = True
    loop.tick()  # the decision on the row, then checkpoint-and-stop (made before it breaks: the boot first)
    if boot:
        [booting] = attempts(store, job.id)
        assert booting.ended_at is None and not booting.message.startswith("changeover")
        assert any("boots beside it (make-before-break" in line for line in log_lines(store, job.id))
        loop.tick()  # the boot is up: the decision on the row, then checkpoint-and-stop
    [first] = attempts(store, job.id)
    assert first.message.startswith("changeover: to on-demand in elsewhere") and first.ended_at is None
    gate.release()
    ex.wait(str(first.handle), timeout=RUN_END_S)
    loop.tick()  # closes attempt 1 (stopped), requeues and starts attempt 2
    [_, second] = attempts(store, job.id)
    ex.wait(str(second.handle), timeout=RUN_END_S)
    loop.tick()
    detail = svc.status(me, job.id)
    assert detail.state == "succeeded", (detail.message, svc.logs(me, job.id).lines[-8:])
    old, new = attempts(store, job.id)
    assert (old.outcome, new.outcome, new.zone) == ("stopped", "succeeded", "elsewhere")
    assert "stopped for a changeover at step 5; checkpoint of step 5 saved" in old.message
    assert old.metrics is not None and old.metrics["changeover"] == {"resumes_at_step": 5, "lost_steps": 0}
    assert ex.status(str(new.handle)).progress.resumed_from_step == 5
    with store.read() as session:
        charged = sorted(s.attempt_id for s in session.exec(select(Spend).where(Spend.job_id == job.id)))
    assert charged == sorted(a.id for a in (old, new))
    plain = InProcessExecutor()
    ref = plain.wait(plain.submit(RunRequest(job_id="ref", attempt=1, spec=reference, strategy=cpu_strategy(),
                                             checkpoint_uri=str(tmp_path / "ref"), run_name="ref")), 60)
    assert ref.state is RunState.SUCCEEDED, ref.message
    assert_same_weights(final_state(job.checkpoint_uri)[1], final_state(str(tmp_path / "ref"))[1])


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
    from scheduler.composition import spot_zones_of

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
