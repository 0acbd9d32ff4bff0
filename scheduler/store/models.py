"""SQLModel tables and their API shapes (Base / Create / Public families, as in the FastAPI
full-stack template): a table model holds everything, ``*Create`` is what a client may send, and
``*Public`` is what the API returns (never a token hash, never another team's data).

Times are timezone-aware UTC everywhere; :class:`UTCDateTime` keeps them so on SQLite too.
"""

from __future__ import annotations

import enum
import re
from datetime import UTC, date, datetime
from typing import Any

from pydantic import ConfigDict, field_validator
from sqlalchemy import JSON, Column, DateTime, Index, MetaData, String, Text, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

from errors import InvalidInput
from planner.plan_record import PlannedRun, dump_planned_run, load_planned_run
from scheduler.inputs import JsonObject, Key, Name
from scheduler.store.states import JobState, Market

# Deterministic constraint names so Alembic migrations can refer to them on every backend.
SQLModel.metadata.naming_convention = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
metadata: MetaData = SQLModel.metadata


class UTCDateTime(TypeDecorator[datetime]):
    """Stores UTC; always returns an aware datetime (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC time")
        return value.astimezone(UTC) if dialect.name != "sqlite" else value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class EnumText(TypeDecorator[Any]):
    """A StrEnum stored as its text (a VARCHAR, as a plain str column): rows read back hold members, and a
    value that is not one is refused on the way in."""

    impl = String
    cache_ok = True

    def __init__(self, enum_type: type[enum.StrEnum], length: int = 16) -> None:
        super().__init__(length)
        self.enum_type = enum_type
        self.length = length

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum_type(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> enum.StrEnum | None:
        return None if value is None else self.enum_type(value)


class PlanColumn(TypeDecorator[PlannedRun]):
    """A job's plan: a :class:`PlannedRun` in Python, its versioned JSON document (planner.plan_record) in the
    database; documents of earlier schema versions are upgraded as they are read."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: PlannedRun | None, dialect: Dialect) -> dict[str, Any] | None:
        return None if value is None else dump_planned_run(value)

    def process_result_value(self, value: dict[str, Any] | None, dialect: Dialect) -> PlannedRun | None:
        return None if value is None else load_planned_run(value)


def _enum(enum_type: type[enum.StrEnum], default: Any = None) -> Any:
    return Field(default=default, sa_column=Column(EnumText(enum_type), nullable=False))


def _ts(nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


# ------------------------------------------------------------------ teams and tokens


# One rule for team names on every path (API bodies and paths, CLI, GPUPLAN_TEAM): a name is a
# URL path segment and a Prometheus label value, and lowercase only so "ML" and "ml" never differ.
# The pattern is also the dashboard's HTML ``pattern`` attribute: '-' is escaped so browsers that
# compile it with the 'v' flag accept it too.
TEAM_NAME_PATTERN = r"[a-z0-9][a-z0-9_\-]{0,62}"
_TEAM_NAME = re.compile(TEAM_NAME_PATTERN)
TEAM_NAME_RULE = "1 to 63 lowercase letters, digits, '-' or '_', starting with a letter or digit"


def team_name_error(name: str) -> str | None:
    """Why ``name`` is not a valid team name (with a valid spelling to use instead), or None."""
    if _TEAM_NAME.fullmatch(name):
        return None
    fixed = re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-_")[:63]
    instead = f", e.g. {fixed!r}" if fixed and _TEAM_NAME.fullmatch(fixed) else ""
    return f"team name {name!r} is not valid: use {TEAM_NAME_RULE}{instead}"


def check_team_name(name: str) -> str:
    """``name``, or InvalidInput saying the rule."""
    problem = team_name_error(name)
    if problem is not None:
        raise InvalidInput(problem, path="team")
    return name


class TeamBase(SQLModel):
    name: str = Field(description="team name: " + TEAM_NAME_RULE)  # checked by TeamCreate, one message
    budget_usd: float | None = Field(default=None, ge=0, le=1e12, description="None: no budget limit")
    gpu_quota: int | None = Field(default=None, ge=0, le=1_000_000,
                                  description="GPUs of running jobs (queued jobs wait for it); None: no limit")


class TeamCreate(TeamBase):
    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]
    name: Name

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        problem = team_name_error(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class TeamUpdate(SQLModel):
    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]
    budget_usd: float | None = Field(default=None, ge=0, le=1e12)
    gpu_quota: int | None = Field(default=None, ge=0, le=1_000_000)
    clear_budget: bool = False
    clear_quota: bool = False


class Team(TeamBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, sa_column_kwargs={"unique": True}, nullable=False)
    created_at: datetime = _ts()


