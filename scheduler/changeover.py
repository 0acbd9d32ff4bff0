"""Changing a running attempt over: to spot in another zone, back to spot, or to on-demand.

The loop (scheduler/loop.py) asks a chooser that can (:class:`Reconsiders`, e.g.
:class:`scheduler.placement.SpotChooser`) whether each running attempt should move. A move is
durable before anything is stopped: the attempt's row is marked (its message starts with
:data:`MARK`), then the executor stops it, with a just-in-time checkpoint where it can
(:class:`StopsWithCheckpoint`: InProcessExecutor's ``preempt``), else with ``cancel`` (the run
stops at its next step; the newest periodic checkpoint stands). When the stopped attempt is
closed, a marked attempt requeues its job instead of cancelling it, and the next attempt starts
where the chooser said (the loop keeps that target; after a restart the chooser decides again).
A loop that restarts between the mark and the stop stops the attempt when it next sees it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

from sqlmodel import Session

from planner.types import Candidate
from scheduler import logbook
from scheduler.models import Attempt, Job
from scheduler.placement import Placement, Running
from workers.executor import Executor, RunStatus

MARK = "changeover: "


@runtime_checkable
class Reconsiders(Protocol):
    def reconsider(self, job: Job, running: Running, now: datetime) -> Placement | None:
        """Where the running attempt should change over to; None: leave it."""
        ...


@runtime_checkable
class StopsWithCheckpoint(Protocol):
    def preempt(self, handle: str) -> None:
        """Stop the attempt after a just-in-time checkpoint; it ends PREEMPTED."""
        ...


def marked(attempt: Attempt) -> bool:
    """Whether the loop stopped this attempt to change the job over."""
    return attempt.message.startswith(MARK)


def describe(target: Placement) -> str:
    where = f" in {target.zone}" if target.zone else ""
    return f"{MARK}to {target.market}{where} at ${target.usd_per_h:,.2f}/h"


def running(job: Job, attempt: Attempt, status: RunStatus) -> Running:
    """The attempt's market and zone and the job's work done, from its progress (steps of the plan's hours)."""
    progress = status.progress
    done = progress.step / progress.total_steps if progress.total_steps > 0 else 0.0
    hours = Candidate.model_validate(job.plan["chosen"]).estimate.hours
    return Running(market=attempt.market, zone=attempt.zone, work_done_h=done * hours)


def mark(session: Session, attempt_id: int | None, target: Placement, now: datetime) -> bool:
    """Record the decision on the open attempt's row (and the job's log); False if it has ended."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.ended_at is not None:
        return False
    attempt.message = describe(target)
    session.add(attempt)
    logbook.append(session, attempt.job_id, [logbook.note_line(now, f"attempt {attempt.number} {attempt.message}")])
    return True


def stop(executor: Executor, handle: str) -> None:
    """Stop the attempt, keeping as much work as the executor can (idempotent)."""
    if isinstance(executor, StopsWithCheckpoint):
        executor.preempt(handle)
    else:
        executor.cancel(handle)
