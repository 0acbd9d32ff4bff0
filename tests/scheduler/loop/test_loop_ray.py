"""The real loop driving the real RayExecutor on the session's local Ray cluster, and a scheduler
that restarts (kill -9 of a real server process) while Ray runs its job: the run is found, not
started twice, and finishes; one attempt, one spend row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import col, select

from scheduler.loop.scheduling import Scheduler, TickReport
from scheduler.service import ADMIN, Principal, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import Attempt, Event, JobCreate, JobDetail, Spend, TeamCreate
from tests.net import free_port
from tests.scheduler.loop.test_loop_inprocess import cpu_plan
from tests.scheduler.server import start_process
from tests.workers.tiny import Gate
from workers.executors.protocol import RunState
from workers.executors.ray_executor import NAMESPACE, RayExecutor

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
TRANSITIONS = [(None, "pending"), ("pending", "planned"), ("planned", "queued"), ("queued", "running"),
               ("running", "succeeded")]
ADMIN_HEADERS = {"Authorization": "Bearer admin-secret"}


def tiny_spec(steps: int, interval: int) -> dict[str, Any]:
    return {"name": "tiny", "task": "train", "model": "tiny-llama",
            "train": {"tokens": 64 * 2 * steps, "seq_len": 64, "micro_batch": 2,
                      "checkpoint_interval_steps": interval}}


def ray_executor(tmp_path: Path, gate: Gate | None = None) -> RayExecutor:
    return RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                       start_timeout_s=2.0, step_hook=gate)


def named_drivers() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]


def until(predicate: Any, timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def _tick_until_it_succeeds(loop: Scheduler, svc: SchedulerService, me: Principal, job_id: str) -> JobDetail:
    """Run the loop until the job ends; it must have succeeded (else its last log lines say why)."""

    def ended() -> bool:
        loop.tick()
        return svc.status(me, job_id).state in ("succeeded", "failed")

    until(ended, 300, "the job to end")
    detail = svc.status(me, job_id)
    assert detail.state == "succeeded", (detail.message, svc.logs(me, job_id).lines[-5:])
    return detail


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_the_loop_dispatches_follows_and_charges_a_ray_run(ray_cluster: Any, store: Store, tmp_path: Path) -> None:
    svc = SchedulerService(store, cpu_plan, checkpoint_root=str(tmp_path / "ckpt"))
    svc.create_team(ADMIN, TeamCreate(name="ml"))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    job = svc.submit(me, JobCreate(spec=tiny_spec(steps=6, interval=3)))
    gate = Gate(str(tmp_path / "gate"))
    ex = ray_executor(tmp_path, gate)
    loop = Scheduler(store, ex, poll_s=0.1)
    assert loop.reconcile() == TickReport()
    gate.hold(3)  # still running when looked at
    assert loop.tick().dispatched == [job.id]
    handle = ex.active()[0]
    assert handle.startswith(f"{job.id}.1.") and handle in named_drivers()
    gate.release()
    detail = _tick_until_it_succeeds(loop, svc, me, job.id)
    assert [(a.number, a.handle, a.outcome) for a in detail.attempt_list] == [(1, handle, "succeeded")]
    assert "finished 6 steps" in detail.message
    with store.read() as session:
        attempts = session.exec(select(Attempt)).all()
        spend = session.exec(select(Spend)).all()
        events = session.exec(select(Event).where(Event.job_id == job.id).order_by(col(Event.id))).all()
    assert [s.attempt_id for s in spend] == [attempts[0].id]
    ended, started = attempts[0].ended_at, attempts[0].started_at
    assert ended is not None and spend[0].hours == pytest.approx((ended - started).total_seconds() / 3600)
    assert [(e.from_state, e.to_state) for e in events] == TRANSITIONS
    # The outcome was read, so the driver actor was released: nothing of the attempt stays in Ray.
    until(lambda: handle not in named_drivers(), 30, "the driver actor to exit")
    assert ex.active() == []


def start_server(db_url: str, port: int, workdir: Path, address: str, n: int) -> subprocess.Popen[bytes]:
    return start_process([sys.executable, "-m", "tests.scheduler.serve_ray_proc", db_url, str(port), str(workdir),
                          address], port, workdir / f"server-{n}.log", cwd=ROOT, timeout=240)


def test_kill_9_of_the_server_mid_run_the_new_one_follows_the_same_ray_run(
        ray_cluster: Any, tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'gpuplan.db'}"
    port = free_port()
    gate = Gate(str(tmp_path / "gate"))  # the server's runs hold where the test says
    gate.hold(5)
    proc = start_server(db_url, port, tmp_path, ray_cluster.address, 1)
    try:
        admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=ADMIN_HEADERS, timeout=30)
        assert admin.post("/v1/teams", json={"name": "ml", "budget_usd": 1000}).status_code == 201
        token = admin.post("/v1/teams/ml/tokens").json()["token"]
        c = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
        job_id = c.post("/v1/jobs", json={"spec": tiny_spec(steps=20, interval=10)}).json()["id"]
        here = ray_executor(tmp_path)  # this process sees the attempt through Ray, as any process can
        gate.wait_held(5)
        [handle] = here.active()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # The server's Ray job is gone; its attempt is not: it trains on, to the next hold.
        gate.hold(12)
        gate.wait_held(12)
        until(lambda: here.snapshot(handle)["progress"].step == 12, 60, "the progress of step 12")
        assert here.status(handle).state is RunState.RUNNING

        proc = start_server(db_url, port, tmp_path, ray_cluster.address, 2)
        # The new server came up while the run still trains: it has to find it, not start it again.
        at_restart = here.status(handle)
        assert at_restart.state is RunState.RUNNING, at_restart.message
        gate.release()
        until(lambda: c.get(f"/v1/jobs/{job_id}").json()["state"] in ("succeeded", "failed"), 300, "the job to end")
        detail = c.get(f"/v1/jobs/{job_id}").json()
        lines = c.get(f"/v1/jobs/{job_id}/logs").json()["lines"]
    finally:
        gate.release()
        proc.kill()
        proc.wait()

    assert detail["state"] == "succeeded", (detail["message"], lines[-8:])
    store = Store(db_url)
    with store.read() as session:
        attempts = session.exec(select(Attempt)).all()
        spend = session.exec(select(Spend)).all()
        events = session.exec(select(Event).order_by(col(Event.id))).all()
    store.dispose()
    # One attempt, never lost, charged once for its whole span across the restart.
    assert [(a.number, a.handle, a.outcome) for a in attempts] == [(1, handle, "succeeded")]
    assert [s.attempt_id for s in spend] == [attempts[0].id]
    ended, started = attempts[0].ended_at, attempts[0].started_at
    assert ended is not None and spend[0].hours == pytest.approx((ended - started).total_seconds() / 3600)
    assert [(e.from_state, e.to_state) for e in events] == TRANSITIONS
    # One Ray run: the training loop started once, from step 0, and was never resumed or restarted.
    starts = [line for line in lines if line.startswith(f"job {job_id}: ")]
    assert len(starts) == 1 and "resumed" not in starts[0], starts
    assert sum(line.startswith("step 20/20") for line in lines) == 1
    assert "finished 20 steps" in detail["message"] and "resumed" not in detail["message"]
    until(lambda: handle not in named_drivers(), 30, "the driver actor to exit")


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_a_crash_before_the_handle_is_recorded_never_runs_the_job_twice(
        ray_cluster: Any, store: Store, tmp_path: Path) -> None:
    svc = SchedulerService(store, cpu_plan, checkpoint_root=str(tmp_path / "ckpt"))
    svc.create_team(ADMIN, TeamCreate(name="ml"))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    job = svc.submit(me, JobCreate(spec=tiny_spec(steps=6, interval=3)))
    gate = Gate(str(tmp_path / "gate"))
    gate.hold(3)  # the orphan is mid-run when the next scheduler finds it
    first = Scheduler(store, ray_executor(tmp_path, gate), poll_s=0.1)
    assert first.tick().dispatched == [job.id]
    gate.wait_held(3)
    with store.write() as session:  # the scheduler died between submit and recording the handle
        attempt = session.exec(select(Attempt)).one()
        orphan, attempt.handle = attempt.handle, None
        session.add(attempt)
    assert orphan is not None

    ex = ray_executor(tmp_path)
    loop = Scheduler(store, ex, poll_s=0.1)
    report = loop.reconcile()
    assert report.lost == [job.id] and report.orphans_cancelled == [orphan]
    gate.release()  # the orphan reads the cancel at the end of its next step
    detail = _tick_until_it_succeeds(loop, svc, me, job.id)
    assert [a.outcome for a in detail.attempt_list] == ["lost", "succeeded"]
    # The orphan was stopped before attempt 2 was submitted, and its driver leaves once it has ended.
    assert ex.status(orphan).state is RunState.CANCELLED
    until(lambda: orphan not in named_drivers() and ex.active() == [], 60, "both drivers to exit")
    with store.read() as session:
        spend = session.exec(select(Spend)).all()
        attempts = session.exec(select(Attempt)).all()
    assert sorted(s.attempt_id for s in spend) == sorted(a.id for a in attempts if a.id is not None)
