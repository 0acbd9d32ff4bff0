"""What the CLI talks to: the server over HTTP (``GPUPLAN_API_URL`` set) or the service in-process.

Both classes expose the same methods with the same return types, so the CLI renders one way.
The HTTP client turns the server's one error format back into the same GpuplanError subclasses
the in-process service raises, so messages and exit codes match.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter

from catalog.errors import ExternalServiceError, GpuplanError, InvalidInput
from planner.spec import parse_hours
from planner.types import Plan
from scheduler.models import (
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
)
from scheduler.service import Principal, SchedulerService

M = TypeVar("M", bound=BaseModel)


class Backend(Protocol):
    def submit(self, body: JobCreate) -> JobPublic: ...
    def status(self, job_id: str) -> JobDetail: ...
    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]: ...
    def cancel(self, job_id: str, reason: str = "") -> JobPublic: ...
    def logs(self, job_id: str, since: int = 0) -> JobLogs: ...
    def plan(self, spec: dict[str, Any]) -> Plan: ...
    def spend_report(self, *, since: str = "30d", team: str | None = None) -> SpendReport: ...
    def me(self) -> TeamPublic: ...
    def create_team(self, body: TeamCreate) -> TeamPublic: ...
    def update_team(self, name: str, body: TeamUpdate) -> TeamPublic: ...
    def list_teams(self) -> list[TeamPublic]: ...
    def create_token(self, team: str, name: str = "default") -> ApiTokenCreated: ...
    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic: ...


def _window(since: str) -> timedelta:
    try:
        return timedelta(hours=parse_hours(since))
    except ValueError as exc:  # parse_hours' message already shows the form to write
        raise InvalidInput(str(exc), path="since") from None
    except OverflowError:
        raise InvalidInput(f"window {since!r} is too large", path="since", hint="write e.g. 30d, 12h or 90m") from None


class LocalClient:
    """The service in this process, acting as ``principal`` (the embedded default)."""

    def __init__(self, service: SchedulerService, principal: Principal, admin: Principal) -> None:
        self.service = service
        self.principal = principal
        self.admin = admin

    def submit(self, body: JobCreate) -> JobPublic:
        return self.service.submit(self.principal, body)

    def status(self, job_id: str) -> JobDetail:
        return self.service.status(self.principal, job_id)

    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]:
        return self.service.list_jobs(self.principal, state=state, limit=limit)

    def cancel(self, job_id: str, reason: str = "") -> JobPublic:
        return self.service.cancel(self.principal, job_id, reason)

    def logs(self, job_id: str, since: int = 0) -> JobLogs:
        return self.service.logs(self.principal, job_id, since)

    def plan(self, spec: dict[str, Any]) -> Plan:
        return self.service.plan(spec)

    def spend_report(self, *, since: str = "30d", team: str | None = None) -> SpendReport:
        start = self.service.clock() - _window(since)
        who = self.admin if team is not None else self.principal
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
        return self.service.create_token(self.admin, team, name)

    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic:
        return self.service.revoke_token(self.admin, token_id)


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

    def _call(self, method: str, path: str, *, retry: bool = False, **kwargs: Any) -> Any:
        attempts = self.retries if retry else 1
        for i in range(attempts):
            try:
                resp = self._http.request(method, path, **kwargs)
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

    def _get(self, model: type[M], path: str, **kwargs: Any) -> M:
        return model.model_validate(self._call("GET", path, **kwargs))

    def submit(self, body: JobCreate) -> JobPublic:
        if body.idempotency_key is None:
            body = body.model_copy(update={"idempotency_key": "cli-" + secrets.token_hex(12)})
        return JobPublic.model_validate(self._call("POST", "/v1/jobs", json=body.model_dump(mode="json"), retry=True))

    def status(self, job_id: str) -> JobDetail:
        return self._get(JobDetail, f"/v1/jobs/{job_id}")

    def list_jobs(self, *, state: str | None = None, limit: int = 50) -> list[JobPublic]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        return TypeAdapter(list[JobPublic]).validate_python(self._call("GET", "/v1/jobs", params=params))

    def cancel(self, job_id: str, reason: str = "") -> JobPublic:
        return JobPublic.model_validate(self._call("POST", f"/v1/jobs/{job_id}/cancel", json={"reason": reason}))

    def logs(self, job_id: str, since: int = 0) -> JobLogs:
        return self._get(JobLogs, f"/v1/jobs/{job_id}/logs", params={"since": since})

    def plan(self, spec: dict[str, Any]) -> Plan:
        return Plan.model_validate(self._call("POST", "/v1/plans", json={"spec": spec}))

    def spend_report(self, *, since: str = "30d", team: str | None = None) -> SpendReport:
        params = {"since": since} | ({"team": team} if team else {})
        return self._get(SpendReport, "/v1/reports/spend", params=params)

    def me(self) -> TeamPublic:
        return self._get(TeamPublic, "/v1/teams/me")

    def create_team(self, body: TeamCreate) -> TeamPublic:
        return TeamPublic.model_validate(self._call("POST", "/v1/teams", json=body.model_dump(mode="json")))

    def update_team(self, name: str, body: TeamUpdate) -> TeamPublic:
        return TeamPublic.model_validate(self._call("PATCH", f"/v1/teams/{name}", json=body.model_dump(mode="json")))

    def list_teams(self) -> list[TeamPublic]:
        return TypeAdapter(list[TeamPublic]).validate_python(self._call("GET", "/v1/teams"))

    def create_token(self, team: str, name: str = "default") -> ApiTokenCreated:
        return ApiTokenCreated.model_validate(self._call("POST", f"/v1/teams/{team}/tokens", json={"name": name}))

    def revoke_token(self, team: str, token_id: int) -> ApiTokenPublic:
        return ApiTokenPublic.model_validate(self._call("DELETE", f"/v1/teams/{team}/tokens/{token_id}"))


def local_client(database_url: str, *, checkpoint_root: str, team: str = "default",
                 machine_home: Path | None = None) -> LocalClient:
    """The embedded default: the real planner and catalog, the local database, acting as ``team``
    (created on first use, without limits) and as admin for team commands (you own the file).

    With ``machine_home`` the catalog also holds this machine's $0/h placements (its GPUs and its
    CPU, probed once and cached there): a `gpuplan server` on this database and machine runs the
    jobs submitted here. They are detected at the first plan, not for every command."""
    from scheduler.api.server import machine_planner, make_service
    from scheduler.service import ADMIN

    planner = machine_planner(machine_home) if machine_home is not None else None
    service = make_service(database_url, checkpoint_root=checkpoint_root, planner=planner)
    info = service.ensure_team(team)
    return LocalClient(service, Principal(team_id=info.id, team_name=info.name), ADMIN)
