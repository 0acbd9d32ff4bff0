"""What the CLI talks to: the server over HTTP (``GPUPLAN_API_URL`` set) or the service in-process.

Both classes expose the same methods with the same return types, so the CLI renders one way.
The HTTP client turns the server's one error format back into the same GpuplanError subclasses
the in-process service raises, so messages and exit codes match.
"""

from __future__ import annotations

import json as jsonlib
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlencode

import httpx
from pydantic import BaseModel, TypeAdapter

from errors import ExternalServiceError, GpuplanError, InvalidInput, NotFound
from planner.types import Plan
from scheduler.auth import Principal
from scheduler.inputs import JobId, Label, Reason, RowId, Word, accept
from scheduler.service import SchedulerService
from scheduler.store import ledger
from scheduler.store.models import (
    ApiTokenCreated,
    ApiTokenPublic,
    JobCreate,
    JobDetail,
    JobLogs,
    JobPublic,
    SpendReport,
    TeamCreate,
    TeamPublic,
    TeamUpdate,
    check_team_name,
)

M = TypeVar("M", bound=BaseModel)


class Backend(Protocol):
    def submit(self, body: JobCreate) -> JobPublic: ...
    def status(self, job_id: str) -> JobDetail: ...
    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]: ...
    def cancel(self, job_id: str, reason: str = "") -> JobPublic: ...
    def logs(self, job_id: str, since: int = 0) -> JobLogs: ...
    def plan(self, spec: dict[str, Any]) -> Plan: ...
    def spend_report(self, *, since: str = "30d", team: str | None = None,
                     all_teams: bool = False) -> SpendReport: ...
    def me(self) -> TeamPublic: ...
    def create_team(self, body: TeamCreate) -> TeamPublic: ...
    def update_team(self, name: str, body: TeamUpdate) -> TeamPublic: ...
    def list_teams(self) -> list[TeamPublic]: ...
    def create_token(self, team: str, name: str = "default") -> ApiTokenCreated: ...
    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic: ...
    def list_tokens(self, team: str) -> list[ApiTokenPublic]: ...


DEFAULT_TEAM = "default"  # the one team the in-process CLI creates on first use


class LocalClient:
    """The service in this process, acting as team ``team`` (the embedded default) and as admin
    for team commands. The team is looked up on the first job command, so team commands work
    before it exists; only :data:`DEFAULT_TEAM` is created then, any other name must exist."""

    def __init__(self, service: SchedulerService, team: str, admin: Principal, *, shared: bool = False) -> None:
        self.service = service
        self.team = team
        self.admin = admin
        self.shared = shared  # a database named by GPUPLAN_DATABASE_URL: the default team only in an empty one
        self._principal: Principal | None = None

    @property
    def principal(self) -> Principal:
        if self._principal is None:
            try:
                self._principal = self.service.team_principal(self.team, create=self.team == DEFAULT_TEAM,
                                                              shared=self.shared)
            except (NotFound, InvalidInput) as exc:
                raise type(exc)(f"GPUPLAN_TEAM={self.team}: {exc}") from None
        return self._principal

    def submit(self, body: JobCreate) -> JobPublic:
        return self.service.submit(self.principal, body)

    def status(self, job_id: str) -> JobDetail:
        return self.service.status(self.principal, accept(JobId, job_id, "job_id"))

    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]:
        state = None if state is None else accept(Word, state, "state")
        return self.service.list_jobs(self.principal, state=state, limit=limit)

    def cancel(self, job_id: str, reason: str = "") -> JobPublic:
        return self.service.cancel(self.principal, accept(JobId, job_id, "job_id"), accept(Reason, reason, "reason"))

    def logs(self, job_id: str, since: int = 0) -> JobLogs:
        return self.service.logs(self.principal, accept(JobId, job_id, "job_id"), since)

    def plan(self, spec: dict[str, Any]) -> Plan:
        return self.service.plan(spec)

    def spend_report(self, *, since: str = "30d", team: str | None = None, all_teams: bool = False) -> SpendReport:
        start = ledger.since_start(since, self.service.clock())
        who = self.admin if team is not None or all_teams else self.principal
        return self.service.spend_report(who, since=start, team=team)

    def me(self) -> TeamPublic:
        return self.service.get_team(self.principal)

    def create_team(self, body: TeamCreate) -> TeamPublic:
        return self.service.create_team(self.admin, body)

    def update_team(self, name: str, body: TeamUpdate) -> TeamPublic:
        return self.service.update_team(self.admin, name, body)

    def list_teams(self) -> list[TeamPublic]:
        return self.service.list_teams(self.admin)

    def create_token(self, team: str, name: str = "default") -> ApiTokenCreated:
        return self.service.create_token(self.admin, team, accept(Label, name, "name"))

    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic:
        return self.service.revoke_token(self.admin, team, accept(RowId, token_id, "token_id"))

    def list_tokens(self, team: str) -> list[ApiTokenPublic]:
        return self.service.list_tokens(self.admin, team)


