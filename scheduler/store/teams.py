"""Teams and their tokens (admin), and a team's figures: budget, spend, reservations, GPUs in use."""

from __future__ import annotations

import contextlib
import difflib
import secrets
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from errors import Conflict, NotFound
from scheduler.auth import ADMIN, Principal, TokenAuth, hash_token, require_admin, team_id_of
from scheduler.loop import quota
from scheduler.store import ledger
from scheduler.store.database import Store
from scheduler.store.models import (
    ApiToken,
    ApiTokenCreated,
    ApiTokenPublic,
    Team,
    TeamCreate,
    TeamPublic,
    TeamUpdate,
    check_team_name,
)


def _teams_hint(name: str, names: list[str]) -> str:
    """Did-you-mean and the teams there are, or how to create the first one."""
    if not names:
        return f"there are no teams yet; create it with `gpuplan team create {name}`"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return (f"did you mean {close[0]!r}? " if close else "") + f"teams: {shown}"


def _left(budget: float | None, spent: float, reserved: float) -> float | None:
    return None if budget is None else budget - spent - reserved


def budgets_left(session: Session, teams: list[Team], spent: dict[int, float] | None = None) -> dict[int, float | None]:
    """{team id: budget less spend less what active jobs reserve (None: no budget)}: the
    ``remaining_usd`` of team_public without the figures a report does not show. ``spent``: each
    team's spend ever, when the caller summed it already."""
    ids = [t.id for t in teams if t.id is not None and t.budget_usd is not None]
    if spent is None:
        spent = ledger.spent_by_team(session, ids) if ids else {}
    reserved = ledger.reserved_by_team(session, ids) if ids else {}
    return {t.id: _left(t.budget_usd, spent.get(t.id, 0.0), reserved.get(t.id, (0.0, 0))[0])
            for t in teams if t.id is not None}


def team_public(session: Session, team: Team) -> TeamPublic:
    return teams_public(session, [team])[0]


def teams_public(session: Session, teams: list[Team]) -> list[TeamPublic]:
    """Each team's figures (spent, reserved, GPUs running and queued): one grouped query per figure
    for all of them, not a round of queries per team."""
    ids = [t.id for t in teams if t.id is not None]
    spent = ledger.spent_by_team(session, ids)
    reserved = ledger.reserved_by_team(session, ids)
    running = quota.holders(session, ids[0] if len(ids) == 1 else None)
    out = []
    for team in teams:
        assert team.id is not None
        used, (held, queued) = spent.get(team.id, 0.0), reserved.get(team.id, (0.0, 0))
        out.append(TeamPublic(id=team.id, name=team.name, budget_usd=team.budget_usd, gpu_quota=team.gpu_quota,
                              created_at=team.created_at, spent_usd=used, reserved_usd=held,
                              remaining_usd=_left(team.budget_usd, used, held),
                              gpus_in_use=sum(g for _, g in running.get(team.id, ())), gpus_queued=queued))
    return out


def team_by_name(session: Session, name: str) -> Team:
    team = session.exec(select(Team).where(Team.name == name)).first()
    if team is None:
        check_team_name(name)  # a name no team can have says the rule, not just "not found"
        names = sorted(str(n) for n in session.exec(select(Team.name)).all())
        raise NotFound(f"team {name!r} does not exist", hint=_teams_hint(name, names))
    return team


