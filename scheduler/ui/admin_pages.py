"""Admin: teams, budgets, quotas and tokens (a new token is shown once, on the page that made it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form
from fastapi.responses import Response

from errors import InvalidInput
from scheduler.inputs import Label, Name, RowId, Word
from scheduler.store.models import TEAM_NAME_PATTERN, TEAM_NAME_RULE, ApiTokenCreated, TeamCreate, TeamUpdate
from scheduler.ui.web import Ctx, CtxDep, check_csrf, number, redirect, render, team_body

router = APIRouter()


def _admin(ctx: Ctx, status: int = 200, created: ApiTokenCreated | None = None, created_team: str = "") -> Response:
    teams = ctx.service.list_teams(ctx.principal)  # Forbidden for a team
    tokens = {t.name: ctx.service.list_tokens(ctx.principal, t.name) for t in teams}
    return render(ctx, "admin.html", status, team_rows=teams, tokens=tokens, created=created,
                  created_team=created_team, team_name_pattern=TEAM_NAME_PATTERN, team_name_rule=TEAM_NAME_RULE)


@router.get("/admin")
def admin_page(ctx: CtxDep) -> Response:
    return _admin(ctx)


@router.post("/admin/teams")
def create_team(ctx: CtxDep, csrf: Annotated[str, Form()] = "", name: Annotated[Name, Form()] = "",
                budget: Annotated[Word, Form()] = "", quota: Annotated[Word, Form()] = "") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    body = team_body(TeamCreate, name=name, budget_usd=number(budget, float, "budget"),
                     gpu_quota=number(quota, int, "quota"))
    ctx.service.create_team(ctx.principal, body)
    return redirect("/ui/admin")


@router.post("/admin/teams/{name}")
def update_team(ctx: CtxDep, name: Name, csrf: Annotated[str, Form()] = "",
                budget: Annotated[Word, Form()] = "", quota: Annotated[Word, Form()] = "") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    b, q = number(budget, float, "budget"), number(quota, int, "quota")
    body = team_body(TeamUpdate, budget_usd=b, gpu_quota=q, clear_budget=b is None, clear_quota=q is None)
    ctx.service.update_team(ctx.principal, name, body)
    return redirect("/ui/admin")


@router.post("/admin/teams/{name}/tokens")
def create_token(ctx: CtxDep, name: Name, csrf: Annotated[str, Form()] = "",
                 label: Annotated[Label, Form()] = "default") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    created = ctx.service.create_token(ctx.principal, name, label)
    return _admin(ctx, 201, created=created, created_team=name)


@router.get("/admin/teams/{name}/tokens/{token_id}/revoke")
def revoke_confirm(ctx: CtxDep, name: Name, token_id: RowId) -> Response:
    token = next((t for t in ctx.service.list_tokens(ctx.principal, name) if t.id == token_id), None)
    if token is None:
        raise InvalidInput(f"team {name} has no token {token_id}")
    return render(ctx, "confirm.html", title=f"Revoke token {token_id} of team {name}?",
                  text=f"Revoke token {token.id} ({token.name}) of team {name}? Clients and dashboard sessions "
                  "using it stop working within seconds. This cannot be undone.",
                  action=f"/ui/admin/teams/{name}/tokens/{token_id}/revoke", back="/ui/admin",
                  button="Revoke the token", reason=False)


@router.post("/admin/teams/{name}/tokens/{token_id}/revoke")
def revoke(ctx: CtxDep, name: Name, token_id: RowId, csrf: Annotated[str, Form()] = "") -> Response:
    check_csrf(ctx, ctx.request, csrf)
    ctx.service.revoke_token(ctx.principal, name, token_id)
    return redirect("/ui/admin")
