"""A running job's latest progress (step, %, tokens/s, loss, ETA) for `status` and `list`.

The workers report each step to the executor, and the loop copies their log lines into the job's
log (scheduler.store.logbook) every tick, so the database already holds the newest ``step N/M loss L R
tokens/s`` line of the open attempt: read back here, every API process and the in-process CLI show
the same progress, with nothing new to store.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlmodel import Session

from scheduler.store.models import Attempt, Job, JobLog, JobProgress
from scheduler.store.states import JobState

# workers.train.loop's report line: "step 16/64 loss 5.1234 2,210 tokens/s" (the rate once it is steady)
_STEP = re.compile(r"^step (\d+)/(\d+) loss (\S+)(?: ([\d,.]+) tokens/s)?")
_log = JobLog.__table__  # type: ignore[attr-defined]
_attempt = Attempt.__table__  # type: ignore[attr-defined]
_job = Job.__table__  # type: ignore[attr-defined]


def parse_step_line(line: str, tokens: float | None) -> JobProgress | None:
    """The progress a step line says; ``tokens``: the spec's total (train.tokens), for the ETA."""
    found = _STEP.match(line)
    if found is None:
        return None
    step, total = int(found.group(1)), int(found.group(2))
    rate = float(found.group(4).replace(",", "")) if found.group(4) else None
    try:
        loss: float | None = float(found.group(3))
    except ValueError:
        loss = None
    left = tokens * max(total - step, 0) / total if tokens and total else None
    return JobProgress(step=step, total_steps=total, percent=100.0 * step / total if total else None, loss=loss,
                       tokens_per_s=rate, eta_s=left / rate if left is not None and rate else None)


def latest(session: Session, jobs: Iterable[Any]) -> dict[str, JobProgress]:
    """Job id -> the progress of its open attempt, for the running ones among ``jobs`` (each with ``id``
    and ``state``); an attempt that has not logged a step yet has none."""
    out: dict[str, JobProgress] = {}
    for job in jobs:
        if str(job["state"]) != JobState.RUNNING.value:
            continue
        stmt = (select(_log.c.line).join(_attempt, _attempt.c.id == _log.c.attempt_id)
                .where(_log.c.job_id == job["id"], _attempt.c.ended_at.is_(None), _log.c.line.like("step %/%"))
                .order_by(_log.c.seq.desc()).limit(1))
        line = session.execute(stmt).scalar_one_or_none()
        if line is None:
            continue
        spec = session.execute(select(_job.c.spec).where(_job.c.id == job["id"])).scalar_one_or_none() or {}
        progress = parse_step_line(str(line), (spec.get("train") or {}).get("tokens"))
        if progress is not None:
            out[str(job["id"])] = progress
    return out
