"""Plan: paste or upload a JobSpec, see what `gpuplan plan` shows (ranked table, rejections by
reason, the cost-vs-time Pareto plot), and submit it."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from markupsafe import Markup

from errors import Forbidden, InvalidInput, NoFeasiblePlan
from planner.search import summarize_rejections
from planner.types import Plan
from scheduler.store.models import JobCreate
from scheduler.ui import views
from scheduler.ui.web import Ctx, CtxDep, check_csrf, pydantic_message, redirect, render, said

router = APIRouter()


@router.get("/plan")
def plan_form(ctx: CtxDep) -> Response:
    return render(ctx, "plan.html", spec="", result=None)


@router.post("/plan")
async def plan(ctx: CtxDep, csrf: Annotated[str, Form()] = "",
               spec: Annotated[str, Form(max_length=views.MAX_SPEC_CHARS)] = "",
               upload: Annotated[UploadFile | None, File()] = None) -> Response:
    check_csrf(ctx, ctx.request, csrf)
    if upload is not None and upload.filename:
        raw = await upload.read(views.MAX_SPEC_CHARS * 4 + 1)
        if len(raw) > views.MAX_SPEC_CHARS * 4:
            raise InvalidInput("the uploaded spec is too large", path="upload")
        try:
            spec = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"the uploaded spec is not UTF-8 (byte 0x{raw[exc.start]:02X} at "
                               f"{exc.start})", path="upload") from None
    return await run_in_threadpool(_plan_page, ctx, spec)


def _plan_page(ctx: Ctx, text: str) -> Response:
    """The plan of a pasted spec; any refusal (the spec's schema, or a name the catalog does not
    know) is shown above the spec, which stays in its box to be fixed."""
    try:
        data = views.parse_spec_text(text)
        body = JobCreate.model_validate({"spec": data})  # the API's rules for a spec document
        result, error = _planned(ctx, body.spec)
    except InvalidInput as exc:
        return render(ctx, "plan.html", 422, spec=text, result=None, error=said(exc))
    except ValueError as exc:  # pydantic: the JsonObject rules
        return render(ctx, "plan.html", 422, spec=text, result=None, error=pydantic_message(exc))
    groups = summarize_rejections(result.rejections)
    # A key made with the page: posting its form twice (a double click, a resent form) submits one job.
    return render(ctx, "plan.html", spec=text, result=result, error=error, idempotency_key=secrets.token_urlsafe(18),
                  rows=views.plan_rows(result.candidates[:20], result.chosen),
                  chosen=views.chosen_line(result.chosen), groups=groups,
                  plot=Markup(views.pareto_plot(result)) if result.candidates else "")


def _planned(ctx: Ctx, spec: dict[str, object]) -> tuple[Plan, str]:
    """(the plan, why nothing can be submitted or ""); InvalidInput for a spec the catalog refuses."""
    service = ctx.service
    job_spec = service.parse_spec(spec)
    try:
        return service.plan(job_spec), ""
    except NoFeasiblePlan as exc:
        return service.planner(job_spec), said(exc)  # no plan: show the rejections, as `gpuplan plan` does


@router.post("/plan/submit")
def submit(ctx: CtxDep, csrf: Annotated[str, Form()] = "",
           spec: Annotated[str, Form(max_length=views.MAX_SPEC_CHARS)] = "",
           priority: Annotated[int, Form(ge=-1000, le=1000)] = 0,
           idempotency_key: Annotated[str, Form(max_length=200)] = "") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    if ctx.is_admin:
        raise Forbidden("jobs belong to teams; sign in with a team token to submit")
    try:
        body = JobCreate.model_validate({"spec": views.parse_spec_text(spec), "priority": priority,
                                        "idempotency_key": idempotency_key or None})
    except InvalidInput:
        raise
    except ValueError as exc:
        raise InvalidInput(pydantic_message(exc), path="spec") from None
    job = ctx.service.submit(ctx.principal, body)
    return redirect(f"/ui/jobs/{job.id}")
