"""Job states and the transitions allowed between them, as data.

Every change of a job's state goes through :func:`check_transition` (called by the store helper
that also writes the Event), so an illegal move is refused in one place with a Conflict.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from errors import Conflict


class JobState(enum.StrEnum):
    PENDING = "pending"  # accepted, not yet planned
    PLANNED = "planned"  # has a plan and a reserved estimate
    QUEUED = "queued"  # waiting for the loop to dispatch an attempt
    RUNNING = "running"  # an attempt is live on the executor
    PREEMPTED = "preempted"  # the attempt lost its node; requeued to resume from the checkpoint
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class Market(enum.StrEnum):
    """Where a job's attempt runs: a spot instance, an on-demand one, or this machine ($0/h)."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    LOCAL = "local"


TERMINAL: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE: frozenset[JobState] = frozenset(set(JobState) - TERMINAL)

# from-state -> the states it may move to. Running -> queued is a failed or lost attempt being
# retried; preempted -> queued is the requeue after a preemption.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.PLANNED, JobState.FAILED, JobState.CANCELLED}),
    JobState.PLANNED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.PREEMPTED, JobState.QUEUED, JobState.CANCELLED}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def allowed(src: JobState, dst: JobState) -> bool:
    return dst in TRANSITIONS[src]


def check_transition(job_id: str, src: JobState, dst: JobState) -> None:
    """Raise Conflict unless ``src -> dst`` is an allowed transition."""
    if not allowed(src, dst):
        options = ", ".join(sorted(TRANSITIONS[src])) or "none: it is final"
        raise Conflict(
            f"job {job_id} cannot go from {src} to {dst}",
            hint=f"from {src} it may go to: {options}",
        )
