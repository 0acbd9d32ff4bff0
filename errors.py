"""The one gpuplan error tree.

Every error a user can cause derives from :class:`GpuplanError` and carries a message that says
what was wrong and how to fix it. It lives in ``catalog`` because that is the package every other
package may import (imports flow cli -> scheduler -> workers -> planner -> catalog).

The API maps ``GpuplanError`` to one JSON error format in one handler using ``status_code`` and
``code``; the CLI prints ``str(error)`` and exits with ``exit_code``.

    GpuplanError
    ├── InvalidInput            bad spec, field, file or number (422)
    │   ├── UnknownName         a name not in the catalog, with close matches (422)
    │   └── UnreachablePath     a spec's file path the job's machine cannot read (422)
    ├── NotFound                a job, team or checkpoint that does not exist (404)
    ├── Conflict                illegal state transition, duplicate name (409)
    ├── AuthError               missing, wrong or revoked token (401)
    ├── Forbidden               a token that may not do this (403)
    ├── LimitExceeded           budget or GPU quota would be exceeded (402)
    ├── NoFeasiblePlan          nothing in the catalog can run the job (422)
    ├── CatalogError            catalog data missing or inconsistent (500)
    ├── ExecutionError          a worker or executor failure (500)
    │   ├── Infeasible          no node of the cluster can ever run the job (422)
    │   └── CheckpointError     a checkpoint that cannot be written or read (500)
    └── ExternalServiceError    a cloud or price API that failed (502)
        ├── CloudCredentialsMissing no (or rejected) cloud credentials (exit 8)
        └── CloudUnreachable        a cloud endpoint that cannot be reached (exit 9)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class GpuplanError(Exception):
    """Base of every gpuplan error. ``str(err)`` is a complete, actionable message."""

    status_code: int = 500
    code: str = "error"
    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}; {hint}")

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"code": self.code, "message": str(self)}
        return body


class InvalidInput(GpuplanError):
    status_code = 422
    code = "invalid_input"
    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message, hint=hint)

    def to_dict(self) -> dict[str, object]:
        body = super().to_dict()
        if self.path:
            body["path"] = self.path
        return body


class UnreachablePath(InvalidInput):
    """A path in a job spec that the machine running the job cannot read (relative, or not there)."""

    code = "unreachable_path"


def close_matches(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """Closest valid names to ``name`` (case-insensitive), best first."""
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.5)
    if not hits:
        hits = [low for low in by_lower if name.lower() in low or low in name.lower()][:n]
    return [by_lower[h] for h in hits]


def plural(noun: str) -> str:
    """'policy' -> 'policies', 'GPU' -> 'GPUs' (enough for the kinds of names gpuplan lists)."""
    if noun.endswith("y") and noun[-2:-1] not in tuple("aeiou"):
        return noun[:-1] + "ies"
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


class UnknownName(InvalidInput):
    """A GPU, model, cloud, field... that does not exist. Suggests the closest valid names."""

    code = "unknown_name"

    def __init__(self, kind: str, name: str, choices: Iterable[str], *, path: str | None = None) -> None:
        choices = list(choices)
        self.kind = kind
        self.name = name
        self.suggestions = close_matches(name, choices)
        if self.suggestions:
            hint = "did you mean " + " or ".join(self.suggestions) + "?"
        else:
            shown = ", ".join(sorted(choices)[:12]) + (", ..." if len(choices) > 12 else "")
            hint = f"valid {plural(kind)}: {shown}"
        super().__init__(f"unknown {kind} {name!r}", path=path, hint=hint)


class NotFound(GpuplanError):
    status_code = 404
    code = "not_found"
    exit_code = 4


class Conflict(GpuplanError):
    status_code = 409
    code = "conflict"
    exit_code = 5


class AuthError(GpuplanError):
    status_code = 401
    code = "unauthorized"
    exit_code = 6


class Forbidden(GpuplanError):
    status_code = 403
    code = "forbidden"
    exit_code = 6


class LimitExceeded(GpuplanError):
    """A team's budget or GPU quota would be exceeded; the message says by how much."""

    status_code = 402
    code = "limit_exceeded"
    exit_code = 7


class NoFeasiblePlan(GpuplanError):
    """Nothing can run the job. The message names the constraint that removed the last candidate."""

    status_code = 422
    code = "no_feasible_plan"
    exit_code = 3


class CatalogError(GpuplanError):
    status_code = 500
    code = "catalog_error"


class ExecutionError(GpuplanError):
    status_code = 500
    code = "execution_error"


class Infeasible(ExecutionError):
    """No node of the cluster can ever satisfy the job's resources (instead of pending forever)."""

    status_code = 422
    code = "infeasible"
    exit_code = 3


class CheckpointError(ExecutionError):
    code = "checkpoint_error"


class ExternalServiceError(GpuplanError):
    status_code = 502
    code = "external_service_error"


class CloudCredentialsMissing(ExternalServiceError):
    """No cloud credentials where a command needs the account, or credentials the cloud rejects."""

    code = "cloud_credentials_missing"
    exit_code = 8


class CloudUnreachable(ExternalServiceError):
    """A cloud API endpoint that cannot be reached (no network, a wrong endpoint URL or region)."""

    code = "cloud_unreachable"
    exit_code = 9
