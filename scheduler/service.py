"""The scheduler's one service: teams, tokens, submit / status / list / cancel / logs, reports.

Budget and GPU-quota rules live here and nowhere else. They hold under concurrency because the
check and the job insert happen in one write transaction that first locks the team row
(PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE`` takes the one write lock).

The API (scheduler.api) and the in-process CLI call this class; scheduler.client offers the same
methods over HTTP.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Integer, bindparam, func, insert
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from catalog.errors import AuthError, Conflict, Forbidden, InvalidInput, LimitExceeded, NoFeasiblePlan, NotFound
from planner.spec import JobSpec, spec_from_dict
from planner.types import Plan
from scheduler import ledger, logbook, quota
from scheduler.models import (
    ApiToken,
    ApiTokenCreated,
    ApiTokenPublic,
    Attempt,
    AttemptPublic,
    Event,
    EventPublic,
    Job,
    JobCreate,
    JobDetail,
    JobLog,
    JobLogs,
    JobPublic,
    Spend,
    SpendReport,
    Team,
    TeamCreate,
    TeamPublic,
    TeamSpend,
    TeamUpdate,
    check_team_name,
)
from scheduler.states import TERMINAL, JobState, check_transition
from scheduler.store import Store, transition

Clock = Callable[[], datetime]
Planner = Callable[[JobSpec], Plan]


_PUBLIC_FIELDS = tuple(name for name in JobPublic.model_fields if name != "spent_usd")


def utcnow() -> datetime:
    return datetime.now(UTC)


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def spec_hash(spec: JobSpec) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def usd(x: float) -> str:
    return f"${x:,.2f}"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a team (through its token) or the admin."""

    team_id: int | None
    team_name: str
    is_admin: bool = False


ADMIN = Principal(team_id=None, team_name="(admin)", is_admin=True)


def _list_statement(*, by_state: bool) -> Any:
    """The job list as one prebuilt Core query (the API's hot path): no spec/plan JSON, spend summed."""
    table = Job.__table__  # type: ignore[attr-defined]
    spend = Spend.__table__  # type: ignore[attr-defined]
    # Table columns, not ORM attributes: an ORM-annotated column would route the whole statement
    # through the ORM compile/execute path on every call.
    spent = (sa_select(func.coalesce(func.sum(spend.c.usd), 0.0)).where(spend.c.job_id == table.c.id)
             .correlate(table).scalar_subquery())
    columns = [c for c in table.c if c.name not in ("spec", "plan")]
    stmt = sa_select(*columns, spent.label("spent_usd")).where(table.c.team_id == bindparam("team_id"))
    if by_state:
        stmt = stmt.where(table.c.state == bindparam("state"))
    return (stmt.order_by(table.c.created_at.desc(), table.c.id)
            .limit(bindparam("limit", type_=Integer)).offset(bindparam("offset", type_=Integer)))


def _status_statements() -> tuple[Any, Any, Any]:
    """Job detail as prebuilt Core queries (the API's hot path): the job with its spend, attempts, events."""
    table = Job.__table__  # type: ignore[attr-defined]
    spend = Spend.__table__  # type: ignore[attr-defined]
    # Table columns, not ORM attributes: an ORM-annotated column would route the whole statement
    # through the ORM compile/execute path on every call.
    spent = (sa_select(func.coalesce(func.sum(spend.c.usd), 0.0)).where(spend.c.job_id == table.c.id)
             .correlate(table).scalar_subquery())
    job = sa_select(*table.c, spent.label("spent_usd")).where(table.c.id == bindparam("job_id"),
                                                             table.c.team_id == bindparam("team_id"))
    attempt = Attempt.__table__  # type: ignore[attr-defined]
    attempts = (sa_select(*(attempt.c[name] for name in AttemptPublic.model_fields))
                .where(attempt.c.job_id == bindparam("job_id")).order_by(attempt.c.number))
    event = Event.__table__  # type: ignore[attr-defined]
    events = (sa_select(*(event.c[name] for name in EventPublic.model_fields))
              .where(event.c.job_id == bindparam("job_id")).order_by(event.c.id))
    return job, attempts, events


