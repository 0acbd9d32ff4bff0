"""/v1/jobs and /v1/plans."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Query, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from planner.types import Plan
from scheduler.api.deps import PrincipalDep, ServiceDep
from scheduler.models import JobCreate, JobDetail, JobLogs, JobPublic
from scheduler.service import SchedulerService

router = APIRouter(prefix="/v1", tags=["jobs"])
T = TypeVar("T")


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(default="", max_length=500)


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    spec: dict[str, Any] = Field(description="a JobSpec (see DESIGN.md)")


# The hot endpoints are ``async``. On SQLite a service call is a few in-process statements with no
# I/O wait, so it runs inline: no thread hop and no GIL convoy per request (bench/load.py, SQLite:
# ~130 -> ~170 req/s). On PostgreSQL the short indexed reads (status, list) also run inline: a
# few sub-millisecond round trips to a local server cost less than the thread hop. PostgreSQL
# writes, which may wait on a row lock, go to the threadpool. Anything that can take long
# (planning a spec not in the plan cache, executor logs, dry-run plans) always goes to the threadpool.


async def _call(service: SchedulerService, fn: Callable[..., T], *args: Any, inline: bool = True,
                read: bool = False) -> T:
    if inline and (read or not service.store.is_postgres):
        return fn(*args)
    return await run_in_threadpool(fn, *args)


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobPublic)
async def submit(body: JobCreate, principal: PrincipalDep, service: ServiceDep) -> JobPublic:
    """Plan and queue a job. The same ``idempotency_key`` returns the same job."""
    return await _call(service, service.submit, principal, body, inline=service.plan_is_cached(body.spec))


@router.get("/jobs", response_model=list[JobPublic])
async def list_jobs(principal: PrincipalDep, service: ServiceDep,
              state: Annotated[str | None, Query(max_length=16)] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 50,
              offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> list[JobPublic]:
    return await _call(service, functools.partial(service.list_jobs, principal, state=state, limit=limit,
                                                   offset=offset), read=True)


@router.get("/jobs/{job_id}", response_model=JobDetail)
async def get_job(job_id: str, principal: PrincipalDep, service: ServiceDep) -> JobDetail:
    return await _call(service, service.status, principal, job_id, read=True)


@router.post("/jobs/{job_id}/cancel", response_model=JobPublic)
async def cancel(job_id: str, principal: PrincipalDep, service: ServiceDep,
           body: Annotated[CancelBody | None, Body()] = None) -> JobPublic:
    return await _call(service, service.cancel, principal, job_id, body.reason if body else "")


@router.get("/jobs/{job_id}/logs", response_model=JobLogs)
def logs(job_id: str, principal: PrincipalDep, service: ServiceDep,
         since: Annotated[int, Query(ge=0, le=100_000_000)] = 0) -> JobLogs:
    return service.logs(principal, job_id, since)


@router.post("/plans", response_model=Plan)
def dry_run(body: PlanRequest, _principal: PrincipalDep, service: ServiceDep) -> Plan:
    """Plan a spec without submitting it."""
    return service.plan(body.spec)