class TeamPublic(TeamBase):
    id: int
    created_at: datetime
    spent_usd: float = 0.0
    reserved_usd: float = Field(
        default=0.0,
        description="estimates not yet spent of active jobs and of cancelled jobs whose attempt is still being stopped")
    remaining_usd: float | None = None
    gpus_in_use: int = Field(default=0, description="GPUs of jobs running now: what the quota caps")
    gpus_queued: int = Field(default=0, description="GPUs of queued jobs, waiting to start")


class ApiToken(SQLModel, table=True):
    __tablename__ = "api_token"
    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="team.id", index=True)
    name: str = Field(default="default", max_length=64)
    token_hash: str = Field(max_length=64, sa_column_kwargs={"unique": True}, nullable=False)
    created_at: datetime = _ts()
    revoked_at: datetime | None = _ts(nullable=True)


class ApiTokenPublic(SQLModel):
    id: int
    team_id: int
    name: str
    created_at: datetime
    revoked_at: datetime | None


class ApiTokenCreated(ApiTokenPublic):
    token: str = Field(description="the secret; shown once, only its sha256 is stored")


# ------------------------------------------------------------------ jobs


class JobBase(SQLModel):
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)


class JobCreate(JobBase):
    model_config = ConfigDict(extra="forbid")  # type: ignore[assignment]
    idempotency_key: Key | None = None
    spec: JsonObject = Field(description="a job spec: the fields of the README's 'Job spec' (examples/*.yaml)")


class Job(JobBase, table=True):
    __table_args__ = (
        UniqueConstraint("team_id", "idempotency_key", name="uq_job_team_idempotency_key"),
        Index("ix_job_state_next_run_at", "state", "next_run_at"),
        Index("ix_job_team_id_state", "team_id", "state"),
        Index("ix_job_team_id_created_at", "team_id", "created_at"),
        Index("ix_job_team_id_id_gpu", "team_id", "id", "gpu"),  # spend by GPU type joins this alone (0006)
    )
    id: str = Field(primary_key=True, max_length=32)
    team_id: int = Field(foreign_key="team.id")
    name: str = Field(max_length=128)
    spec: dict[str, Any] = Field(sa_column=Column(JSON, nullable=False))
    spec_hash: str = Field(max_length=64)
    plan: PlannedRun = Field(sa_column=Column(PlanColumn(), nullable=False))
    state: JobState = _enum(JobState)
    estimated_usd: float = 0.0
    estimated_hours: float = 0.0
    gpus: int = 0
    gpu: str = Field(default="", max_length=64)
    market: Market = _enum(Market, Market.ON_DEMAND)
    usd_per_h: float = 0.0
    attempts: int = 0
    max_attempts: int = 3
    checkpoint_uri: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=2000)
    next_run_at: datetime | None = _ts(nullable=True)
    created_at: datetime = _ts(index=True)
    updated_at: datetime = _ts()
    started_at: datetime | None = _ts(nullable=True)
    finished_at: datetime | None = _ts(nullable=True)


class JobProgress(SQLModel):
    """A running job's newest reported step (scheduler.loop.job_progress): what `status` and `list` show."""

    step: int
    total_steps: int
    percent: float | None = None
    loss: float | None = None
    tokens_per_s: float | None = Field(default=None, description="steady-state rate the workers measured")
    eta_s: float | None = Field(default=None, description="seconds left at that rate (train.tokens to go)")


class JobPublic(JobBase):
    id: str
    team_id: int
    name: str
    state: JobState
    estimated_usd: float
    estimated_hours: float
    gpus: int
    gpu: str
    market: Market
    usd_per_h: float
    attempts: int
    max_attempts: int
    checkpoint_uri: str
    message: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    spent_usd: float = 0.0
    progress: JobProgress | None = Field(default=None, description="a running job's newest step; None otherwise")


class Attempt(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempt_job_id_number"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    number: int
    handle: str | None = Field(default=None, max_length=256)
    market: str = Field(max_length=16)
    usd_per_h: float = Field(description="price at launch")
    started_at: datetime = _ts()
    last_seen_at: datetime | None = _ts(nullable=True)
    ended_at: datetime | None = _ts(nullable=True, index=True)
    outcome: str | None = Field(default=None, max_length=16)
    message: str = Field(default="", max_length=2000)
    metrics: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON, nullable=True),
        description="predicted vs measured (scheduler.loop.accuracy.attempt_metrics); "
                    "None if the attempt reported none")
    zone: str | None = Field(default=None, max_length=64, description="the zone it was placed in (None: any)")


