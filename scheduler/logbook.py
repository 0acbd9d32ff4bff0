"""Executor log lines in the database (table ``attempt_log``): the loop appends, the service reads.

Lines are numbered per attempt from 0, in the executor's order; the loop copies from the count
already stored, so after a crash it resumes where the last committed copy ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import func, insert, select
from sqlmodel import Session

from scheduler.models import AttemptLog

MAX_LINE_CHARS = 8000  # a runaway line (a tensor printed whole) must not bloat the database

_table = AttemptLog.__table__  # type: ignore[attr-defined]


def stored_count(session: Session, attempt_id: int) -> int:
    """How many lines of the attempt are stored: the ``since`` to ask the executor for."""
    count = session.execute(select(func.count()).where(_table.c.attempt_id == attempt_id)).scalar_one()
    return int(count)


def append(session: Session, attempt_id: int, first_seq: int, lines: Sequence[str]) -> None:
    """Store ``lines`` as lines ``first_seq``... of the attempt (one multi-row insert)."""
    if not lines:
        return
    rows = [{"attempt_id": attempt_id, "seq": first_seq + i, "line": _clip(line)} for i, line in enumerate(lines)]
    session.execute(insert(_table), rows)


def lines_by_attempt(session: Session, attempt_ids: Iterable[int]) -> dict[int, list[str]]:
    """Stored lines per attempt, in order; attempts with none are absent."""
    ids = list(attempt_ids)
    if not ids:
        return {}
    stmt = (select(_table.c.attempt_id, _table.c.line).where(_table.c.attempt_id.in_(ids))
            .order_by(_table.c.attempt_id, _table.c.seq))
    found: dict[int, list[str]] = {}
    for attempt_id, line in session.execute(stmt):
        found.setdefault(int(attempt_id), []).append(str(line))
    return found


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f"... ({len(line) - MAX_LINE_CHARS} more characters cut)"
