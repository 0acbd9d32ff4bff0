"""The spend ledger: what each attempt cost, at the price it launched at, recorded exactly once.

An attempt is closed and its Spend row written in the same transaction, and ``spend.attempt_id``
is unique, so a crash either leaves the attempt open (the loop closes it on restart) or leaves
both written; it can never drop or double-count one. The same transaction adds the row to its
team's, UTC day's, GPU type's and market's total in ``spend_day`` (an upsert), so the summary the
reports read never misses or double-counts a row either: if the upsert fails, nothing is written.

Reports over a time window read whole UTC days from ``spend_day`` and only the partial days at the
window's edges from ``spend`` (:func:`day_split`); totals ever are the summary's alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import Float, case, delete, func, or_
from sqlalchemy import select as sa_select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, col, select

from errors import InvalidInput
from planner.spec import parse_hours
from scheduler.store.models import Attempt, Job, Spend, SpendDay, SpendLine
from scheduler.store.states import ACTIVE, JobState

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
SINCE_FORMS = "a window (30d, 12h, 90m) or a UTC date or time (2026-11-01, 2026-11-01T08:00)"


def since_start(since: str, now: datetime) -> datetime:
    """The start of a spend report: ``since`` is a window back from ``now`` (``30d``) or an ISO
    date or date-time (UTC unless it names an offset)."""
    text = since.strip()
    if _ISO_DATE.match(text):
        try:
            start = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidInput(f"{since!r} is not a date; write {SINCE_FORMS}", path="since") from None
        start = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
        if start > now:
            raise InvalidInput(f"{since!r} is in the future (now is {now:%Y-%m-%d %H:%M} UTC)", path="since")
        return start
    try:
        return now - timedelta(hours=parse_hours(text))
    except ValueError as exc:  # parse_hours' message shows the window forms; add the dates
        raise InvalidInput(f"{exc}, or a date such as 2026-11-01", path="since") from None
    except OverflowError:
        raise InvalidInput(f"window {since!r} is too large", path="since", hint=f"write {SINCE_FORMS}") from None


def close_attempt(session: Session, attempt: Attempt, job: Job, ended_at: datetime, outcome: str,
                  message: str = "") -> Spend:
    """End ``attempt`` and charge it (idempotent: a closed attempt returns its existing row)."""
    existing = session.exec(select(Spend).where(Spend.attempt_id == attempt.id)).first()
    if existing is not None:
        return existing
    end = max(ended_at, attempt.started_at)
    hours = (end - attempt.started_at).total_seconds() / 3600.0
    attempt.ended_at = end
    attempt.outcome = outcome
    attempt.message = message[:2000]
    session.add(attempt)
    assert attempt.id is not None
    row = Spend(team_id=job.team_id, job_id=job.id, attempt_id=attempt.id, market=attempt.market,
                usd_per_h=attempt.usd_per_h, hours=hours, usd=attempt.usd_per_h * hours, recorded_at=end)
    session.add(row)
    add_to_day(session, row, job.gpu)
    return row


_spend_day = SpendDay.__table__  # type: ignore[attr-defined]
_DAY_KEY = [_spend_day.c.team_id, _spend_day.c.day, _spend_day.c.gpu, _spend_day.c.market]


def utc_day(at: datetime) -> date:
    return at.astimezone(UTC).date()


def add_to_day(session: Session, row: Spend, gpu: str) -> None:
    """Add ``row`` to its (team, UTC day, GPU type, market) total in ``spend_day``, in the caller's
    transaction: one INSERT ... ON CONFLICT DO UPDATE (PostgreSQL and SQLite alike), which takes the
    summary row's lock on PostgreSQL until commit, so concurrent writers add in turn."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(_spend_day).values(team_id=row.team_id, day=utc_day(row.recorded_at), gpu=gpu, market=row.market,
                                     usd=row.usd, hours=row.hours, attempts=1)
    session.execute(stmt.on_conflict_do_update(index_elements=_DAY_KEY, set_={
        "usd": _spend_day.c.usd + stmt.excluded.usd, "hours": _spend_day.c.hours + stmt.excluded.hours,
        "attempts": _spend_day.c.attempts + stmt.excluded.attempts}))


def rebuild_days(session: Session) -> int:
    """Refill ``spend_day`` from the ledger (what migration 0008 did): for rows written around the
    ledger, as bench/service/ui_pages.py's bulk seed does. Returns the number of summary rows."""
    spend, job = Spend.__table__, Job.__table__  # type: ignore[attr-defined]
    day = utc_day_of(session.get_bind().dialect.name, spend.c.recorded_at).label("day")
    session.execute(delete(_spend_day))
    select_rows = (sa_select(spend.c.team_id, day, job.c.gpu, spend.c.market, func.sum(spend.c.usd),
                             func.sum(spend.c.hours), func.count())
                   .join(job, job.c.id == spend.c.job_id)
                   .group_by(spend.c.team_id, day, job.c.gpu, spend.c.market))
    session.execute(_spend_day.insert().from_select(
        ["team_id", "day", "gpu", "market", "usd", "hours", "attempts"], select_rows))
    return int(session.execute(sa_select(func.count()).select_from(_spend_day)).scalar_one())


