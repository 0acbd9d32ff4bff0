"""Inference attempts (task: infer) on the shared local Ray cluster: outputs, resume from outputs, cancel,
planned GPUs, a lost node."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from errors import Infeasible
from planner.types import Strategy
from tests.waits import RUN_END_S
from tests.workers.ray_runs import (
    FAKE_GPU,
    Holder,
    executor_on,
    infer_request,
    output_ids,
    remove_nodes,
    wait_for,
)
from tests.workers.tiny import Gate, cpu_strategy
from workers.executors.protocol import RunState

pytestmark = pytest.mark.ray


def test_runs_an_inference_job_and_a_new_attempt_redoes_nothing(ray_cluster: Any, tmp_path: Path) -> None:
    executor = executor_on(tmp_path)
    request = infer_request(tmp_path / "out", "ray-gen", cpu_strategy())
    assert executor.feasibility(request) is None
    handle = executor.submit(request)
    status = executor.wait(handle, timeout=240)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "generated 4 requests"
    assert status.progress.step == 4 and status.progress.total_steps == 4
    assert status.metrics["tokens"] == 4 * 3 and status.metrics["resumes"] == 0
    assert sorted(output_ids(tmp_path / "out")) == [0, 1, 2, 3]
    assert any("generated 4 requests (0 already done)" in line for line in executor.logs(handle))
    executor.release(handle)
    # A new attempt (a requeue after a lost node, a restarted scheduler) resumes from the outputs.
    lines = (tmp_path / "out" / "outputs.jsonl").read_text()
    again = executor.wait(executor.submit(dataclasses.replace(request, attempt=2)), timeout=240)
    assert again.state is RunState.SUCCEEDED, again.message
    assert again.progress.resumed_from_step == 4 and again.metrics["resumes"] == 1
    assert "4 requests already written" in again.message
    assert (tmp_path / "out" / "outputs.jsonl").read_text() == lines
    executor.release(again.handle)


def test_cancel_stops_a_running_inference_job_and_the_next_attempt_finishes_it(
        ray_cluster: Any, tmp_path: Path) -> None:
    gate = Gate(str(tmp_path / "gate"))
    executor = executor_on(tmp_path, gate)
    request = infer_request(tmp_path / "out", "ray-gen-cancel", cpu_strategy(), batch=1, requests=8)
    gate.hold(2)  # the task waits after its second batch until cancelled
    handle = executor.submit(request)
    gate.wait_held(2)
    executor.cancel(handle)
    status = executor.wait(handle, timeout=RUN_END_S)
    assert status.state is RunState.CANCELLED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "cancelled after 2 of 8 requests"
    assert output_ids(tmp_path / "out") == [0, 1]  # whole batches only: the kill left no torn line to read
    assert executor.active() == []
    executor.release(handle)
    gate.release()
    resumed = executor.wait(executor.submit(dataclasses.replace(request, attempt=2)), timeout=600)
    assert resumed.state is RunState.SUCCEEDED, resumed.message
    assert resumed.progress.resumed_from_step == 2
    assert sorted(output_ids(tmp_path / "out")) == list(range(8))  # none redone, none missing
    executor.release(resumed.handle)


def test_an_inference_job_with_a_missing_prompts_file_fails_with_the_reason(ray_cluster: Any, tmp_path: Path) -> None:
    executor = executor_on(tmp_path)
    missing = tmp_path / "nope.jsonl"
    status = executor.wait(executor.submit(
        infer_request(tmp_path / "out", "ray-gen-bad", cpu_strategy(), prompts=str(missing))), timeout=240)
    assert status.state is RunState.FAILED
    assert status.message.startswith(f"prompts file {missing} does not exist")
    assert any("error: prompts file" in line for line in executor.logs(status.handle))
    executor.release(status.handle)
    to_gcs = dataclasses.replace(infer_request(tmp_path / "out", "ray-gen-gs", cpu_strategy()),
                                 checkpoint_uri="gs://bucket/gen")  # s3:// works (tests/workers/infer/test_infer_s3.py)
    gcs = executor.wait(executor.submit(to_gcs), timeout=RUN_END_S)
    assert gcs.state is RunState.FAILED and "cannot go to 'gs://bucket/gen'" in gcs.message
    executor.release(gcs.handle)


def test_an_inference_job_holds_its_planned_gpu_waits_for_it_and_is_refused_when_none_fits(
        ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    node = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    holder: Any = None
    try:
        ray_cluster.wait_for_nodes()
        executor = executor_on(tmp_path)
        h100 = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
        too_big = infer_request(tmp_path / "out", "ray-gen-8", h100.model_copy(update={"gpu_count": 8}))
        with pytest.raises(Infeasible, match="needs 8 x accelerator_type:H100 per node; the biggest node has 1"):
            executor.submit(too_big)
        spread = infer_request(tmp_path / "out", "ray-gen-2n", h100.model_copy(update={"gpu_count": 2, "nodes": 2}))
        assert "runs on one node, but the plan spreads it over 2 nodes" in str(executor.feasibility(spread))

        # The only H100 is taken: the attempt waits for it; a cancel stops it while it waits.
        holder = ray.remote(num_cpus=0, num_gpus=1, resources={"accelerator_type:H100": 1})(Holder).remote()
        assert ray.get(holder.ready.remote())
        request = infer_request(tmp_path / "out", "ray-gen-gpu", h100)
        first = executor.submit(request)
        status = executor.status(first)
        assert status.state is RunState.PENDING and status.message == "waiting for workers to start"
        executor.cancel(first)
        status = executor.wait(first, timeout=RUN_END_S)
        # Which words depend on whether the driver had handed Ray its task when the cancel came (a busy
        # box can be slower to get there than the test to cancel); either way it never ran.
        assert status.state is RunState.CANCELLED and status.message in (
            "cancelled while waiting for resources", "cancelled before it started"), status.message
        assert not (tmp_path / "out" / "outputs.jsonl").exists()
        executor.release(first)
        # Once the H100 is free, the next attempt runs on the node that has it (its fake GPU
        # has no CUDA behind it, so the worker generates on that node's CPU).
        ray.kill(holder)
        holder = None
        handle = executor.submit(dataclasses.replace(request, attempt=2))
        status = executor.wait(handle, timeout=240)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
        assert executor.snapshot(handle)["node_id"] == node.node_id
        assert sorted(output_ids(tmp_path / "out")) == [0, 1, 2, 3]
        executor.release(handle)
    finally:
        if holder is not None:
            ray.kill(holder)
        ray_cluster.remove_node(node)


@pytest.mark.slow
def test_an_inference_job_resumes_from_its_outputs_after_its_node_is_lost(ray_cluster: Any, tmp_path: Path) -> None:
    """Kill the node generating with no warning: Ray retries the task on another node, which skips
    the requests already written; every request is answered exactly once."""
    nodes = [ray_cluster.add_node(**FAKE_GPU) for _ in range(2)]
    gate = Gate(str(tmp_path / "gate"))
    try:
        ray_cluster.wait_for_nodes()
        executor = executor_on(tmp_path, gate)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
        gate.hold(3)  # the node goes while the task waits after its third request
        handle = executor.submit(infer_request(tmp_path / "out", "ray-gen-kill", strategy, batch=1, requests=10))
        gate.wait_held(3)
        snap = wait_for(executor, handle, lambda s: s["progress"].step == 3)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        ray_cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        # Released only once the retry has started: the killed worker may outlive its raylet a moment.
        wait_for(executor, handle, lambda s: s["resumes"] >= 1)
        gate.release()
        status = executor.wait(handle, timeout=600)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
        assert status.metrics["resumes"] == 1 and "resumed 1 time(s)" in status.message
        assert status.progress.resumed_from_step == 3
        assert executor.snapshot(handle)["node_id"] == nodes[0].node_id
        assert sorted(output_ids(tmp_path / "out")) == list(range(10))  # none redone, none missing
        executor.release(handle)
    finally:
        gate.release()
        remove_nodes(ray_cluster, nodes)


