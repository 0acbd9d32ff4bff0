"""The one error format: ``{"error": {"code", "message", "path"?}}`` for every failure."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from errors import GpuplanError
from scheduler.inputs import printable

log = logging.getLogger("gpuplan.api")

_HTTP_CODES = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
               406: "not_acceptable", 413: "too_large", 415: "unsupported_media_type"}


class ErrorBody(BaseModel):
    code: str
    message: str
    path: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text}
    for status, text in ((401, "missing, wrong or revoked token"), (403, "token may not do this"),
                         (404, "not found (or another team's)"), (409, "conflict"), (402, "budget or quota"),
                         (422, "invalid input"))
}


def _error(status: int, code: str, message: str, path: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    # Messages may quote an input: escape what a client's terminal or UTF-8 encoder would choke on.
    body: dict[str, Any] = {"code": code, "message": printable(message)}
    if path:
        body["path"] = printable(path)
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [printable(str(p), 40) for p in loc if p not in ("body", "query", "path", "header", "[key]")]
    return ".".join(parts) or ".".join(str(p) for p in loc)


def _message(error: Mapping[str, Any]) -> str:
    """Pydantic's message, said plainly where it is not (a lone surrogate, a body that is not JSON)."""
    kind = error.get("type")
    if kind == "string_unicode":
        return "contains a lone surrogate (U+D800 to U+DFFF), which is not Unicode; send UTF-8 text"
    if kind == "json_invalid":
        where = error.get("loc", ("body", "?"))[-1]
        return f"not valid JSON ({error.get('ctx', {}).get('error', 'syntax error')} at character {where})"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")  # our validators' own words


def _unparsable_body(cause: BaseException) -> str:
    """What FastAPI's bare "error parsing the body" was: JSON parsing raised something else than a syntax error."""
    if isinstance(cause, UnicodeDecodeError):
        return f"not UTF-8 (byte 0x{cause.object[cause.start]:02X} at position {cause.start})"
    if "digits" in str(cause):  # int() refuses a literal over 4300 digits
        return "holds a number with thousands of digits; no field takes one that long"
    return "not valid JSON"


def install(app: FastAPI) -> None:
    @app.exception_handler(GpuplanError)
    async def _gpuplan(_req: Request, exc: GpuplanError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        body = exc.to_dict()
        return _error(exc.status_code, str(body["code"]), str(body["message"]),
                      str(body["path"]) if body.get("path") else None, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        path = "body" if first.get("type") == "json_invalid" else _loc(tuple(first.get("loc", ())))
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        return _error(422, "invalid_input", f"{path}: {_message(first)}{more}", path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):  # JSON parsing of the body failed
            return _error(422, "invalid_input", f"body: {_unparsable_body(exc.__cause__)}", "body")
        if exc.status_code == 404 and exc.detail == "Not Found":  # no route matched (a '/' inside an id, a typo)
            return _error(404, "not_found", f"no API route {req.method} {printable(req.url.path, 80)}; the "
                          "routes are listed at /docs (a job id or team name holds no '/')")
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return _error(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error(500, "internal", f"internal error ({type(exc).__name__}); see the server log")
