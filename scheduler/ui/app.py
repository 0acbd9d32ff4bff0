"""The dashboard: a FastAPI sub-application mounted at /ui by the API's app factory.

Routes are thin: check the session (and the CSRF field on a POST), call the service (or
scheduler.ui.queries for the few reads it lacks), shape with scheduler.ui.views, render a template.
The service decides who may see what: a team's session acts as that team; the admin's picks a
team (``?team=``) through ``SchedulerService.team_principal``.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from catalog.errors import AuthError, Forbidden, GpuplanError, InvalidInput, NoFeasiblePlan
from catalog.loader import Catalog
from planner.search import summarize_rejections
from scheduler import accuracy, ledger
from scheduler.api.deps import utf8_url
from scheduler.inputs import JobId, Label, Name, Reason, RowId, TextRule, Word, printable
from scheduler.models import JobCreate, TeamCreate, TeamUpdate
from scheduler.service import ADMIN, Principal, SchedulerService, hash_token
from scheduler.states import JobState
from scheduler.ui import queries, views
from scheduler.ui.session import COOKIE, LIFETIME_S, Session, Signer, csrf_ok, new_session

log = logging.getLogger("gpuplan.ui")

PAGE_SIZE = 25
LOG_TAIL = 500
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
Token = Annotated[str, TextRule(200)]
Search = Annotated[str, TextRule(100)]


class SignInNeeded(Exception):
    """No valid session: pages redirect to the sign-in form."""


@dataclass(frozen=True)
class Ctx:
    request: Request
    session: Session
    principal: Principal

    @property
    def is_admin(self) -> bool:
        return self.principal.is_admin


async def ctx_dep(request: Request) -> Ctx:
    """The signed-in caller: the session's token digest, checked by the service on every request."""
    service: SchedulerService = request.app.state.service
    signer: Signer = request.app.state.signer
    session = signer.load(request.cookies.get(COOKIE))
    if session is None or session.digest is None:
        raise SignInNeeded
    try:
        principal = service.authenticate_hash(session.digest)
    except AuthError:  # revoked (within the token-cache window) or deleted: sign in again
        raise SignInNeeded from None
    return Ctx(request, session, principal)


CtxDep = Annotated[Ctx, Depends(ctx_dep)]


def _package_dir(name: str) -> str:
    return str(resources.files("scheduler.ui").joinpath(name))