class Teams:
    def __init__(self, store: Store, clock: Callable[[], datetime], auth: TokenAuth) -> None:
        self.store = store
        self.clock = clock
        self.auth = auth

    def create_team(self, principal: Principal, body: TeamCreate) -> TeamPublic:
        require_admin(principal)
        try:
            with self.store.write() as session:
                if session.exec(select(Team).where(Team.name == body.name)).first() is not None:
                    raise Conflict(f"team {body.name!r} already exists", hint="pick another name or update it")
                team = Team(name=body.name, budget_usd=body.budget_usd, gpu_quota=body.gpu_quota,
                            created_at=self.clock())
                session.add(team)
                session.flush()
                return team_public(session, team)
        except IntegrityError:
            raise Conflict(f"team {body.name!r} already exists", hint="pick another name") from None

    def team_principal(self, name: str, *, create: bool = False, shared: bool = False) -> Principal:
        """Act as team ``name`` without a token (the in-process CLI). It must exist; with
        ``create`` (the one default team) it is made on first use, without limits; ``shared`` (a database
        named by GPUPLAN_DATABASE_URL, not the user's own file) only while it has no teams at all."""
        check_team_name(name)
        with self.store.read() as session:
            team = session.exec(select(Team).where(Team.name == name)).first()
            if team is None and not create:
                team_by_name(session, name)  # raises, listing the teams
            others = [] if team is not None or not shared else sorted(session.exec(select(Team.name)).all())
        if team is None and others:
            # A shared database with teams is a server's (an admin made them): a command run in-process on
            # it acts as one of them, and never adds a team of its own to it.
            raise NotFound(f"team {name!r} is not in this database, which is a server's (its teams: "
                           f"{', '.join(others)}); an in-process command does not add a team to it",
                           hint="set GPUPLAN_TEAM to your team there, or go through the server with "
                           "GPUPLAN_API_URL and GPUPLAN_TOKEN")
        if team is None:
            with contextlib.suppress(Conflict):  # created meanwhile by another process: use it
                self.create_team(ADMIN, TeamCreate(name=name))
            with self.store.read() as session:
                team = team_by_name(session, name)
        assert team.id is not None
        return Principal(team_id=team.id, team_name=team.name)

    def update_team(self, principal: Principal, name: str, body: TeamUpdate) -> TeamPublic:
        require_admin(principal)
        with self.store.write() as session:
            team = team_by_name(session, name)
            assert team.id is not None
            team = self.store.lock_team(session, team.id)
            if body.clear_budget:
                team.budget_usd = None
            elif body.budget_usd is not None:
                team.budget_usd = body.budget_usd
            if body.clear_quota:
                team.gpu_quota = None
            elif body.gpu_quota is not None:
                team.gpu_quota = body.gpu_quota
            session.add(team)
            session.flush()
            return team_public(session, team)

    def get_team(self, principal: Principal, name: str | None = None) -> TeamPublic:
        with self.store.read() as session:
            if name is None or (not principal.is_admin and name == principal.team_name):
                team = session.get(Team, team_id_of(principal))
                if team is None:
                    raise NotFound("your team no longer exists")
                return team_public(session, team)
            require_admin(principal)
            return team_public(session, team_by_name(session, name))

    def list_teams(self, principal: Principal) -> list[TeamPublic]:
        require_admin(principal)
        with self.store.read() as session:
            return teams_public(session, list(session.exec(select(Team).order_by(col(Team.name))).all()))

    def create_token(self, principal: Principal, team_name: str, name: str = "default") -> ApiTokenCreated:
        require_admin(principal)
        secret = "gpt_" + secrets.token_urlsafe(32)
        with self.store.write() as session:
            team = team_by_name(session, team_name)
            assert team.id is not None
            row = ApiToken(team_id=team.id, name=name, token_hash=hash_token(secret), created_at=self.clock())
            session.add(row)
            session.flush()
            assert row.id is not None
            return ApiTokenCreated(id=row.id, team_id=row.team_id, name=row.name, created_at=row.created_at,
                                   revoked_at=None, token=secret)

    def list_tokens(self, principal: Principal, team_name: str) -> list[ApiTokenPublic]:
        require_admin(principal)
        with self.store.read() as session:
            team = team_by_name(session, team_name)
            rows = session.exec(select(ApiToken).where(ApiToken.team_id == team.id).order_by(col(ApiToken.id))).all()
            return [ApiTokenPublic.model_validate(r, from_attributes=True) for r in rows]

    def revoke_token(self, principal: Principal, team_name: str, token_id: int) -> ApiTokenPublic:
        """Revoke the team's token ``token_id``; another team's token is a NotFound and stays valid."""
        require_admin(principal)
        with self.store.write() as session:
            team = team_by_name(session, team_name)
            row = session.exec(select(ApiToken).where(ApiToken.id == token_id, ApiToken.team_id == team.id)).first()
            if row is None:
                raise NotFound(f"team {team.name} has no token {token_id}",
                               hint=f"list its tokens with `gpuplan team token {team.name} --list`")
            if row.revoked_at is None:
                row.revoked_at = self.clock()
                session.add(row)
            self.auth.forget(row.token_hash)
            return ApiTokenPublic.model_validate(row, from_attributes=True)
