"""The scheduling loop: claim queued jobs, run them on the Executor, follow, requeue, charge.

One ``tick()``:

1. follow every open attempt (``executor.status``): a finished one is closed and charged in the
   same transaction as the job's transition; PREEMPTED requeues the job at once (it resumes from
   its checkpoint: ``run_name`` is the job id), FAILED requeues with exponential backoff until the
   job's ``max_attempts`` failures, a cancelled job's live attempt is stopped; a live attempt that a
   chooser with ``reconsider`` (scheduler.placement.SpotChooser) wants elsewhere is changed over
   (scheduler.changeover: decision recorded, checkpointed and stopped, or stopped without a checkpoint
   after ``changeover_timeout_s``; requeued, started where the chooser said). A changeover the chooser
   makes before it breaks (``Placement.boot``, with an executor that ``BootsAhead``) first boots the
   target's nodes beside the running attempt and changes over only once they are up; nodes that do not
   come up within ``boot_timeout_s`` (no capacity there) are given back and the attempt stays;
   An attempt still waiting for nodes whose launches the cloud refuses (``RunStatus.launch_failure``) says so
   on its job and, after ``launch_timeout_s``, is changed over to the job's next planned placement
   (scheduler.fallback: another zone, then on-demand, in the plan's cost order);
2. dispatch due queued jobs, highest priority first, that their team's GPU quota admits
   (scheduler.quota: a job that does not fit stays queued with the reason), claimed with
   ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite's ``BEGIN IMMEDIATE`` makes the claim a
   single writer).

Dispatch is two-phase so a crash can never hide a running attempt: the Attempt row (no handle
yet) and the job's move to RUNNING commit first, then ``executor.submit``, then the handle is
recorded. :meth:`Scheduler.reconcile` (run at start) closes attempts the executor does not know
as ``lost`` and requeues their jobs, and cancels executor runs no open attempt owns, so a job
never has two attempts at once. With an executor whose attempts outlive this process (Ray: one
detached actor per attempt) the attempts found running are followed on: nothing is lost or
started twice. Such an executor sees every attempt on its cluster, so one scheduler database
owns one cluster (another's runs would be cancelled as orphans). Once a finished attempt's row
is closed, an executor that keeps outcomes until read (``ReleasesAttempts``) is told to drop it.
A lost attempt is charged up to its last heartbeat (``Attempt.last_seen_at``: the last tick that
found it alive on the executor), not through a scheduler's downtime to the restart that finds it gone:
what the nodes were seen running is what is billed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from catalog.errors import GpuplanError
from planner.calibration import CostCalibration
from planner.spec import spec_from_dict
from scheduler import changeover, fallback, ledger, logbook, quota
from scheduler.accuracy import attempt_metrics
from scheduler.models import Attempt, Job
from scheduler.placement import MarketChooser, ObservesZones, Placement, market_chooser
from scheduler.service import Clock, utcnow
from scheduler.states import JobState, Market
from scheduler.store import LoopLock, Store, transition
from workers.executor import BootsAhead, BootState, Executor, ReleasesAttempts, RunRequest, RunState, RunStatus

log = logging.getLogger("gpuplan.loop")


@dataclass
class TickReport:
    dispatched: list[str] = field(default_factory=list)
    finished: dict[str, str] = field(default_factory=dict)  # job id -> attempt outcome
    requeued: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    orphans_cancelled: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)  # finished attempts released at reconcile


class Scheduler:
    def __init__(
        self,
        store: Store,
        executor: Executor,
        *,
        clock: Clock = utcnow,
        choose_market: MarketChooser | None = None,
        poll_s: float = 1.0,
        batch: int = 16,
        max_running: int | None = None,
        backoff_base_s: float = 30.0,
        backoff_max_s: float = 3600.0,
        lock: LoopLock | None = None,
        stall_s: float = 600.0,
        changeover_timeout_s: float = 300.0,
        boot_timeout_s: float = 1800.0,
        launch_timeout_s: float = 300.0,
    ) -> None:
        self.store = store
        self.executor = executor
        self.clock = clock
        # default: the spot policy with the calibration model's default restart delay (make_loop passes the file's)
        self.choose_market = choose_market or market_chooser(CostCalibration())
        self.poll_s = poll_s
        self.batch = batch
        self.max_running = max_running
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.lock = lock  # the database's loop lock (Store.loop_lock), released when run_forever ends
        # attempt id -> lines of its executor log already copied into the job's log (read back from
        # the database the first time an attempt is seen, so a restarted loop resumes the copy)
        self._copied: dict[int, int] = {}
        # job id -> where its next attempt goes: a changeover decided on a running attempt (kept in memory;
        # after a restart the chooser decides again)
        self._moves: dict[str, Placement] = {}
        # spot attempt id -> (its step, when it last advanced): advancing steps show the zone's capacity,
        # steps stalled for stall_s its loss
        self._steps: dict[int, tuple[int, datetime]] = {}
        self.stall_s = stall_s
        # a changeover asks the attempt to checkpoint and stop, and waits this long (loop clock) for it to end
        # before stopping it without a checkpoint (scheduler.changeover)
        self.changeover_timeout_s = changeover_timeout_s
        # attempt id -> (when the loop asked it to checkpoint and stop, whether it fell back to a plain stop)
        self._stopping: dict[int, tuple[datetime, bool]] = {}
        # attempt id -> (boot token, where it moves once the boot is up, when the boot began): changeovers made
        # before they break; in memory, like the executor's hold (after a restart the chooser decides again)
        self._boots: dict[int, tuple[str, Placement, datetime]] = {}
        self.boot_timeout_s = boot_timeout_s
        # attempt id -> when the loop first saw the cloud refuse the nodes it waits for (scheduler.fallback): after
        # launch_timeout_s of that (loop clock) the job moves to its next planned placement
        self._refused: dict[int, datetime] = {}
        # jobs moved down their placements for refused launches: the chooser does not move them back up (the
        # refused placement would only refuse again, and each move stops an attempt); in memory like _moves
        self._descended: set[str] = set()
        self.launch_timeout_s = launch_timeout_s

    # -------------------------------------------------------------- main entry points

    def run_forever(self, stop: threading.Event) -> None:
        try:
            self.reconcile()
            while not stop.is_set():
                try:
                    self.tick()
                except Exception:  # one bad tick (DB hiccup) must not stop the server's loop
                    log.exception("scheduler tick failed; retrying in %.1fs", self.poll_s)
                stop.wait(self.poll_s)
        finally:
            if self.lock is not None:
                self.lock.release()

    def tick(self) -> TickReport:
        report = TickReport()
        self._follow(report)
        self._dispatch(report)
        return report

    def reconcile(self) -> TickReport:
        """Make the DB and the executor agree after a (re)start."""
        report = TickReport()
        active = set(self.executor.active())
        with self.store.read() as session:
            open_attempts = list(session.exec(select(Attempt).where(col(Attempt.ended_at).is_(None))).all())
        owned = {a.handle for a in open_attempts if a.handle}
        for attempt in open_attempts:
            if attempt.handle is None or (attempt.handle not in active and self._status(attempt.handle) is None):
                self._lose(attempt, "the executor does not know this attempt (scheduler restarted)", report)
        for handle in sorted(active - owned):
            log.warning("cancelling executor run %s: no open attempt owns it", handle)
            self.executor.cancel(handle)
            self._release(handle)  # nobody will read its outcome
            report.orphans_cancelled.append(handle)
        if isinstance(self.executor, ReleasesAttempts):
            # Finished attempts whose rows were closed just before a crash, so never released.
            for handle in sorted(set(self.executor.held()) - owned):
                self._release(handle)
                report.released.append(handle)
        return report

    # -------------------------------------------------------------- follow

    def _status(self, handle: str) -> RunStatus | None:
        try:
            return self.executor.status(handle)
        except (GpuplanError, KeyError):
            return None

    def _follow(self, report: TickReport) -> None:
        with self.store.read() as session:
            rows = session.exec(
                select(Attempt, Job).join(Job, col(Job.id) == col(Attempt.job_id)).where(
                    col(Attempt.ended_at).is_(None), col(Attempt.handle).is_not(None))
            ).all()
        for attempt, job in rows:
            assert attempt.handle is not None
            self._copy_logs(attempt)
            if job.state == JobState.CANCELLED.value:
                self.executor.cancel(attempt.handle)
                self._finish(attempt.id, "cancelled", "job cancelled", report)
                self._release(attempt.handle)  # the executor drops it once the cancel has stopped it
                continue
            status = self._status(attempt.handle)
            if status is None:
                self._lose(attempt, "the executor no longer knows this attempt", report)
            elif status.state.finished:
                self._copy_logs(attempt)  # the lines written since the first copy of this tick
                self._finish(attempt.id, status.state.value, status.message, report, status)
                self._release(attempt.handle)
            else:
                self._heartbeat(attempt)
                self._watch(attempt, job, status)

    def _heartbeat(self, attempt: Attempt) -> None:
        """The attempt is alive now: a loss found later is billed up to here (``_lose``)."""
        table = Attempt.__table__  # type: ignore[attr-defined]
        with self.store.write() as session:
            session.execute(update(table).where(table.c.id == attempt.id, table.c.ended_at.is_(None))
                            .values(last_seen_at=self.clock()))

    def _watch(self, attempt: Attempt, job: Job, status: RunStatus) -> None:
        """A live attempt: what it shows of its zone's spot capacity, and whether to change it over
        (scheduler.changeover: the decision is recorded on its row before it is stopped)."""
        assert attempt.handle is not None
        now = self.clock()
        self._watch_zone(attempt, status, now)
        if changeover.marked(attempt):  # stopping already (after a restart between mark and stop: asks now)
            self._stop_for_changeover(attempt, now)
            return
        if attempt.id in self._boots:
            self._follow_boot(attempt, job, now)
            return
        if status.launch_failure and status.state is RunState.PENDING:
            self._wait_for_launch(attempt, job, status.launch_failure, now)
            return
        self._refused.pop(attempt.id or 0, None)
        if (not isinstance(self.choose_market, changeover.Reconsiders) or job.state != JobState.RUNNING.value
                or job.id in self._descended):
            return
        target = self.choose_market.reconsider(job, changeover.running(job, attempt, status), now)
        if target is None or target.wait_s is not None:
            return
        if target.boot:  # never broken instead: the slack that affords a boot may not afford a restart
            if isinstance(self.executor, BootsAhead):
                self._start_boot(attempt, job, target, now)
            return
        self._change_over(attempt, job, target, now)

    def _wait_for_launch(self, attempt: Attempt, job: Job, failure: str, now: datetime) -> None:
        """The attempt waits for nodes whose launches fail: say so on the job, and after ``launch_timeout_s``
        move it to its next planned placement that the cluster runs (scheduler.fallback); at the end of
        that list (``spot: always`` out of spot zones) it waits on, with the reason."""
        assert attempt.id is not None
        if attempt.market == Market.SPOT.value and attempt.zone:  # a refused launch: no capacity there now
            self._observe(attempt.zone, False, now)
        since = self._refused.setdefault(attempt.id, now)
        target = fallback.next_placement(job, attempt, self._runnable(job, attempt.number + 1))
        where = f"{attempt.market}" + (f" in {attempt.zone}" if attempt.zone else "")
        if target is None:
            message = f"attempt {attempt.number} waits for {where}: {failure}; no other planned placement to move to"
        elif (now - since).total_seconds() >= self.launch_timeout_s:
            moved = Placement(target.market, target.usd_per_h, target.zone,
                              why=f"launches on {where} failed for {self.launch_timeout_s:.0f} s: {failure}")
            self._refused.pop(attempt.id, None)
            self._descended.add(job.id)
            self._change_over(attempt, job, moved, now)
            return
        else:
            there = target.market + (f" in {target.zone}" if target.zone else "")
            message = (f"attempt {attempt.number} waits for {where}: {failure}; moves to {there} if no node "
                       f"comes within {self.launch_timeout_s:.0f} s")
        with self.store.write() as session:
            fresh = session.get(Job, job.id)
            if fresh is not None and fresh.message != message[:2000]:
                fresh.message = message[:2000]
                logbook.append(session, job.id, [logbook.note_line(now, message)])

    def _runnable(self, job: Job, number: int) -> Callable[[Placement], bool]:
        """Whether the executor's cluster can ever run the job's next attempt at a placement."""
        def runnable(place: Placement) -> bool:
            try:
                return self.executor.feasibility(self._request(job, number, place.market, place.zone)) is None
            except (GpuplanError, ValueError):
                return False
        return runnable

    def _change_over(self, attempt: Attempt, job: Job, target: Placement, now: datetime) -> None:
        with self.store.write() as session:
            if not changeover.mark(session, attempt.id, target, now):
                return
        self._moves[job.id] = target
        self._stop_for_changeover(attempt, now)

    def _start_boot(self, attempt: Attempt, job: Job, target: Placement, now: datetime) -> None:
        """Boot the target's nodes beside the running attempt (make-before-break); the attempt works on."""
        assert isinstance(self.executor, BootsAhead) and attempt.id is not None
        request = self._request(job, attempt.number + 1, target.market, target.zone, target.mttp_h)
        try:
            token = self.executor.boot(request)
        except GpuplanError as exc:
            log.warning("could not boot %s for job %s: %s", target.market, job.id, exc)
            return
        self._boots[attempt.id] = (token, target, now)
        where = f" in {target.zone}" if target.zone else ""
        with self.store.write() as session:
            logbook.append(session, job.id, [logbook.note_line(
                now, f"attempt {attempt.number} works on while {target.market}{where} boots beside it "
                f"(make-before-break; it moves once the nodes are up){f' ({target.why})' if target.why else ''}")])

    def _follow_boot(self, attempt: Attempt, job: Job, now: datetime) -> None:
        """A boot beside the attempt: up -> change over onto it; gone, or not up within ``boot_timeout_s``
        (no capacity there) -> give it back, note the zone's lack of capacity, and leave the attempt."""
        assert isinstance(self.executor, BootsAhead) and attempt.id is not None
        token, target, since = self._boots[attempt.id]
        try:
            state = self.executor.boot_state(token)
        except GpuplanError as exc:  # not known this tick: still booting, until the timeout says otherwise
            log.warning("could not read boot %s of job %s: %s", token, job.id, exc)
            state = BootState.BOOTING
        waited = (now - since).total_seconds()
        if state is BootState.BOOTING and waited < self.boot_timeout_s:
            return
        del self._boots[attempt.id]
        if state is BootState.READY:
            self._change_over(attempt, job, target, now)
            self.executor.unboot(token)  # after the stop is asked for: the nodes stay up for the next attempt
            return
        self.executor.unboot(token)
        if target.zone:
            self._observe(target.zone, False, now)
        where = f" in {target.zone}" if target.zone else ""
        why = "its nodes were lost" if state is BootState.GONE else f"it was not up within {waited:.0f} s"
        with self.store.write() as session:
            logbook.append(session, job.id, [logbook.note_line(
                now, f"attempt {attempt.number} stays on {attempt.market}: the {target.market} boot{where} was given "
                f"up ({why})")])

    def _stop_for_changeover(self, attempt: Attempt, now: datetime) -> None:
        """Ask a marked attempt to checkpoint and stop; past ``changeover_timeout_s`` without an outcome,
        stop it as a cancel does (scheduler.changeover.fall_back), and say so in the job's log."""
        assert attempt.handle is not None and attempt.id is not None
        asked = self._stopping.get(attempt.id)
        if asked is None:
            checkpoints = changeover.stop(self.executor, attempt.handle)
            self._stopping[attempt.id] = (now, not checkpoints)
            return
        since, fell_back = asked
        if fell_back:
            return
        waited = (now - since).total_seconds()
        if waited < self.changeover_timeout_s:
            return
        changeover.fall_back(self.executor, attempt.handle)
        self._stopping[attempt.id] = (since, True)
        with self.store.write() as session:
            logbook.append(session, attempt.job_id, [logbook.note_line(
                now, f"attempt {attempt.number} did not checkpoint and stop within {waited:.0f} s of the changeover "
                "request: stopped without a checkpoint; the work since its newest checkpoint is lost")])

    def _watch_zone(self, attempt: Attempt, status: RunStatus, now: datetime) -> None:
        """A spot attempt's steps advancing show its zone's capacity; stalled for ``stall_s`` (after a
        first step, so loading never counts), its loss: Ray waits in place for a node after a preemption."""
        if attempt.market != Market.SPOT.value or not attempt.zone or attempt.id is None:
            return
        step, last = status.progress.step, self._steps.get(attempt.id)
        if last is None or step > last[0]:
            if last is not None:
                self._observe(attempt.zone, True, now)
            self._steps[attempt.id] = (step, now)
        elif step > 0 and (now - last[1]).total_seconds() >= self.stall_s:
            self._observe(attempt.zone, False, now)

    def _observe(self, zone: str, available: bool, now: datetime) -> None:
        if isinstance(self.choose_market, ObservesZones):
            self.choose_market.observe(zone, available, now)

    def _release(self, handle: str) -> None:
        """After the row is closed, never before: a crash in between leaves an outcome to re-read."""
        if isinstance(self.executor, ReleasesAttempts):
            try:
                self.executor.release(handle)
            except GpuplanError as exc:  # only a leak until the executor's own expiry; never a lost outcome
                log.warning("could not release attempt %s: %s", handle, exc)

    def _copy_logs(self, attempt: Attempt) -> None:
        """Append the attempt's new executor log lines to the job's log (scheduler.logbook).

        Each tick, and once more before the attempt is closed: the API reads logs from the
        database, so they survive the executor dropping the attempt and reach API workers in
        other processes. A failed copy is retried next tick from the stored count.
        """
        if attempt.id is None or attempt.handle is None:
            return
        start = self._copied.get(attempt.id)
        try:
            if start is None:
                with self.store.read() as session:
                    start = logbook.executor_lines_stored(session, attempt.id)
            lines = self.executor.logs(attempt.handle, start)
            if lines:
                with self.store.write() as session:
                    logbook.append(session, attempt.job_id, lines, attempt_id=attempt.id)
        except Exception as exc:  # logs are best effort: never let them stop following the attempt
            log.warning("could not copy the logs of attempt %s: %s", attempt.handle, exc)
            self._copied.pop(attempt.id, None)
            return
        self._copied[attempt.id] = start + len(lines)

    def _finish(self, attempt_id: int | None, outcome: str, message: str, report: TickReport,
                status: RunStatus | None = None) -> None:
        fell_back = False
        if attempt_id is not None:
            self._copied.pop(attempt_id, None)
            self._steps.pop(attempt_id, None)
            boot = self._boots.pop(attempt_id, None)
            if boot is not None and isinstance(self.executor, BootsAhead):  # ended before its boot was up
                self.executor.unboot(boot[0])
            fell_back = self._stopping.pop(attempt_id, (None, False))[1]
            self._refused.pop(attempt_id, None)
        now = self.clock()
        with self.store.write() as session:
            attempt = session.get(Attempt, attempt_id)
            if attempt is None or attempt.ended_at is not None:
                return  # closed already (another tick, or a crash replay): never charge twice
            job = session.get(Job, attempt.job_id)
            assert job is not None
            if status is not None:  # predicted vs measured, kept with the attempt (failed ones too)
                attempt.metrics = attempt_metrics(status, job.plan)
            moving = changeover.marked(attempt)
            kept = (changeover.outcome(status, str(job.spec.get("task", "train")), fell_back)
                    if moving and status is not None else None)
            if kept is not None:
                attempt.metrics = {**(attempt.metrics or {}), "changeover": kept.metrics()}
                message = f"{message}; {kept.note}"
            ledger.close_attempt(session, attempt, job, now, outcome,
                                 f"{attempt.message}; {message}" if moving else message)
            report.finished[job.id] = outcome
            state = job.state
            if state.terminal:
                return
            note = f"attempt {attempt.number} {outcome}" + (f": {message}" if message else "")
            job.message = note[:2000]
            if outcome == RunState.SUCCEEDED.value:
                transition(session, job, JobState.SUCCEEDED, now, note)
            elif outcome == RunState.STOPPED.value or (
                    moving and outcome in (RunState.PREEMPTED.value, RunState.CANCELLED.value)):
                # checkpointed and stopped for a changeover (or, unmarked, by hand): nothing failed
                at = f" (step {kept.resumes_at})" if kept is not None and kept.resumes_at is not None else ""
                transition(session, job, JobState.QUEUED, now,
                           f"{note}; requeued to resume from {job.checkpoint_uri}{at}")
                job.next_run_at = now
                report.requeued.append(job.id)
            elif outcome == RunState.PREEMPTED.value:
                if attempt.market == Market.SPOT.value and attempt.zone:
                    self._observe(attempt.zone, False, now)
                transition(session, job, JobState.PREEMPTED, now, note)
                transition(session, job, JobState.QUEUED, now, "requeued to resume from " + job.checkpoint_uri)
                job.next_run_at = now
                report.requeued.append(job.id)
            elif outcome == RunState.CANCELLED.value:
                transition(session, job, JobState.CANCELLED, now, note + " (stopped by the executor)")
            else:
                self._retry_or_fail(session, job, now, note, report)

    def _retry_or_fail(self, session: Session, job: Job, now: datetime, note: str, report: TickReport) -> None:
        failures = session.exec(select(func.count()).select_from(Attempt).where(
            Attempt.job_id == job.id, Attempt.outcome == RunState.FAILED.value)).one()
        if failures >= job.max_attempts:
            transition(session, job, JobState.FAILED, now, f"{note}; gave up after {failures} failed attempts")
            return
        delay = min(self.backoff_base_s * 2 ** (failures - 1), self.backoff_max_s)
        transition(session, job, JobState.QUEUED, now,
                   f"{note}; retry {failures + 1}/{job.max_attempts} in {delay:.0f}s")
        job.next_run_at = now + timedelta(seconds=delay)
        report.requeued.append(job.id)

    def _lose(self, attempt: Attempt, why: str, report: TickReport) -> None:
        if attempt.id is not None:
            self._stopping.pop(attempt.id, None)
        now = self.clock()
        with self.store.write() as session:
            fresh = session.get(Attempt, attempt.id)
            if fresh is None or fresh.ended_at is not None:
                return
            job = session.get(Job, fresh.job_id)
            assert job is not None
            seen = fresh.last_seen_at or fresh.started_at  # never past now: a clock that went back bills no more
            ledger.close_attempt(session, fresh, job, min(seen, now), "lost",
                                 f"{why}; charged up to its last heartbeat ({seen:%Y-%m-%d %H:%M:%S} UTC)")
            report.lost.append(job.id)
            if job.state == JobState.RUNNING.value:
                transition(session, job, JobState.QUEUED, now,
                           f"attempt {fresh.number} lost: {why}; requeued to resume from {job.checkpoint_uri}")
                job.next_run_at = now
                report.requeued.append(job.id)

    # -------------------------------------------------------------- dispatch

    def _dispatch(self, report: TickReport) -> None:
        now = self.clock()
        with self.store.write() as session:
            limit = self.batch
            if self.max_running is not None:
                running = session.exec(select(func.count()).select_from(Attempt).where(
                    col(Attempt.ended_at).is_(None))).one()
                limit = min(limit, self.max_running - running)
            if limit <= 0:
                return
            claimed: list[tuple[Job, Attempt, RunRequest]] = []
            for job in self.store.claim(session, self._admit(session, now, limit)):
                open_attempt = session.exec(select(Attempt).where(
                    Attempt.job_id == job.id, col(Attempt.ended_at).is_(None))).first()
                if open_attempt is not None:  # cannot happen while states hold; refuse a second attempt
                    log.error("job %s is queued but attempt %s is open; not dispatching", job.id, open_attempt.number)
                    continue
                choice = self._moves.pop(job.id, None) or self.choose_market(job, now)
                place = choice if isinstance(choice, Placement) else Placement(*choice)
                if place.wait_s is not None:  # the spot policy waits for capacity: stays queued
                    self._wait_for_spot(session, job, now, place.wait_s, place.why)
                    continue
                market, price = place.market, place.usd_per_h
                try:
                    request = self._request(job, job.attempts + 1, market, place.zone, place.mttp_h)
                    reason = self.executor.feasibility(request)
                except (GpuplanError, ValueError) as exc:  # a stored spec/plan that no longer validates
                    reason = f"cannot build the run request: {exc}"
                if reason is not None:
                    # Never start an attempt that no node can ever run (Ray would pend silently).
                    job.message = f"infeasible: {reason}"[:2000]
                    transition(session, job, JobState.FAILED, now, job.message)
                    report.finished[job.id] = "infeasible"
                    continue
                job.attempts += 1
                attempt = Attempt(job_id=job.id, number=job.attempts, market=market, usd_per_h=price,
                                  started_at=now, last_seen_at=now, zone=request.zone)
                session.add(attempt)
                job.market, job.usd_per_h, job.next_run_at = Market(market), price, None
                transition(session, job, JobState.RUNNING, now, f"attempt {attempt.number} on {market}"
                           + (f" in {place.zone}" if place.zone else "") + f" at ${price:,.2f}/h"
                           + (f" ({place.why})" if place.why else ""))
                claimed.append((job, attempt, request))
            session.flush()
        for job, attempt, request in claimed:
            self._launch(job, attempt, request, report)

    def _admit(self, session: Session, now: datetime, limit: int) -> list[str]:
        """Ids of due jobs to start, within their teams' GPU quotas (scheduler.quota); a job the
        quota holds back stays queued, its reason in its message and, when it changes, its log."""
        queue = self.store.due_queue(session, now)
        messages = {row.id: row.message for row in queue}
        start, waits = quota.admit(
            (quota.Queued(row.id, row.team_id, row.gpus) for row in queue),
            quota.quotas(session, {row.team_id for row in queue}), quota.holders(session), limit)
        for job_id, reason in waits.items():
            if messages[job_id] != reason:
                self._note_wait(session, job_id, reason, now)
        return start

    @staticmethod
    def _note_wait(session: Session, job_id: str, reason: str, now: datetime) -> None:
        table = Job.__table__  # type: ignore[attr-defined]
        result: Any = session.execute(update(table).where(
            table.c.id == job_id, table.c.state == JobState.QUEUED.value).values(message=reason[:2000]))
        if result.rowcount:  # a cancel may have won the row since the queue was read
            logbook.append(session, job_id, [logbook.note_line(now, reason)])

    @staticmethod
    def _wait_for_spot(session: Session, job: Job, now: datetime, wait_s: float, why: str = "") -> None:
        """Leave a claimed job queued until ``now + wait_s`` (no spot capacity, and its deadline
        can afford the wait). The reason, with what the policy weighed now, goes to its message; its
        log gets it when the job starts waiting (not at every recheck, whose numbers move)."""
        job.next_run_at = now + timedelta(seconds=wait_s)
        reason = "waiting for spot capacity (the deadline leaves room to wait)"
        message = f"{reason}: {why}" if why else reason
        if not job.message.startswith(reason):
            logbook.append(session, job.id, [logbook.note_line(now, message)])
        job.message = message[:2000]
        session.add(job)

    @staticmethod
    def _request(job: Job, number: int, market: str, zone: str | None = None,
                 mttp_h: float | None = None) -> RunRequest:
        return RunRequest(
            job_id=job.id, attempt=number, spec=spec_from_dict(job.spec),
            strategy=job.plan.strategy, checkpoint_uri=job.checkpoint_uri, run_name=job.id, market=market,
            # the policy's zone when it placed the attempt, else the zone the plan priced
            zone=zone or job.plan.zone,
            mean_time_to_preemption_h=(mttp_h or job.plan.spot_mttp_h) if market == "spot" else None,
        )

    def _launch(self, job: Job, attempt: Attempt, request: RunRequest, report: TickReport) -> None:
        try:
            handle = self.executor.submit(request)
        except GpuplanError as exc:
            log.warning("submit of %s attempt %d failed: %s", job.id, attempt.number, exc)
            self._finish(attempt.id, RunState.FAILED.value, f"submit failed: {exc}", report)
            return
        with self.store.write() as session:
            fresh = session.get(Attempt, attempt.id)
            assert fresh is not None
            fresh.handle = handle
            session.add(fresh)
            logbook.append(session, job.id, [logbook.attempt_header(attempt.number, attempt.market,
                                                                    attempt.usd_per_h, handle)])
        report.dispatched.append(job.id)
