"""Who is calling: a team through its token, or the admin; token hashes, and a short cache of them.

The cache spares a database read per request on the API's hot path. Revoking through the same
process forgets the token at once; another server process notices within ``cache_s``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

from sqlmodel import col, select

from errors import AuthError, Forbidden
from scheduler.store.database import Store
from scheduler.store.models import ApiToken, Team


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who is calling: a team (through its token) or the admin."""

    team_id: int | None
    team_name: str
    is_admin: bool = False


ADMIN = Principal(team_id=None, team_name="(admin)", is_admin=True)


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden("only the admin token may manage teams, budgets, quotas and tokens")


def team_id_of(principal: Principal) -> int:
    if principal.team_id is None:
        raise Forbidden("jobs belong to teams; use a team token, not the admin token",
                        hint="create one with `gpuplan team token TEAM`")
    return principal.team_id


class TokenAuth:
    _MAX_CACHED = 10_000

    def __init__(self, store: Store, *, admin_token: str | None, cache_s: float) -> None:
        self.store = store
        self._admin_hash = hash_token(admin_token) if admin_token else None
        self._cache: dict[str, tuple[Principal, float]] = {}  # token hash -> (principal, monotonic expiry)
        self._cache_s = cache_s

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise AuthError("missing bearer token", hint="send 'Authorization: Bearer <token>' (gpuplan team token)")
        return self.authenticate_hash(hash_token(token))

    def authenticate_hash(self, digest: str) -> Principal:
        """Who holds the token whose sha256 is ``digest`` (a web session keeps the digest, never the
        token); the same checks and cache as :meth:`authenticate`."""
        if self._admin_hash is not None and hmac.compare_digest(digest, self._admin_hash):
            return ADMIN
        cached = self._cache.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        with self.store.read() as session:
            row = session.exec(
                select(ApiToken, Team).join(Team, col(Team.id) == col(ApiToken.team_id)).where(
                    ApiToken.token_hash == digest)
            ).first()
        if row is None:
            raise AuthError("invalid token", hint="check GPUPLAN_TOKEN (GPUPLAN_ADMIN_TOKEN for team commands); "
                            "an admin can issue a team token with `gpuplan team token TEAM`")
        token_row, team = row
        if token_row.revoked_at is not None:
            raise AuthError(f"token {token_row.id} was revoked at {token_row.revoked_at:%Y-%m-%d %H:%M} UTC",
                            hint="ask an admin for a new one with `gpuplan team token TEAM`")
        assert team.id is not None
        principal = Principal(team_id=team.id, team_name=team.name)
        if self._cache_s > 0:
            if len(self._cache) > self._MAX_CACHED:
                self._cache.clear()
            self._cache[digest] = (principal, time.monotonic() + self._cache_s)
        return principal

    def forget(self, token_hash: str) -> None:
        """A revoked token: refused from the next request on (by this process)."""
        self._cache.pop(token_hash, None)
