"""The scheduler a command talks to: `gpuplan server` when GPUPLAN_API_URL is set (token: GPUPLAN_TOKEN; team
admin commands use GPUPLAN_ADMIN_TOKEN), else the same service in-process on the local database
(GPUPLAN_DATABASE_URL or ~/.gpuplan/gpuplan.db) as team GPUPLAN_TEAM (default "default")."""

from __future__ import annotations

from typing import Any


def open_backend(*, admin: bool = False) -> Any:
    import os
    from pathlib import Path

    from scheduler.client import DEFAULT_TEAM, HttpClient, local_client
    from scheduler.store import database_url, default_home

    url = os.environ.get("GPUPLAN_API_URL", "").strip()
    if url:
        token = (os.environ.get("GPUPLAN_ADMIN_TOKEN") if admin else None) or os.environ.get("GPUPLAN_TOKEN")
        if not token:
            # Said here, in the user's terms (environment variables), not as the server's HTTP header hint.
            from catalog.errors import AuthError

            if admin:
                raise AuthError("no admin token: set GPUPLAN_ADMIN_TOKEN",
                                hint="the token `gpuplan server` was started with (its GPUPLAN_ADMIN_TOKEN)")
            raise AuthError("no team token: set GPUPLAN_TOKEN",
                            hint="an admin issues one with `gpuplan team token TEAM`")
        return HttpClient(url, token)
    home = Path(os.environ.get("GPUPLAN_HOME", "") or default_home())
    return local_client(database_url(os.environ, home=home), checkpoint_root=str(home / "checkpoints"),
                        team=os.environ.get("GPUPLAN_TEAM", "").strip() or DEFAULT_TEAM, machine_home=home)