def utc_day_of(dialect: str, column: Any) -> Any:
    """The UTC day of a timestamp column, in SQL (the ledger's rebuild and the dashboard's edge days)."""
    if dialect == "postgresql":  # the session's time zone must not move a row to another day
        return func.date(func.timezone("UTC", column))
    return func.date(column)  # SQLite stores naive UTC text


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


@dataclass(frozen=True)
class DaySplit:
    """A window [since, until] as the whole UTC days ``first``..``last`` (both included; none when
    ``first > last``), read from ``spend_day``, and the rest, read from ``spend``: [since, first's
    midnight) and [the midnight after last, until] (the whole window when there are no whole days)."""

    since: datetime
    until: datetime
    first: date
    last: date

    @property
    def has_days(self) -> bool:
        return self.first <= self.last

    def raw(self, recorded_at: Any) -> list[Any]:
        """The conditions on a spend row's ``recorded_at`` for the parts outside the whole days, one
        range each (one query each: an OR of two ranges made SQLite read the team's whole index)."""
        if not self.has_days:
            return [(recorded_at >= self.since) & (recorded_at <= self.until)]
        ranges = [(recorded_at >= midnight(self.last + timedelta(days=1))) & (recorded_at <= self.until)]
        if self.since < midnight(self.first):
            ranges.insert(0, (recorded_at >= self.since) & (recorded_at < midnight(self.first)))
        return ranges


def day_split(since: datetime, until: datetime) -> DaySplit:
    """The whole UTC days inside [since, until]: from since's day if it starts at midnight, else
    the next, to the day before until's (until's own day ends after until: it is partial)."""
    start, end = since.astimezone(UTC), until.astimezone(UTC)
    first = start.date() if start == midnight(start.date()) else start.date() + timedelta(days=1)
    return DaySplit(start, end, first, end.date() - timedelta(days=1))


def team_spent(session: Session, team_id: int) -> float:
    total = session.execute(sa_select(func.coalesce(func.sum(_spend_day.c.usd), 0.0))
                            .where(_spend_day.c.team_id == team_id)).scalar_one()
    return float(total)


class _greatest(FunctionElement[float]):
    """GREATEST(a, b): PostgreSQL's name; SQLite's two-argument max() is the same function."""

    type = Float()
    inherit_cache = True


@compiles(_greatest)
def _greatest_sql(element: _greatest, compiler: Any, **kw: Any) -> str:
    return f"greatest({compiler.process(element.clauses, **kw)})"


@compiles(_greatest, "sqlite")
def _greatest_sqlite(element: _greatest, compiler: Any, **kw: Any) -> str:
    return f"max({compiler.process(element.clauses, **kw)})"


def _reserved_by_team(team_ids: list[int] | None) -> Any:
    """(team id, USD still reserved by active jobs' estimates beyond what they spent, GPUs of queued
    jobs) per team: each active job's spend is summed from its own index entries (named once in
    the statement, so it is summed once per job), not the teams' whole ledgers.

    A cancelled job whose attempt is still open (the loop has not stopped it yet) keeps its reservation:
    its GPUs are billed until then and its spend is written when the attempt closes, so releasing the
    estimate at the cancel let a new job be admitted into money about to be charged (the team went over
    its budget: tests/scheduler/test_invariants.py found it)."""
    spend, job, attempt = Spend.__table__, Job.__table__, Attempt.__table__  # type: ignore[attr-defined]
    spent = (sa_select(func.coalesce(func.sum(spend.c.usd), 0.0)).where(spend.c.job_id == job.c.id)
             .correlate(job).scalar_subquery())
    open_attempt = sa_select(attempt.c.job_id).where(attempt.c.ended_at.is_(None))
    stmt = (sa_select(job.c.team_id, func.coalesce(func.sum(_greatest(job.c.estimated_usd - spent, 0.0)), 0.0),
                      func.coalesce(func.sum(case((job.c.state == JobState.QUEUED.value, job.c.gpus), else_=0)), 0))
            .where(or_(job.c.state.in_([s.value for s in ACTIVE]), job.c.id.in_(open_attempt)))
            .group_by(job.c.team_id))
    return stmt if team_ids is None else stmt.where(job.c.team_id.in_(team_ids))


def team_reserved(session: Session, team_id: int) -> tuple[float, int]:
    """(USD still reserved by active jobs' estimates beyond what they spent, GPUs of queued jobs)."""
    return reserved_by_team(session, [team_id]).get(team_id, (0.0, 0))


def reserved_by_team(session: Session, team_ids: list[int] | None = None) -> dict[int, tuple[float, int]]:
    """{team id: team_reserved} for ``team_ids`` (None: every team) in one grouped query; a team
    without active jobs is absent."""
    rows = session.execute(_reserved_by_team(team_ids)).all()
    return {int(t): (float(u), int(g)) for t, u, g in rows}


