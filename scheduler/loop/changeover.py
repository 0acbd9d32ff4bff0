"""Changing a running attempt over: to spot in another zone, back to spot, or to on-demand.

The loop (scheduler/loop/scheduling.py) asks a chooser that can (:class:`Reconsiders`, e.g.
:class:`scheduler.loop.attempt_placement.SpotChooser`) whether each running attempt should move. A move is
durable before anything is stopped: the attempt's row is marked (its message starts with
:data:`MARK`). Then the executor is asked to **checkpoint and stop** the attempt
(:class:`workers.executors.protocol.StopsForChangeover`: RayExecutor and InProcessExecutor): the training loop
takes the spot notice's just-in-time checkpoint of the step it finishes and ends STOPPED with that
step, an inference attempt stops after the batch it writes. Nothing is lost: the next attempt
resumes from exactly that step. The loop waits for that outcome, a tick at a time, at most
``changeover_timeout_s``; an attempt that has not answered by then, or an executor that cannot
checkpoint on request, is stopped as a cancel stops it (:func:`fall_back`: at its next step, no
checkpoint), and the work since its newest checkpoint is lost; :func:`outcome` says how much, in
the attempt's message, its metrics (``changeover``) and the job's log. When the stopped attempt is
closed (and charged up to then), a marked attempt requeues its job instead of cancelling it, and the
next attempt starts where the chooser said (the loop keeps that target; after a restart the chooser
decides again). A loop that restarts between the mark and the stop asks again when it next sees the
attempt (its wait starts again then).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from sqlmodel import Session

from scheduler.loop.attempt_placement import MarketChoice, Running
from scheduler.store import logbook
from scheduler.store.models import Attempt, Job
from workers.executors.protocol import Executor, RunState, RunStatus, StopsForChangeover

MARK = "changeover: "


@runtime_checkable
class Reconsiders(Protocol):
    def reconsider(self, job: Job, running: Running, now: datetime) -> MarketChoice | None:
        """Where the running attempt should change over to; None: leave it."""
        ...


def marked(attempt: Attempt) -> bool:
    """Whether the loop stopped this attempt to change the job over."""
    return attempt.message.startswith(MARK)


def describe(target: MarketChoice) -> str:
    where = f" in {target.zone}" if target.zone else ""
    why = f" ({target.why})" if target.why else ""
    return f"{MARK}to {target.market}{where} at ${target.usd_per_h:,.2f}/h{why}"


def running(job: Job, attempt: Attempt, status: RunStatus) -> Running:
    """The attempt's market and zone and the job's work done, from its progress (steps of the plan's hours)."""
    progress = status.progress
    done = progress.step / progress.total_steps if progress.total_steps > 0 else 0.0
    return Running(market=attempt.market, zone=attempt.zone, work_done_h=done * job.plan.hours)


def mark(session: Session, attempt_id: int | None, target: MarketChoice, now: datetime) -> bool:
    """Record the decision on the open attempt's row (and the job's log); False if it has ended."""
    attempt = session.get(Attempt, attempt_id)
    if attempt is None or attempt.ended_at is not None:
        return False
    attempt.message = describe(target)
    session.add(attempt)
    logbook.append(session, attempt.job_id, [logbook.note_line(now, f"attempt {attempt.number} {attempt.message}")])
    return True


def stop(executor: Executor, handle: str) -> bool:
    """Ask the attempt to checkpoint and stop (idempotent); True if the executor can, else it is stopped
    as a cancel stops it (False: the work since its newest checkpoint is lost)."""
    if isinstance(executor, StopsForChangeover):
        executor.checkpoint_stop(handle)
        return True
    executor.cancel(handle)
    return False


def fall_back(executor: Executor, handle: str) -> None:
    """The attempt did not answer the checkpoint-and-stop in time: stop it without a checkpoint."""
    executor.cancel(handle)


@dataclass(frozen=True)
class ChangeoverOutcome:
    """How a changed-over attempt ended: where the next attempt resumes and what was lost."""

    resumes_at: int | None  # the step of the newest checkpoint (inference: requests written); None: from the start
    lost_steps: int  # training steps done after that checkpoint, to be done again
    note: str

    def metrics(self) -> dict[str, Any]:
        return {"resumes_at_step": self.resumes_at, "lost_steps": self.lost_steps}


def outcome(status: RunStatus | None, task: str, fell_back: bool) -> ChangeoverOutcome:
    """What the stop of a changed-over attempt kept, from its final status."""
    progress = status.progress if status is not None else None
    if task != "train":
        done = progress.step if progress is not None else None
        return ChangeoverOutcome(done, 0, "the outputs written stand; the next attempt answers the rest")
    if status is not None and status.state is RunState.STOPPED:
        at = progress.checkpoint_step if progress is not None else None
        where = f"the checkpoint of step {at}" if at is not None else "the start"
        return ChangeoverOutcome(at, 0, f"nothing lost: the next attempt resumes from {where}")
    at = progress.checkpoint_step if progress is not None else None
    step = progress.step if progress is not None else 0
    lost = max(0, step - (at or 0))
    if lost == 0:  # e.g. a spot notice's just-in-time checkpoint came first
        where = f"the checkpoint of step {at}" if at is not None else "the start"
        return ChangeoverOutcome(at, 0, f"nothing lost: the next attempt resumes from {where}")
    why = "did not answer the checkpoint-and-stop in time" if fell_back else "was stopped without a checkpoint"
    where = f"the checkpoint of step {at}" if at is not None else "the start"
    return ChangeoverOutcome(at, lost, f"it {why}: {lost} step(s) after {where} are lost and done again")
