"""A server whose executor could never run a job's plan refuses it at submit, with the plan and the reason,
instead of answering "queued ... estimated" and failing it the same second (the README's llama3-8b-sft
example on an in-process server). The planner, the catalog with this machine's CPU, and the in-process
executor are real; only the driver's GPU answer is faked (none)."""

from __future__ import annotations

from pathlib import Path

import pytest

import catalog.local
from catalog.errors import Infeasible
from commands.specfile import load_spec
from scheduler.api.server import machine_planner, make_service
from scheduler.models import JobCreate, TeamCreate
from scheduler.service import ADMIN
from workers.inprocess import InProcessExecutor

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_in_process_server_refuses_a_cloud_plan_at_submit_and_queues_a_local_one(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: None)
    executor = InProcessExecutor()
    svc = make_service(db_url, checkpoint_root=str(tmp_path / "ckpt"), planner=machine_planner(tmp_path),
                       feasibility=executor.feasibility)
    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=10_000, gpu_quota=64))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    sft = load_spec(EXAMPLES / "llama3-8b-sft.yaml").model_dump(mode="json")
    with pytest.raises(Infeasible) as refused:
        svc.submit(me, JobCreate(spec=sft))
    message = str(refused.value)
    assert message.startswith("job 'llama3-8b-sft' can never run on this server: its plan is 8xA100-40GB")
    assert "the cluster has: no GPUs" in message and "in-process executor runs jobs on this server's machine" in message
    assert svc.list_jobs(me) == []  # nothing queued, nothing reserved
    tiny = load_spec(EXAMPLES / "tiny-train.yaml").model_dump(mode="json")
    job = svc.submit(me, JobCreate(spec=tiny))
    assert (job.state, job.gpu, job.market) == ("queued", "cpu", "local")
