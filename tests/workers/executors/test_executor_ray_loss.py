"""A training attempt on the shared local Ray cluster loses its node, then gets a spot notice: it resumes
both times and ends with the weights of an uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from planner.types import Strategy
from tests.workers.ray_runs import FAKE_GPU, executor_on, remove_nodes, train_request, wait_for
from tests.workers.tiny import Gate, assert_same_weights, cpu_strategy, final_state, write_config
from workers.executors.inprocess import InProcessExecutor
from workers.executors.protocol import RunState

pytestmark = pytest.mark.ray


@pytest.mark.slow
def test_node_loss_then_spot_notice_both_resume_and_match_an_uninterrupted_run(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kill the node running the job with no warning: it resumes on another node from the last
    checkpoint. Then drain that node with a spot notice: a just-in-time checkpoint, and the resume
    loses at most one step. The final weights equal an uninterrupted run's, bit for bit.

    A gate holds the run at each point the test acts on, so the run cannot end before the test acts."""
    from workers.executors.preemption import drain_ray_node

    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    config = write_config(tmp_path / "m")
    spec_args: dict[str, Any] = {"steps": 40, "interval": 5}
    reference = InProcessExecutor()
    ref = reference.wait(reference.submit(train_request(config, tmp_path / "ref", "ref", cpu_strategy(), **spec_args)),
                         600)
    assert ref.state is RunState.SUCCEEDED

    nodes = [ray_cluster.add_node(**FAKE_GPU) for _ in range(2)]
    gate = Gate(str(tmp_path / "gate"), until_notice=True)
    try:
        ray_cluster.wait_for_nodes()
        executor = executor_on(tmp_path, gate)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2)
        gate.hold(12)
        handle = executor.submit(train_request(config, tmp_path / "ck", "ray-kill", strategy, **spec_args))

        # 1. no warning: the node goes between checkpoints (held at step 12, after the one of step 10)
        gate.wait_held(12)
        snap = wait_for(executor, handle, lambda s: s["progress"].checkpoints >= 2 and s["progress"].step == 12)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        ray_cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        nodes.append(ray_cluster.add_node(**FAKE_GPU))  # the autoscaler's replacement
        snap = wait_for(executor, handle, lambda s: s["resumes"] >= 1)
        assert snap["progress"].resumed_from_step == 10  # the newest checkpoint, never a step none recorded
        assert executor.status(handle).state is RunState.RUNNING
        assert "resumed 1 time(s)" in executor.status(handle).message

        # 2. spot notice: drain the node now running it, deadline a few seconds out. The gate holds
        # the run at step 22 until the notice reaches it; the next step's poll acts on it.
        gate.hold(22)
        gate.wait_held(22)
        snap = wait_for(executor, handle, lambda s: s["progress"].step == 22)
        noticed = snap["node_id"]
        # Never drain a node the test did not add (the head holds the drivers of every test).
        assert noticed in [n.node_id for n in nodes], (noticed, [n.node_id for n in nodes])
        drain_ray_node(ray_cluster.address, noticed, time.time() + 8)
        snap = wait_for(executor, handle, lambda s: any("spot notice" in line
                                                          for line in executor.logs(handle)))
        last_step_seen = snap["progress"].step
        gate.release()  # the next node runs on to the end
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
        gate.release()
        remove_nodes(ray_cluster, nodes)


