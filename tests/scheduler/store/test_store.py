"""Migrations on a real SQLite file and a real PostgreSQL schema."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text
from sqlmodel import select

from errors import Conflict, ExternalServiceError, InvalidInput
from scheduler.store import logbook
from scheduler.store.database import Store, transition
from scheduler.store.models import Attempt, Event, Job, Team, metadata
from scheduler.store.states import JobState
from tests.scheduler.conftest import toy_record


def test_an_unsupported_database_is_refused() -> None:
    with pytest.raises(InvalidInput, match="unsupported database"):
        Store("mysql://u@h/db")


def test_schema_at_head_matches_the_models(store: Store) -> None:
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert diffs == []
    store.migrate()  # a second start is a no-op


# a plan as the code of those revisions stored it (schema version 1, tests/data/plans)
OLD_PLAN = (Path(__file__).resolve().parents[2] / "data" / "plans" / "v1_train_spot_auto.json").read_text()


def _insert_old_job(conn: Connection, now: datetime) -> None:
    """Job j-1 of team 1 as the baseline schema stores it (every column an older revision had)."""
    conn.execute(text(
        "INSERT INTO job (id, team_id, name, spec, spec_hash, plan, state, priority, estimated_usd, "
        "estimated_hours, gpus, gpu, market, usd_per_h, attempts, max_attempts, checkpoint_uri, message, "
        "created_at, updated_at) VALUES ('j-1', 1, 'old', '{}', 'h', :plan, 'succeeded', 0, 1, 1, 1, 'H100', "
        "'spot', 2.5, 1, 3, '/c', '', :t, :t)"), {"t": now, "plan": json.dumps(json.loads(OLD_PLAN)["plan"])})


def test_upgrade_keeps_existing_data(db_url: str) -> None:
    old = Store(db_url)
    old.migrate("0001")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with old.engine.begin() as conn:
        conn.execute(text("INSERT INTO team (id, name, budget_usd, created_at) VALUES (1, 'ml', 500, :t)"), {"t": now})
        _insert_old_job(conn, now)
        conn.execute(text("INSERT INTO attempt (id, job_id, number, market, usd_per_h, started_at, message) "
                          "VALUES (1, 'j-1', 1, 'spot', 2.5, :t, '')"), {"t": now})
        conn.execute(text("INSERT INTO spend (team_id, job_id, attempt_id, market, usd_per_h, hours, usd, "
                          "recorded_at) VALUES (1, 'j-1', 1, 'spot', 2.5, 2, 5, :t)"), {"t": now})
        for from_state, to_state in [(None, "pending"), ("pending", "queued"), ("queued", "succeeded")]:
            conn.execute(text("INSERT INTO event (job_id, from_state, to_state, at, reason) "
                              "VALUES ('j-1', :f, :s, :t, 'old')"), {"f": from_state, "s": to_state, "t": now})
    old.dispose()
    new = Store(db_url)
    new.migrate()
    try:
        with new.engine.connect() as conn:
            assert conn.execute(text("SELECT name, budget_usd FROM team")).all() == [("ml", 500)]
            assert conn.execute(text("SELECT usd FROM spend")).scalar_one() == 5
            indexes = {ix["name"] for ix in inspect(conn).get_indexes("spend")}
        assert "ix_spend_team_time_cover" in indexes and "ix_spend_team_id_recorded_at" not in indexes  # 0007
        with new.read() as session:
            job = session.get(Job, "j-1")
            assert job is not None and job.created_at == now and job.state == "succeeded"
            assert job.plan.strategy.gpu == "A100-40GB"  # its plan reads as the typed record
            # the job's recorded history became the first lines of its log (revision 0004)
            assert logbook.read(session, "j-1") == [
                "2026-01-01T00:00:00Z - -> pending: old", "2026-01-01T00:00:00Z pending -> queued: old",
                "2026-01-01T00:00:00Z queued -> succeeded: old"]
    finally:
        new.dispose()


def test_upgrade_to_attempt_metrics_keeps_old_attempts_without_metrics(db_url: str) -> None:
    old = Store(db_url)
    old.migrate("0004")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with old.engine.begin() as conn:
        conn.execute(text("INSERT INTO team (id, name, created_at) VALUES (1, 'ml', :t)"), {"t": now})
        _insert_old_job(conn, now)
        conn.execute(text("INSERT INTO attempt (id, job_id, number, market, usd_per_h, started_at, outcome, message) "
                          "VALUES (1, 'j-1', 1, 'spot', 2.5, :t, 'succeeded', 'done')"), {"t": now})
    old.dispose()
    new = Store(db_url)
    new.migrate()
    try:
        with new.write() as session:
            attempt = session.get(Attempt, 1)
            assert attempt is not None and attempt.outcome == "succeeded" and attempt.metrics is None
            attempt.metrics = {"measured": {"tokens_per_s": 5.0}, "predicted": {}, "oom_backoffs": []}
            session.add(attempt)
        with new.read() as session:
            kept = session.get(Attempt, 1)
            assert kept is not None and kept.metrics == {"measured": {"tokens_per_s": 5.0}, "predicted": {},
                                                         "oom_backoffs": []}
        from alembic import command

        cfg = new.alembic_config()
        with new.engine.begin() as conn:  # and back down
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        with new.engine.connect() as conn:
            assert "metrics" not in {c["name"] for c in inspect(conn).get_columns("attempt")}
    finally:
        new.dispose()


def test_upgrade_to_spend_day_sums_the_existing_ledger_per_utc_day(db_url: str) -> None:
    # Revision 0008 fills spend_day from the spend rows so far: per team, UTC day (on PostgreSQL
    # whatever the session's time zone), the job's GPU type and market; and goes back down.
    old = Store(db_url)
    old.migrate("0007")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    late, early = datetime(2026, 1, 1, 23, 59, 59, 999999, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    rows = [  # (team, job, market, usd, hours, at)
        (1, "j-1", "spot", 5.0, 2.0, late), (1, "j-1", "spot", 1.5, 0.5, late), (1, "j-1", "spot", 2.0, 1.0, early),
        (1, "j-1", "on-demand", 8.0, 1.0, late), (1, "j-2", "spot", 3.0, 1.0, late),
        (2, "j-3", "spot", 0.25, 0.125, early)]
    with old.engine.begin() as conn:
        for team in (1, 2):
            conn.execute(text("INSERT INTO team (id, name, created_at) VALUES (:i, :n, :t)"),
                         {"i": team, "n": f"t{team}", "t": t0})
        for job, team, gpu in (("j-1", 1, "H100"), ("j-2", 1, ""), ("j-3", 2, "H100")):
            conn.execute(text(
                "INSERT INTO job (id, team_id, name, spec, spec_hash, plan, state, priority, estimated_usd, "
                "estimated_hours, gpus, gpu, market, usd_per_h, attempts, max_attempts, checkpoint_uri, message, "
                "created_at, updated_at) VALUES (:j, :team, 'old', '{}', 'h', '{}', 'succeeded', 0, 1, 1, 1, :gpu, "
                "'spot', 2.5, 1, 3, '/c', '', :t, :t)"), {"j": job, "team": team, "gpu": gpu, "t": t0})
        for n, (team, job, market, usd, hours, at) in enumerate(rows, 1):
            conn.execute(text("INSERT INTO attempt (id, job_id, number, market, usd_per_h, started_at, message) "
                              "VALUES (:n, :j, :n, :m, 1, :t, '')"), {"n": n, "j": job, "m": market, "t": t0})
            conn.execute(text("INSERT INTO spend (team_id, job_id, attempt_id, market, usd_per_h, hours, usd, "
                              "recorded_at) VALUES (:team, :j, :n, :m, 1, :h, :u, :t)"),
                         {"team": team, "j": job, "n": n, "m": market, "h": hours, "u": usd,
                          "t": at.replace(tzinfo=None) if db_url.startswith("sqlite") else at})  # as the app stores it
    old.dispose()
    # a session 14 hours ahead of UTC: 23:59 UTC is the next day there, but not in the summary
    new = Store(db_url.replace("options=", "options=-cTimeZone%3DPacific/Kiritimati%20") if "options=" in db_url
                else db_url)
    new.migrate()
    try:
        with new.engine.connect() as conn:
            got = conn.execute(text("SELECT team_id, day, gpu, market, usd, hours, attempts FROM spend_day")).all()
        d1, d2 = late.date(), early.date()
        assert sorted((t, d if isinstance(d, type(d1)) else type(d1).fromisoformat(d), g, m, u, h, n)
                      for t, d, g, m, u, h, n in got) == [
            (1, d1, "", "spot", 3.0, 1.0, 1), (1, d1, "H100", "on-demand", 8.0, 1.0, 1),
            (1, d1, "H100", "spot", 6.5, 2.5, 2), (1, d2, "H100", "spot", 2.0, 1.0, 1),
            (2, d2, "H100", "spot", 0.25, 0.125, 1)]
        from alembic import command

        cfg = new.alembic_config()
        with new.engine.begin() as conn:  # and back down
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
        with new.engine.connect() as conn:
            assert "spend_day" not in inspect(conn).get_table_names()
    finally:
        new.dispose()


def test_transition_writes_an_event_and_refuses_illegal_moves(store: Store) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with store.write() as session:
        team = Team(name="t", created_at=now)
        session.add(team)
        session.flush()
        assert team.id is not None
        job = Job(id="j-x", team_id=team.id, name="x", spec={}, spec_hash="h", plan=toy_record(), state="queued",
                  created_at=now, updated_at=now)
        session.add(job)
        session.flush()
        transition(session, job, JobState.RUNNING, now, "dispatched")
    with store.write() as session:
        job2 = session.get(Job, "j-x")
        assert job2 is not None
        with pytest.raises(Conflict, match="cannot go from running to planned"):
            transition(session, job2, JobState.PLANNED, now, "nope")
    with store.read() as session:
        events = session.exec(select(Event)).all()
        assert [(e.from_state, e.to_state, e.reason) for e in events] == [("queued", "running", "dispatched")]
        assert session.get(Job, "j-x").state == "running"  # type: ignore[union-attr]


def test_migrate_on_an_unreachable_database_is_one_error_line() -> None:
    store = Store("postgresql+psycopg://gpuplan:s3cret@127.0.0.1:1/test")  # nothing listens on port 1
    try:
        with pytest.raises(ExternalServiceError) as info:
            store.migrate()
    finally:
        store.dispose()
    message = str(info.value)
    assert message.startswith("cannot use the database postgresql+psycopg://gpuplan:***@127.0.0.1:1/test: ")
    assert "s3cret" not in message and "\n" not in message and "GPUPLAN_DATABASE_URL" in message


def test_one_loop_lock_per_database_released_with_its_holder(db_url: str) -> None:
    first, second = Store(db_url), Store(db_url)
    try:
        lock = first.loop_lock()
        with pytest.raises(Conflict, match="another gpuplan server already runs the scheduling loop"):
            second.loop_lock()
        lock.release()
        lock.release()  # idempotent
        again = second.loop_lock()  # free once released
        with pytest.raises(Conflict):
            first.loop_lock()
        again.release()
    finally:
        first.dispose()
        second.dispose()


def test_a_released_loop_lock_is_free_the_moment_release_returns(db_url: str) -> None:
    # PostgreSQL: dropping the session alone freed the lock only once the server noticed (a second store asking
    # at once was refused, 62 times in 400 under two busy cores); release now unlocks before it drops the session
    first, second = Store(db_url), Store(db_url)
    try:
        for _ in range(50):
            first.loop_lock().release()
            second.loop_lock().release()
    finally:
        first.dispose()
        second.dispose()
