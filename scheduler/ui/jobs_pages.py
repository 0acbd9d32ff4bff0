"""Jobs: the list (filter, search, pages), one job (plan, attempts, log tail, accuracy), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Query
from fastapi.responses import JSONResponse, Response

from errors import InvalidInput
from scheduler.inputs import JobId, Name, Reason, Word
from scheduler.loop import accuracy
from scheduler.store.states import JobState
from scheduler.ui import views
from scheduler.ui.web import CtxDep, Search, acting, check_csrf, page_url, redirect, render

PAGE_SIZE = 25
LOG_TAIL = 500

router = APIRouter()


@router.get("/jobs")
def jobs_page(ctx: CtxDep, state: Annotated[Word, Query()] = "", q: Annotated[Search, Query()] = "",
              page: Annotated[int, Query(ge=1, le=100_000)] = 1,
              team: Annotated[Name, Query()] = "") -> Response:
    service = ctx.service
    who, teams = acting(ctx, team)
    rows: list[Any] = []
    if who is not None:
        offset = (page - 1) * PAGE_SIZE
        if q.strip():
            if state and state not in {s.value for s in JobState}:
                service.list_jobs(who, state=state, limit=1)  # the service's message for a bad state
            rows = ctx.reads.search_jobs(who, text=q.strip(), state=state or None, limit=PAGE_SIZE + 1,
                                         offset=offset)
        else:
            rows = service.list_jobs(who, state=state or None, limit=PAGE_SIZE + 1, offset=offset)
    more = len(rows) > PAGE_SIZE
    query = {k: v for k, v in (("state", state), ("q", q), ("team", team)) if v}
    return render(ctx, "jobs.html", jobs=rows[:PAGE_SIZE], state=state, q=q, page=page, more=more,
                  team=who.team_name if who else "", teams=teams,
                  prev_url=page_url("/ui/jobs", query, page - 1) if page > 1 else "",
                  next_url=page_url("/ui/jobs", query, page + 1) if more else "")


@router.get("/jobs/{job_id}")
def job_page(ctx: CtxDep, job_id: JobId, team: Annotated[Name, Query()] = "") -> Response:
    service = ctx.service
    who, teams = acting(ctx, team)
    if who is None:
        raise InvalidInput("there are no teams yet, so no jobs", hint="create a team on the Admin page")
    detail = service.status(who, job_id)
    logs = service.logs(who, job_id, 0)
    planned = detail.planned_run()
    rows = accuracy.accuracy_rows(accuracy.team_records([detail]))
    lines = logs.lines[-LOG_TAIL:]
    return render(ctx, "job.html", job=detail, team=who.team_name, teams=teams,
                  chosen=views.chosen_line(planned.chosen),
                  alternatives=views.plan_rows(planned.alternatives, planned.chosen), accuracy=rows,
                  log_lines=lines, log_next=logs.next, log_complete=logs.complete,
                  log_cut=len(logs.lines) - len(lines), terminal=JobState(detail.state).terminal,
                  terminal_states=[s.value for s in JobState if s.terminal])


@router.get("/jobs/{job_id}/log")
def job_log(ctx: CtxDep, job_id: JobId, since: Annotated[int, Query(ge=0, le=100_000_000)] = 0,
            team: Annotated[Name, Query()] = "") -> JSONResponse:
    who, _ = acting(ctx, team)
    if who is None:
        raise InvalidInput("there are no teams yet")
    logs = ctx.service.logs(who, job_id, since)
    return JSONResponse({"lines": logs.lines, "next": logs.next, "state": logs.state, "complete": logs.complete})


@router.get("/jobs/{job_id}/cancel")
def cancel_confirm(ctx: CtxDep, job_id: JobId, team: Annotated[Name, Query()] = "") -> Response:
    who, _ = acting(ctx, team)
    if who is None:
        raise InvalidInput("there are no teams yet")
    detail = ctx.service.status(who, job_id)
    back = page_url(f"/ui/jobs/{detail.id}", {"team": team} if team else {})
    if JobState(detail.state).terminal:  # a stale page's link: say so, offer no button that can only fail
        return render(ctx, "confirm.html", title=f"Job {detail.id} has ended",
                      text=f"Job {detail.name} ({detail.id}) is already {detail.state}: there is nothing to cancel.",
                      action="", back=back, button="", reason=False)
    return render(ctx, "confirm.html", title=f"Cancel job {detail.id}?",
                  text=f"Cancel job {detail.name} ({detail.id}, {detail.state})? A running attempt is stopped "
                  f"and charged up to now. This cannot be undone.",
                  action=page_url(f"/ui/jobs/{detail.id}/cancel", {"team": team} if team else {}),
                  back=back, button="Cancel the job", reason=True)


@router.post("/jobs/{job_id}/cancel")
def cancel(ctx: CtxDep, job_id: JobId, csrf: Annotated[str, Form()] = "",
           reason: Annotated[Reason, Form()] = "", team: Annotated[Name, Query()] = "") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    who, _ = acting(ctx, team)
    if who is None:
        raise InvalidInput("there are no teams yet")
    ctx.service.cancel(who, job_id, reason.strip())
    return redirect(page_url(f"/ui/jobs/{job_id}", {"team": team} if team else {}))