class JobLog(SQLModel, table=True):
    """One line of a job's log (scheduler.store.logbook): state changes, attempt headers and executor
    lines in one append-only stream, numbered per job from 0."""

    __tablename__ = "job_log"
    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_log_job_id_seq"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id")
    seq: int = Field(description="0-based position of the line in the job's log")
    attempt_id: int | None = Field(default=None, foreign_key="attempt.id", index=True,
                                   description="set on an attempt's executor lines (not on its header)")
    line: str = Field(sa_column=Column(Text, nullable=False))


class AttemptPublic(SQLModel):
    number: int
    handle: str | None
    market: str
    usd_per_h: float
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    message: str
    metrics: dict[str, Any] | None = Field(
        default=None, description="'measured' and 'predicted' peak allocated/reserved bytes, tokens/s, checkpoint "
        "save s, and 'oom_backoffs' (each halving of the micro-batch after a CUDA OOM)")


class Event(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    from_state: str | None = Field(default=None, max_length=16)
    to_state: str = Field(max_length=16)
    at: datetime = _ts()
    reason: str = Field(default="", max_length=2000)


class EventPublic(SQLModel):
    from_state: str | None
    to_state: str
    at: datetime
    reason: str


class JobDetail(JobPublic):
    plan: dict[str, Any] = Field(description="the job's plan: its chosen candidate, warnings and the leading "
                                 "candidates as alternatives (planner.plan_record.PlannedRun)")
    spec: dict[str, Any]
    attempt_list: list[AttemptPublic] = Field(default_factory=list)
    events: list[EventPublic] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list, description="what ran differently from the plan, e.g. NCCL "
                                "over TCP sockets where the plan priced EFA, with the plan's speed on that link")

    def planned_run(self) -> PlannedRun:
        """The job's plan, typed."""
        return load_planned_run(self.plan)


class JobLogs(SQLModel):
    job_id: str
    lines: list[str]
    next: int = Field(description="pass as ?since= to continue")
    state: JobState
    complete: bool = Field(default=False, description="the job has ended and its last attempt is closed: no line "
                           "will be added (a follower stops here; the state alone can end before the last lines)")


# ------------------------------------------------------------------ spend


class Spend(SQLModel, table=True):
    """One row per finished attempt: price at launch x hours. ``attempt_id`` is unique, so a
    replayed close (after a crash) cannot count an attempt twice."""

    # the reports' filter (team, time) first, then every column they sum or group by: the spend
    # report, the Spend page and a team's figures read the index alone (migration 0006)
    __table_args__ = (Index("ix_spend_team_time_cover", "team_id", "recorded_at", "job_id", "market", "usd",
                            "hours"),)
    id: int | None = Field(default=None, primary_key=True)
    team_id: int = Field(foreign_key="team.id", index=True)
    job_id: str = Field(foreign_key="job.id", index=True)
    attempt_id: int = Field(foreign_key="attempt.id", sa_column_kwargs={"unique": True}, nullable=False)
    market: str = Field(max_length=16)
    usd_per_h: float
    hours: float
    usd: float
    recorded_at: datetime = _ts(index=True)


class SpendDay(SQLModel, table=True):
    """Spend summed per team, UTC day, GPU type and market: what the spend reports and the Spend
    page group by, kept by the ledger in the transaction that writes each Spend row (migration
    0008 filled it from the rows before it). A report reads whole days here and only the partial
    days at its window's edges from ``spend``."""

    __tablename__ = "spend_day"
    __table_args__ = (Index("ix_spend_day_day", "day"),)  # every team's days (the admin's Spend page)
    team_id: int = Field(foreign_key="team.id", primary_key=True)
    day: date = Field(primary_key=True)
    gpu: str = Field(primary_key=True, max_length=64)  # the job's GPU type ("" when it has none)
    market: str = Field(primary_key=True, max_length=16)
    usd: float
    hours: float
    attempts: int  # the Spend rows summed here


class SpendLine(SQLModel):
    job_id: str
    job_name: str
    market: str
    attempts: int
    hours: float
    usd: float


class TeamSpend(SQLModel):
    team: str
    total_usd: float
    by_market: dict[str, float]
    budget_usd: float | None
    remaining_usd: float | None


class SpendReport(SQLModel):
    team: str | None = Field(description="None: every team (the admin's report without a team)")
    since: datetime
    until: datetime
    total_usd: float
    by_market: dict[str, float]
    jobs: list[SpendLine] = Field(description="per job and market, for one team's report")
    budget_usd: float | None
    remaining_usd: float | None
    teams: list[TeamSpend] = Field(default_factory=list, description="per team, in the every-team report")
