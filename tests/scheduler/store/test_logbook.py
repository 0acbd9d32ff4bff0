"""A job's log: one append-only stream, numbered per job, never two lines with one number."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from scheduler.store import logbook
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, JobLog, Team
from tests.scheduler.conftest import toy_record

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def _jobs(store: Store, *job_ids: str) -> list[int]:
    """A team with these running jobs, one attempt each; the attempts' ids."""
    with store.write() as session:
        team = Team(name="ml", created_at=NOW)
        session.add(team)
        session.flush()
        assert team.id is not None
        session.add_all([Job(id=j, team_id=team.id, name=j, spec={}, spec_hash="h", plan=toy_record(), state="running",
                             created_at=NOW, updated_at=NOW) for j in job_ids])
        session.flush()
        attempts = [Attempt(job_id=j, number=1, market="spot", usd_per_h=1.0, started_at=NOW) for j in job_ids]
        session.add_all(attempts)
        session.flush()
        return [a.id for a in attempts if a.id is not None]


def test_lines_are_numbered_per_job_and_read_from_any_point(store: Store) -> None:
    a1, b1 = _jobs(store, "j1", "j2")
    with store.write() as session:
        logbook.append(session, "j1", ["event"])
        logbook.append(session, "j1", ["x0", "x1"], attempt_id=a1)
        logbook.append(session, "j2", ["other job"], attempt_id=b1)
        logbook.append(session, "j1", ["x2"], attempt_id=a1)
        logbook.append(session, "j1", [])
    with store.read() as session:
        assert logbook.read(session, "j1") == ["event", "x0", "x1", "x2"]
        assert logbook.read(session, "j1", 2) == ["x1", "x2"]
        assert logbook.read(session, "j1", 4) == []
        assert logbook.read(session, "j2") == ["other job"]
        assert logbook.executor_lines_stored(session, a1) == 3  # the header-less executor lines only
        assert logbook.executor_lines_stored(session, b1) == 1


def test_a_line_number_is_never_given_twice(store: Store) -> None:
    _jobs(store, "j1")
    with store.write() as session:
        logbook.append(session, "j1", ["a", "b"])
    with pytest.raises(IntegrityError), store.write() as session:
        session.execute(insert(JobLog.__table__), logbook.first_lines("j1", ["b again"]))  # type: ignore[attr-defined]
    with store.read() as session:
        assert logbook.read(session, "j1") == ["a", "b"]


def test_runaway_lines_are_clipped_with_a_note(store: Store) -> None:
    _jobs(store, "j1")
    with store.write() as session:
        logbook.append(session, "j1", ["z" * (logbook.MAX_LINE_CHARS + 5)])
    with store.read() as session:
        (line,) = logbook.read(session, "j1")
    assert line.endswith("... (5 more characters cut)") and len(line) < logbook.MAX_LINE_CHARS + 40
