"""/v1/teams: admin-only management of teams, budgets, quotas and tokens (plus GET /v1/teams/me)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, status
from pydantic import BaseModel, ConfigDict

from scheduler.api.deps import PrincipalDep, ServiceDep
from scheduler.inputs import Label, Name, RowId
from scheduler.store.models import ApiTokenCreated, ApiTokenPublic, TeamCreate, TeamPublic, TeamUpdate

router = APIRouter(prefix="/v1/teams", tags=["teams"])


class TokenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Label = "default"


@router.get("/me", response_model=TeamPublic)
def me(principal: PrincipalDep, service: ServiceDep) -> TeamPublic:
    """The caller's team: budget, spent, reserved, remaining, GPUs in use."""
    return service.get_team(principal)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TeamPublic)
def create_team(body: TeamCreate, principal: PrincipalDep, service: ServiceDep) -> TeamPublic:
    return service.create_team(principal, body)


@router.get("", response_model=list[TeamPublic])
def list_teams(principal: PrincipalDep, service: ServiceDep) -> list[TeamPublic]:
    return service.list_teams(principal)


@router.get("/{name}", response_model=TeamPublic)
def get_team(name: Name, principal: PrincipalDep, service: ServiceDep) -> TeamPublic:
    return service.get_team(principal, name)


@router.patch("/{name}", response_model=TeamPublic)
def update_team(name: Name, body: TeamUpdate, principal: PrincipalDep, service: ServiceDep) -> TeamPublic:
    """Set or clear the budget (USD) and GPU quota."""
    return service.update_team(principal, name, body)


@router.post("/{name}/tokens", status_code=status.HTTP_201_CREATED, response_model=ApiTokenCreated)
def create_token(name: Name, principal: PrincipalDep, service: ServiceDep,
                 body: Annotated[TokenRequest | None, Body()] = None) -> ApiTokenCreated:
    """Issue a token; the secret is in this response only (the server keeps its sha256)."""
    return service.create_token(principal, name, body.name if body else "default")


@router.get("/{name}/tokens", response_model=list[ApiTokenPublic])
def list_tokens(name: Name, principal: PrincipalDep, service: ServiceDep) -> list[ApiTokenPublic]:
    return service.list_tokens(principal, name)


@router.delete("/{name}/tokens/{token_id}", response_model=ApiTokenPublic)
def revoke_token(name: Name, token_id: RowId, principal: PrincipalDep,
                 service: ServiceDep) -> ApiTokenPublic:
    return service.revoke_token(principal, name, token_id)
