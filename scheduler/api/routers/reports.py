"""/v1/reports/spend, /healthz and /metrics."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import PlainTextResponse

from catalog.errors import InvalidInput
from planner.spec import parse_hours
from scheduler.api.deps import PrincipalDep, ServiceDep
from scheduler.inputs import Name, Word
from scheduler.metrics import render_prometheus
from scheduler.models import SpendReport

router = APIRouter(tags=["reports"])


@router.get("/v1/reports/spend", response_model=SpendReport)
def spend(principal: PrincipalDep, service: ServiceDep,
          since: Annotated[Word, Query(description="window, e.g. 30d, 12h")] = "30d",
          team: Annotated[Name | None, Query(description="admin only: any team")] = None,
          ) -> SpendReport:
    try:
        hours = parse_hours(since)
        window = timedelta(hours=hours)
        start = service.clock() - window
    except ValueError as exc:  # parse_hours' message already shows the form to write
        raise InvalidInput(str(exc), path="since") from None
    except OverflowError:
        raise InvalidInput(f"window {since!r} is too large", path="since", hint="write e.g. 30d, 12h or 90m") from None
    return service.spend_report(principal, since=start, team=team)


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
