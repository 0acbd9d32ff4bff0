"""Sign-in and sign-out: the token is checked once, then only its digest lives in the session cookie."""

from __future__ import annotations

import ipaddress
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import RedirectResponse, Response

from errors import AuthError
from scheduler.service import hash_token
from scheduler.ui.session import new_session
from scheduler.ui.web import Search, Token, check_csrf, local, redirect, render, service_of, session_of, set_cookie

router = APIRouter()

NEEDS_HTTPS = ("Sign-in needs HTTPS at this address: the session cookie is Secure, and browsers keep it over "
               "plain HTTP only on 127.0.0.1 or localhost. Serve the dashboard over HTTPS (a TLS proxy in front), "
               "or reach it through a tunnel: ssh -L 8000:127.0.0.1:8000 HOST, then open http://127.0.0.1:8000/ui")


def secure_here(request: Request) -> bool:
    """Whether a browser keeps the Secure session cookie for this address: HTTPS, or loopback."""
    host = (request.url.hostname or "").lower().strip("[]")
    if request.url.scheme == "https" or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost
        return False


@router.get("/", include_in_schema=False)
async def home() -> RedirectResponse:
    return redirect("/ui/jobs")


@router.get("/login")
async def login_form(request: Request, next: Annotated[Search, Query()] = "/ui/jobs") -> Response:
    session = session_of(request)
    if session is None:
        session = new_session()
    response = render(None, "login.html", request=request, csrf=session.csrf, next=local(next), error="",
                      needs_https=NEEDS_HTTPS)
    set_cookie(request, response, session)
    return response


@router.post("/login")
async def login(request: Request, token: Annotated[Token, Form()] = "", csrf: Annotated[str, Form()] = "",
                next: Annotated[Search, Form()] = "/ui/jobs") -> Response:
    session = session_of(request)
    if session is None and not secure_here(request):
        return render(None, "login.html", 403, request=request, csrf="", next=local(next), error=NEEDS_HTTPS)
    check_csrf(session, request, csrf)
    assert session is not None
    try:
        principal = service_of(request).authenticate(token.strip() or None)
    except AuthError as exc:
        return render(None, "login.html", 401, request=request, csrf=session.csrf, next=local(next),
                      error=exc.to_dict()["message"])
    del principal  # valid: the session keeps the token's digest and re-checks it on every request
    done = redirect(local(next))
    set_cookie(request, done, new_session(hash_token(token.strip())))  # a new nonce: no session fixation
    return done


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form()] = "") -> Response:
    check_csrf(session_of(request), request, csrf)
    response = redirect("/ui/login")
    set_cookie(request, response, new_session())
    return response
