"""`gpuplan server --workers N`: API worker processes on one socket, supervised, loop in the parent.

Real processes throughout: the CLI's server command in a subprocess, real kill -9 of a worker,
SIGTERM of the supervisor, and a real database (SQLite file and PostgreSQL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import load_catalog
from cli import app
from errors import ExecutionError, InvalidInput
from scheduler.api.processes import ApiSettings, WorkerPool, api_workers
from tests.net import free_port
from tests.scheduler import hostile
from tests.scheduler.server import start_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "workers-admin"
SPEC = yaml.safe_load((ROOT / "examples" / "tiny-train.yaml").read_text())


def children(pid: int) -> set[int]:
    """Live child processes of ``pid`` that are API workers (not multiprocessing's resource tracker)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.add(int(entry.name))
    return found


def start_server(db_url: str, port: int, home: Path, workers: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GPUPLAN_DATABASE_URL": db_url, "GPUPLAN_HOME": str(home), "GPUPLAN_ADMIN_TOKEN": ADMIN}
    return start_process([sys.executable, str(ROOT / "cli.py"), "server", "--port", str(port), "--executor", "none",
                          "--workers", str(workers)], port, home / "server.log", cwd=ROOT, env=env)


def submit(client: httpx.Client, key: str) -> str:
    """Submit with an idempotency key, retrying refused connections (a worker being replaced)."""
    deadline = time.monotonic() + 120  # only a guard against a hang: a loaded box replaces a worker slowly
    while time.monotonic() < deadline:
        try:
            response = client.post("/v1/jobs", json={"spec": SPEC, "idempotency_key": key})
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        assert response.status_code in (200, 201), response.text
        return str(response.json()["id"])
    raise AssertionError(f"submit {key} never got an answer")


@pytest.mark.slow
def test_workers_serve_together_survive_a_killed_worker_and_stop_with_the_supervisor(
        db_url: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(db_url, port, tmp_path, workers=2)
    try:
        wait_for(lambda: len(children(proc.pid)) == 2, 120, "two API workers")
        first = children(proc.pid)
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)
        assert admin.post("/v1/teams", json={"name": "ml", "budget_usd": 1000}).status_code == 201
        token = admin.post("/v1/teams/ml/tokens").json()["token"]
        headers = {"Authorization": f"Bearer {token}"}

        def one(i: int) -> str:
            with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
                return submit(client, f"key-{i}")

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(one, range(24)))
            victim = sorted(first)[0]
            os.kill(victim, signal.SIGKILL)
            # Every key re-sent while one worker is dead and replaced: the same jobs come back.
            assert list(pool.map(one, range(24))) == ids
        assert len(set(ids)) == 24
        wait_for(lambda: len(children(proc.pid)) == 2 and victim not in children(proc.pid), 120,
                 "a replacement worker")
        with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
            listed = client.get("/v1/jobs", params={"limit": 100}).json()
        assert sorted(j["id"] for j in listed) == sorted(ids)
        workers = children(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    assert code == 0
    wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 60,
             "the workers to exit with the supervisor")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=2)


@pytest.mark.slow
def test_hostile_inputs_answer_4xx_from_two_workers(db_url: str, tmp_path: Path) -> None:
    """Issue 9 against the real thing: `gpuplan server --workers 2`, the real planner, no 5xx."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_server(db_url, port, tmp_path, workers=2)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60) as admin:
            assert admin.post("/v1/teams", json={"name": "ml", "budget_usd": 1000}).status_code == 201
            token = admin.post("/v1/teams/ml/tokens").json()["token"]
            openapi = admin.get("/openapi.json").json()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            job_id = submit(client, "hostile")
        bodies = {("POST", "/v1/jobs"): {"spec": SPEC, "idempotency_key": "hostile"},
                  ("POST", "/v1/plans"): {"spec": SPEC},
                  ("POST", "/v1/jobs/{job_id}/cancel"): {"reason": "no longer needed"},
                  ("POST", "/v1/teams"): {"name": "other", "budget_usd": 10, "gpu_quota": 8},
                  ("PATCH", "/v1/teams/{name}"): {"budget_usd": 1000},
                  ("POST", "/v1/teams/{name}/tokens"): {"name": "ci"}}
        # The job spec's fields once each kind (the in-process schema test probes them all).
        outcome = hostile.check(url, openapi, token=token, admin_token=ADMIN, bodies=bodies,
                                path_values={"job_id": job_id, "name": "ml", "token_id": "999999"},
                                spec_fields=["name", "train.tokens", "resources.accelerators.0"])
        assert len(children(proc.pid)) == 2  # no worker died on the way
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert outcome.sent > 500
    assert outcome.problems == []
    assert "unhandled error" not in (tmp_path / "server.log").read_text()


def test_auto_takes_one_worker_on_sqlite_and_one_per_core_up_to_4_on_postgres() -> None:
    sqlite, pg = "sqlite:////tmp/x.db", "postgresql://gpuplan@db/gpuplan"
    assert [api_workers("auto", sqlite, n) for n in (1, 2, 16)] == [1, 1, 1]
    assert [api_workers("auto", pg, n) for n in (None, 1, 2, 16)] == [1, 1, 2, 4]
    assert api_workers("auto", "postgres://u@h/d", 2) == 2
    assert api_workers("3", sqlite, 2) == 3


def test_a_bad_worker_count_is_refused_before_anything_starts(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path))
    result = CliRunner().invoke(app, ["server", "--workers", "lots", "--executor", "none"])
    assert result.exit_code != 0
    assert "--workers must be auto or a whole number from 1 to 64" in result.output
    assert not (tmp_path / "gpuplan.db").exists()  # refused before the database was touched
    with pytest.raises(InvalidInput, match="got '0'"):
        api_workers("0", "sqlite://", 2)


def test_a_pool_whose_workers_die_at_start_up_gives_up_with_the_reason(tmp_path: Path) -> None:
    settings = ApiSettings(database_url="nosuchdb://x", checkpoint_root=str(tmp_path), catalog=load_catalog())
    sock = socket.create_server(("127.0.0.1", 0))
    pool = WorkerPool(settings, sock, 1, max_quick_deaths=2)
    try:
        pool.start()
        with pytest.raises(ExecutionError, match="keep exiting at start-up") as err:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                pool.check()
                time.sleep(0.1)
        assert "--workers 1" in (err.value.hint or "")
    finally:
        pool.stop()
        sock.close()
    assert all(not p.is_alive() for p in pool.processes)


@pytest.mark.slow
def test_a_second_server_with_a_loop_on_the_same_database_is_refused_and_touches_nothing(
        db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "GPUPLAN_DATABASE_URL": db_url, "GPUPLAN_HOME": str(tmp_path), "GPUPLAN_ADMIN_TOKEN": ADMIN}
    port = free_port()
    first = start_process([sys.executable, str(ROOT / "cli.py"), "server", "--port", str(port), "--executor",
                           "inprocess", "--workers", "1"], port, tmp_path / "first.log", cwd=ROOT, env=env)
    try:
        second = subprocess.run([sys.executable, str(ROOT / "cli.py"), "server", "--port", str(free_port()),
                                 "--executor", "inprocess", "--workers", "1"], env=env, cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode != 0
        assert "another gpuplan server already runs the scheduling loop on this database" in second.stderr
        assert "--executor none" in second.stderr
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        # API-only servers take no lock: any number may serve the same database next to the loop.
        (tmp_path / "api").mkdir()
        api_only = start_server(db_url, free_port(), tmp_path / "api", workers=1)
        api_only.send_signal(signal.SIGTERM)
        api_only.wait(timeout=30)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)
