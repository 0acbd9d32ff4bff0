"""/v1/jobs and /v1/plans."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, status
from pydantic import BaseModel, ConfigDict, Field

from planner.types import Plan
from scheduler.api.deps import PrincipalDep, ServiceDep
from scheduler.models import JobCreate, JobDetail, JobLogs, JobPublic

router = APIRouter(prefix="/v1", tags=["jobs"])


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=500)


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = Field(description="a JobSpec (see DESIGN.md)")


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobPublic)
def submit(body: JobCreate, principal: PrincipalDep, service: ServiceDep) -> JobPublic:
    """Plan and queue a job. The same ``idempotency_key`` returns the same job."""
    return service.submit(principal, body)


@router.get("/jobs", response_model=list[JobPublic])
def list_jobs(principal: PrincipalDep, service: ServiceDep,
              state: Annotated[str | None, Query(max_length=16)] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 50,
              offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> list[JobPublic]:
    return service.list_jobs(principal, state=state, limit=limit, offset=offset)


@router.get("/jobs/{job_id}", response_model=JobDetail)
def get_job(job_id: str, principal: PrincipalDep, service: ServiceDep) -> JobDetail:
    return service.status(principal, job_id)


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic)
def cancel(job_id: str, principal: PrincipalDep, service: ServiceDep,
           body: Annotated[CancelBody | None, Body()] = None) -> JobPublic:
    return service.cancel(principal, job_id, body.reason if body else "")


@router.get("/jobs/{job_id}/logs", response_model=JobLogs)
def logs(job_id: str, principal: PrincipalDep, service: ServiceDep,
         since: Annotated[int, Query(ge=0, le=100_000_000)] = 0) -> JobLogs:
    return service.logs(principal, job_id, since)


@router.post("/plans", response_model=Plan)
def dry_run(body: PlanRequest, _principal: PrincipalDep, service: ServiceDep) -> Plan:
    """Plan a spec without submitting it."""
    return service.plan(body.spec)
