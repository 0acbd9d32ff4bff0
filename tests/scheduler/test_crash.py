"""kill -9 the server and its loop mid-run, restart: real training resumes from its last checkpoint;
no job is lost or duplicated; spend matches the attempts; idempotency keys still name the same jobs.

The server (tests.scheduler.serve_proc) plans with the real planner on the catalog plus this
machine's CPU and trains through the in-process executor. The kill never races the training: the
held job waits at a gate (a file) after its checkpoint of step HOLD was committed, and the other
job has finished, before the test kills the server.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import select

from scheduler.store.database import Store
from scheduler.store.models import Attempt, Job, Spend
from tests.net import free_port
from tests.scheduler.server import start_process, wait_for
from workers.checkpoint.local import open_store

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": "Bearer admin-secret"}
STEPS, INTERVAL, HOLD = 8, 4, 4  # held in step 5, once the checkpoint of step 4 is committed
SEQ = 16


def start(db_url: str, port: int, workdir: Path, n: int, workers: int = 1) -> subprocess.Popen[bytes]:
    return start_process([sys.executable, "-m", "tests.scheduler.serve_proc", db_url, str(port), str(workdir),
                          str(workers)], port, workdir / f"server-{n}.log", cwd=ROOT, timeout=120)


def train_spec(name: str, *, pin_cpu: bool) -> dict[str, Any]:
    """A tiny-llama run of STEPS short steps; unpinned, the planner picks the $0 CPU by itself."""
    resources: dict[str, Any] = {"spot": "never", **({"accelerators": ["cpu"]} if pin_cpu else {})}
    return {"name": name, "task": "train", "model": "tiny-llama",
            "train": {"tokens": STEPS * SEQ, "seq_len": SEQ, "micro_batch": 1, "checkpoint_interval_steps": INTERVAL,
                      "learning_rate": 1e-3, "seed": 0},
            "resources": resources}


def committed_step(uri: str) -> int:
    latest = open_store(uri).latest() if Path(uri).exists() else None
    return -1 if latest is None else latest.step


@pytest.mark.slow
@pytest.mark.parametrize(("db_url", "workers"), [
    pytest.param("sqlite", 2, id="sqlite-api-workers"),
    pytest.param("postgres", 1, id="postgres-one-process", marks=pytest.mark.postgres),
], indirect=["db_url"])
def test_kill_9_mid_run_then_restart_resumes_real_training(db_url: str, tmp_path: Path, workers: int) -> None:
    """With api-workers the kill hits the supervisor (the loop's process); its API workers must go with it.

    Each database once and each server shape once, not every pair (each pair costs a minute): SQLite takes
    the several processes, the harder case for a file database whose writer is killed mid-run."""
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "held").write_text(str(HOLD))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(db_url, port, tmp_path, 1, workers)
    try:
        admin = httpx.Client(base_url=url, headers=ADMIN, timeout=60)
        assert admin.post("/v1/teams", json={"name": "ml", "budget_usd": 1000}).status_code == 201
        token = admin.post("/v1/teams/ml/tokens").json()["token"]
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        bodies = [{"spec": train_spec("free", pin_cpu=False), "idempotency_key": "k-free"},
                  {"spec": train_spec("held", pin_cpu=True), "idempotency_key": "k-held"}]
        created = [c.post("/v1/jobs", json=b) for b in bodies]
        assert [r.status_code for r in created] == [201, 201], [r.text for r in created]
        ids = [r.json()["id"] for r in created]
        # The planner put both on this machine's CPU at $0/h: unpinned because it is the cheapest.
        assert [(r.json()["gpu"], r.json()["usd_per_h"]) for r in created] == [("cpu", 0.0), ("cpu", 0.0)]
        held_uri = created[1].json()["checkpoint_uri"]
        wait_for(lambda: c.get(f"/v1/jobs/{ids[0]}").json()["state"] == "succeeded"
                 and (gates / "held.held").exists() and committed_step(held_uri) == HOLD,
                 300, "the free job done and the held job waiting after its checkpoint of step 4")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        (gates / "held").unlink()  # the restarted server runs it through
        proc = start(db_url, port, tmp_path, 2, workers)
        # Clients retry their submits after the outage: the keys return the same jobs.
        assert [c.post("/v1/jobs", json=b).json()["id"] for b in bodies] == ids
        wait_for(lambda: all(c.get(f"/v1/jobs/{i}").json()["state"] == "succeeded" for i in ids), 300,
                 "both jobs done after the restart")
        held_logs = c.get(f"/v1/jobs/{ids[1]}/logs").json()["lines"]
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
    by_job = {i: [a for a in attempts if a.job_id == i] for i in ids}
    # Each job finished exactly once: the free one in one attempt, the held one lost to the kill, then done.
    assert [a.outcome for a in by_job[ids[0]]] == ["succeeded"]
    assert [a.outcome for a in by_job[ids[1]]] == ["lost", "succeeded"]
    for runs in by_job.values():
        for before, after in itertools.pairwise(runs):  # never two attempts of one job at once
            assert before.ended_at is not None and before.ended_at <= after.started_at
    # Spend: exactly one row per attempt, the price at launch ($0 on the CPU) x its duration.
    assert sorted(s.attempt_id for s in spend) == sorted(a.id for a in attempts if a.id is not None)
    for s in spend:
        a = next(x for x in attempts if x.id == s.attempt_id)
        assert a.ended_at is not None and a.usd_per_h == 0.0
        assert s.hours == pytest.approx((a.ended_at - a.started_at).total_seconds() / 3600)
        assert s.usd == 0.0
    # The second attempt resumed from the checkpoint the first one committed, not from step 0, and
    # trained to the end (with api-workers these lines reach the API through the database).
    assert any(f"resumed from the checkpoint of step {HOLD}" in line for line in held_logs), held_logs[-20:]
    assert any(f"step {STEPS}/{STEPS}" in line for line in held_logs)
    assert committed_step(held_uri) == STEPS
