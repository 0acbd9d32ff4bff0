"""The in-process CLI (no server) refuses hostile text as the API does, on SQLite and on PostgreSQL:
a NUL byte typed at the terminal is a one-line error, never a database driver's traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()

CASES = [
    # the same lines as over HTTP (tests/scheduler/test_cli.py)
    (["status", "a\x00b"], "job_id: contains a NUL byte (U+0000) at character 2; remove it"),
    (["status", "j" * 10_000], "job_id: is 10000 characters long; at most 32 are allowed"),
    (["status", "x\ud800"], "job_id: contains"),
    (["logs", "a\x00b"], "job_id: contains a NUL byte (U+0000) at character 2; remove it"),
    (["cancel", "j-1\x00"], "job_id: contains a NUL byte (U+0000) at character 4; remove it"),
    (["cancel", "j-1", "--reason", "stop\x1b[31m"],
     "reason: contains the control character U+001B at character 5; remove it"),
    (["list", "--state", "queued\x00"], "state: contains a NUL byte (U+0000) at character 7; remove it"),
    (["team", "token", "default", "--name", "ci\x00"], "name: contains a NUL byte (U+0000) at character 3"),
    (["team", "create", "a\x00b"], "a\\x00b"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a)[:24].encode("unicode_escape").decode()
                                                          for a, _ in CASES])
def test_in_process_cli_refuses_hostile_text_on_both_databases(db_url: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, args: list[str],
                                                              message: str) -> None:
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPLAN_DATABASE_URL", db_url)
    monkeypatch.delenv("GPUPLAN_TEAM", raising=False)
    assert runner.invoke(app, ["list", "--json"]).exit_code == 0  # the database exists and answers
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert message in error["message"], error
    assert "Traceback" not in result.output and "psycopg" not in result.output
