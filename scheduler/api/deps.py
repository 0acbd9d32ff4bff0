"""Request dependencies: the service and the caller (from the bearer token).

They are ``async`` on purpose: a sync dependency costs a hop through the threadpool per request.
Authentication answers from the service's token cache almost always; on a miss it does one short
indexed read on the event loop.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from catalog.loader import Catalog
from scheduler.auth import Principal
from scheduler.inputs import check_utf8_url
from scheduler.service import SchedulerService

_bearer = HTTPBearer(auto_error=False, description="a team token, or the admin token for /v1/teams")


async def utf8_url(request: Request) -> None:
    """Refuse a URL whose percent-escapes are not UTF-8 (scheduler.inputs.check_utf8_url)."""
    check_utf8_url(request.scope.get("raw_path") or b"", request.scope.get("query_string") or b"")


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
