"""The web session: a signed cookie that holds the sha256 of the signed-in token, never the token.

Every request re-authenticates that digest through the service (``authenticate_hash``), so a revoked
token ends its sessions within the service's token-cache window, in every API process alike. The
cookie is ``Secure; HttpOnly; SameSite=Strict`` and signed with HMAC-SHA256 under the server's UI
secret (shared by its API processes), so a client can neither forge nor alter one.

CSRF: each session (signed in or not: the sign-in form is protected too) carries a random nonce;
every form posts it back, and a POST whose field does not match is refused. SameSite=Strict and a
same-origin ``Origin`` check are the second and third lines.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

COOKIE = "gpuplan_session"
LIFETIME_S = 12 * 3600
SECRET_ENV = "GPUPLAN_UI_SECRET"


@dataclass(frozen=True)
class Session:
    csrf: str
    digest: str | None = None  # sha256 of the signed-in token; None before sign-in
    expires: int = 0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the UI secret must have at least 16 bytes")
        self._key = hashlib.sha256(b"gpuplan-ui-session\0" + secret).digest()

    def _mac(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest())

    def dump(self, session: Session) -> str:
        payload = _b64(json.dumps({"c": session.csrf, "d": session.digest, "e": session.expires},
                                  separators=(",", ":")).encode())
        return f"{payload}.{self._mac(payload)}"

    def load(self, value: str | None, now: float | None = None) -> Session | None:
        """The session in a cookie value, or None when it is missing, altered, malformed or expired."""
        if not value or len(value) > 1024 or value.count(".") != 1:
            return None
        payload, mac = value.split(".")
        if not hmac.compare_digest(mac, self._mac(payload)):
            return None
        try:
            data = json.loads(_unb64(payload))
            session = Session(csrf=str(data["c"]), digest=data["d"], expires=int(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.expires < (time.time() if now is None else now):
            return None
        return session


def new_session(digest: str | None = None) -> Session:
    return Session(csrf=secrets.token_urlsafe(24), digest=digest, expires=int(time.time()) + LIFETIME_S)


def csrf_ok(session: Session | None, posted: str | None) -> bool:
    if session is None or not posted:
        return False
    return hmac.compare_digest(session.csrf.encode(), posted.encode("utf-8", "replace"))


def load_or_create_secret(home: Path, env: dict[str, str] | None = None) -> bytes:
    """The UI secret: $GPUPLAN_UI_SECRET, else ``home/ui-secret`` (made once, mode 0600).

    Every API process of one server reads the same file; servers on several hosts behind one
    address need the same $GPUPLAN_UI_SECRET."""
    value = (env if env is not None else dict(os.environ)).get(SECRET_ENV, "").strip()
    if value:
        return value.encode()
    path = home / "ui-secret"
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_bytes().strip()
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32))
    return path.read_bytes().strip()
