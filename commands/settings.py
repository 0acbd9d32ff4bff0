"""The one reader of gpuplan's environment: the commands build a :class:`Settings` and pass its values
down; the packages below take them as arguments and read no environment of their own.

  GPUPLAN_HOME          where runs, checkpoints, the local database and the CPU probe live (~/.gpuplan)
  GPUPLAN_DATABASE_URL  the scheduler's database (default: a SQLite file in the home)
  GPUPLAN_API_URL       talk to `gpuplan server` there instead of the local database
  GPUPLAN_TOKEN         the team token sent to it; GPUPLAN_ADMIN_TOKEN for team admin commands
  GPUPLAN_TEAM          the team of in-process commands (default "default")

(GPUPLAN_CATALOG_DIR, the user catalog overlay, is read where the catalog loads: see docs/CATALOG.md.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    home: Path
    database_url: str
    api_url: str  # "" runs the service in-process on ``database_url``
    token: str
    admin_token: str
    team: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        from scheduler.client import DEFAULT_TEAM  # httpx: only when a command asks

        env = os.environ if env is None else env

        def get(name: str) -> str:
            return env.get(name, "").strip()

        home = Path(get("GPUPLAN_HOME") or Path.home() / ".gpuplan").expanduser()
        return cls(home=home, database_url=get("GPUPLAN_DATABASE_URL") or own_database_url(home),
                   api_url=get("GPUPLAN_API_URL"), token=get("GPUPLAN_TOKEN"), admin_token=get("GPUPLAN_ADMIN_TOKEN"),
                   team=get("GPUPLAN_TEAM") or DEFAULT_TEAM)

    @property
    def remote(self) -> bool:
        """Whether the commands talk to a `gpuplan server` (GPUPLAN_API_URL) rather than the local database."""
        return bool(self.api_url)

    @property
    def shared_database(self) -> bool:
        """The database is one GPUPLAN_DATABASE_URL names (a server's, perhaps), not the home's own file."""
        return self.database_url != own_database_url(self.home)


def own_database_url(home: Path) -> str:
    return f"sqlite:///{home / 'gpuplan.db'}"