def _team_path(name: str) -> str:
    """The team's URL, for a valid name only: another (``a/b``) would reach a different route."""
    return f"/v1/teams/{check_team_name(name)}"


def _error_classes() -> dict[str, type[GpuplanError]]:
    found: dict[str, type[GpuplanError]] = {}
    stack: list[type[GpuplanError]] = [GpuplanError]
    while stack:
        cls = stack.pop()
        found.setdefault(cls.code, cls)
        stack.extend(cls.__subclasses__())
    return found


def error_from_response(resp: httpx.Response) -> GpuplanError:
    """The GpuplanError a server error response stands for (same class, message and exit code)."""
    try:
        body = resp.json()["error"]
        code, message = str(body["code"]), str(body["message"])
    except (ValueError, KeyError, TypeError):
        return ExternalServiceError(f"server answered HTTP {resp.status_code}: {resp.text[:300]}")
    cls = _error_classes().get(code)
    if cls is None:
        cls = {401: GpuplanError, 404: GpuplanError}.get(resp.status_code, GpuplanError)
    err = cls.__new__(cls)
    GpuplanError.__init__(err, message)
    if isinstance(err, InvalidInput):
        err.path = body.get("path")
    if cls is GpuplanError:
        err.status_code = resp.status_code
        err.code = code
    return err


def _utf8(value: object) -> bytes:
    # surrogatepass: a lone surrogate (from an argv that was not UTF-8) still travels, and the
    # server answers what is wrong with it instead of this process failing to encode it.
    return str(value).encode("utf-8", "surrogatepass")


def _segment(value: object) -> str:
    """One URL path segment: a '/', '?' or NUL in a job id or team name stays inside it."""
    return quote(_utf8(value), safe="")