def create_ui(service: SchedulerService, catalog: Catalog, secret: bytes | None = None) -> FastAPI:
    """The dashboard app; ``secret`` signs its session cookies (None: a random one, for one process)."""
    ui = FastAPI(title="gpuplan dashboard", docs_url=None, redoc_url=None, openapi_url=None,
                 dependencies=[Depends(utf8_url)])
    signer = Signer(secret or secrets.token_bytes(32))
    ui.state.service, ui.state.signer = service, signer
    templates = Jinja2Templates(directory=_package_dir("templates"))
    templates.env.globals.update(money=views.money, gib=views.gib, states=[s.value for s in JobState])
    ui.mount("/static", StaticFiles(directory=_package_dir("static")), name="static")

    # ------------------------------------------------------------ plumbing

    def session_of(request: Request) -> Session | None:
        return signer.load(request.cookies.get(COOKIE))

    def set_cookie(response: Response, session: Session) -> None:
        response.set_cookie(COOKIE, signer.dump(session), max_age=LIFETIME_S, path="/ui", secure=True,
                            httponly=True, samesite="strict")


    def check_csrf(ctx_or_session: Ctx | Session | None, request: Request, posted: str) -> None:
        session = ctx_or_session.session if isinstance(ctx_or_session, Ctx) else ctx_or_session
        origin = request.headers.get("origin")
        if origin and origin != "null" and origin != f"{request.url.scheme}://{request.url.netloc}":
            raise Forbidden(f"this form was posted from another site ({printable(origin, 80)})")
        if not csrf_ok(session, posted):
            raise Forbidden("the form's CSRF token is missing or does not match your session",
                            hint="reload the page and send the form again")

    def render(ctx: Ctx | None, name: str, status: int = 200, **values: Any) -> HTMLResponse:
        request = ctx.request if ctx else values.pop("request")
        csrf = ctx.session.csrf if ctx else values.pop("csrf", "")
        base = {"principal": ctx.principal if ctx else None, "csrf": csrf, "path": request.url.path}
        return templates.TemplateResponse(request, name, base | values, status_code=status)

    def acting(ctx: Ctx, team: str | None) -> tuple[Principal | None, list[str]]:
        """(the team principal a page shows, the team names an admin may pick from)."""
        if not ctx.is_admin:
            return ctx.principal, []
        names = queries.team_names(service.store)
        if team:
            return service.team_principal(team), names
        return (service.team_principal(names[0]) if names else None), names

    def redirect(url: str) -> RedirectResponse:
        return RedirectResponse(url, status_code=303)

    # ------------------------------------------------------------ errors and headers

    @ui.middleware("http")
    async def headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        if not request.url.path.startswith("/ui/static/"):
            response.headers["Cache-Control"] = "no-store"
        return response

    def error_page(request: Request, status: int, message: str, hint: str | None = None) -> Response:
        if request.url.path.endswith("/log"):  # the live tail's JSON
            return JSONResponse({"error": {"message": printable(message)}}, status_code=status)
        session = session_of(request)
        return templates.TemplateResponse(request, "error.html", {
            "principal": None, "csrf": session.csrf if session else "", "path": request.url.path,
            "status": status, "message": printable(message, 500), "hint": printable(hint or "", 300)},
            status_code=status)

    @ui.exception_handler(SignInNeeded)
    async def _sign_in(request: Request, _exc: SignInNeeded) -> Response:
        if request.method == "GET" and not request.url.path.endswith("/log"):
            return redirect("/ui/login?" + urlencode({"next": request.url.path}))
        return error_page(request, 401, "you are not signed in (or your token was revoked)", "sign in again")

    @ui.exception_handler(GpuplanError)
    async def _gpuplan(request: Request, exc: GpuplanError) -> Response:
        body = exc.to_dict()
        return error_page(request, exc.status_code, str(body["message"]), str(body.get("hint") or ""))

    @ui.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "body", "path", "form"))
        said = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return error_page(request, 422, f"{where or 'input'}: {said}")

    @ui.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        message = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_page(request, exc.status_code, message)

    @ui.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error in the dashboard")
        return error_page(request, 500, f"internal error ({type(exc).__name__}); see the server log")

    # ------------------------------------------------------------ sign-in

    @ui.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return redirect("/ui/jobs")

    @ui.get("/login")
    async def login_form(request: Request, next: Annotated[Search, Query()] = "/ui/jobs") -> Response:
        session = session_of(request)
        if session is None:
            session = new_session()
        response = render(None, "login.html", request=request, csrf=session.csrf, next=_local(next), error="")
        set_cookie(response, session)
        return response

    @ui.post("/login")
    async def login(request: Request, token: Annotated[Token, Form()] = "", csrf: Annotated[str, Form()] = "",
                    next: Annotated[Search, Form()] = "/ui/jobs") -> Response:
        session = session_of(request)
        check_csrf(session, request, csrf)
        assert session is not None
        try:
            principal = service.authenticate(token.strip() or None)
        except AuthError as exc:
            return render(None, "login.html", 401, request=request, csrf=session.csrf, next=_local(next),
                          error=exc.to_dict()["message"])
        del principal  # valid: the session keeps the token's digest and re-checks it on every request
        done = redirect(_local(next))
        set_cookie(done, new_session(hash_token(token.strip())))  # a new nonce: no session fixation
        return done

    @ui.post("/logout")
    async def logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
        check_csrf(session_of(request), request, csrf)
        response = redirect("/ui/login")
        set_cookie(response, new_session())
        return response

    # ------------------------------------------------------------ jobs

    @ui.get("/jobs")
    def jobs_page(ctx: CtxDep, state: Annotated[Word, Query()] = "", q: Annotated[Search, Query()] = "",
                  page: Annotated[int, Query(ge=1, le=100_000)] = 1,
                  team: Annotated[Name, Query()] = "") -> Response:
        who, teams = acting(ctx, team)
        rows: list[Any] = []
        if who is not None:
            offset = (page - 1) * PAGE_SIZE
            if q.strip():
                if state and state not in {s.value for s in JobState}:
                    service.list_jobs(who, state=state, limit=1)  # the service's message for a bad state
                rows = queries.search_jobs(service.store, _tid(who), text=q.strip(), state=state or None,
                                           limit=PAGE_SIZE + 1, offset=offset)
            else:
                rows = service.list_jobs(who, state=state or None, limit=PAGE_SIZE + 1, offset=offset)
        more = len(rows) > PAGE_SIZE
        query = {k: v for k, v in (("state", state), ("q", q), ("team", team)) if v}
        return render(ctx, "jobs.html", jobs=rows[:PAGE_SIZE], state=state, q=q, page=page, more=more,
                      team=who.team_name if who else "", teams=teams,
                      prev_url=_url("/ui/jobs", query, page - 1) if page > 1 else "",
                      next_url=_url("/ui/jobs", query, page + 1) if more else "")

    @ui.get("/jobs/{job_id}")
    def job_page(ctx: CtxDep, job_id: JobId, team: Annotated[Name, Query()] = "") -> Response:
        who, teams = acting(ctx, team)
        if who is None:
            raise InvalidInput("there are no teams yet, so no jobs", hint="create a team on the Admin page")
        detail = service.status(who, job_id)
        logs = service.logs(who, job_id, 0)
        chosen, alternatives = views.stored_candidates(detail.plan)
        rows = accuracy.accuracy_rows(accuracy.team_records([detail]))
        lines = logs.lines[-LOG_TAIL:]
        return render(ctx, "job.html", job=detail, team=who.team_name, teams=teams,
                      chosen=views.chosen_line(chosen) if chosen else "",
                      alternatives=views.plan_rows(alternatives, chosen), accuracy=rows,
                      log_lines=lines, log_next=logs.next, log_complete=logs.complete,
                      log_cut=len(logs.lines) - len(lines), terminal=JobState(detail.state).terminal)

    @ui.get("/jobs/{job_id}/log")
    def job_log(ctx: CtxDep, job_id: JobId, since: Annotated[int, Query(ge=0, le=100_000_000)] = 0,
                team: Annotated[Name, Query()] = "") -> JSONResponse:
        who, _ = acting(ctx, team)
        if who is None:
            raise InvalidInput("there are no teams yet")
        logs = service.logs(who, job_id, since)
        return JSONResponse({"lines": logs.lines, "next": logs.next, "state": logs.state, "complete": logs.complete})

    @ui.get("/jobs/{job_id}/cancel")
    def cancel_confirm(ctx: CtxDep, job_id: JobId, team: Annotated[Name, Query()] = "") -> Response:
        who, _ = acting(ctx, team)
        if who is None:
            raise InvalidInput("there are no teams yet")
        detail = service.status(who, job_id)
        return render(ctx, "confirm.html", title=f"Cancel job {detail.id}?",
                      text=f"Cancel job {detail.name} ({detail.id}, {detail.state})? A running attempt is stopped "
                      f"and charged up to now. This cannot be undone.",
                      action=_url(f"/ui/jobs/{detail.id}/cancel", {"team": team} if team else {}),
                      back=_url(f"/ui/jobs/{detail.id}", {"team": team} if team else {}),
                      button="Cancel the job", reason=True)

    @ui.post("/jobs/{job_id}/cancel")
    def cancel(ctx: CtxDep, job_id: JobId, csrf: Annotated[str, Form()] = "",
               reason: Annotated[Reason, Form()] = "", team: Annotated[Name, Query()] = "") -> Response:
        check_csrf(ctx, ctx.request, csrf)
        who, _ = acting(ctx, team)
        if who is None:
            raise InvalidInput("there are no teams yet")
        service.cancel(who, job_id, reason.strip())
        return redirect(_url(f"/ui/jobs/{job_id}", {"team": team} if team else {}))

    # ------------------------------------------------------------ spend

    @ui.get("/spend")
    def spend_page(ctx: CtxDep, since: Annotated[Word, Query()] = "30d", period: Annotated[Word, Query()] = "day",
                   team: Annotated[Name, Query()] = "") -> Response:
        if period not in ("day", "week"):
            raise InvalidInput(f"period must be day or week, not {printable(period, 20)!r}", path="period")
        now = service.clock()
        start = ledger.since_start(since, now)
        teams: list[str] = []
        if ctx.is_admin:
            teams = queries.team_names(service.store)
            report = service.spend_report(ADMIN, since=start, team=team or None, top=views.TOP_JOBS)
        else:
            report = service.spend_report(ctx.principal, since=start, top=views.TOP_JOBS)
        team_id = None
        if report.team is not None:
            team_id = _tid(service.team_principal(report.team) if ctx.is_admin else ctx.principal)
        # The chart: the window's whole UTC days (the totals above are to the minute); the
        # burn-down: every day since the team's first spend, as per-day totals.
        daily = queries.spend_by_day(service.store, team_id, start, now)
        series = views.spend_series(daily, period, start.date(), now.date(),
                                    f"{'team ' + report.team if report.team else 'every team'}: USD per {period} "
                                    "by GPU type and market")
        burn = None
        if report.team is not None and report.budget_usd is not None and report.remaining_usd is not None:
            assert team_id is not None
            burn = views.burn_down(queries.spend_per_day(service.store, team_id, now), report.budget_usd,
                                   report.remaining_usd, now.date(), report.team)
        return render(ctx, "spend.html", report=report, series=series, plot=Markup(series.plot),
                      burn=burn, burn_plot=Markup(burn.plot) if burn else "", top=views.top_jobs(report),
                      since=since, period=period, team=report.team or "", spend_teams=teams,
                      markets=sorted(report.by_market.items()))

    # ------------------------------------------------------------ plan

    @ui.get("/plan")
    def plan_form(ctx: CtxDep) -> Response:
        return render(ctx, "plan.html", spec="", result=None)

    @ui.post("/plan")
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
        try:
            data = views.parse_spec_text(text)
            body = JobCreate.model_validate({"spec": data})  # the API's rules for a spec document
            job_spec = service.parse_spec(body.spec)
        except InvalidInput as exc:
            return render(ctx, "plan.html", 422, spec=text, result=None, error=_said(exc))
        except ValueError as exc:  # pydantic: the JsonObject rules
            return render(ctx, "plan.html", 422, spec=text, result=None, error=_pydantic(exc))
        try:
            result = service.plan(job_spec)
        except NoFeasiblePlan as exc:
            result = service.planner(job_spec)  # no plan: show the rejections, as `gpuplan plan` does
            error = _said(exc)
        else:
            error = ""
        groups = summarize_rejections(result.rejections)
        return render(ctx, "plan.html", spec=text, result=result, error=error,
                      rows=views.plan_rows(result.candidates[:20], result.chosen),
                      chosen=views.chosen_line(result.chosen), groups=groups,
                      plot=Markup(views.pareto_plot(result)) if result.candidates else "")

    @ui.post("/plan/submit")
    def submit(ctx: CtxDep, csrf: Annotated[str, Form()] = "",
               spec: Annotated[str, Form(max_length=views.MAX_SPEC_CHARS)] = "",
               priority: Annotated[int, Form(ge=-1000, le=1000)] = 0) -> Response:
        check_csrf(ctx, ctx.request, csrf)
        if ctx.is_admin:
            raise Forbidden("jobs belong to teams; sign in with a team token to submit")
        try:
            body = JobCreate.model_validate({"spec": views.parse_spec_text(spec), "priority": priority})
        except InvalidInput:
            raise
        except ValueError as exc:
            raise InvalidInput(_pydantic(exc), path="spec") from None
        job = service.submit(ctx.principal, body)
        return redirect(f"/ui/jobs/{job.id}")

    # ------------------------------------------------------------ accuracy

    @ui.get("/accuracy")
    def accuracy_page(ctx: CtxDep, team: Annotated[Name, Query()] = "") -> Response:
        who, teams = acting(ctx, team)
        rows = accuracy.accuracy_rows(queries.accuracy_records(service.store, _tid(who))) if who else []
        gib = 1 / (1 << 30)
        mem = [(r["predicted_peak_allocated_bytes"] * gib, r["measured_peak_allocated_bytes"] * gib, r["job"])
               for r in rows if r["error_peak_allocated_bytes"] is not None]
        tps = [(r["predicted_tokens_per_s"], r["measured_tokens_per_s"], r["job"]) for r in rows
               if r["error_tokens_per_s"] is not None]
        from scheduler.ui import svg

        return render(ctx, "accuracy.html", rows=rows, summary=accuracy.summarize(rows),
                      team=who.team_name if who else "", teams=teams,
                      mem_plot=Markup(svg.predicted_measured_svg(mem, "peak allocated memory per GPU", "GiB")),
                      tps_plot=Markup(svg.predicted_measured_svg(tps, "throughput", "tokens/s")))

    # ------------------------------------------------------------ admin

    @ui.get("/admin")
    def admin_page(ctx: CtxDep) -> Response:
        teams = service.list_teams(ctx.principal)  # Forbidden for a team
        tokens = {t.name: service.list_tokens(ctx.principal, t.name) for t in teams}
        return render(ctx, "admin.html", team_rows=teams, tokens=tokens, created=None)

    @ui.post("/admin/teams")
    def create_team(ctx: CtxDep, csrf: Annotated[str, Form()] = "", name: Annotated[Name, Form()] = "",
                    budget: Annotated[Word, Form()] = "", quota: Annotated[Word, Form()] = "") -> Response:
        check_csrf(ctx, ctx.request, csrf)
        body = _team_body(TeamCreate, name=name, budget_usd=_number(budget, float, "budget"),
                          gpu_quota=_number(quota, int, "quota"))
        service.create_team(ctx.principal, body)
        return redirect("/ui/admin")

    @ui.post("/admin/teams/{name}")
    def update_team(ctx: CtxDep, name: Name, csrf: Annotated[str, Form()] = "",
                    budget: Annotated[Word, Form()] = "", quota: Annotated[Word, Form()] = "") -> Response:
        check_csrf(ctx, ctx.request, csrf)
        b, q = _number(budget, float, "budget"), _number(quota, int, "quota")
        body = _team_body(TeamUpdate, budget_usd=b, gpu_quota=q, clear_budget=b is None, clear_quota=q is None)
        service.update_team(ctx.principal, name, body)
        return redirect("/ui/admin")

    @ui.post("/admin/teams/{name}/tokens")
    def create_token(ctx: CtxDep, name: Name, csrf: Annotated[str, Form()] = "",
                     label: Annotated[Label, Form()] = "default") -> Response:
        check_csrf(ctx, ctx.request, csrf)
        created = service.create_token(ctx.principal, name, label)
        teams = service.list_teams(ctx.principal)
        tokens = {t.name: service.list_tokens(ctx.principal, t.name) for t in teams}
        return render(ctx, "admin.html", 201, team_rows=teams, tokens=tokens, created=created, created_team=name)

    @ui.get("/admin/teams/{name}/tokens/{token_id}/revoke")
    def revoke_confirm(ctx: CtxDep, name: Name, token_id: RowId) -> Response:
        token = next((t for t in service.list_tokens(ctx.principal, name) if t.id == token_id), None)
        if token is None:
            raise InvalidInput(f"team {name} has no token {token_id}")
        return render(ctx, "confirm.html", title=f"Revoke token {token_id} of team {name}?",
                      text=f"Revoke token {token.id} ({token.name}) of team {name}? Clients and dashboard sessions "
                      "using it stop working within seconds. This cannot be undone.",
                      action=f"/ui/admin/teams/{name}/tokens/{token_id}/revoke", back="/ui/admin",
                      button="Revoke the token", reason=False)

    @ui.post("/admin/teams/{name}/tokens/{token_id}/revoke")
    def revoke(ctx: CtxDep, name: Name, token_id: RowId,
               csrf: Annotated[str, Form()] = "") -> Response:
        check_csrf(ctx, ctx.request, csrf)
        service.revoke_token(ctx.principal, name, token_id)
        return redirect("/ui/admin")

    return ui


