"""A server whose executor could never run a job's plan refuses it at submit, with the plan and the reason,
instead of answering "queued ... estimated" and failing it the same second (the README's llama3-8b-sft
example on an in-process server). The planner, the catalog with this machine's CPU, and the in-process
executor are real; only the driver's GPU answer is faked (none)."""

from __future__ import annotations

from pathlib import Path

import pytest

import catalog.local
from commands.specfile import load_spec
from errors import Infeasible
from scheduler.composition import machine_planner, make_service
from scheduler.service import ADMIN
from scheduler.store.models import JobCreate, TeamCreate
from workers.executors.inprocess import InProcessExecutor

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


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


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_in_process_server_on_a_gpu_machine_runs_the_plans_for_its_gpu_and_its_cpu(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from catalog.local import LocalDevice
    from planner.types import Strategy
    from scheduler.composition import make_executor
    from workers.executors.protocol import RunRequest

    l4 = LocalDevice(name="NVIDIA L4", count=1, memory_bytes=23_580_639_232, backend="cuda")
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: l4)
    executor = make_executor("inprocess", local_gpus=("L4", 1))
    assert isinstance(executor, InProcessExecutor)
    svc = make_service(db_url, checkpoint_root=str(tmp_path / "ckpt"), planner=machine_planner(tmp_path),
                       feasibility=executor.feasibility)
    svc.create_team(ADMIN, TeamCreate(name="ml", budget_usd=10_000, gpu_quota=64))
    me = svc.authenticate(svc.create_token(ADMIN, "ml").token)
    tiny = load_spec(EXAMPLES / "tiny-train.yaml")
    job = svc.submit(me, JobCreate(spec=tiny.model_dump(mode="json")))
    assert (job.state, job.gpu, job.market) == ("queued", "L4", "local")  # the local GPU beats the CPU, both free

    def request(gpu: str) -> RunRequest:
        return RunRequest(job_id="j", attempt=1, spec=tiny, strategy=Strategy(gpu=gpu, gpu_count=1),
                          checkpoint_uri="", run_name="j")

    assert executor._device_for(request("L4")) == "cuda" and executor._device_for(request("cpu")) == "cpu"
    assert "no node has accelerator_type:H100" in (executor.feasibility(request("H100-SXM")) or "")
