"""Scheduler fixtures: real SQLite files and a real PostgreSQL (one fresh schema per use).

The planner is injected: ``toy_plan`` builds a real :class:`Plan` from the spec so tests control
cost and GPU count through the spec itself (cost = tokens / 1e6 dollars, GPUs from 'H100:N').
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
from sqlalchemy import text

from catalog.schema import Offer, Source
from planner.plan_record import PlannedRun, planned_run
from planner.spec import JobSpec, spec_from_dict
from planner.types import Candidate, CostEstimate, Estimate, MemoryEstimate, Plan, Strategy, ThroughputEstimate
from scheduler.service import ADMIN, Principal, SchedulerService
from scheduler.spot.policy import ZoneSeen
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, JobPublic, TeamCreate
from tests.pg import drop_pg_schema, new_pg_schema, pg_reason
from tests.scheduler.fakes import FakeClock


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpuplan.db'}"
        return
    reason = pg_reason()
    if reason:
        pytest.skip(reason)
    schema, url = new_pg_schema()
    try:
        yield url
    finally:
        drop_pg_schema(schema)


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file at the head revision; each test gets a copy (migrating is the slow part)."""
    path = tmp_path_factory.mktemp("template") / "gpuplan.db"
    template = Store(f"sqlite:///{path}")
    template.migrate()
    template.dispose()  # the last connection to close checkpoints the WAL into the file we copy
    assert not Path(f"{path}-wal").exists()
    return path


@pytest.fixture(scope="session")
def _migrated_pg() -> Iterator[str | None]:
    """One PostgreSQL schema at head for the whole run (tables are truncated between tests)."""
    if pg_reason():
        yield None
        return
    schema, url = new_pg_schema()
    template = Store(url)
    template.migrate()
    template.dispose()
    try:
        yield url
    finally:
        drop_pg_schema(schema)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path, _migrated_sqlite: Path,
          _migrated_pg: str | None) -> Iterator[Store]:
    """A migrated, empty database: a copy of the SQLite template, or the shared PG schema truncated."""
    if request.param == "sqlite":
        path = tmp_path / "gpuplan.db"
        shutil.copyfile(_migrated_sqlite, path)
        s = Store(f"sqlite:///{path}")
    else:
        if _migrated_pg is None:
            pytest.skip(pg_reason() or "no PostgreSQL")
        s = Store(_migrated_pg)
        with s.engine.begin() as conn:
            conn.execute(text("TRUNCATE team, api_token, job, attempt, job_log, event, spend, spend_day "
                              "RESTART IDENTITY CASCADE"))
    try:
        yield s
    finally:
        s.dispose()


OFFER = Offer(
    cloud="aws", instance_type="p5.48xlarge", gpu="H100-SXM", gpu_count=8, vcpus=192, ram_gib=2048,
    region="us-east-1", zone="use1-az6", on_demand_usd_per_h=55.04, spot_usd_per_h=14.25,
    source=Source(url="https://example.invalid/test-offer", as_of=date(2026, 1, 1), note="test"),
)


TOY_MTTP_H = 8.0  # the mean time to preemption toy_plan prices spot at


def toy_plan(spec: JobSpec) -> Plan:
    """A real Plan whose cost the test controls: $ = tokens/1e6 (or requests/1e3); GPUs from 'X:N'."""
    pins = spec.resources.accelerator_pins()
    gpus = next((n for n in pins.values() if n), 1)
    amount = spec.train.tokens / 1e6 if spec.train else (spec.infer.requests / 1e3 if spec.infer else 1.0)
    market = "spot" if spec.resources.spot == "always" else "on-demand"
    per_h = 10.0
    strategy = Strategy(gpu="H100-SXM", gpu_count=gpus)
    estimate = Estimate(
        strategy=strategy,
        memory=MemoryEstimate(peak_allocated_bytes=1, peak_reserved_bytes=1, total_bytes=1, usable_bytes=2,
                              fits=True, breakdown={}),
        throughput=ThroughputEstimate(tokens_per_s=1000.0),
        hours=amount / per_h,
    )
    cand = Candidate(estimate=estimate, offer=OFFER,
                     cost=CostEstimate(market=market, usd_per_h=per_h, hours=amount / per_h, usd=amount,
                                       mean_time_to_preemption_h=TOY_MTTP_H if market == "spot" else None))
    return Plan(job=spec.name, objective="cheapest", chosen=cand, candidates=[cand], rejections=[])


def toy_record(name: str = "job") -> PlannedRun:
    """toy_plan's plan of spec_dict(), as a job keeps it: for tests that write job rows themselves."""
    return planned_run(toy_plan(spec_from_dict(spec_dict(name=name))))


def spec_dict(tokens: float = 1e6, gpus: int = 1, name: str = "job", spot: str = "never") -> dict[str, object]:
    """A train spec costing tokens/1e6 dollars on ``gpus`` GPUs under toy_plan."""
    return {"name": name, "task": "train", "model": "llama-3-8b", "train": {"tokens": tokens},
            "resources": {"accelerators": [f"H100:{gpus}"], "spot": spot}}


@pytest.fixture
def service(store: Store, tmp_path: Path) -> SchedulerService:
    return SchedulerService(store, toy_plan, checkpoint_root=str(tmp_path / "ckpt"), admin_token="admin-secret")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def svc(store: Store, tmp_path: Path, clock: FakeClock) -> SchedulerService:
    """A service over ``store`` planning with toy_plan, on a clock the test moves."""
    return SchedulerService(store, toy_plan, clock=clock, checkpoint_root=str(tmp_path / "ckpt"))


def ml_team(svc: SchedulerService, budget: float | None = None) -> Principal:
    """Team "ml" (with ``budget``), signed in."""
    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=budget))
    return svc.authenticate(svc.create_token(ADMIN, "ml").token)


def spot_job(svc: SchedulerService, who: Principal, deadline: float | None) -> JobPublic:
    """48 h of work under toy_plan (spot $14.25/h, on-demand $55.04/h) that may run on spot or on-demand."""
    spec = spec_dict(tokens=4.8e8, spot="auto")
    if deadline is not None:
        spec["resources"] = {**spec["resources"], "deadline": deadline}  # type: ignore[dict-item]
    return svc.submit(who, JobCreate(spec=spec))


def zone(available: bool, up_h: float = 20.0, preemptions: int = 2, outage_age_h: float = 0.0) -> ZoneSeen:
    """What the loop has seen of a zone: 30 h watched, ``up_h`` of them with capacity."""
    return ZoneSeen(watched_h=30.0, up_h=up_h, preemptions=preemptions, run_h=3.0 if available else 0.0,
                    available=available, outage_age_h=0.0 if available else outage_age_h)
