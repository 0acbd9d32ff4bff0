"""The GPU quota admits jobs to run, not to the queue.

A team's budget is reserved at submit (scheduler.service). Its GPU quota caps the GPUs of the
jobs that hold an attempt right now: a job that does not fit stays queued, with the reason as its
message and a line in its log, and starts once running jobs of its team end. Only a job larger
than the whole quota is refused at submit, since it could never start.

Jobs of one team start in priority order, then submit order: a job waiting for quota holds back
the team's later jobs, so a large job is never starved by a stream of small ones. Other teams'
jobs are not held back.

:func:`admit` is the pure decision; the loop (scheduler.loop.scheduling) feeds it the due queue and the
running attempts read in its dispatch transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlmodel import Session, col

from scheduler.store.models import Attempt, Job, Team

WAITING = "waiting: "  # the prefix of a queued job's message while the quota holds it back


@dataclass(frozen=True)
class Queued:
    """A due queued job, as the admission needs it."""

    id: str
    team_id: int
    gpus: int


@dataclass(frozen=True)
class Quota:
    team: str
    gpus: int


Holders = Mapping[int, Sequence[tuple[str, int]]]  # team id -> (job id, GPUs) of jobs holding an attempt


def quotas(session: Session, team_ids: Iterable[int] | None = None) -> dict[int, Quota]:
    """team id -> its quota, for teams that have one."""
    stmt = select(col(Team.id), col(Team.name), col(Team.gpu_quota)).where(col(Team.gpu_quota).is_not(None))
    if team_ids is not None:
        stmt = stmt.where(col(Team.id).in_(list(team_ids)))
    return {int(i): Quota(str(n), int(q)) for i, n, q in session.execute(stmt).all()}


def holders(session: Session, team_id: int | None = None) -> dict[int, list[tuple[str, int]]]:
    """The jobs whose GPUs count against their team's quota: those with an open attempt (running,
    or cancelled with the attempt not stopped yet), oldest attempt first."""
    stmt = (select(col(Job.team_id), col(Job.id), col(Job.gpus))
            .join(Attempt, col(Attempt.job_id) == col(Job.id))
            .where(col(Attempt.ended_at).is_(None))
            .order_by(col(Attempt.started_at), col(Job.id)))
    if team_id is not None:
        stmt = stmt.where(col(Job.team_id) == team_id)
    out: dict[int, list[tuple[str, int]]] = {}
    for team, job_id, gpus in session.execute(stmt).all():
        out.setdefault(int(team), []).append((str(job_id), int(gpus)))
    return out


def too_large(quota: Quota, gpus: int) -> str | None:
    """Why a job of ``gpus`` can never start under ``quota``, or None."""
    if gpus <= quota.gpus:
        return None
    return f"needs {gpus} GPUs, more than team {quota.team}'s whole quota of {quota.gpus}"


def wait_reason(quota: Quota, gpus: int, running: Sequence[tuple[str, int]]) -> str | None:
    """Why a job of ``gpus`` cannot start now beside ``running``, or None when it fits."""
    big = too_large(quota, gpus)
    if big is not None:
        return f"{WAITING}{big}; raise the quota (gpuplan team quota) or cancel the job"
    used = sum(g for _, g in running)
    if used + gpus <= quota.gpus:
        return None
    ids = [job_id for job_id, _ in running]
    by = ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return (f"{WAITING}{used} of {quota.gpus} GPUs of team {quota.team}'s quota in use by {by}; "
            f"needs {gpus}, starts when {used + gpus - quota.gpus} are free")


def admit(queue: Iterable[Queued], quotas: Mapping[int, Quota], running: Holders,
          limit: int) -> tuple[list[str], dict[str, str]]:
    """(ids to start now, at most ``limit``; {id: why it waits}) for ``queue`` in dispatch order.

    Stops reading the queue once ``limit`` jobs are admitted: the rest keep their message until a
    later tick reaches them.
    """
    held = {team: list(jobs) for team, jobs in running.items()}
    head: dict[int, str] = {}  # team id -> its first job the quota holds back
    start: list[str] = []
    waits: dict[str, str] = {}
    for job in queue:
        if len(start) >= limit:
            break
        quota = quotas.get(job.team_id)
        if quota is None:
            start.append(job.id)
            continue
        if job.team_id in head:
            waits[job.id] = (f"{WAITING}behind {head[job.team_id]}, which team {quota.team}'s GPU quota holds "
                             "back (a team's jobs start in priority order)")
            continue
        reason = wait_reason(quota, job.gpus, held.get(job.team_id, ()))
        if reason is not None:
            head[job.team_id] = job.id
            waits[job.id] = reason
            continue
        held.setdefault(job.team_id, []).append((job.id, job.gpus))
        start.append(job.id)
    return start, waits
