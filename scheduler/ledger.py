"""The spend ledger: what each attempt cost, at the price it launched at, recorded exactly once.

An attempt is closed and its Spend row written in the same transaction, and ``spend.attempt_id``
is unique, so a crash either leaves the attempt open (the loop closes it on restart) or leaves
both written; it can never drop or double-count one.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Float, case, func
from sqlalchemy import select as sa_select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, col, select

from catalog.errors import InvalidInput
from planner.spec import parse_hours
from scheduler.models import Attempt, Job, Spend, SpendLine
from scheduler.states import ACTIVE, JobState

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
    return row


def team_spent(session: Session, team_id: int) -> float:
    total = session.exec(select(func.coalesce(func.sum(Spend.usd), 0.0)).where(Spend.team_id == team_id)).one()
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
    the statement, so it is summed once per job), not the teams' whole ledgers."""
    spend, job = Spend.__table__, Job.__table__  # type: ignore[attr-defined]
    spent = (sa_select(func.coalesce(func.sum(spend.c.usd), 0.0)).where(spend.c.job_id == job.c.id)
             .correlate(job).scalar_subquery())
    stmt = (sa_select(job.c.team_id, func.coalesce(func.sum(_greatest(job.c.estimated_usd - spent, 0.0)), 0.0),
                      func.coalesce(func.sum(case((job.c.state == JobState.QUEUED.value, job.c.gpus), else_=0)), 0))
            .where(job.c.state.in_([s.value for s in ACTIVE])).group_by(job.c.team_id))
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
    """{team id: everything it spent} in one grouped query; a team that spent nothing is absent."""
    spend = Spend.__table__  # type: ignore[attr-defined]
    stmt = sa_select(spend.c.team_id, func.sum(spend.c.usd)).group_by(spend.c.team_id)
    if team_ids is not None:
        stmt = stmt.where(spend.c.team_id.in_(team_ids))
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
    # was most of a busy team's Spend page (bench/ui_pages.py)
    return [
        SpendLine.model_construct(job_id=str(job_id), job_name=str(name), market=str(market), attempts=int(n),
                                  hours=float(h), usd=float(u))
        for job_id, name, market, n, h, u in session.execute(stmt).all()
    ]


def spend_by_team_between(session: Session, since: datetime, until: datetime, team_ids: list[int] | None = None,
                          ) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    """({team id: {market: USD recorded in [since, until]}}, {team id: USD ever}) of ``team_ids``
    (None: every team): the window's and all-time totals in one grouped pass over the ledger,
    summed in the database; markets in name order."""
    spend = Spend.__table__  # type: ignore[attr-defined]
    inside = case(((spend.c.recorded_at >= since) & (spend.c.recorded_at <= until), spend.c.usd))  # else NULL
    stmt = (sa_select(spend.c.team_id, spend.c.market, func.sum(inside), func.sum(spend.c.usd))
            .group_by(spend.c.team_id, spend.c.market))
    if team_ids is not None:
        stmt = stmt.where(spend.c.team_id.in_(team_ids))
    rows = sorted(session.execute(stmt).all(), key=lambda r: (r[0], r[1]))
    window: dict[int, dict[str, float]] = {}
    ever: dict[int, float] = {}
    for team_id, market, usd, total in rows:
        if usd is not None:  # the market had spend inside the window
            window.setdefault(int(team_id), {})[str(market)] = float(usd)
        ever[int(team_id)] = ever.get(int(team_id), 0.0) + float(total)
    return window, ever


def spend_by_team(session: Session) -> dict[int, dict[str, float]]:
    rows = session.exec(select(Spend.team_id, Spend.market, func.sum(Spend.usd)).group_by(
        col(Spend.team_id), col(Spend.market))).all()
    out: dict[int, dict[str, float]] = {}
    for team_id, market, usd in rows:
        out.setdefault(team_id, {})[market] = float(usd)
    return out
