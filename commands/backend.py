"""The scheduler a command talks to: `gpuplan server` when GPUPLAN_API_URL is set (token: GPUPLAN_TOKEN; team
admin commands use GPUPLAN_ADMIN_TOKEN), else the same service in-process on the local database
(GPUPLAN_DATABASE_URL or ~/.gpuplan/gpuplan.db) as team GPUPLAN_TEAM (default "default")."""

from __future__ import annotations

from typing import Any

from commands.settings import Settings


def open_backend(*, admin: bool = False, settings: Settings | None = None) -> Any:
    from scheduler.client import HttpClient, local_client

    s = settings or Settings.from_env()
    if s.remote:
        token = (s.admin_token if admin else "") or s.token
        if not token:
            # Said here, in the user's terms (environment variables), not as the server's HTTP header hint.
            from errors import AuthError

            if admin:
                raise AuthError("no admin token: set GPUPLAN_ADMIN_TOKEN",
                                hint="the token `gpuplan server` was started with (its GPUPLAN_ADMIN_TOKEN)")
            raise AuthError("no team token: set GPUPLAN_TOKEN",
                            hint="an admin issues one with `gpuplan team token TEAM`")
        return HttpClient(s.api_url, token)
    return local_client(s.database_url, checkpoint_root=str(s.home / "checkpoints"), team=s.team, machine_home=s.home,
                        shared=s.shared_database)
