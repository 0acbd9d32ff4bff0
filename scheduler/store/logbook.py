"""A job's log as one append-only stream in the database (table ``job_log``).

Every line of ``gpuplan logs`` is a row: state changes (written with their Event, by
``scheduler.store.database.transition`` and by submit), a header per attempt, and the attempt's executor
lines (copied by the loop each tick). Lines are numbered per job from 0 and never move, so a
client that has seen N lines asks for ``since=N`` and gets exactly what is new, whatever was
written in between (``gpuplan logs --follow``). Any API process can read it, and it outlives
the executor's memory (a released Ray actor, a restarted server).

The next number is taken under the job's row lock (PostgreSQL; SQLite has one writer at a time),
and ``(job_id, seq)`` is unique, so two writers can never give two lines one number.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, insert, select
from sqlmodel import Session

from scheduler.store.models import Attempt, Job, JobLog

MAX_LINE_CHARS = 8000  # a runaway line (a tensor printed whole) must not bloat the database

_log = JobLog.__table__  # type: ignore[attr-defined]
_job = Job.__table__  # type: ignore[attr-defined]
_attempt = Attempt.__table__  # type: ignore[attr-defined]


def event_line(at: datetime, from_state: str | None, to_state: str, reason: str) -> str:
    return f"{at:%Y-%m-%dT%H:%M:%SZ} {from_state or '-'} -> {to_state}: {reason}"


def note_line(at: datetime, text: str) -> str:
    """A line about the job that is not a state change (why a queued job waits)."""
    return f"{at:%Y-%m-%dT%H:%M:%SZ} {text}"


def attempt_header(number: int, market: str, usd_per_h: float, handle: str | None) -> str:
    return f"--- attempt {number} ({market}, ${usd_per_h:,.2f}/h, handle {handle or '-'}) ---"


def first_lines(job_id: str, lines: Sequence[str]) -> list[dict[str, object]]:
    """Rows for the first lines of a job that is being inserted in the same transaction."""
    return _rows(job_id, 0, lines, None)


def append(session: Session, job_id: str, lines: Sequence[str], *, attempt_id: int | None = None) -> None:
    """Append ``lines`` to the job's log (``attempt_id``: they are that attempt's executor lines)."""
    if not lines:
        return
    # The row lock serialises writers of one job's log; the caller's flush has taken it already
    # when it changed the job (a transition), in which case this is a no-op re-lock.
    session.execute(select(_job.c.id).where(_job.c.id == job_id).with_for_update())
    start = session.execute(select(func.coalesce(func.max(_log.c.seq), -1)).where(_log.c.job_id == job_id))
    first = int(start.scalar_one()) + 1
    session.execute(insert(_log), _rows(job_id, first, lines, attempt_id))


def executor_lines_stored(session: Session, attempt_id: int) -> int:
    """How many executor lines of the attempt are stored: the ``since`` to ask the executor for."""
    count = session.execute(select(func.count()).where(_log.c.attempt_id == attempt_id)).scalar_one()
    return int(count)


def read(session: Session, job_id: str, since: int = 0) -> list[str]:
    """The job's lines from number ``since`` on."""
    stmt = select(_log.c.line).where(_log.c.job_id == job_id, _log.c.seq >= since).order_by(_log.c.seq)
    return [str(line) for line in session.execute(stmt).scalars()]


def newest_open_line(session: Session, job_id: str, needle: str) -> str | None:
    """The newest line containing ``needle`` of the job's attempt still running (None: none has it)."""
    stmt = (select(_log.c.line).join(_attempt, _attempt.c.id == _log.c.attempt_id)
            .where(_log.c.job_id == job_id, _attempt.c.ended_at.is_(None), _log.c.line.contains(needle))
            .order_by(_log.c.seq.desc()).limit(1))
    line = session.execute(stmt).scalar()
    return None if line is None else str(line)


def _rows(job_id: str, first: int, lines: Sequence[str], attempt_id: int | None) -> list[dict[str, object]]:
    return [{"job_id": job_id, "seq": first + i, "attempt_id": attempt_id, "line": _clip(line)}
            for i, line in enumerate(lines)]


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f"... ({len(line) - MAX_LINE_CHARS} more characters cut)"