# ---------------------------------------------------------------- helpers


def _local(url: str) -> str:
    """A redirect target inside the dashboard only (no open redirect to another site)."""
    return url if url.startswith("/ui/") and not url.startswith("//") and "\\" not in url else "/ui/jobs"


def _url(path: str, query: dict[str, str], page: int | None = None) -> str:
    q = dict(query)
    if page is not None and page > 1:
        q["page"] = str(page)
    return path + ("?" + urlencode(q) if q else "")


def _tid(principal: Principal) -> int:
    assert principal.team_id is not None  # acting() only returns team principals
    return principal.team_id


def _said(exc: GpuplanError) -> str:
    body = exc.to_dict()
    hint = body.get("hint")
    return str(body["message"]) + (f" ({hint})" if hint else "")


def _pydantic(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"spec: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}"
    return str(exc)


def _number(text: str, kind: type[float] | type[int], what: str) -> float | int | None:
    """A form's number, or None when left empty (no limit)."""
    text = text.strip()
    if not text or text.lower() == "none":
        return None
    try:
        value = kind(text)
    except ValueError:
        raise InvalidInput(f"{what} must be a number or empty (no limit), not {printable(text, 30)!r}",
                           path=what) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidInput(f"{what} must be a finite number", path=what)
    return value


def _team_body(model: Any, **fields: Any) -> Any:
    try:
        return model.model_validate(fields)
    except ValueError as exc:
        raise InvalidInput(_pydantic(exc).replace("spec: ", ""), path="team") from None

