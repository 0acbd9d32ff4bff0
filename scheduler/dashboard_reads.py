"""The dashboard's reads that the API has no endpoint for: a job search, spend per day by GPU type and
market, the attempts that recorded predicted vs measured, and the team names an admin picks from.

Read-only aggregates over the service's tables, asked as a caller and answered under the service's rules:
a team reads its own team's rows; only the admin reads the team names and every team's spend at once. The
dashboard (scheduler.ui) reads through :class:`DashboardReads`, never the database itself.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time
from typing import Any

from sqlalchemy import String, cast, func, or_
from sqlalchemy import select as sa_select
from sqlalchemy.sql.elements import ColumnElement

from scheduler.auth import Principal, require_admin, team_id_of
from scheduler.store import ledger
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, JobPublic, Spend, SpendDay, Team


class DashboardReads:
    """The dashboard's reads over ``store``, each for a caller (:class:`scheduler.auth.Principal`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def search_jobs(self, principal: Principal, *, text: str, state: str | None, limit: int,
                    offset: int) -> list[JobPublic]:
        """The caller's team's jobs whose name or id contains ``text`` (case-insensitive), newest first."""
        return _search_jobs(self.store, team_id_of(principal), text=text, state=state, limit=limit, offset=offset)

    def team_names(self, principal: Principal) -> list[str]:
        """Every team's name, for the admin's team picker."""
        require_admin(principal)
        return _team_names(self.store)

    def spend_by_day(self, principal: Principal, since: datetime | None = None,
                     until: datetime | None = None) -> list[tuple[date, str, str, float]]:
        """(UTC day, GPU type, market, USD) of the caller's team, or of every team for the admin."""
        team_id = None if principal.is_admin else team_id_of(principal)
        return _spend_by_day(self.store, team_id, since, until)

    def spend_per_day(self, principal: Principal, until: datetime) -> list[tuple[date, float]]:
        """(UTC day, USD) of every day the caller's team spent on up to ``until``: the burn-down's history."""
        return _spend_per_day(self.store, team_id_of(principal), until)

    def accuracy_records(self, principal: Principal, limit: int = 500) -> list[tuple[str, str, dict[str, Any]]]:
        """(job id/attempt, outcome, metrics) of the caller's team's latest closed attempts with metrics."""
        return _accuracy_records(self.store, team_id_of(principal), limit)


_job = Job.__table__  # type: ignore[attr-defined]
_spend = Spend.__table__  # type: ignore[attr-defined]
_attempt = Attempt.__table__  # type: ignore[attr-defined]
_team = Team.__table__  # type: ignore[attr-defined]
_spend_day = SpendDay.__table__  # type: ignore[attr-defined]


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _search_jobs(store: Store, team_id: int, *, text: str, state: str | None, limit: int,
                offset: int) -> list[JobPublic]:
    """The team's jobs whose name or id contains ``text`` (case-insensitive), newest first."""
    spent = (sa_select(func.coalesce(func.sum(_spend.c.usd), 0.0)).where(_spend.c.job_id == _job.c.id)
             .correlate(_job).scalar_subquery())
    pattern = f"%{_like_escape(text.lower())}%"
    stmt = sa_select(*(c for c in _job.c if c.name not in ("spec", "plan")), spent.label("spent_usd")).where(
        _job.c.team_id == team_id,
        or_(func.lower(_job.c.name).like(pattern, escape="\\"), func.lower(_job.c.id).like(pattern, escape="\\")))
    if state is not None:
        stmt = stmt.where(_job.c.state == state)
    stmt = stmt.order_by(_job.c.created_at.desc(), _job.c.id).limit(limit).offset(offset)
    with store.read() as session:
        return [JobPublic.model_validate(dict(r)) for r in session.execute(stmt).mappings().all()]


def _team_names(store: Store) -> list[str]:
    """Every team's name, for the admin's team picker (the service's list_teams also sums each team's
    spend and reservations, which a picker does not need)."""
    with store.read() as session:
        return [str(n) for n in session.execute(sa_select(_team.c.name).order_by(_team.c.name)).scalars()]


def _day(store: Store) -> ColumnElement[Any]:
    return ledger.utc_day_of(store.dialect, _spend.c.recorded_at)  # type: ignore[no-any-return]


def _date(d: Any) -> date:
    return d if isinstance(d, date) else date.fromisoformat(str(d))


