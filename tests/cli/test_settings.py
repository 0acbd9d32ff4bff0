"""The one settings reader: every command finds the home, the database and the server the same way."""

from __future__ import annotations

from pathlib import Path

from commands.settings import Settings


def test_home_and_database_come_from_the_environment(tmp_path: Path) -> None:
    s = Settings.from_env({"GPUPLAN_HOME": str(tmp_path)})
    assert s.home == tmp_path and s.database_url == f"sqlite:///{tmp_path / 'gpuplan.db'}"
    assert not s.remote and s.team == "default"
    pg = Settings.from_env({"GPUPLAN_HOME": str(tmp_path), "GPUPLAN_DATABASE_URL": " postgresql://x@h/db "})
    assert pg.database_url == "postgresql://x@h/db" and pg.home == tmp_path


def test_unset_or_empty_variables_take_the_defaults() -> None:
    for env in ({}, {"GPUPLAN_HOME": "", "GPUPLAN_TEAM": " ", "GPUPLAN_API_URL": ""}):
        s = Settings.from_env(env)
        assert s.home == Path.home() / ".gpuplan" and s.team == "default" and not s.remote
        assert s.database_url == f"sqlite:///{Path.home() / '.gpuplan' / 'gpuplan.db'}"


def test_a_server_url_makes_the_commands_remote() -> None:
    s = Settings.from_env({"GPUPLAN_API_URL": "http://127.0.0.1:8000", "GPUPLAN_TOKEN": "gpt_x", "GPUPLAN_TEAM": "ml"})
    assert s.remote and s.api_url == "http://127.0.0.1:8000" and s.token == "gpt_x" and s.team == "ml"
