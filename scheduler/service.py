"""The scheduler's one service: submit / status / list / cancel / logs, reports; teams and tokens
(scheduler.store.teams) and authentication (scheduler.auth) behind the same object.

Budget and GPU-quota rules live here and nowhere else. They hold under concurrency because the
check and the job insert happen in one write transaction that first locks the team row
(PostgreSQL ``SELECT ... FOR UPDATE``; SQLite ``BEGIN IMMEDIATE`` takes the one write lock).

The API (scheduler.api) and the in-process CLI call this class; scheduler.client offers the same
methods over HTTP.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert
from sqlalchemy import select as sa_select
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from errors import Conflict, InvalidInput, LimitExceeded, NoFeasiblePlan, NotFound
from planner.plan_record import planned_run
from planner.spec import JobSpec, model_is_path, spec_from_dict
from planner.types import Plan
from scheduler import spend_reports
from scheduler.auth import ADMIN, Principal, TokenAuth, hash_token, team_id_of
from scheduler.loop import job_progress, quota
from scheduler.loop.admission import Feasibility, refuse_unrunnable
from scheduler.loop.network_status import Relink, network_warnings
from scheduler.store import ledger, logbook, queries
from scheduler.store.database import Store, transition
from scheduler.store.models import (
    ApiTokenCreated,
    ApiTokenPublic,
    Attempt,
    Event,
    Job,
    JobCreate,
    JobDetail,
    JobLog,
    JobLogs,
    JobPublic,
    SpendReport,
    TeamCreate,
    TeamPublic,
    TeamUpdate,
)
from scheduler.store.states import TERMINAL, JobState, Market, check_transition
from scheduler.store.teams import Teams
from workers.cluster.nccl_net import LINE_PREFIX
from workers.spec_files import check_spec_files

__all__ = ["ADMIN", "Clock", "Planner", "Principal", "SchedulerService", "hash_token", "spec_hash", "utcnow"]

Clock = Callable[[], datetime]
Planner = Callable[[JobSpec], Plan]


_PUBLIC_FIELDS = tuple(name for name in JobPublic.model_fields if name not in ("spent_usd", "progress"))


def utcnow() -> datetime:
    return datetime.now(UTC)


def spec_hash(spec: JobSpec) -> str:
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def usd(x: float) -> str:
    return f"${x:,.2f}"


def _public(job: Job, spent_usd: float) -> JobPublic:
    return JobPublic.model_validate({name: getattr(job, name) for name in _PUBLIC_FIELDS} | {"spent_usd": spent_usd})


def _random_job_id() -> str:
    return "j-" + secrets.token_hex(8)


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
        job_ids: Callable[[], str] | None = None,
        relink: Relink | None = None,
        feasibility: Feasibility | None = None,
    ) -> None:
        self.store = store
        self.planner = planner
        self.clock = clock
        # injected like the clock: a test that replays steps (Hypothesis) needs the same ids each time,
        # since jobs submitted at one instant start in id order
        self.job_ids = job_ids or _random_job_id
        self.relink = relink  # a plan's speed on another link (scheduler.loop.network_status), for status's warnings
        # the executor's own check, asked at submit (scheduler.loop.admission); None: no executor here to ask
        self.feasibility = feasibility
        self.checkpoint_root = checkpoint_root.rstrip("/")
        self.max_attempts = max_attempts
        self._plans: OrderedDict[str, Plan] = OrderedDict()
        self._plans_lock = threading.Lock()
        self._plan_cache_size = plan_cache_size
        self.auth = TokenAuth(store, admin_token=admin_token, cache_s=auth_cache_s)
        self.teams = Teams(store, clock, self.auth)
        self._list_stmt = (queries.list_statement(by_state=False), queries.list_statement(by_state=True))
        self._status_stmts = queries.status_statements()
        self._existing_stmt = queries.existing_job_statement()

    # -------------------------------------------------------------- auth, teams and tokens (scheduler.store.teams)

    def authenticate(self, token: str | None) -> Principal:
        return self.auth.authenticate(token)

    def authenticate_hash(self, digest: str) -> Principal:
        """Who holds the token whose sha256 is ``digest`` (a web session keeps the digest, never the token)."""
        return self.auth.authenticate_hash(digest)

    def team_principal(self, name: str, *, create: bool = False, shared: bool = False) -> Principal:
        return self.teams.team_principal(name, create=create, shared=shared)

    def create_team(self, principal: Principal, body: TeamCreate) -> TeamPublic:
        return self.teams.create_team(principal, body)

    def update_team(self, principal: Principal, name: str, body: TeamUpdate) -> TeamPublic:
        return self.teams.update_team(principal, name, body)

    def get_team(self, principal: Principal, name: str | None = None) -> TeamPublic:
        return self.teams.get_team(principal, name)

    def list_teams(self, principal: Principal) -> list[TeamPublic]:
        return self.teams.list_teams(principal)

    def create_token(self, principal: Principal, team_name: str, name: str = "default") -> ApiTokenCreated:
        return self.teams.create_token(principal, team_name, name)

    def list_tokens(self, principal: Principal, team_name: str) -> list[ApiTokenPublic]:
        return self.teams.list_tokens(principal, team_name)

    def revoke_token(self, principal: Principal, team_name: str, token_id: int) -> ApiTokenPublic:
        return self.teams.revoke_token(principal, team_name, token_id)

    # -------------------------------------------------------------- planning

    def parse_spec(self, spec: dict[str, Any] | JobSpec) -> JobSpec:
        return spec if isinstance(spec, JobSpec) else spec_from_dict(spec)

    def plan_is_cached(self, spec: dict[str, Any] | JobSpec) -> bool:
        """Whether submitting ``spec`` needs no planning (callers may then run it on an event loop)."""
        try:
            job_spec = self.parse_spec(spec)
        except InvalidInput:
            return True  # refused at once, no planning either
        if model_is_path(job_spec.model):
            return False  # planned afresh each time (plan)
        with self._plans_lock:
            return spec_hash(job_spec) in self._plans

    def plan(self, spec: dict[str, Any] | JobSpec) -> Plan:
        """Plan a spec (cached by spec hash: the catalog a service holds does not change under it), once the
        files it names are readable here (workers.spec_files: a server's working directory is not the user's)."""
        job_spec = self.parse_spec(spec)
        check_spec_files(job_spec)
        if model_is_path(job_spec.model):  # the file may change under the same spec: planned afresh each time
            return self._planned(job_spec)
        key = spec_hash(job_spec)
        with self._plans_lock:
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return cached
        plan = self._planned(job_spec)
        with self._plans_lock:
            self._plans[key] = plan
            while len(self._plans) > self._plan_cache_size:
                self._plans.popitem(last=False)
        return plan

    def _planned(self, job_spec: JobSpec) -> Plan:
        plan = self.planner(job_spec)
        if plan.chosen is None:
            reasons = "; ".join(r.reason for r in plan.rejections[:3]) or "no candidate offers"
            raise NoFeasiblePlan(f"no feasible plan for job {job_spec.name!r}: {reasons}",
                                 hint="relax resources (accelerators, deadline, budget) or lower tokens")
        return plan

    # -------------------------------------------------------------- jobs

    def _public(self, session: Session, jobs: list[Job]) -> list[JobPublic]:
        spent = ledger.job_spent(session, [j.id for j in jobs])
        return [_public(j, spent.get(j.id, 0.0)) for j in jobs]

    def submit(self, principal: Principal, body: JobCreate) -> JobPublic:
        team_id = team_id_of(principal)
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
        # Everything that needs no lock is prepared first; the write transaction is a few Core
        # statements so the team lock (or SQLite's write lock) is held as briefly as possible.
        plan = self.plan(job_spec)
        refuse_unrunnable(self.feasibility, job_spec, plan)
        job = self._new_job(team_id, job_spec, digest, plan, body)
        moves = self._submit_moves(job, plan, principal)
        try:
            existing_id = self._insert_within_limits(job, moves, body.idempotency_key)
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
                existing = session.get(Job, existing_id)
                assert existing is not None
                return self._public(session, [existing])[0]
        return _public(job, 0.0)  # a new job has spent nothing: no need to ask the ledger

    def _new_job(self, team_id: int, spec: JobSpec, digest: str, plan: Plan, body: JobCreate) -> Job:
        """The queued job of a plan (not yet stored); the model's defaults fill the rest."""
        chosen = plan.chosen
        assert chosen is not None
        strategy = chosen.estimate.strategy
        job_id = self.job_ids()
        now = self.clock()
        return Job(id=job_id, team_id=team_id, name=spec.name, spec=spec.model_dump(mode="json"), spec_hash=digest,
                   plan=planned_run(plan), state=JobState.QUEUED, priority=body.priority,
                   idempotency_key=body.idempotency_key, estimated_usd=chosen.cost.usd,
                   estimated_hours=chosen.cost.hours, gpus=strategy.gpu_count, gpu=strategy.gpu,
                   market=Market(chosen.cost.market), usd_per_h=chosen.cost.usd_per_h, max_attempts=self.max_attempts,
                   checkpoint_uri=f"{self.checkpoint_root}/{job_id}", created_at=now, updated_at=now)

    @staticmethod
    def _submit_moves(job: Job, plan: Plan, principal: Principal) -> list[tuple[str | None, str, str]]:
        """The three submit transitions (from, to, reason), checked like any other; recorded as Events."""
        chosen = plan.chosen
        assert chosen is not None
        moves = [(None, JobState.PENDING, f"submitted by team {principal.team_name}"),
                 (JobState.PENDING, JobState.PLANNED,
                  f"plan: {chosen.estimate.strategy.label()} on {chosen.key}, est. {usd(chosen.cost.usd)} over "
                  f"{chosen.cost.hours:.2f} h at {usd(chosen.cost.usd_per_h)}/h"),
                 (JobState.PLANNED, JobState.QUEUED, "reserved the estimate within the budget; the GPU quota "
                  "admits it to run")]
        for src, dst, _ in moves:
            if src is not None:
                check_transition(job.id, src, dst)
        return [(src.value if src else None, dst.value, reason) for src, dst, reason in moves]

    def _insert_within_limits(self, job: Job, moves: list[tuple[str | None, str, str]],
                              key: str | None) -> str | None:
        """Insert the job, its events and first log lines if the team's limits allow; or the id of the
        team's job submitted earlier with ``key`` (then nothing is inserted)."""
        now = job.created_at
        with self.store.write() as session:
            team = self.store.lock_team_limits(session, job.team_id)
            if key:
                existing_id = self._existing_id(session, job.team_id, key, job.spec_hash)
                if existing_id is not None:
                    return existing_id
            self._check_limits(session, team, job.estimated_usd, job.gpus)
            job.message = self._initial_wait(session, team, job.gpus)
            table = Job.__table__  # type: ignore[attr-defined]
            session.execute(insert(table), [{c.name: getattr(job, c.name) for c in table.c}])
            session.execute(insert(Event.__table__), [  # type: ignore[attr-defined]
                {"job_id": job.id, "from_state": src, "to_state": dst, "at": now, "reason": reason}
                for src, dst, reason in moves])
            lines = [logbook.event_line(now, src, dst, reason) for src, dst, reason in moves]
            if job.message:
                lines.append(logbook.note_line(now, job.message))
            session.execute(insert(JobLog.__table__), logbook.first_lines(job.id, lines))  # type: ignore[attr-defined]
        return None

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
        jobs to run (scheduler.loop.quota), so only a job larger than the whole quota is refused here.
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
        team_id = team_id_of(principal)
        job = session.exec(select(Job).where(Job.id == job_id, Job.team_id == team_id)).first()
        if job is None:
            # The same answer whether the job is missing or another team's: no existence leak.
            raise NotFound(f"job {job_id!r} not found", hint="list your jobs with `gpuplan list`")
        return job

    def status(self, principal: Principal, job_id: str) -> JobDetail:
        team_id = team_id_of(principal)
        job_stmt, attempts_stmt, events_stmt = self._status_stmts
        with self.store.read() as session:
            row = session.execute(job_stmt, {"job_id": job_id, "team_id": team_id}).mappings().first()
            if row is None:
                # The same answer whether the job is missing or another team's: no existence leak.
                raise NotFound(f"job {job_id!r} not found", hint="list your jobs with `gpuplan list`")
            attempts = session.execute(attempts_stmt, {"job_id": job_id}).mappings().all()
            events = session.execute(events_stmt, {"job_id": job_id}).mappings().all()
            # a running attempt's network is in its log (the run says it after its first step) before its metrics
            running_net = logbook.newest_open_line(session, job_id, LINE_PREFIX) if row["gpus"] > 1 else None
            progress = job_progress.latest(session, [row]).get(job_id)
        planned = row["plan"]
        detail = JobDetail.model_validate(dict(row) | {"plan": planned.public(), "progress": progress,
                                                       "attempt_list": [dict(a) for a in attempts],
                                                       "events": [dict(e) for e in events]})
        detail.warnings = network_warnings(detail.spec, planned, [a.model_dump() for a in detail.attempt_list],
                                           self.relink, running_net)
        return detail

    def list_jobs(self, principal: Principal, *, state: str | None = None, limit: int = 50,
                  offset: int = 0) -> list[JobPublic]:
        team_id = team_id_of(principal)
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidInput(f"unknown state {state!r}", path="state",
                               hint="one of " + ", ".join(s.value for s in JobState))
        if not 1 <= limit <= 1000 or offset < 0:
            raise InvalidInput("limit must be 1..1000 and offset >= 0", path="limit")
        with self.store.read() as session:
            stmt = self._list_stmt[state is not None]
            params: dict[str, Any] = {"team_id": team_id, "state": state, "limit": limit, "offset": offset}
            rows = session.execute(stmt, params).mappings().all()
            progress = job_progress.latest(session, rows)
            return [JobPublic.model_validate(dict(row) | {"progress": progress.get(row["id"])}) for row in rows]

    def cancel(self, principal: Principal, job_id: str, reason: str = "") -> JobPublic:
        """Mark the job cancelled; the loop stops a live attempt and charges it up to now."""
        with self.store.write() as session:
            job = self._own_job(session, principal, job_id)
            if job.state in TERMINAL:
                raise Conflict(f"job {job_id} already {job.state}; nothing to cancel")
            transition(session, job, JobState.CANCELLED, self.clock(),
                       f"cancelled by team {principal.team_name}" + (f": {reason}" if reason else ""))
            return self._public(session, [job])[0]

    def logs(self, principal: Principal, job_id: str, since: int = 0) -> JobLogs:
        """The job's log (scheduler.store.logbook) from line ``since`` on: state changes, attempt headers
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
        complete = job.state.terminal and open_attempts == 0
        return JobLogs(job_id=job.id, lines=lines, next=since + len(lines), state=job.state, complete=complete)

    # -------------------------------------------------------------- reports and metrics (scheduler.spend_reports)

    def spend_report(self, principal: Principal, *, since: datetime, team: str | None = None,
                     top: int | None = None) -> SpendReport:
        return spend_reports.spend_report(self.store, principal, since=since, until=self.clock(), team=team, top=top)

    def metrics_snapshot(self, principal: Principal) -> tuple[dict[tuple[str, str], int],
                                                               dict[tuple[str, str], float]]:
        return spend_reports.metrics_snapshot(self.store, principal)
