"""Request dependencies: the service and the caller (from the bearer token).

They are ``async`` on purpose: a sync dependency costs a hop through the threadpool per request.
Authentication answers from the service's token cache almost always; on a miss it does one short
indexed read on the event loop.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from catalog.loader import Catalog
from errors import InvalidInput
from scheduler.auth import Principal
from scheduler.service import SchedulerService

_bearer = HTTPBearer(auto_error=False, description="a team token, or the admin token for /v1/teams")


async def utf8_url(request: Request) -> None:
    """Refuse a URL whose percent-escapes are not UTF-8 (%ED%A0%80, a lone surrogate): the server
    would otherwise read them as U+FFFD and look up a value the client never sent."""
    scope = request.scope
    for part, raw in (("path", scope.get("raw_path") or b""), ("query", scope.get("query_string") or b"")):
        try:
            unquote_to_bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"the URL's {part} is not UTF-8 once its %-escapes are decoded (byte "
                               f"0x{exc.object[exc.start]:02X})", hint="percent-encode text as UTF-8") from None


async def get_service(request: Request) -> SchedulerService:
    service: SchedulerService = request.app.state.service
    return service


async def get_catalog(request: Request) -> Catalog:
    catalog: Catalog = request.app.state.catalog
    return catalog


async def get_principal(
    service: Annotated[SchedulerService, Depends(get_service)],
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    return service.authenticate(creds.credentials if creds else None)


ServiceDep = Annotated[SchedulerService, Depends(get_service)]
CatalogDep = Annotated[Catalog, Depends(get_catalog)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
