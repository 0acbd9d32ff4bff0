"""The API's hot-path reads as prebuilt Core statements (compiled once per service, bound per call).

Table columns, not ORM attributes: an ORM-annotated column would route the whole statement through
the ORM compile/execute path on every call.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, bindparam, func
from sqlalchemy import select as sa_select

from scheduler.store.models import Attempt, AttemptPublic, Event, EventPublic, Job, Spend


def _spent(table: Any) -> Any:
    spend = Spend.__table__  # type: ignore[attr-defined]
    return (sa_select(func.coalesce(func.sum(spend.c.usd), 0.0)).where(spend.c.job_id == table.c.id)
            .correlate(table).scalar_subquery())


def list_statement(*, by_state: bool) -> Any:
    """A team's jobs, newest first (params team_id, [state], limit, offset): no spec/plan JSON, spend summed."""
    table = Job.__table__  # type: ignore[attr-defined]
    columns = [c for c in table.c if c.name not in ("spec", "plan")]
    stmt = sa_select(*columns, _spent(table).label("spent_usd")).where(table.c.team_id == bindparam("team_id"))
    if by_state:
        stmt = stmt.where(table.c.state == bindparam("state"))
    return (stmt.order_by(table.c.created_at.desc(), table.c.id)
            .limit(bindparam("limit", type_=Integer)).offset(bindparam("offset", type_=Integer)))


def status_statements() -> tuple[Any, Any, Any]:
    """Job detail (params job_id, team_id): the job with its spend, its attempts, its events."""
    table = Job.__table__  # type: ignore[attr-defined]
    job = sa_select(*table.c, _spent(table).label("spent_usd")).where(table.c.id == bindparam("job_id"),
                                                                      table.c.team_id == bindparam("team_id"))
    attempt = Attempt.__table__  # type: ignore[attr-defined]
    attempts = (sa_select(*(attempt.c[name] for name in AttemptPublic.model_fields))
                .where(attempt.c.job_id == bindparam("job_id")).order_by(attempt.c.number))
    event = Event.__table__  # type: ignore[attr-defined]
    events = (sa_select(*(event.c[name] for name in EventPublic.model_fields))
              .where(event.c.job_id == bindparam("job_id")).order_by(event.c.id))
    return job, attempts, events


def existing_job_statement() -> Any:
    """(id, spec_hash) of the team's job with an idempotency key (params team_id, key)."""
    job = Job.__table__  # type: ignore[attr-defined]
    return sa_select(job.c.id, job.c.spec_hash).where(job.c.team_id == bindparam("team_id"),
                                                      job.c.idempotency_key == bindparam("key"))
