"""Starting attempts, phase one: which due jobs start now, where, and as which attempt.

Due queued jobs are claimed highest priority first, as their teams' GPU quotas admit them (scheduler.loop.quota: a
job that does not fit stays queued with the reason), with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite's
``BEGIN IMMEDIATE`` makes the claim a single writer). Each is placed (where a changeover sent it, else where the
market chooser says, or left queued while the spot policy waits for capacity), checked with the executor (a job
no node can ever run fails now), and moved to RUNNING with its Attempt row, no handle yet, in one transaction.
The loop then submits the attempts (phase two, scheduler.loop.scheduling): a crash in between can never hide a running
one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, update
from sqlmodel import Session, col, select

from errors import GpuplanError
from planner.spec import spec_from_dict
from scheduler.loop import quota
from scheduler.loop.attempt_placement import MarketChoice, MarketChooser
from scheduler.store import logbook
from scheduler.store.database import Store, transition
from scheduler.store.models import Attempt, Job
from scheduler.store.states import JobState, Market
from workers.executors.protocol import Executor, RunRequest

log = logging.getLogger("gpuplan.loop")


@dataclass(frozen=True)
class Claimed:
    """A job moved to RUNNING with its new attempt, to be submitted as ``request``."""

    job: Job
    attempt: Attempt
    request: RunRequest


@dataclass
class Claims:
    started: list[Claimed] = field(default_factory=list)
    infeasible: list[str] = field(default_factory=list)  # ids of jobs failed because no node can run them


def run_request(job: Job, number: int, market: str, zone: str | None = None,
                mttp_h: float | None = None) -> RunRequest:
    """The job's attempt ``number`` on ``market``, as the executor runs it."""
    return RunRequest(
        job_id=job.id, attempt=number, spec=spec_from_dict(job.spec),
        strategy=job.plan.strategy, checkpoint_uri=job.checkpoint_uri, run_name=job.id, market=market,
        # the policy's zone when it placed the attempt, else the zone the plan priced
        zone=zone or job.plan.zone,
        mean_time_to_preemption_h=(mttp_h or job.plan.spot_mttp_h) if market == "spot" else None,
    )


class Dispatcher:
    """Claims due jobs and starts their attempts' rows; ``moved(job_id)``: where a changeover sent the job."""

    def __init__(self, store: Store, executor: Executor, choose_market: MarketChooser,
                 moved: Callable[[str], MarketChoice | None], *, batch: int, max_running: int | None) -> None:
        self.store = store
        self.executor = executor
        self.choose_market = choose_market
        self.moved = moved
        self.batch = batch
        self.max_running = max_running

    def claim(self, now: datetime) -> Claims:
        """Phase one for up to ``batch`` due jobs (fewer where ``max_running`` attempts are open)."""
        claims = Claims()
        with self.store.write() as session:
            limit = self.batch
            if self.max_running is not None:
                running = session.exec(select(func.count()).select_from(Attempt).where(
                    col(Attempt.ended_at).is_(None))).one()
                limit = min(limit, self.max_running - running)
            if limit <= 0:
                return claims
            for job in self.store.claim(session, self._admit(session, now, limit)):
                self._start(session, job, now, claims)
            session.flush()
        return claims

    def _start(self, session: Session, job: Job, now: datetime, claims: Claims) -> None:
        """Place one claimed job and open its attempt, or leave it queued (waiting for spot), or fail it."""
        open_attempt = session.exec(select(Attempt).where(
            Attempt.job_id == job.id, col(Attempt.ended_at).is_(None))).first()
        if open_attempt is not None:  # cannot happen while states hold; refuse a second attempt
            log.error("job %s is queued but attempt %s is open; not dispatching", job.id, open_attempt.number)
            return
        choice = self.moved(job.id) or self.choose_market(job, now)
        place = choice if isinstance(choice, MarketChoice) else MarketChoice(*choice)
        if place.wait_s is not None:  # the spot policy waits for capacity: stays queued
            self._wait_for_spot(session, job, now, place.wait_s, place.why)
            return
        market, price = place.market, place.usd_per_h
        try:
            request = run_request(job, job.attempts + 1, market, place.zone, place.mttp_h)
            reason = self.executor.feasibility(request)
        except (GpuplanError, ValueError) as exc:  # a stored spec/plan that no longer validates
            reason = f"cannot build the run request: {exc}"
        if reason is not None:
            # Never start an attempt that no node can ever run (Ray would pend silently).
            job.message = f"infeasible: {reason}"[:2000]
            transition(session, job, JobState.FAILED, now, job.message)
            claims.infeasible.append(job.id)
            return
        job.attempts += 1
        attempt = Attempt(job_id=job.id, number=job.attempts, market=market, usd_per_h=price,
                          started_at=now, last_seen_at=now, zone=request.zone)
        session.add(attempt)
        job.market, job.usd_per_h, job.next_run_at = Market(market), price, None
        transition(session, job, JobState.RUNNING, now, f"attempt {attempt.number} on {market}"
                   + (f" in {place.zone}" if place.zone else "") + f" at ${price:,.2f}/h"
                   + (f" ({place.why})" if place.why else ""))
        claims.started.append(Claimed(job, attempt, request))

    def _admit(self, session: Session, now: datetime, limit: int) -> list[str]:
        """Ids of due jobs to start, within their teams' GPU quotas (scheduler.loop.quota); a job the
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