def _teams_hint(name: str, names: list[str]) -> str:
    """Did-you-mean and the teams there are, or how to create the first one."""
    if not names:
        return f"there are no teams yet; create it with `gpuplan team create {name}`"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return (f"did you mean {close[0]!r}? " if close else "") + f"teams: {shown}"


def _by_market(amounts: Iterable[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for market, amount in amounts:
        out[market] = out.get(market, 0.0) + amount
    return out


class SchedulerService:
    def __init__(
        self,
        store: Store,
        planner: Planner,
        *,
        clock: Clock = utcnow,
        checkpoint_root: str,
        admin_token: str | None = None,
        max_attempts: int = 3,
        plan_cache_size: int = 512,
        auth_cache_s: float = 2.0,
    ) -> None:
        self.store = store
        self.planner = planner
        self.clock = clock
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self.max_attempts = max_attempts
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._plans_lock = threading.Lock()
        self._plan_cache_size = plan_cache_size
        # token hash -> (principal, monotonic expiry). Revocation through this instance clears it
        # at once; another server process notices within auth_cache_s.
        self._auth_cache: dict[str, tuple[Principal, float]] = {}
        self._auth_cache_s = auth_cache_s
        self._list_stmt = (_list_statement(by_state=False), _list_statement(by_state=True))
        self._status_stmts = _status_statements()
        job = Job.__table__  # type: ignore[attr-defined]
        self._existing_stmt = sa_select(job.c.id, job.c.spec_hash).where(
            job.c.team_id == bindparam("team_id"), job.c.idempotency_key == bindparam("key"))

    # -------------------------------------------------------------- auth

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthError("missing bearer token", hint="send 'Authorization: Bearer <token>' (gpuplan team token)")
        return self.authenticate_hash(hash_token(token))

    def authenticate_hash(self, digest: str) -> Principal:
        """Who holds the token whose sha256 is ``digest`` (a web session keeps the digest, never the
        token); the same checks and cache as :meth:`authenticate`."""
        if self._admin_hash is not None and hmac.compare_digest(digest, self._admin_hash):
            return ADMIN
        cached = self._auth_cache.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        with self.store.read() as session:
            row = session.exec(
                select(ApiToken, Team).join(Team, col(Team.id) == col(ApiToken.team_id)).where(
                    ApiToken.token_hash == digest)
            ).first()
        if row is None:
            raise AuthError("invalid token", hint="check GPUPLAN_TOKEN (GPUPLAN_ADMIN_TOKEN for team commands); "
                            "an admin can issue a team token with `gpuplan team token TEAM`")
        token_row, team = row
        if token_row.revoked_at is not None:
            raise AuthError(f"token {token_row.id} was revoked at {token_row.revoked_at:%Y-%m-%d %H:%M} UTC",
                            hint="ask an admin for a new one with `gpuplan team token TEAM`")
        assert team.id is not None
        principal = Principal(team_id=team.id, team_name=team.name)
        if self._auth_cache_s > 0:
            if len(self._auth_cache) > 10_000:
                self._auth_cache.clear()
            self._auth_cache[digest] = (principal, time.monotonic() + self._auth_cache_s)
        return principal

    @staticmethod
    def _require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise Forbidden("only the admin token may manage teams, budgets, quotas and tokens")

    @staticmethod
    def _team_id(principal: Principal) -> int:
        if principal.team_id is None:
            raise Forbidden("jobs belong to teams; use a team token, not the admin token",
                            hint="create one with `gpuplan team token TEAM`")
        return principal.team_id

    # -------------------------------------------------------------- teams

    def _team_public(self, session: Session, team: Team) -> TeamPublic:
        assert team.id is not None
        spent = ledger.team_spent(session, team.id)
        reserved, queued = ledger.team_reserved(session, team.id)
        running = sum(g for _, g in quota.holders(session, team.id).get(team.id, ()))
        remaining = None if team.budget_usd is None else team.budget_usd - spent - reserved
        return TeamPublic(id=team.id, name=team.name, budget_usd=team.budget_usd, gpu_quota=team.gpu_quota,
                          created_at=team.created_at, spent_usd=spent, reserved_usd=reserved,
                          remaining_usd=remaining, gpus_in_use=running, gpus_queued=queued)

    def _team_by_name(self, session: Session, name: str) -> Team:
        team = session.exec(select(Team).where(Team.name == name)).first()
        if team is None:
            check_team_name(name)  # a name no team can have says the rule, not just "not found"
            names = sorted(str(n) for n in session.exec(select(Team.name)).all())
            raise NotFound(f"team {name!r} does not exist", hint=_teams_hint(name, names))
        return team

    def create_team(self, principal: Principal, body: TeamCreate) -> TeamPublic:
        self._require_admin(principal)
        try:
            with self.store.write() as session:
                if session.exec(select(Team).where(Team.name == body.name)).first() is not None:
                    raise Conflict(f"team {body.name!r} already exists", hint="pick another name or update it")
                team = Team(name=body.name, budget_usd=body.budget_usd, gpu_quota=body.gpu_quota,
                            created_at=self.clock())
                session.add(team)
                session.flush()
                return self._team_public(session, team)
        except IntegrityError:
            raise Conflict(f"team {body.name!r} already exists", hint="pick another name") from None

    def team_principal(self, name: str, *, create: bool = False) -> Principal:
        """Act as team ``name`` without a token (the in-process CLI). It must exist; with
        ``create`` (the one default team) it is made on first use, without limits."""
        check_team_name(name)
        with self.store.read() as session:
            team = session.exec(select(Team).where(Team.name == name)).first()
            if team is None and not create:
                self._team_by_name(session, name)  # raises, listing the teams
        if team is None:
            with contextlib.suppress(Conflict):  # created meanwhile by another process: use it
                self.create_team(ADMIN, TeamCreate(name=name))
            with self.store.read() as session:
                team = self._team_by_name(session, name)
        assert team.id is not None
        return Principal(team_id=team.id, team_name=team.name)

    def update_team(self, principal: Principal, name: str, body: TeamUpdate) -> TeamPublic:
        self._require_admin(principal)
        with self.store.write() as session:
            team = self._team_by_name(session, name)
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
            return self._team_public(session, team)

    def get_team(self, principal: Principal, name: str | None = None) -> TeamPublic:
        with self.store.read() as session:
            if name is None or (not principal.is_admin and name == principal.team_name):
                team = session.get(Team, self._team_id(principal))
                if team is None:
                    raise NotFound("your team no longer exists")
                return self._team_public(session, team)
            self._require_admin(principal)
            return self._team_public(session, self._team_by_name(session, name))

    def list_teams(self, principal: Principal) -> list[TeamPublic]:
        self._require_admin(principal)
        with self.store.read() as session:
            return [self._team_public(session, t) for t in session.exec(select(Team).order_by(col(Team.name))).all()]

    def create_token(self, principal: Principal, team_name: str, name: str = "default") -> ApiTokenCreated:
        self._require_admin(principal)
        secret = "gpt_" + secrets.token_urlsafe(32)
        with self.store.write() as session:
            team = self._team_by_name(session, team_name)
            assert team.id is not None
            row = ApiToken(team_id=team.id, name=name, token_hash=hash_token(secret), created_at=self.clock())
            session.add(row)
            session.flush()
            assert row.id is not None
            return ApiTokenCreated(id=row.id, team_id=row.team_id, name=row.name, created_at=row.created_at,
                                   revoked_at=None, token=secret)

    def list_tokens(self, principal: Principal, team_name: str) -> list[ApiTokenPublic]:
        self._require_admin(principal)
        with self.store.read() as session:
            team = self._team_by_name(session, team_name)
            rows = session.exec(select(ApiToken).where(ApiToken.team_id == team.id).order_by(col(ApiToken.id))).all()
            return [ApiTokenPublic.model_validate(r, from_attributes=True) for r in rows]

    def revoke_token(self, principal: Principal, team_name: str, token_id: int) -> ApiTokenPublic:
        """Revoke the team's token ``token_id``; another team's token is a NotFound and stays valid."""
        self._require_admin(principal)
        with self.store.write() as session:
            team = self._team_by_name(session, team_name)
            row = session.exec(select(ApiToken).where(ApiToken.id == token_id, ApiToken.team_id == team.id)).first()
            if row is None:
                raise NotFound(f"team {team.name} has no token {token_id}",
                               hint=f"list its tokens with `gpuplan team token {team.name} --list`")
            if row.revoked_at is None:
                row.revoked_at = self.clock()
                session.add(row)
            self._auth_cache.pop(row.token_hash, None)
            return ApiTokenPublic.model_validate(row, from_attributes=True)

    # -------------------------------------------------------------- planning

    def parse_spec(self, spec: dict[str, Any] | JobSpec) -> JobSpec:
        return spec if isinstance(spec, JobSpec) else spec_from_dict(spec)

    def plan_is_cached(self, spec: dict[str, Any] | JobSpec) -> bool:
        """Whether submitting ``spec`` needs no planning (callers may then run it on an event loop)."""
        try:
            key = spec_hash(self.parse_spec(spec))
        except InvalidInput:
            return True  # refused at once, no planning either
        with self._plans_lock:
            return key in self._plans

    def plan(self, spec: dict[str, Any] | JobSpec) -> Plan:
        """Plan a spec (cached by spec hash: the catalog a service holds does not change under it)."""
        job_spec = self.parse_spec(spec)
        key = spec_hash(job_spec)
        with self._plans_lock:
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return cached
        plan = self.planner(job_spec)
        if plan.chosen is None:
            reasons = "; ".join(r.reason for r in plan.rejections[:3]) or "no candidate offers"
            raise NoFeasiblePlan(f"no feasible plan for job {job_spec.name!r}: {reasons}",
                                 hint="relax resources (accelerators, deadline, budget) or lower tokens")
        with self._plans_lock:
            self._plans[key] = plan
            while len(self._plans) > self._plan_cache_size:
                self._plans.popitem(last=False)
        return plan

    # -------------------------------------------------------------- jobs

    def _public(self, session: Session, jobs: list[Job]) -> list[JobPublic]:
        spent = ledger.job_spent(session, [j.id for j in jobs])
        return [JobPublic.model_validate({name: getattr(j, name) for name in _PUBLIC_FIELDS}
                                         | {"spent_usd": spent.get(j.id, 0.0)}) for j in jobs]

    def submit(self, principal: Principal, body: JobCreate) -> JobPublic:
        team_id = self._team_id(principal)
        job_spec = self.parse_spec(body.spec)
        digest = spec_hash(job_spec)
        # A repeated key whose plan is cached is answered by the write transaction below, which
        # checks the key again before anything else; the early read only spares planning.
        with self._plans_lock:
            cached = digest in self._plans
        if body.idempotency_key and not cached:
            with self.store.read() as session:
                found = self._existing_id(session, team_id, body.idempotency_key, digest)
                job = session.get(Job, found) if found else None
                if job is not None:
                    return self._public(session, [job])[0]
        plan = self.plan(job_spec)
        chosen = plan.chosen
        assert chosen is not None
        strategy = chosen.estimate.strategy
        gpus = strategy.gpu_count
        estimate = chosen.cost.usd
        # Everything that needs no lock is prepared first; the write transaction is a few Core
        # statements so the team lock (or SQLite's write lock) is held as briefly as possible.
        now = self.clock()
        job_id = "j-" + secrets.token_hex(8)
        stored_plan = plan.model_dump(mode="json", include={"job", "objective", "chosen", "warnings"})
        stored_plan["alternatives"] = [c.model_dump(mode="json") for c in plan.candidates[:4]]
        row: dict[str, Any] = {
            "id": job_id, "team_id": team_id, "name": job_spec.name, "spec": job_spec.model_dump(mode="json"),
            "spec_hash": digest, "plan": stored_plan, "state": JobState.QUEUED.value, "priority": body.priority,
            "idempotency_key": body.idempotency_key, "estimated_usd": estimate,
            "estimated_hours": chosen.cost.hours, "gpus": gpus, "gpu": strategy.gpu, "market": chosen.cost.market,
            "usd_per_h": chosen.cost.usd_per_h, "attempts": 0, "max_attempts": self.max_attempts,
            "checkpoint_uri": f"{self.checkpoint_root}/{job_id}", "message": "", "next_run_at": None,
            "created_at": now, "updated_at": now, "started_at": None, "finished_at": None,
        }
        # The three submit transitions, checked like any other and recorded as Events.
        moves = [(None, JobState.PENDING, f"submitted by team {principal.team_name}"),
                 (JobState.PENDING, JobState.PLANNED,
                  f"plan: {strategy.label()} on {chosen.key}, est. {usd(estimate)} over "
                  f"{chosen.cost.hours:.2f} h at {usd(chosen.cost.usd_per_h)}/h"),
                 (JobState.PLANNED, JobState.QUEUED, "reserved the estimate within the budget; the GPU quota "
                  "admits it to run")]
        events = []
        for src, dst, reason in moves:
            if src is not None:
                check_transition(job_id, src, dst)
            events.append({"job_id": job_id, "from_state": src.value if src else None, "to_state": dst.value,
                           "at": now, "reason": reason})
        existing_id: str | None = None
        try:
            with self.store.write() as session:
                team = self.store.lock_team_limits(session, team_id)
                if body.idempotency_key:
                    existing_id = self._existing_id(session, team_id, body.idempotency_key, digest)
                if existing_id is None:
                    self._check_limits(session, team, estimate, gpus)
                    row["message"] = self._initial_wait(session, team, gpus)
                    session.execute(insert(Job.__table__), [row])  # type: ignore[attr-defined]
                    session.execute(insert(Event.__table__), events)  # type: ignore[attr-defined]
                    lines = [logbook.event_line(now, src.value if src else None, dst.value, reason)
                             for src, dst, reason in moves]
                    if row["message"]:
                        lines.append(logbook.note_line(now, row["message"]))
                    session.execute(insert(JobLog.__table__),  # type: ignore[attr-defined]
                                    logbook.first_lines(job_id, lines))
        except IntegrityError:
            # Only a racing submit with the same idempotency key gets here; it won, return its job.
            if not body.idempotency_key:
                raise
            with self.store.read() as session:
                existing_id = self._existing_id(session, team_id, body.idempotency_key, digest)
            if existing_id is None:
                raise
        if existing_id is not None:
            with self.store.read() as session:
                job = session.get(Job, existing_id)
                assert job is not None
                return self._public(session, [job])[0]
        # A new job has spent nothing: no need to ask the ledger.
        return JobPublic.model_validate(row | {"spent_usd": 0.0})

    def _existing_id(self, session: Session, team_id: int, key: str, digest: str) -> str | None:
        found = session.execute(
            self._existing_stmt, {"team_id": team_id, "key": key}).first()
        if found is None:
            return None
        if found[1] != digest:
            raise Conflict(f"idempotency key {key!r} was already used for job {found[0]} with a different spec",
                           hint="use a new key for a new job, or resend the same spec to get the same job")
        return str(found[0])

    @staticmethod
    def _check_limits(session: Session, team: Any, estimate: float, gpus: int) -> None:
        """Budget: the estimate is reserved now, so it must fit what is left. GPU quota: it admits
        jobs to run (scheduler.quota), so only a job larger than the whole quota is refused here.
        ``team``: a Team or a row with its id, name, budget_usd and gpu_quota."""
        assert team.id is not None
        if team.budget_usd is not None:
            reserved, _ = ledger.team_reserved(session, team.id)
            remaining = team.budget_usd - ledger.team_spent(session, team.id) - reserved
            if estimate > remaining + 1e-9:
                raise LimitExceeded(
                    f"estimated {usd(estimate)} exceeds team {team.name}'s remaining budget "
                    f"{usd(max(remaining, 0.0))} by {usd(estimate - max(remaining, 0.0))}",
                    hint="raise the budget or lower tokens",
                )
        big = None if team.gpu_quota is None else quota.too_large(quota.Quota(team.name, team.gpu_quota), gpus)
        if big is not None:
            raise LimitExceeded(
                f"the job {big}, so it could never start",
                hint=(f"set resources.max_gpus: {team.gpu_quota} in the spec so the planner picks a plan that fits, "
                      "or " if team.gpu_quota > 0 else "") + f"raise the quota (gpuplan team quota {team.name} {gpus})",
            )

    @staticmethod
    def _initial_wait(session: Session, team: Any, gpus: int) -> str:
        """The new job's message: why it will wait, when its team's running jobs fill the quota."""
        if team.gpu_quota is None:
            return ""
        running = quota.holders(session, team.id).get(team.id, [])
        return quota.wait_reason(quota.Quota(team.name, team.gpu_quota), gpus, running) or ""

    def _own_job(self, session: Session, principal: Principal, job_id: str) -> Job:
        team_id = self._team_id(principal)
        job = session.exec(select(Job).where(Job.id == job_id, Job.team_id == team_id)).first()
        if job is None:
            # The same answer whether the job is missing or another team's: no existence leak.
            raise NotFound(f"job {job_id!r} not found", hint="list your jobs with `gpuplan list`")
        return job

    def status(self, principal: Principal, job_id: str) -> JobDetail:
        team_id = self._team_id(principal)
        job_stmt, attempts_stmt, events_stmt = self._status_stmts
        with self.store.read() as session:
            row = session.execute(job_stmt, {"job_id": job_id, "team_id": team_id}).mappings().first()
            if row is None:
                # The same answer whether the job is missing or another team's: no existence leak.
                raise NotFound(f"job {job_id!r} not found", hint="list your jobs with `gpuplan list`")
            attempts = session.execute(attempts_stmt, {"job_id": job_id}).mappings().all()
            events = session.execute(events_stmt, {"job_id": job_id}).mappings().all()
        return JobDetail.model_validate(dict(row) | {"attempt_list": [dict(a) for a in attempts],
                                                     "events": [dict(e) for e in events]})

    def list_jobs(self, principal: Principal, *, state: str | None = None, limit: int = 50,
                  offset: int = 0) -> list[JobPublic]:
        team_id = self._team_id(principal)
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidInput(f"unknown state {state!r}", path="state",
                               hint="one of " + ", ".join(s.value for s in JobState))
        if not 1 <= limit <= 1000 or offset < 0:
            raise InvalidInput("limit must be 1..1000 and offset >= 0", path="limit")
        with self.store.read() as session:
            stmt = self._list_stmt[state is not None]
            params: dict[str, Any] = {"team_id": team_id, "state": state, "limit": limit, "offset": offset}
            rows = session.execute(stmt, params).mappings().all()
            return [JobPublic.model_validate(dict(row)) for row in rows]

    def cancel(self, principal: Principal, job_id: str, reason: str = "") -> JobPublic:
        """Mark the job cancelled; the loop stops a live attempt and charges it up to now."""
        with self.store.write() as session:
            job = self._own_job(session, principal, job_id)
            if JobState(job.state) in TERMINAL:
                raise Conflict(f"job {job_id} already {job.state}; nothing to cancel")
            transition(session, job, JobState.CANCELLED, self.clock(),
                       f"cancelled by team {principal.team_name}" + (f": {reason}" if reason else ""))
            return self._public(session, [job])[0]

    def logs(self, principal: Principal, job_id: str, since: int = 0) -> JobLogs:
        """The job's log (scheduler.logbook) from line ``since`` on: state changes, attempt headers
        and executor lines in the order they happened. Lines never move, so ``next`` is the
        ``since`` that returns exactly the lines written after these."""
        if since < 0:
            raise InvalidInput("since must be >= 0", path="since")
        with self.store.read() as session:
            job = self._own_job(session, principal, job_id)
            lines = logbook.read(session, job.id, since)
            # A cancelled job's attempt stays open until the loop has stopped it and copied its
            # last lines; only then is the log complete.
            open_attempts = session.execute(sa_select(func.count()).select_from(Attempt).where(
                col(Attempt.job_id) == job.id, col(Attempt.ended_at).is_(None))).scalar_one()
        complete = JobState(job.state).terminal and open_attempts == 0
        return JobLogs(job_id=job.id, lines=lines, next=since + len(lines), state=job.state, complete=complete)

    # -------------------------------------------------------------- reports and metrics

    def spend_report(self, principal: Principal, *, since: datetime, team: str | None = None) -> SpendReport:
        """One team's spend per job (the caller's, or any team's for the admin); the admin without
        a team gets every team's totals."""
        until = self.clock()
        with self.store.read() as session:
            if team is None and principal.is_admin:
                return self._all_teams_spend(session, since, until)
            if team is not None and (principal.is_admin or team != principal.team_name):
                self._require_admin(principal)
                row = self._team_by_name(session, team)
            else:
                row_or_none = session.get(Team, self._team_id(principal))
                if row_or_none is None:
                    raise NotFound("your team no longer exists")
                row = row_or_none
            assert row.id is not None
            lines = ledger.spend_lines(session, row.id, since, until)
            info = self._team_public(session, row)
        return SpendReport(team=row.name, since=since, until=until, total_usd=sum(x.usd for x in lines),
                           by_market=_by_market((x.market, x.usd) for x in lines), jobs=lines,
                           budget_usd=row.budget_usd, remaining_usd=info.remaining_usd)

    def _all_teams_spend(self, session: Session, since: datetime, until: datetime) -> SpendReport:
        teams = []
        for row in session.exec(select(Team).order_by(col(Team.name))).all():
            assert row.id is not None
            lines = ledger.spend_lines(session, row.id, since, until)
            teams.append(TeamSpend(team=row.name, total_usd=sum(x.usd for x in lines),
                                   by_market=_by_market((x.market, x.usd) for x in lines), budget_usd=row.budget_usd,
                                   remaining_usd=self._team_public(session, row).remaining_usd))
        return SpendReport(team=None, since=since, until=until, total_usd=sum(t.total_usd for t in teams),
                           by_market=_by_market(m for t in teams for m in t.by_market.items()), jobs=[],
                           budget_usd=None, remaining_usd=None, teams=teams)

    def metrics_snapshot(self, principal: Principal) -> tuple[dict[tuple[str, str], int],
                                                               dict[tuple[str, str], float]]:
        """({(team, state): jobs}, {(team, market): usd}) for the Prometheus endpoint (admin only)."""
        self._require_admin(principal)
        with self.store.read() as session:
            names = {t.id: t.name for t in session.exec(select(Team)).all()}
            jobs = session.exec(select(Job.team_id, Job.state, func.count()).group_by(
                col(Job.team_id), col(Job.state))).all()
            spend = ledger.spend_by_team(session)
        by_state = {(names.get(t, str(t)), s): int(n) for t, s, n in jobs}
        by_team = {(names.get(t, str(t)), m): v for t, markets in spend.items() for m, v in markets.items()}
        return by_state, by_team
