"""The dashboard: a FastAPI sub-application mounted at /ui by the API's app factory.

Routes are thin: check the session (and the CSRF field on a POST), call the service (or its
scheduler.dashboard_reads for the few reads the API lacks), shape with scheduler.ui.views, render a template.
The service decides who may see what: a team's session acts as that team; the admin's picks a
team (``?team=``) through ``SchedulerService.team_principal``.

This module assembles the app (state, headers, error pages); the routes are per page area:
scheduler.ui.signin, jobs_pages, spend_pages (Spend, Accuracy), plan_pages, admin_pages, and what
they share is scheduler.ui.web.
"""

from __future__ import annotations

import logging
import secrets
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from catalog.loader import Catalog
from errors import GpuplanError
from scheduler.dashboard_reads import DashboardReads
from scheduler.inputs import printable
from scheduler.service import Principal, SchedulerService
from scheduler.store.states import JobState
from scheduler.ui import admin_pages, jobs_pages, plan_pages, signin, spend_pages, views
from scheduler.ui.session import Session, Signer
from scheduler.ui.web import SignInNeeded, redirect, service_of, session_of, utf8_url

log = logging.getLogger("gpuplan.ui")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def _package_dir(name: str) -> str:
    return str(resources.files("scheduler.ui").joinpath(name))


def create_ui(service: SchedulerService, catalog: Catalog, secret: bytes | None = None) -> FastAPI:
    """The dashboard app; ``secret`` signs its session cookies (None: a random one, for one process)."""
    del catalog  # the service plans with it; kept in the signature the API's app factory calls
    ui = FastAPI(title="gpuplan dashboard", docs_url=None, redoc_url=None, openapi_url=None,
                 dependencies=[Depends(utf8_url)])
    templates = Jinja2Templates(directory=_package_dir("templates"))
    templates.env.globals.update(money=views.money, gib=views.gib, states=[s.value for s in JobState])
    ui.state.service, ui.state.templates = service, templates
    ui.state.reads = DashboardReads(service.store)  # the reads the API lacks, under the service's rules
    ui.state.signer = Signer(secret or secrets.token_bytes(32))
    ui.mount("/static", StaticFiles(directory=_package_dir("static")), name="static")
    ui.middleware("http")(_headers)
    _error_pages(ui, templates)
    for area in (signin, jobs_pages, spend_pages, plan_pages, admin_pages):
        ui.include_router(area.router)
    return ui


async def _headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.url.path.startswith("/ui/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response


def _signed_in(request: Request, session: Session | None) -> Principal | None:
    """Who an error page is for, so it keeps the navigation and Sign out (None: not signed in)."""
    if session is None or session.digest is None:
        return None
    try:
        return service_of(request).authenticate_hash(session.digest)
    except GpuplanError:  # revoked, or the store is what failed: the page offers Sign in instead
        return None
    except Exception:  # an error page must render whatever failed before it
        log.exception("could not tell who an error page is for")
        return None


def _error_pages(ui: FastAPI, templates: Jinja2Templates) -> None:
    """Every error as the dashboard's error page (the live tail's request: as JSON)."""

    def error_page(request: Request, status: int, message: str, hint: str | None = None) -> Response:
        if request.url.path.endswith("/log"):  # the live tail's JSON
            return JSONResponse({"error": {"message": printable(message)}}, status_code=status)
        session = session_of(request)
        return templates.TemplateResponse(request, "error.html", {
            "principal": _signed_in(request, session), "csrf": session.csrf if session else "",
            "path": request.url.path,
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