def _days(stmt: Any, team_id: int | None, first: date | None, until: datetime | None) -> Any:
    """``stmt`` over ``spend_day`` limited to the team and the whole days from ``first`` to the day
    before ``until``'s (its own day is partial: read from the ledger)."""
    if team_id is not None:
        stmt = stmt.where(_spend_day.c.team_id == team_id)
    if first is not None:
        stmt = stmt.where(_spend_day.c.day >= first)
    if until is not None:
        stmt = stmt.where(_spend_day.c.day < ledger.utc_day(until))
    return stmt


def _last_day(stmt: Any, team_id: int | None, start: datetime | None, until: datetime) -> Any:
    """``stmt`` over the ledger limited to the team and [until's UTC midnight (or ``start`` if
    later), until]: the partial day the summary's whole days stop before."""
    if team_id is not None:
        stmt = stmt.where(_spend.c.team_id == team_id)
    lower = ledger.midnight(ledger.utc_day(until))
    return stmt.where(_spend.c.recorded_at >= (lower if start is None else max(start, lower)),
                      _spend.c.recorded_at <= until)


def _spend_by_day(store: Store, team_id: int | None, since: datetime | None = None,
                 until: datetime | None = None) -> list[tuple[date, str, str, float]]:
    """(UTC day, GPU type, market, USD) for one team (None: every team), oldest first; ``since``
    counts whole days from its own (the chart's bars are days). Whole days are the summary's
    (``spend_day``); ``until``'s own day is summed from its spend rows, joined to their jobs."""
    start = None if since is None else datetime.combine(since.date(), time(), tzinfo=UTC)
    key = (_spend_day.c.day, _spend_day.c.gpu, _spend_day.c.market)  # one team's rows are one each already
    days = _days(sa_select(*key, func.sum(_spend_day.c.usd)), team_id, None if start is None else start.date(),
                 until).group_by(*key)
    with store.read() as session:
        rows = [(_date(d), str(g or "?"), str(m), float(u)) for d, g, m, u in session.execute(days).all()]
        if until is not None:
            day = _day(store).label("day")
            # A job's spend rows carry its team: joining on (team, id) reads ix_job_team_id_id_gpu alone
            on = ((_job.c.team_id == (_spend.c.team_id if team_id is None else team_id))
                  & (_job.c.id == _spend.c.job_id))
            last = _last_day(sa_select(day, _job.c.gpu, _spend.c.market, func.sum(_spend.c.usd)).join(_job, on),
                             team_id, start, until).group_by(day, _job.c.gpu, _spend.c.market)
            rows += [(_date(d), str(g or "?"), str(m), float(u)) for d, g, m, u in session.execute(last).all()]
    # sorted here, not by the database: the groups of the summary and of the last day never meet
    return sorted(rows)


def _spend_per_day(store: Store, team_id: int, until: datetime) -> list[tuple[date, float]]:
    """(UTC day, USD) of every day the team spent on up to ``until``, oldest first: the burn-down's
    history, the whole days summed from the summary's (GPU type, market) rows, ``until``'s own
    day from its spend rows."""
    days = _days(sa_select(_spend_day.c.day, func.sum(_spend_day.c.usd)), team_id, None, until).group_by(
        _spend_day.c.day)
    day = _day(store).label("day")
    last = _last_day(sa_select(day, func.sum(_spend.c.usd)), team_id, None, until).group_by(day)
    with store.read() as session:
        rows = [*session.execute(days).all(), *session.execute(last).all()]
    return sorted((_date(d), float(u)) for d, u in rows)


def _accuracy_records(store: Store, team_id: int, limit: int = 500) -> list[tuple[str, str, dict[str, Any]]]:
    """(job id/attempt, outcome, metrics) of the team's latest closed attempts that recorded metrics,
    the records ``scheduler.loop.accuracy.accuracy_rows`` reads."""
    stmt = (sa_select(_attempt.c.job_id, _attempt.c.number, _attempt.c.outcome, _attempt.c.metrics)
            .join(_job, _job.c.id == _attempt.c.job_id)
            .where(_job.c.team_id == team_id, _attempt.c.metrics.is_not(None),
                   cast(_attempt.c.metrics, String) != "null",  # a JSON null, not SQL NULL
                   _attempt.c.ended_at.is_not(None))
            .order_by(_attempt.c.ended_at.desc()).limit(limit))
    with store.read() as session:
        rows = session.execute(stmt).all()
    return [(f"{j}/{n}", str(o), dict(m)) for j, n, o, m in rows if isinstance(m, dict)]
