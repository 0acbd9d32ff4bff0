"""`gpuplan team`: teams, budgets, GPU quotas and tokens (admin)."""

from __future__ import annotations

import sys
from typing import Any

import typer
from pydantic import BaseModel

from commands import output
from commands.backend import open_backend
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table, usd
from errors import InvalidInput

app = typer.Typer(help="Teams, budgets, GPU quotas and tokens (admin).\n\nExamples:\n\n"
                       "  gpuplan team create ml --budget 5000 --quota 16\n\n"
                       "  gpuplan team token ml\n\n"
                       "  gpuplan team list --json", no_args_is_help=True)

# Names and numbers are never cut; ``drop`` orders what a narrow terminal leaves out (first the highest).
TOKEN_COLS = [Col("id", right=True), Col("name"), Col("created", drop=1), Col("revoked", drop=2)]
TEAM_COLS = [Col("name"), Col("budget", right=True, drop=2), Col("spent", right=True, drop=3),
             Col("reserved", right=True, drop=4), Col("remaining", right=True), Col("GPU quota", right=True, drop=1),
             Col("GPUs in use", right=True, drop=5)]


def _print_team(team: Any, as_json: bool) -> None:
    if as_json:
        print_json(team)
        return
    quota = "none" if team.gpu_quota is None else str(team.gpu_quota)
    output.console.print(f"team {team.name}: budget {usd(team.budget_usd)} (spent {usd(team.spent_usd)}, reserved "
                         f"{usd(team.reserved_usd)}, remaining {usd(team.remaining_usd)}), GPU quota {quota} "
                         f"({team.gpus_in_use} in use)", highlight=False)


def _limit(value: str, kind: type[float] | type[int], what: str) -> tuple[Any, bool]:
    import math

    if value.lower() in ("none", "unlimited"):
        return None, True
    try:
        number = kind(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        whole = "a whole number" if kind is int else "a number"
        raise InvalidInput(f"must be {whole} >= 0 or 'none', got {value!r}", path=what) from None
    return number, False


def _team_body(model: type[BaseModel], **fields: Any) -> Any:
    """The team request body; a value the model refuses (over its cap) is one error line, not a traceback."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        if first["type"] == "value_error":  # our own validator: its message already names the value
            raise InvalidInput(str(first["msg"]).removeprefix("Value error, "), path=name) from None
        raise InvalidInput(f"{first['msg']}, got {first.get('input')!r}",
                           path={"budget_usd": "budget", "gpu_quota": "quota"}.get(name, name)) from None


# A negative number is a value to refuse with a reason, not an unknown option ("No such option: -5").
_NUMBER_ARGS = {"ignore_unknown_options": True}


@app.command("create")
@handle_errors
def team_create_command(name: str = typer.Argument(...),
                        budget: float | None = typer.Option(None, "--budget", min=0, help="USD; omit: no limit."),
                        quota: int | None = typer.Option(None, "--quota", min=0, help="GPUs; omit: no limit."),
                        as_json: bool = JSON_OPTION) -> None:
    """Create a team.  Example:  gpuplan team create ml --budget 500 --quota 16"""
    from scheduler.store.models import TeamCreate

    body = _team_body(TeamCreate, name=name, budget_usd=budget, gpu_quota=quota)
    _print_team(open_backend(admin=True).create_team(body), as_json)


@app.command("budget", context_settings=_NUMBER_ARGS)
@handle_errors
def team_budget_command(name: str = typer.Argument(...), usd: str = typer.Argument(..., help="USD or 'none'."),
                        as_json: bool = JSON_OPTION) -> None:
    """Set a team's budget.  Example:  gpuplan team budget ml 1000"""
    from scheduler.store.models import TeamUpdate

    value, clear = _limit(usd, float, "budget")
    body = _team_body(TeamUpdate, budget_usd=value, clear_budget=clear)
    _print_team(open_backend(admin=True).update_team(name, body), as_json)


@app.command("quota", context_settings=_NUMBER_ARGS)
@handle_errors
def team_quota_command(name: str = typer.Argument(...), gpus: str = typer.Argument(..., help="GPUs or 'none'."),
                       as_json: bool = JSON_OPTION) -> None:
    """Set a team's GPU quota.  Example:  gpuplan team quota ml 32"""
    from scheduler.store.models import TeamUpdate

    value, clear = _limit(gpus, int, "quota")
    body = _team_body(TeamUpdate, gpu_quota=value, clear_quota=clear)
    _print_team(open_backend(admin=True).update_team(name, body), as_json)


@app.command("token")
@handle_errors
def team_token_command(name: str = typer.Argument(...),
                       revoke: int | None = typer.Option(None, "--revoke", help="Revoke this token id instead."),
                       list_them: bool = typer.Option(False, "--list", help="List the team's token ids instead."),
                       label: str = typer.Option("default", "--name", help="A label for the new token."),
                       as_json: bool = JSON_OPTION) -> None:
    """Issue a team token (shown once), list the team's tokens, or revoke one of them.

    Examples:

      gpuplan team token ml

      gpuplan team token ml --list

      gpuplan team token ml --revoke 3
    """
    backend = open_backend(admin=True)
    if list_them:
        _print_tokens(backend.list_tokens(name), name, as_json)
        return
    if revoke is not None:
        row = backend.revoke_token(name, revoke)
        if as_json:
            print_json(row)
        else:
            output.console.print(f"token {row.id} of team {name} revoked", highlight=False)
        return
    created = backend.create_token(name, label)
    if as_json:
        print_json(created)
        return
    output.console.print(f"token {created.id} for team {name} (shown once, store it now):", highlight=False)
    sys.stdout.write(created.token + "\n")


def _print_tokens(tokens: list[Any], team: str, as_json: bool) -> None:
    if as_json:
        print_json(tokens)
        return
    print_table(f"tokens of team {team}", TOKEN_COLS,
                [[str(t.id), t.name, f"{t.created_at:%Y-%m-%d %H:%M}",
                  f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "-"] for t in tokens])


@app.command("list")
@handle_errors
def team_list_command(as_json: bool = JSON_OPTION) -> None:
    """List teams with budget, spend and quota (admin).  Example:  gpuplan team list --json"""
    teams = open_backend(admin=True).list_teams()
    if as_json:
        print_json(teams)
        return
    print_table("teams", TEAM_COLS,
                [[t.name, usd(t.budget_usd), usd(t.spent_usd), usd(t.reserved_usd), usd(t.remaining_usd),
                  "-" if t.gpu_quota is None else str(t.gpu_quota), str(t.gpus_in_use)] for t in teams])
