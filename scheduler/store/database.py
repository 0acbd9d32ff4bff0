"""The database: engines, sessions, migrations and the few dialect-specific locking helpers.

SQLite (the embedded default) runs in WAL mode with two engines: reads start a deferred
transaction, writes ``BEGIN IMMEDIATE`` so concurrent writers queue on SQLite's one write lock
instead of failing on upgrade. PostgreSQL uses one engine; writers that check a team's budget
lock the team row (``SELECT ... FOR UPDATE``) and the loop claims jobs with ``SKIP LOCKED``.

The database URL is read at the edge (commands/settings.py) and passed in.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy import select as sa_select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.selectable import GenerativeSelect
from sqlmodel import Session, col, or_, select

from errors import Conflict, ExternalServiceError, InvalidInput, NotFound
from scheduler.loop.quota import WAITING
from scheduler.store import logbook
from scheduler.store.models import Event, Job, Team
from scheduler.store.states import JobState, check_transition

_Select = TypeVar("_Select", bound=GenerativeSelect)
_Row = TypeVar("_Row")

_HERE = Path(__file__).resolve().parent


class LoopLock:
    """The scheduling-loop lock of one database (:meth:`Store.loop_lock`), held until released."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()


def _unlock_and_drop(conn: Connection) -> None:
    """Release the loop's advisory lock on its own session, then drop that session.

    Why both: the unlock returns once the server has released the lock, so whoever asks next gets it;
    closing the connection alone frees it only when the server's backend notices the client has gone, a
    moment later (a second store asking at once was refused: tests/scheduler/store/test_store.py under load).
    Invalidate, not close: a pooled connection would keep any session state for its next user."""
    try:
        conn.execute(text("SELECT pg_advisory_unlock(hashtext(current_schema() || '.gpuplan-loop'))"))
        conn.commit()
    except SQLAlchemyError:
        pass  # the session is already broken: the server drops its locks with it
    finally:
        conn.invalidate()


