"""kill -9 the server and its loop mid-run, restart: no job lost, none duplicated, spend exact."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from sqlmodel import select

from scheduler.models import Attempt, Job, Spend
from scheduler.store import Store
from tests.scheduler.conftest import spec_dict
from tests.scheduler.server import free_port, start_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": "Bearer admin-secret"}


def start(db_url: str, port: int, workdir: Path, n: int, workers: int = 1) -> subprocess.Popen[bytes]:
    return start_process([sys.executable, "-m", "tests.scheduler.serve_proc", db_url, str(port), str(workdir), "1.0",
                          str(workers)], port, workdir / f"server-{n}.log", cwd=ROOT, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "api-workers"])
def test_kill_9_mid_run_then_restart_loses_and_duplicates_nothing(db_url: str, tmp_path: Path, workers: int) -> None:
    """With api-workers the kill hits the supervisor (the loop's process); its API workers must go with it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # job0 runs to the end; the attempts of the others wait mid-run, after their first checkpoint.
    hold, held = tmp_path / "hold", tmp_path / "hold.held"
    hold.write_text("\n".join(f"job{i}" for i in range(1, 6)))
    proc = start(db_url, port, tmp_path, 1, workers)
    try:
        admin = httpx.Client(base_url=url, headers=ADMIN, timeout=30)
        assert admin.post("/v1/teams", json={"name": "ml", "budget_usd": 1000}).status_code == 201
        token = admin.post("/v1/teams/ml/tokens").json()["token"]
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        bodies = [{"spec": spec_dict(name=f"job{i}"), "idempotency_key": f"k{i}"} for i in range(6)]
        ids = [c.post("/v1/jobs", json=b).json()["id"] for b in bodies]
        # Kill once job0 has finished and three attempts (max_running) wait mid-run.
        wait_for(lambda: held.exists() and len(held.read_text().split()) == 3
                 and len(c.get("/v1/jobs", params={"state": "succeeded"}).json()) == 1, 180, "a mid-run moment")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        hold.unlink()
        proc = start(db_url, port, tmp_path, 2, workers)
        # Clients retry their submits after the outage: the keys return the same jobs.
        assert [c.post("/v1/jobs", json=b).json()["id"] for b in bodies] == ids
        wait_for(lambda: len(c.get("/v1/jobs", params={"state": "succeeded"}).json()) == 6, 90, "all jobs done")
        logs = [line for i in ids for line in c.get(f"/v1/jobs/{i}/logs").json()["lines"]]
    finally:
        proc.kill()
        proc.wait()

    store = Store(db_url)
    with store.read() as session:
        jobs = session.exec(select(Job)).all()
        attempts = session.exec(select(Attempt).order_by(Attempt.job_id, Attempt.number)).all()  # type: ignore[arg-type]
        spend = session.exec(select(Spend)).all()
    store.dispose()
    assert sorted(j.id for j in jobs) == sorted(ids) and all(j.state == "succeeded" for j in jobs)
    by_job: dict[str, list[Attempt]] = {}
    for a in attempts:
        by_job.setdefault(a.job_id, []).append(a)
    lost = [a for a in attempts if a.outcome == "lost"]
    assert len(lost) == 3, "the kill caught the three held attempts mid-run"
    for runs in by_job.values():
        assert [a.outcome for a in runs][-1] == "succeeded"
        assert all(a.outcome == "lost" for a in runs[:-1]), [a.outcome for a in runs]
        for before, after in itertools.pairwise(runs):  # never two attempts of one job at once
            assert before.ended_at is not None and before.ended_at <= after.started_at
    # Spend: exactly one row per attempt, price at launch x its duration.
    assert sorted(s.attempt_id for s in spend) == sorted(a.id for a in attempts if a.id is not None)
    for s in spend:
        a = next(x for x in attempts if x.id == s.attempt_id)
        assert a.ended_at is not None
        assert s.hours == pytest.approx((a.ended_at - a.started_at).total_seconds() / 3600)
        assert s.usd == pytest.approx(a.usd_per_h * s.hours)
    # A lost job resumed from its checkpoint rather than starting over (with api-workers these
    # lines reach the API through the database: the executor lives in the supervisor).
    assert any("attempt 2 resumes at" in line and "at 0.0s" not in line for line in logs)
    # The journal (one line per executor start) matches the attempts the DB handed out.
    journal = (tmp_path / "journal").read_text().split("\n")
    assert len([j for j in journal if j]) == len(attempts)
