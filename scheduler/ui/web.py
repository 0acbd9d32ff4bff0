"""What every dashboard route shares: the signed-in caller, CSRF checks, rendering, redirects and
form/URL helpers. Routes live in scheduler.ui.{signin,jobs_pages,spend_pages,plan_pages,admin_pages};
scheduler.ui.app assembles them.

The service, its dashboard reads, the session signer and the templates are the app's state
(``request.app.state``), set once by ``create_ui``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from errors import AuthError, Forbidden, GpuplanError, InvalidInput
from scheduler.dashboard_reads import DashboardReads
from scheduler.inputs import TextRule, check_utf8_url, printable
from scheduler.service import Principal, SchedulerService
from scheduler.ui.session import COOKIE, LIFETIME_S, Session, Signer, csrf_ok

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

    @property
    def service(self) -> SchedulerService:
        return service_of(self.request)

    @property
    def reads(self) -> DashboardReads:
        return reads_of(self.request)


def service_of(request: Request) -> SchedulerService:
    service: SchedulerService = request.app.state.service
    return service


def reads_of(request: Request) -> DashboardReads:
    """The reads the dashboard needs besides the API's (scheduler.dashboard_reads), as a caller."""
    reads: DashboardReads = request.app.state.reads
    return reads


async def utf8_url(request: Request) -> None:
    """Every dashboard request: a URL whose percent-escapes are not UTF-8 is refused, as by the API."""
    check_utf8_url(request.scope.get("raw_path") or b"", request.scope.get("query_string") or b"")


def session_of(request: Request) -> Session | None:
    signer: Signer = request.app.state.signer
    return signer.load(request.cookies.get(COOKIE))


async def ctx_dep(request: Request) -> Ctx:
    """The signed-in caller: the session's token digest, checked by the service on every request."""
    session = session_of(request)
    if session is None or session.digest is None:
        raise SignInNeeded
    try:
        principal = service_of(request).authenticate_hash(session.digest)
    except AuthError:  # revoked (within the token-cache window) or deleted: sign in again
        raise SignInNeeded from None
    return Ctx(request, session, principal)


CtxDep = Annotated[Ctx, Depends(ctx_dep)]


def set_cookie(request: Request, response: Response, session: Session) -> None:
    signer: Signer = request.app.state.signer
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


def templates_of(request: Request) -> Jinja2Templates:
    templates: Jinja2Templates = request.app.state.templates
    return templates


def render(ctx: Ctx | None, name: str, status: int = 200, **values: Any) -> HTMLResponse:
    request = ctx.request if ctx else values.pop("request")
    csrf = ctx.session.csrf if ctx else values.pop("csrf", "")
    base = {"principal": ctx.principal if ctx else None, "csrf": csrf, "path": request.url.path}
    return templates_of(request).TemplateResponse(request, name, base | values, status_code=status)


def acting(ctx: Ctx, team: str | None) -> tuple[Principal | None, list[str]]:
    """(the team principal a page shows, the team names an admin may pick from)."""
    if not ctx.is_admin:
        return ctx.principal, []
    service = ctx.service
    names = ctx.reads.team_names(ctx.principal)
    if team:
        return service.team_principal(team), names
    return (service.team_principal(names[0]) if names else None), names


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303)


def local(url: str) -> str:
    """A redirect target inside the dashboard only (no open redirect to another site)."""
    return url if url.startswith("/ui/") and not url.startswith("//") and "\\" not in url else "/ui/jobs"


def page_url(path: str, query: dict[str, str], page: int | None = None) -> str:
    q = dict(query)
    if page is not None and page > 1:
        q["page"] = str(page)
    return path + ("?" + urlencode(q) if q else "")


def said(exc: GpuplanError) -> str:
    body = exc.to_dict()
    hint = body.get("hint")
    return str(body["message"]) + (f" ({hint})" if hint else "")


def pydantic_message(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"spec: {str(first.get('msg', 'invalid')).removeprefix('Value error, ')}"
    return str(exc)


def number(text: str, kind: type[float] | type[int], what: str) -> float | int | None:
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


def team_body(model: Any, **fields: Any) -> Any:
    try:
        return model.model_validate(fields)
    except ValueError as exc:
        raise InvalidInput(pydantic_message(exc).replace("spec: ", ""), path="team") from None
