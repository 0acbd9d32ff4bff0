"""RayExecutor on the shared local Ray cluster: real Ray Train V2, real PyTorch on CPU, tiny models."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import Infeasible, NotFound
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
    import ray

    executor = _executor(tmp_path)
    assert isinstance(executor, Executor)
    handle = executor.submit(_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-cpu", cpu_strategy(),
                                      steps=6, interval=3))
    assert executor.active() == [handle]
    status = executor.wait(handle, timeout=240)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.progress.step == 6 and status.progress.checkpoints == 2
    assert status.metrics["steps"] == 6 and status.metrics["resumes"] == 0
    logs = executor.logs(handle)
    assert any("step 6/6" in line for line in logs)
    assert executor.active() == []
    # Another process (a restarted scheduler) sees the same attempt through Ray, not through memory.
    other = _executor(tmp_path)
    assert other.status(handle) == status and other.logs(handle) == logs
    # Released, the driver actor exits; its record still answers.
    other.release(handle)
    deadline = time.time() + 30
    while handle in [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]:
        assert time.time() < deadline, "the released driver actor did not exit"
        time.sleep(0.1)
    assert executor.status(handle) == status and executor.logs(handle) == logs
    with pytest.raises(NotFound):
        executor.status("ray-cpu.1.00000000")


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


class _Holder:
    """Holds resources (here the only fake H100) for as long as it lives."""

    def ready(self) -> bool:
        return True


def test_cancelling_an_attempt_that_waits_for_resources_stops_it(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    node = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    holder: Any = None
    try:
        ray_cluster.wait_for_nodes()
        holder = ray.remote(num_cpus=0, num_gpus=1, resources={"accelerator_type:H100": 1})(_Holder).remote()
        assert ray.get(holder.ready.remote())
        executor = RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                               start_timeout_s=2.0)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2)
        # Feasible (a node has an H100) but the H100 is taken: the attempt waits for it.
        request = _request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-wait", strategy)
        first = executor.submit(request)

        def wait_for_a_pending_placement_group() -> None:
            deadline = time.time() + 120
            while not [pg for pg in ray.util.placement_group_table().values() if pg["state"] == "PENDING"]:
                assert time.time() < deadline, "Ray Train never asked for the worker group's resources"
                time.sleep(0.1)

        wait_for_a_pending_placement_group()
        status = executor.status(first)
        assert status.state is RunState.PENDING and status.message == "waiting for workers to start"
        # A second attempt of the same run (a restarted scheduler's retry) stops the first before it
        # starts: never two at once.
        handle = executor.submit(dataclasses.replace(request, attempt=2))
        assert executor.status(first).state is RunState.CANCELLED
        assert executor.active() == [handle]
        executor.release(first)
        wait_for_a_pending_placement_group()
        executor.cancel(handle)
        status = executor.wait(handle, timeout=120)
        assert status.state is RunState.CANCELLED, (status.message, executor.logs(handle)[-5:])
        assert status.message == "cancelled while waiting for resources"
        assert executor.active() == []
        # Nothing of it is left waiting in Ray: once the H100 is free, no run of the job starts.
        assert [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"] == []
        ray.kill(holder)
        holder = None
        assert executor.status(handle).progress.total_steps == 0
        executor.release(handle)
    finally:
        if holder is not None:
            ray.kill(holder)
        ray_cluster.remove_node(node)


def _wait_for(executor: RayExecutor, handle: str, until: Any, timeout: float = 600) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        snap = executor.snapshot(handle)
        if until(snap):
            return snap
        assert not executor.status(handle).state.finished, executor.status(handle).message
        time.sleep(0.05)
    raise AssertionError(f"timed out; last progress {snap['progress']}")


@pytest.mark.slow
def test_node_loss_then_spot_notice_both_resume_and_match_an_uninterrupted_run(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the node running the job with no warning: it resumes on another node from the last
    checkpoint. Then drain that node with a spot notice: a just-in-time checkpoint, and the resume
    loses at most one step. The final weights equal an uninterrupted run's, bit for bit."""
    from workers.preemption import drain_ray_node

    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    config = write_config(tmp_path / "m")
    spec_args: dict[str, Any] = {"steps": 80, "interval": 5}
    reference = InProcessExecutor()
    ref = reference.wait(reference.submit(_request(config, tmp_path / "ref", "ref", cpu_strategy(), **spec_args)), 600)
    assert ref.state is RunState.SUCCEEDED

    fake_gpu = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}
    nodes = [ray_cluster.add_node(**fake_gpu) for _ in range(2)]
    try:
        ray_cluster.wait_for_nodes()
        executor = _executor(tmp_path)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2)
        handle = executor.submit(_request(config, tmp_path / "ck", "ray-kill", strategy, **spec_args))

        # 1. no warning: the node goes between checkpoints
        snap = _wait_for(executor, handle, lambda s: s["progress"].checkpoints >= 2)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        killed_at = snap["progress"].step
        ray_cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        nodes.append(ray_cluster.add_node(**fake_gpu))  # the autoscaler's replacement
        snap = _wait_for(executor, handle, lambda s: s["resumes"] >= 1 and s["progress"].step > killed_at)
        first_resume = snap["progress"].resumed_from_step
        # A periodic checkpoint at or after the one seen before the kill (the loop runs on while
        # the node is being removed), never a step that no checkpoint recorded.
        assert first_resume is not None and first_resume % 5 == 0 and 10 <= first_resume < 80
        assert executor.status(handle).state is RunState.RUNNING
        assert "resumed 1 time(s)" in executor.status(handle).message

        # 2. spot notice: drain the node now running it, deadline a few seconds out
        snap = _wait_for(executor, handle, lambda s: s["progress"].step >= first_resume + 12)
        noticed = snap["node_id"]
        drain_ray_node(ray_cluster.address, noticed, time.time() + 8)
        snap = _wait_for(executor, handle, lambda s: any("spot notice" in line
                                                          for line in executor.logs(handle)))
        last_step_seen = snap["progress"].step
        ray_cluster.remove_node(next(n for n in nodes if n.node_id == noticed), allow_graceful=False)
        status = executor.wait(handle, timeout=600)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-8:])
        assert status.metrics["resumes"] == 2
        jit = status.progress.resumed_from_step
        assert jit is not None and jit >= last_step_seen - 1  # lost at most one step
        assert any(f"step {jit}: spot notice" in line for line in executor.logs(handle))
        assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])
        executor.release(handle)
    finally:
        for node in nodes:
            if node in ray_cluster.worker_nodes:
                ray_cluster.remove_node(node)
