"""The server's start on a cluster head (scheduler.head), against moto's Secrets Manager, SSM and S3: the
secrets reach the server's environment only, admin is always enabled, and the SQLite database is restored
before the server starts and backed up when it stops."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from scheduler import head
from tests.moto_server import moto_server, use_moto

TOKEN, URL = "s3cr3t-admin-token", "postgresql+psycopg://gpuplan:hunter2@db:5432/gpuplan"
BUCKET = "gpuplan-head-test"

# the "server": records what it was started with (argv, environment, whether its database was there) and
# adds a row to the SQLite database, as a server writing a team would
SERVER = """
import json, os, sqlite3, sys
out, db = sys.argv[1], sys.argv[2]
had = os.path.exists(db)
with sqlite3.connect(db) as c:
    c.execute("create table if not exists team (name text)")
    c.execute("insert into team values ('ml')")
json.dump({"argv": sys.argv, "had_db": had, "token": os.environ.get("GPUPLAN_ADMIN_TOKEN"),
           "url": os.environ.get("GPUPLAN_DATABASE_URL")}, open(out, "w"))
"""


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    with moto_server() as url:
        urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).close()
        use_moto(monkeypatch, url)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.delenv("GPUPLAN_HOME", raising=False)
        s = boto3.session.Session(region_name="us-east-1")
        s.client("secretsmanager").create_secret(Name="gpuplan/admin", SecretString=TOKEN)
        s.client("ssm").put_parameter(Name="/gpuplan/db", Value=URL, Type="SecureString")
        s.client("s3").create_bucket(Bucket=BUCKET)
        yield s


def _start(session: Any, tmp_path: Path, *flags: str) -> dict[str, Any]:
    out, db = tmp_path / "server.json", tmp_path / "db" / "gpuplan.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    code = head.run([*flags, "--db", str(db), "--", sys.executable, "-c", SERVER, str(out), str(db)], session)
    assert code == 0
    seen: dict[str, Any] = json.loads(out.read_text())
    return seen


def test_the_secrets_reach_the_servers_environment_only(session: Any, tmp_path: Path) -> None:
    elsewhere = boto3.session.Session(region_name="eu-north-1")  # the head's default region may be the bucket's
    seen = _start(elsewhere, tmp_path, "--region", "us-east-1", "--admin-token-secret", "gpuplan/admin",
                  "--database-url-secret", "ssm:/gpuplan/db")
    assert (seen["token"], seen["url"]) == (TOKEN, URL)
    assert not any(TOKEN in a or "hunter2" in a for a in seen["argv"])  # nothing for `ps` to show


def test_without_a_secret_the_head_makes_its_own_admin_token_once(session: Any, tmp_path: Path) -> None:
    first = _start(session, tmp_path)
    token_file = tmp_path / "home" / ".gpuplan" / "admin-token"
    assert first["token"] and first["token"] == token_file.read_text().strip()
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert _start(session, tmp_path)["token"] == first["token"]  # a restarted server: the same admin


def test_the_sqlite_database_is_restored_before_the_server_and_backed_up_after(session: Any, tmp_path: Path) -> None:
    backup = f"s3://{BUCKET}/runs/_server/gpuplan.db"
    first = _start(session, tmp_path / "head1", "--backup", backup)
    assert first["had_db"] is False  # a new cluster: nothing to restore
    second = _start(session, tmp_path / "head2", "--backup", backup)  # ray down, ray up: a new head, a new disk
    assert second["had_db"] is True
    with sqlite3.connect(tmp_path / "head2" / "db" / "gpuplan.db") as c:
        assert c.execute("select count(*) from team").fetchone() == (2,)  # head1's row, restored, and its own
    session.client("s3").download_file(BUCKET, "runs/_server/gpuplan.db", str(tmp_path / "got.db"))
    with sqlite3.connect(tmp_path / "got.db") as c:
        assert c.execute("select count(*) from team").fetchone() == (2,)  # backed up when the server stopped
    assert os.environ.get("GPUPLAN_ADMIN_TOKEN") != first["token"]
