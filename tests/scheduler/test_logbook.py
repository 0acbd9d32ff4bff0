"""Executor log lines kept in the database: ordered per attempt, never stored twice, clipped."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.exc import IntegrityError

from scheduler import logbook
from scheduler.models import Attempt, Job, Team
from scheduler.store import Store


def _attempts(store: Store, n: int) -> list[int]:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    with store.write() as session:
        team = Team(name="ml", created_at=now)
        session.add(team)
        session.flush()
        assert team.id is not None
        session.add(Job(id="j1", team_id=team.id, name="j", spec={}, spec_hash="h", plan={}, state="running",
                        created_at=now, updated_at=now))
        session.flush()
        rows = [Attempt(job_id="j1", number=i + 1, market="spot", usd_per_h=1.0, started_at=now) for i in range(n)]
        session.add_all(rows)
        session.flush()
        return [r.id for r in rows if r.id is not None]


def test_lines_come_back_per_attempt_in_order_and_counts_resume_the_copy(store: Store) -> None:
    first, second = _attempts(store, 2)
    with store.write() as session:
        logbook.append(session, first, 0, ["a0", "a1"])
        logbook.append(session, second, 0, ["b0"])
        logbook.append(session, first, 2, ["a2"])
        logbook.append(session, second, 1, [])
    with store.read() as session:
        assert logbook.stored_count(session, first) == 3
        assert logbook.stored_count(session, second) == 1
        assert logbook.lines_by_attempt(session, [first, second]) == {first: ["a0", "a1", "a2"], second: ["b0"]}
        assert logbook.lines_by_attempt(session, []) == {}


def test_a_replayed_copy_cannot_store_a_line_twice(store: Store) -> None:
    (attempt,) = _attempts(store, 1)
    with store.write() as session:
        logbook.append(session, attempt, 0, ["x", "y"])
    with pytest.raises(IntegrityError), store.write() as session:
        logbook.append(session, attempt, 1, ["y again"])
    with store.read() as session:
        assert logbook.lines_by_attempt(session, [attempt]) == {attempt: ["x", "y"]}


def test_runaway_lines_are_clipped_with_a_note(store: Store) -> None:
    (attempt,) = _attempts(store, 1)
    with store.write() as session:
        logbook.append(session, attempt, 0, ["z" * (logbook.MAX_LINE_CHARS + 5)])
    with store.read() as session:
        (line,) = logbook.lines_by_attempt(session, [attempt])[attempt]
    assert line.endswith("... (5 more characters cut)") and len(line) < logbook.MAX_LINE_CHARS + 40
