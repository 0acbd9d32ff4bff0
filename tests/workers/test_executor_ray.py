"""RayExecutor on the shared local Ray cluster: real Ray Train V2, real PyTorch on CPU, tiny models."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import Infeasible
from planner.types import Strategy
from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.executor import Executor, RunRequest, RunState
from workers.inprocess import InProcessExecutor
from workers.ray_executor import RayExecutor

pytestmark = pytest.mark.ray


def _request(config: Path, ckpt: Path, job: str, strategy: Strategy, **spec_args: Any) -> RunRequest:
    return RunRequest(job_id=job, attempt=1, spec=tiny_spec(config, **spec_args), strategy=strategy,
                      checkpoint_uri=str(ckpt), run_name=job)


def _executor(tmp_path: Path) -> RayExecutor:
    return RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                       max_failures=2)


def test_runs_a_cpu_job_and_reports_progress(ray_cluster: Any, tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    assert isinstance(executor, Executor)
    handle = executor.submit(_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-cpu", cpu_strategy(),
                                      steps=6, interval=3))
    assert executor.active() == [handle]
    status = executor.wait(handle, timeout=240)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.progress.step == 6 and status.progress.checkpoints == 2
    assert status.metrics["steps"] == 6 and status.metrics["resumes"] == 0
    assert any("step 6/6" in line for line in executor.logs(handle))
    assert executor.active() == []


def test_a_job_no_node_can_hold_is_refused_with_the_reason(ray_cluster: Any, tmp_path: Path) -> None:
    node = ray_cluster.add_node(num_cpus=1, num_gpus=2, resources={"accelerator_type:H100": 2})
    try:
        ray_cluster.wait_for_nodes()
        executor = _executor(tmp_path)
        request = _request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-8",
                           Strategy(gpu="H100-SXM", gpu_count=8, precision="bf16"))
        assert executor.feasibility(request) == "needs 8 x accelerator_type:H100 per node; the biggest node has 2"
        with pytest.raises(Infeasible, match="the biggest node has 2"):
            executor.submit(request)
        other = _request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-a100",
                         Strategy(gpu="A100-80GB", gpu_count=1, precision="bf16"))
        assert "no node has accelerator_type:A100" in str(executor.feasibility(other))
    finally:
        ray_cluster.remove_node(node)


@pytest.mark.slow
def test_node_killed_without_warning_resumes_elsewhere_and_matches(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    config = write_config(tmp_path / "m")
    spec_args: dict[str, Any] = {"steps": 60, "interval": 5}
    reference = InProcessExecutor()
    ref = reference.wait(reference.submit(_request(config, tmp_path / "ref", "ref", cpu_strategy(), **spec_args)), 240)
    assert ref.state is RunState.SUCCEEDED

    nodes = [ray_cluster.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1}) for _ in range(2)]
    try:
        ray_cluster.wait_for_nodes()
        executor = _executor(tmp_path)
        handle = executor.submit(_request(config, tmp_path / "ck", "ray-kill",
                                          Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2),
                                          **spec_args))
        attempt = executor._get(handle)
        deadline = time.time() + 500
        while time.time() < deadline:
            snap = ray.get(attempt.progress.snapshot.remote())
            if snap["progress"].checkpoints >= 2:
                break
            time.sleep(0.05)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        killed_at = snap["progress"].step
        ray_cluster.remove_node(victim, allow_graceful=False)
        status = executor.wait(handle, timeout=600)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-8:])
        assert status.metrics["resumes"] >= 1
        assert status.progress.resumed_from_step is not None
        assert 10 <= status.progress.resumed_from_step <= killed_at + 5
        assert "resumed 1 time(s)" in status.message
        assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])
    finally:
        for node in nodes:
            if node in ray_cluster.worker_nodes:
                ray_cluster.remove_node(node)