class HttpClient:
    """The same calls against ``gpuplan server``. Submits carry an idempotency key and are retried
    on connection errors and 5xx, so a flaky network never makes two jobs of one submit."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0, retries: int = 3,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.retries = retries
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, retry: bool = False, json: Any = None,
              params: Mapping[str, object] | None = None) -> Any:
        attempts = self.retries if retry else 1
        if params:
            path += "?" + urlencode({key: _utf8(value) for key, value in params.items()})
        # ASCII JSON (\u0000, \ud800): any text reaches the server, which says what is wrong with it.
        content = None if json is None else jsonlib.dumps(json).encode()
        headers = {"Content-Type": "application/json"} if content is not None else None
        for i in range(attempts):
            try:
                resp = self._http.request(method, path, content=content, headers=headers)
            except httpx.TransportError as exc:
                if i + 1 < attempts:
                    time.sleep(0.2 * 2**i)
                    continue
                raise ExternalServiceError(f"cannot reach the gpuplan server at {self.url}: {exc}",
                                           hint="is `gpuplan server` running? check GPUPLAN_API_URL") from None
            if resp.status_code >= 500 and i + 1 < attempts:
                time.sleep(0.2 * 2**i)
                continue
            if resp.status_code >= 400:
                raise error_from_response(resp)
            return resp.json()
        raise AssertionError("unreachable")

    def _get(self, model: type[M], path: str, params: Mapping[str, object] | None = None) -> M:
        return model.model_validate(self._call("GET", path, params=params))

    def submit(self, body: JobCreate) -> JobPublic:
        if body.idempotency_key is None:
            body = body.model_copy(update={"idempotency_key": "cli-" + secrets.token_hex(12)})
        return JobPublic.model_validate(self._call("POST", "/v1/jobs", json=body.model_dump(mode="json"), retry=True))

    def status(self, job_id: str) -> JobDetail:
        return self._get(JobDetail, f"/v1/jobs/{_segment(job_id)}")

    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return TypeAdapter(list[JobPublic]).validate_python(self._call("GET", "/v1/jobs", params=params))

    def cancel(self, job_id: str, reason: str = "") -> JobPublic:
        return JobPublic.model_validate(self._call("POST", f"/v1/jobs/{_segment(job_id)}/cancel",
                                                   json={"reason": reason}))

    def logs(self, job_id: str, since: int = 0) -> JobLogs:
        return self._get(JobLogs, f"/v1/jobs/{_segment(job_id)}/logs", params={"since": since})

    def plan(self, spec: dict[str, Any]) -> Plan:
        return Plan.model_validate(self._call("POST", "/v1/plans", json={"spec": spec}))

    def spend_report(self, *, since: str = "30d", team: str | None = None, all_teams: bool = False) -> SpendReport:
        # all_teams: the server answers the admin token without a team with every team's totals.
        params = {"since": since} | ({"team": check_team_name(team)} if team else {})
        return self._get(SpendReport, "/v1/reports/spend", params=params)

    def me(self) -> TeamPublic:
        return self._get(TeamPublic, "/v1/teams/me")

    def create_team(self, body: TeamCreate) -> TeamPublic:
        return TeamPublic.model_validate(self._call("POST", "/v1/teams", json=body.model_dump(mode="json")))

    def update_team(self, name: str, body: TeamUpdate) -> TeamPublic:
        return TeamPublic.model_validate(self._call("PATCH", f"{_team_path(name)}", json=body.model_dump(mode="json")))

    def list_teams(self) -> list[TeamPublic]:
        return TypeAdapter(list[TeamPublic]).validate_python(self._call("GET", "/v1/teams"))

    def create_token(self, team: str, name: str = "default") -> ApiTokenCreated:
        return ApiTokenCreated.model_validate(self._call("POST", f"{_team_path(team)}/tokens", json={"name": name}))

    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic:
        return ApiTokenPublic.model_validate(self._call("DELETE", f"{_team_path(team)}/tokens/{token_id}"))

    def list_tokens(self, team: str) -> list[ApiTokenPublic]:
        return TypeAdapter(list[ApiTokenPublic]).validate_python(self._call("GET", f"{_team_path(team)}/tokens"))


def local_client(database_url: str, *, checkpoint_root: str, team: str = DEFAULT_TEAM,
                 machine_home: Path | None = None, shared: bool = False) -> LocalClient:
    """The embedded default: the real planner and catalog, the local database, acting as ``team``
    (which must exist, except the default team, created on first use) and as admin for team
    commands (you own the file).

    With ``machine_home`` the catalog also holds this machine's $0/h placements (its GPUs and its
    CPU, probed once and cached there): a `gpuplan server` on this database and machine runs the
    jobs submitted here. They are detected at the first plan, not for every command. ``shared``: the
    database is not the user's own file (GPUPLAN_DATABASE_URL), so the default team is made only in one
    without teams (one with teams is a server's)."""
    from scheduler.auth import ADMIN
    from scheduler.composition import machine_planner, make_service

    planner = machine_planner(machine_home) if machine_home is not None else None
    service = make_service(database_url, checkpoint_root=checkpoint_root, planner=planner)
    return LocalClient(service, team, ADMIN, shared=shared)
