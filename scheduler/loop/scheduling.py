"""The scheduling loop: claim queued jobs, run them on the Executor, follow, requeue, charge.

One ``tick()``:

1. follow every open attempt (``executor.status``): a finished one is closed and charged in the
   same transaction as the job's transition; PREEMPTED requeues the job at once (it resumes from
   its checkpoint: ``run_name`` is the job id), FAILED requeues with exponential backoff until the
   job's ``max_attempts`` failures, a cancelled job's live attempt is stopped; a live one is watched
   by scheduler.loop.attempt_moves (changed over where the chooser wants it, made before it breaks, moved
   down the plan's placements when the cloud refuses its nodes);
2. dispatch due queued jobs, highest priority first, that their team's GPU quota admits
   (scheduler.loop.dispatch claims them and opens their attempts; this module submits them).

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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from errors import GpuplanError
from planner.calibration import CostCalibration
from scheduler.loop import changeover
from scheduler.loop.accuracy import attempt_metrics
from scheduler.loop.attempt_moves import AttemptMoves
from scheduler.loop.attempt_placement import MarketChooser, market_chooser
from scheduler.loop.dispatch import Dispatcher
from scheduler.service import Clock, utcnow
from scheduler.store import ledger, logbook
from scheduler.store.database import LoopLock, Store, transition
from scheduler.store.models import Attempt, Job
from scheduler.store.states import JobState, Market
from workers.executors.protocol import Executor, ReleasesAttempts, RunRequest, RunState, RunStatus

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
        choose_market = choose_market or market_chooser(CostCalibration())
        self.poll_s = poll_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.lock = lock  # the database's loop lock (Store.loop_lock), released when run_forever ends
        # attempt id -> lines of its executor log already copied into the job's log (read back from
        # the database the first time an attempt is seen, so a restarted loop resumes the copy)
        self._copied: dict[int, int] = {}
        self.moves = AttemptMoves(store, executor, choose_market, stall_s=stall_s,
                                  changeover_timeout_s=changeover_timeout_s, boot_timeout_s=boot_timeout_s,
                                  launch_timeout_s=launch_timeout_s)
        self.dispatcher = Dispatcher(store, executor, choose_market, self.moves.next_placement, batch=batch,
                                     max_running=max_running)

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
                self.moves.watch(attempt, job, status, self.clock())

    def _heartbeat(self, attempt: Attempt) -> None:
        """The attempt is alive now: a loss found later is billed up to here (``_lose``)."""
        table = Attempt.__table__  # type: ignore[attr-defined]
        with self.store.write() as session:
            session.execute(update(table).where(table.c.id == attempt.id, table.c.ended_at.is_(None))
                            .values(last_seen_at=self.clock()))

    def _release(self, handle: str) -> None:
        """After the row is closed, never before: a crash in between leaves an outcome to re-read."""
        if isinstance(self.executor, ReleasesAttempts):
            try:
                self.executor.release(handle)
            except GpuplanError as exc:  # only a leak until the executor's own expiry; never a lost outcome
                log.warning("could not release attempt %s: %s", handle, exc)

    def _copy_logs(self, attempt: Attempt) -> None:
        """Append the attempt's new executor log lines to the job's log (scheduler.store.logbook).

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
            fell_back = self.moves.forget(attempt_id)
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
                    self.moves.observe(attempt.zone, False, now)
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
        if attempt.id is not None:  # no stop to wait for; a boot beside it is given back (no one moves onto it)
            self.moves.forget(attempt.id)
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
        """Start due jobs: their attempts' rows first (scheduler.loop.dispatch), then each submit."""
        claims = self.dispatcher.claim(self.clock())
        for job_id in claims.infeasible:
            report.finished[job_id] = "infeasible"
        for claimed in claims.started:
            self._launch(claimed.job, claimed.attempt, claimed.request, report)

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