def _normalise(url: str) -> str:
    # psycopg 3 is the driver we ship; "postgresql://" alone would ask for psycopg2.
    if url.startswith("postgres://"):
        url = "postgresql://" + url.removeprefix("postgres://")
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def _sqlite_engine(url: str, *, immediate: bool) -> Engine:
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60}, pool_size=8,
                           max_overflow=16)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (pysqlite's own is broken)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=60000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Store:
    """Owns the engines. ``read()`` and ``write()`` hand out sessions bound to one transaction."""

    def __init__(self, url: str, *, pool_size: int = 10) -> None:
        self.url = _normalise(url)
        try:
            parsed = make_url(self.url)
        except Exception as exc:  # sqlalchemy raises ArgumentError with a terse message
            raise InvalidInput(f"database URL {url!r} is not valid: {exc}",
                               hint="use sqlite:///path/to/file.db or postgresql://user@host/db") from None
        self.dialect = parsed.get_backend_name()
        if self.dialect == "sqlite":
            db = parsed.database or ""
            if db and db != ":memory:":
                Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
            self._write = _sqlite_engine(self.url, immediate=True)
            self._read = _sqlite_engine(self.url, immediate=False)
        elif self.dialect == "postgresql":
            self._write = create_engine(self.url, pool_size=pool_size, max_overflow=20, pool_pre_ping=True)
            # Reads run in autocommit (same pool): under READ COMMITTED every statement takes its own
            # snapshot anyway, so a read transaction only adds a BEGIN and a ROLLBACK round trip.
            self._read = self._write.execution_options(isolation_level="AUTOCOMMIT")
        else:
            raise InvalidInput(f"unsupported database {self.dialect!r}",
                               hint="use sqlite:///path/to/file.db or postgresql://user@host/db")
        self._migrated = threading.Lock()
        # SQLite has one write lock per file and a busy handler that sleeps (up to 100 ms a try)
        # while it waits; queueing this process's writers on a mutex hands the lock over at once.
        self._sqlite_writer = threading.RLock() if self.dialect == "sqlite" else None

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    def loop_lock(self) -> LoopLock:
        """Take the database's one scheduling-loop lock, or raise Conflict if another process has it.

        Two loops on one database would each reconcile away the other's running attempts as lost
        and start them again: a job running twice at once. The lock is the operating system's or
        the server's, so it goes with the process that holds it, kill -9 included: PostgreSQL's
        session advisory lock (keyed by the schema, so schemas of one database are independent),
        or ``flock`` on ``<file>.loop.lock`` next to a SQLite file.
        """
        refused = Conflict("another gpuplan server already runs the scheduling loop on this database",
                           hint="stop it first, or start this one with --executor none to serve only the API")
        if self.is_postgres:
            conn = self._write.connect()
            got = conn.execute(text("SELECT pg_try_advisory_lock(hashtext(current_schema() || '.gpuplan-loop'))"))
            held = bool(got.scalar())
            conn.commit()  # the session lock outlives the transaction; the connection is kept
            if not held:
                conn.close()
                raise refused
            return LoopLock(lambda: _unlock_and_drop(conn))
        database = make_url(self.url).database or ""
        if not database or database == ":memory:":
            return LoopLock(lambda: None)  # private to this process: nobody else can run a loop on it
        import fcntl

        fd = os.open(f"{Path(database).expanduser()}.loop.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise refused from None
        return LoopLock(lambda: os.close(fd))

    @property
    def engine(self) -> Engine:
        return self._write

    def dispose(self) -> None:
        self._write.dispose()
        if self._read.pool is not self._write.pool:
            self._read.dispose()

    # -------------------------------------------------------------- migrations

    def alembic_config(self) -> Config:
        cfg = Config(str(_HERE / "alembic.ini"))
        cfg.set_main_option("script_location", str(_HERE / "migrations"))
        cfg.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        return cfg

    def migrate(self, revision: str = "head") -> None:
        """Upgrade the schema to ``revision`` (idempotent; safe when several servers start at once)."""
        with self._migrated:
            cfg = self.alembic_config()
            engine = create_engine(self.url, poolclass=NullPool) if self.is_postgres else self._write
            try:
                with engine.begin() as conn:
                    if self.is_postgres:
                        conn.execute(text("SELECT pg_advisory_xact_lock(74211)"))
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, revision)
            except OperationalError as exc:
                # The first touch of the database: a server that is down or a wrong URL shows here,
                # and must read as one line (driver's first line), not SQLAlchemy's traceback.
                where = make_url(self.url).render_as_string(hide_password=True)
                reason = str(exc.orig or exc).strip().splitlines()[0]
                raise ExternalServiceError(f"cannot use the database {where}: {reason}",
                                           hint="is the database server running? check GPUPLAN_DATABASE_URL") from None
            finally:
                if engine is not self._write:
                    engine.dispose()

    # -------------------------------------------------------------- sessions

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self._read, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One write transaction: committed when the block ends, rolled back on an exception."""
        if self._sqlite_writer is None:
            with Session(self._write, expire_on_commit=False) as session, session.begin():
                yield session
            return
        with self._sqlite_writer, Session(self._write, expire_on_commit=False) as session, session.begin():
            yield session

    # -------------------------------------------------------------- locking helpers

    def _locking(self, stmt: _Select) -> _Select:
        """``stmt`` locking its rows until commit on PostgreSQL; SQLite's write lock already serialises."""
        return stmt.with_for_update() if self.is_postgres else stmt

    def lock_team(self, session: Session, team_id: int) -> Team:
        """The team row, locked until commit."""
        return _found(session.exec(self._locking(select(Team).where(Team.id == team_id))).first(), team_id)

    def lock_team_limits(self, session: Session, team_id: int) -> Any:
        """Like :meth:`lock_team` but a plain row (id, name, budget_usd, gpu_quota) through Core:
        submit only reads the limits, and skips building an ORM object per request."""
        table = Team.__table__  # type: ignore[attr-defined]
        stmt = sa_select(table.c.id, table.c.name, table.c.budget_usd, table.c.gpu_quota).where(
            table.c.id == team_id)
        return _found(session.execute(self._locking(stmt)).first(), team_id)

    def due_queue(self, session: Session, now: datetime) -> list[Any]:
        """(id, team_id, gpus, message) of queued jobs due to run, in dispatch order: highest
        priority first, then oldest. Unlocked and light (no spec or plan): the loop reads it whole
        to decide which jobs the GPU quotas admit, then claims those."""
        table = Job.__table__  # type: ignore[attr-defined]
        stmt = (
            sa_select(table.c.id, table.c.team_id, table.c.gpus, table.c.message)
            .where(table.c.state == JobState.QUEUED.value)
            .where(or_(table.c.next_run_at.is_(None), table.c.next_run_at <= now))
            .order_by(table.c.priority.desc(), table.c.created_at)
        )
        return list(session.execute(stmt).all())

    def claim(self, session: Session, job_ids: list[str]) -> list[Job]:
        """Those of ``job_ids`` still queued, in dispatch order; rows another transaction holds
        (a cancel in flight) are skipped."""
        if not job_ids:
            return []
        stmt = (
            select(Job)
            .where(col(Job.id).in_(job_ids), Job.state == JobState.QUEUED.value)
            .order_by(col(Job.priority).desc(), col(Job.created_at))
        )
        if self.is_postgres:
            stmt = stmt.with_for_update(skip_locked=True)
        return list(session.exec(stmt).all())


def _found(row: _Row | None, team_id: int) -> _Row:
    if row is None:
        raise NotFound(f"team {team_id} does not exist")
    return row


def transition(session: Session, job: Job, to: JobState, at: datetime, reason: str) -> None:
    """Move ``job`` to ``to`` (or raise Conflict) and record the Event, in the caller's transaction."""
    src = JobState(job.state)  # a member once read back; a Job built in memory may still hold its text
    check_transition(job.id, src, to)
    job.state = to
    job.updated_at = at
    if to is not JobState.QUEUED and job.message.startswith(WAITING):
        job.message = ""  # it no longer waits for the GPU quota
    if to is JobState.RUNNING and job.message.startswith("attempt "):
        # how the last attempt ended is history once another runs (its attempt row and events keep it)
        job.message = f"{reason} (the previous {job.message})"[:2000]
    if to is JobState.RUNNING and job.started_at is None:
        job.started_at = at
    if to.terminal:
        job.finished_at = at
        job.next_run_at = None
    session.add(job)
    session.add(Event(job_id=job.id, from_state=src.value, to_state=to.value, at=at, reason=reason[:2000]))
    session.flush()  # the job row's UPDATE takes its lock before the log line takes a number
    logbook.append(session, job.id, [logbook.event_line(at, src.value, to.value, reason[:2000])])
