"""The dashboard's test world: two teams with tokens, a finished run with metrics and spend, a
queued job, another team's job; a real SQLite store, the scripted executor and a clock the test moves."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from catalog.loader import Catalog, load_catalog
from scheduler.api import create_app
from scheduler.loop.scheduling import Scheduler
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, TeamCreate
from tests.scheduler.conftest import spec_dict, toy_plan
from tests.scheduler.fakes import FakeClock, ScriptedExecutor
from workers.executors.protocol import RunState

ADMIN_TOKEN = "admin-secret"
GiB = 1 << 30


@dataclass
class World:
    service: SchedulerService
    clock: FakeClock
    executor: ScriptedExecutor
    loop: Scheduler
    tokens: dict[str, str]
    jobs: dict[str, str]  # name -> id
    app: object

    def client(self) -> TestClient:
        # https: the session cookie is Secure, and a cookie jar sends it over https only.
        return TestClient(self.app, base_url="https://testserver")  # type: ignore[arg-type]

    def signed_in(self, token: str) -> TestClient:
        client = self.client()
        sign_in(client, token)
        return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def sign_in(client: TestClient, token: str) -> None:
    page = client.get("/ui/login")
    assert page.status_code == 200
    resp = client.post("/ui/login", data={"token": token, "csrf": csrf_of(page.text)}, follow_redirects=False)
    assert resp.status_code == 303, resp.text


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture
def world(catalog: Catalog, tmp_path: Path, _migrated_sqlite: Path) -> Iterator[World]:
    path = tmp_path / "gpuplan.db"
    shutil.copyfile(_migrated_sqlite, path)
    store = Store(f"sqlite:///{path}")
    clock = FakeClock(datetime(2026, 11, 20, 9, 0, tzinfo=UTC))
    service = SchedulerService(store, toy_plan, clock=clock, checkpoint_root=str(tmp_path / "ckpt"),
                               admin_token=ADMIN_TOKEN)
    executor = ScriptedExecutor()
    loop = Scheduler(store, executor, clock=clock, poll_s=0.05)
    tokens, jobs = {}, {}
    for name, budget in (("alpha", 500.0), ("beta", None)):
        service.create_team(ADMIN, TeamCreate(name=name, budget_usd=budget))
        tokens[name] = service.create_token(ADMIN, name, "ci").token
    alpha, beta = service.team_principal("alpha"), service.team_principal("beta")
    # alpha: one finished run with metrics and spend, one queued job named like an attack
    done = service.submit(alpha, JobCreate(spec=spec_dict(tokens=40e6, name="finetune-a")))
    loop.tick()
    clock.advance(hours=2)
    executor.finish(executor.handle_of(done.id), RunState.SUCCEEDED,
                    {"measured_peak_allocated_bytes": 30 * GiB, "measured_tokens_per_s": 900.0})
    loop.tick()
    jobs["finetune-a"] = done.id
    evil = service.submit(alpha, JobCreate(spec=spec_dict(tokens=1e6, name="evil")))
    jobs["evil"] = evil.id
    jobs["beta-job"] = service.submit(beta, JobCreate(spec=spec_dict(tokens=2e6, name="beta-job"))).id
    app = create_app(service, catalog)
    try:
        yield World(service, clock, executor, loop, tokens, jobs, app)
    finally:
        store.dispose()