def spent_by_team(session: Session, team_ids: list[int] | None = None) -> dict[int, float]:
    """{team id: everything it spent} in one grouped query over the day totals; a team that spent
    nothing is absent."""
    stmt = sa_select(_spend_day.c.team_id, func.sum(_spend_day.c.usd)).group_by(_spend_day.c.team_id)
    if team_ids is not None:
        stmt = stmt.where(_spend_day.c.team_id.in_(team_ids))
    return {int(t): float(u) for t, u in session.execute(stmt).all()}


def job_spent(session: Session, job_ids: list[str]) -> dict[str, float]:
    if not job_ids:
        return {}
    rows = session.exec(
        select(Spend.job_id, func.sum(Spend.usd)).where(col(Spend.job_id).in_(job_ids)).group_by(col(Spend.job_id))
    ).all()
    return {job_id: float(usd) for job_id, usd in rows}


def spend_lines(session: Session, team_id: int, since: datetime, until: datetime,
                top: int | None = None) -> list[SpendLine]:
    """The team's spend in [since, until] per job and market, costliest first; with ``top``, only
    the lines of its ``top`` costliest jobs (ranked and limited in the database)."""
    spend, job = Spend.__table__, Job.__table__  # type: ignore[attr-defined]
    window = (spend.c.team_id == team_id, spend.c.recorded_at >= since, spend.c.recorded_at <= until)
    stmt = (sa_select(spend.c.job_id, job.c.name, spend.c.market, func.count(), func.sum(spend.c.hours),
                      func.sum(spend.c.usd))
            .join(job, job.c.id == spend.c.job_id).where(*window)
            .group_by(spend.c.job_id, job.c.name, spend.c.market)
            .order_by(func.sum(spend.c.usd).desc(), spend.c.job_id, spend.c.market))
    if top is not None:
        costliest = (sa_select(spend.c.job_id).where(*window).group_by(spend.c.job_id)
                     .order_by(func.sum(spend.c.usd).desc(), spend.c.job_id).limit(top))
        stmt = stmt.where(spend.c.job_id.in_(costliest.scalar_subquery()))
    # model_construct: the values are the database's own, typed here; validating thousands of lines
    # was most of a busy team's Spend page (bench/service/ui_pages.py)
    return [
        SpendLine.model_construct(job_id=str(job_id), job_name=str(name), market=str(market), attempts=int(n),
                                  hours=float(h), usd=float(u))
        for job_id, name, market, n, h, u in session.execute(stmt).all()
    ]


def spend_by_team_between(session: Session, since: datetime, until: datetime, team_ids: list[int] | None = None,
                          ) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    """({team id: {market: USD recorded in [since, until]}}, {team id: USD ever}) of ``team_ids``
    (None: every team): the window's whole UTC days and all-time totals in one grouped pass over
    the day totals, the partial days at the window's edges from the ledger; markets in name order."""
    split = day_split(since, until)
    day = _spend_day.c.day
    inside = case(((day >= split.first) & (day <= split.last), _spend_day.c.usd))  # else NULL
    days = (sa_select(_spend_day.c.team_id, _spend_day.c.market, func.sum(inside), func.sum(_spend_day.c.usd))
            .group_by(_spend_day.c.team_id, _spend_day.c.market))
    spend = Spend.__table__  # type: ignore[attr-defined]
    edges = [sa_select(spend.c.team_id, spend.c.market, func.sum(spend.c.usd)).where(inside_edge)
             .group_by(spend.c.team_id, spend.c.market) for inside_edge in split.raw(spend.c.recorded_at)]
    if team_ids is not None:
        days = days.where(_spend_day.c.team_id.in_(team_ids))
        edges = [edge.where(spend.c.team_id.in_(team_ids)) for edge in edges]
    in_window: dict[tuple[int, str], float] = {}
    ever: dict[int, float] = {}
    for team_id, market, usd, total in sorted(session.execute(days).all(), key=lambda r: (r[0], r[1])):
        if usd is not None:  # the market had spend on a whole day of the window
            in_window[int(team_id), str(market)] = float(usd)
        ever[int(team_id)] = ever.get(int(team_id), 0.0) + float(total)
    for edge in edges:  # the window's start, then its end
        for team_id, market, usd in session.execute(edge).all():
            key = (int(team_id), str(market))
            in_window[key] = in_window.get(key, 0.0) + float(usd)
    window: dict[int, dict[str, float]] = {}
    for (team_id, market), usd in sorted(in_window.items()):
        window.setdefault(team_id, {})[market] = usd
    return window, ever


def spend_by_team(session: Session) -> dict[int, dict[str, float]]:
    """{team id: {market: USD ever}} from the day totals."""
    rows = session.execute(sa_select(_spend_day.c.team_id, _spend_day.c.market, func.sum(_spend_day.c.usd))
                           .group_by(_spend_day.c.team_id, _spend_day.c.market)).all()
    out: dict[int, dict[str, float]] = {}
    for team_id, market, usd in rows:
        out.setdefault(int(team_id), {})[str(market)] = float(usd)
    return out
