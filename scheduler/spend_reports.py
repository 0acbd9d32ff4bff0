"""What teams spent, read for whoever asks: one team's spend per job, every team's totals (the admin), and the
figures of the Prometheus endpoint. The sums are the ledger's (scheduler.store.ledger); the rules of who may read
what are here."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func
from sqlmodel import Session, col, select

from errors import Forbidden, NotFound
from scheduler.auth import Principal, require_admin, team_id_of
from scheduler.store import ledger
from scheduler.store.database import Store
from scheduler.store.models import Job, SpendReport, Team, TeamSpend
from scheduler.store.teams import budgets_left, team_by_name


def _by_market(amounts: Iterable[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for market, amount in amounts:
        out[market] = out.get(market, 0.0) + amount
    return out


def spend_report(store: Store, principal: Principal, *, since: datetime, until: datetime, team: str | None = None,
                 top: int | None = None) -> SpendReport:
    """One team's spend per job between ``since`` and ``until`` (the caller's, or any team's for the admin); the
    admin without a team gets every team's totals. ``top``: list only the lines of the ``top`` costliest jobs
    (the totals still count every job: they are summed in the database either way)."""
    with store.read() as session:
        if team is None and principal.is_admin:
            return _all_teams_spend(session, since, until)
        if team is not None and (principal.is_admin or team != principal.team_name):
            if not principal.is_admin:  # a team token asking for another team: say whose token it is
                raise Forbidden(f"this is team {principal.team_name}'s token, not team {team}'s: a team token "
                                "reads only its own team's spend",
                                hint=f"use a token of team {team}, or the admin token (GPUPLAN_ADMIN_TOKEN) "
                                "for any team")
            row = team_by_name(session, team)
        else:
            row_or_none = session.get(Team, team_id_of(principal))
            if row_or_none is None:
                raise NotFound("your team no longer exists")
            row = row_or_none
        assert row.id is not None
        window, ever = ledger.spend_by_team_between(session, since, until, [row.id])
        by_market = window.get(row.id, {})
        lines = ledger.spend_lines(session, row.id, since, until, top)
        left = budgets_left(session, [row], ever)[row.id]
    return SpendReport(team=row.name, since=since, until=until, total_usd=sum(by_market.values()),
                       by_market=by_market, jobs=lines, budget_usd=row.budget_usd, remaining_usd=left)


def _all_teams_spend(session: Session, since: datetime, until: datetime) -> SpendReport:
    spent, ever = ledger.spend_by_team_between(session, since, until)
    rows = list(session.exec(select(Team).order_by(col(Team.name))).all())
    left = budgets_left(session, rows, ever)
    teams = [TeamSpend(team=row.name, total_usd=sum(spent.get(row.id, {}).values()),
                       by_market=_by_market(spent.get(row.id, {}).items()), budget_usd=row.budget_usd,
                       remaining_usd=left[row.id]) for row in rows if row.id is not None]
    return SpendReport(team=None, since=since, until=until, total_usd=sum(t.total_usd for t in teams),
                       by_market=_by_market(m for t in teams for m in t.by_market.items()), jobs=[],
                       budget_usd=None, remaining_usd=None, teams=teams)


def metrics_snapshot(store: Store, principal: Principal) -> tuple[dict[tuple[str, str], int],
                                                                  dict[tuple[str, str], float]]:
    """({(team, state): jobs}, {(team, market): usd}) for the Prometheus endpoint (admin only)."""
    require_admin(principal)
    with store.read() as session:
        names = {t.id: t.name for t in session.exec(select(Team)).all()}
        jobs = session.exec(select(Job.team_id, Job.state, func.count()).group_by(
            col(Job.team_id), col(Job.state))).all()
        spend = ledger.spend_by_team(session)
    by_state = {(names.get(t, str(t)), s): int(n) for t, s, n in jobs}
    by_team = {(names.get(t, str(t)), m): v for t, markets in spend.items() for m, v in markets.items()}
    return by_state, by_team
