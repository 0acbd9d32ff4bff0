"""/v1/reports/spend, /healthz and /metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from scheduler.api.deps import PrincipalDep, ServiceDep
from scheduler.inputs import Name, Word
from scheduler.metrics import render_prometheus
from scheduler.store import ledger
from scheduler.store.models import SpendReport

router = APIRouter(tags=["reports"])


@router.get("/v1/reports/spend", response_model=SpendReport)
def spend(principal: PrincipalDep, service: ServiceDep,
          since: Annotated[Word, Query(description="a window (30d, 12h, 90m) or a UTC date or "
                                                   "time (2026-11-01, 2026-11-01T08:00)")] = "30d",
          team: Annotated[Name | None, Query(description="admin only: any team; the admin "
                                                         "without it gets every team's totals")] = None,
          ) -> SpendReport:
    return service.spend_report(principal, since=ledger.since_start(since, service.clock()), team=team)


@router.get("/healthz")
def healthz(service: ServiceDep) -> dict[str, str]:
    with service.store.read() as session:
        session.connection().exec_driver_sql("SELECT 1")
    return {"status": "ok", "database": service.store.dialect}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(principal: PrincipalDep, service: ServiceDep) -> str:
    """Prometheus text format: jobs by team and state, spend by team and market (admin token:
    it spans every team)."""
    return render_prometheus(*service.metrics_snapshot(principal))
