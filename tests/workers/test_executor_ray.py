"""RayExecutor on the shared local Ray cluster: real Ray Train V2, real PyTorch on CPU, tiny models."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from catalog.errors import Infeasible, NotFound
from planner.types import Strategy
from tests.workers.tiny import Gate, assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.executor import Executor, RunRequest, RunState
from workers.inprocess import InProcessExecutor
from workers.ray_executor import RayExecutor

pytestmark = pytest.mark.ray


def _request(config: Path, ckpt: Path, job: str, strategy: Strategy, **spec_args: Any) -> RunRequest:
    return RunRequest(job_id=job, attempt=1, spec=tiny_spec(config, **spec_args), strategy=strategy,
                      checkpoint_uri=str(ckpt), run_name=job)


def _executor(tmp_path: Path, gate: Gate | None = None) -> RayExecutor:
    return RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                       max_failures=2, step_hook=gate)


def test_runs_a_cpu_job_and_reports_progress(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    gate = Gate(str(tmp_path / "gate"))
    executor = _executor(tmp_path, gate)
    assert isinstance(executor, Executor)
    gate.hold(3)  # still running when asked
    handle = executor.submit(_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-cpu", cpu_strategy(),
                                      steps=6, interval=3))
    assert executor.active() == [handle]
    gate.release()
    status = executor.wait(handle, timeout=240)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.progress.step == 6 and status.progress.checkpoints == 2
    assert status.metrics["steps"] == 6 and status.metrics["resumes"] == 0
    logs = executor.logs(handle)
    assert any("step 6/6" in line for line in logs)
    # the Ray Train worker ran with the allocator setting the workers default to
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in line for line in logs)
    assert executor.active() == [] and executor.held() == [handle]  # kept until the outcome is recorded
    # Another process (a restarted scheduler) sees the same attempt through Ray, not through memory.
    other = _executor(tmp_path)
    assert other.status(handle) == status and other.logs(handle) == logs
    # Released, the driver actor exits; its record still answers.
    other.release(handle)
    deadline = time.time() + 30
    while handle in [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]:
        assert time.time() < deadline, "the released driver actor did not exit"
        time.sleep(0.1)
    assert executor.held() == []
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


FAKE_GPU: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}  # no CUDA behind


def _remove_nodes(ray_cluster: Any, nodes: list[Any]) -> None:
    """Take a test's extra nodes away again (those it has not killed itself)."""
    for node in nodes:
        if node in ray_cluster.worker_nodes:
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
    loses at most one step. The final weights equal an uninterrupted run's, bit for bit.

    A gate holds the run at each point the test acts on, so the run cannot end before the test acts."""
    from workers.preemption import drain_ray_node

    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    config = write_config(tmp_path / "m")
    spec_args: dict[str, Any] = {"steps": 40, "interval": 5}
    reference = InProcessExecutor()
    ref = reference.wait(reference.submit(_request(config, tmp_path / "ref", "ref", cpu_strategy(), **spec_args)), 600)
    assert ref.state is RunState.SUCCEEDED

    nodes = [ray_cluster.add_node(**FAKE_GPU) for _ in range(2)]
    gate = Gate(str(tmp_path / "gate"), until_notice=True)
    try:
        ray_cluster.wait_for_nodes()
        executor = _executor(tmp_path, gate)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2)
        gate.hold(12)
        handle = executor.submit(_request(config, tmp_path / "ck", "ray-kill", strategy, **spec_args))

        # 1. no warning: the node goes between checkpoints (held at step 12, after the one of step 10)
        gate.wait_held(12)
        snap = _wait_for(executor, handle, lambda s: s["progress"].checkpoints >= 2 and s["progress"].step == 12)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        ray_cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        nodes.append(ray_cluster.add_node(**FAKE_GPU))  # the autoscaler's replacement
        snap = _wait_for(executor, handle, lambda s: s["resumes"] >= 1)
        assert snap["progress"].resumed_from_step == 10  # the newest checkpoint, never a step none recorded
        assert executor.status(handle).state is RunState.RUNNING
        assert "resumed 1 time(s)" in executor.status(handle).message

        # 2. spot notice: drain the node now running it, deadline a few seconds out. The gate holds
        # the run at step 22 until the notice reaches it; the next step's poll acts on it.
        gate.hold(22)
        gate.wait_held(22)
        snap = _wait_for(executor, handle, lambda s: s["progress"].step == 22)
        noticed = snap["node_id"]
        # Never drain a node the test did not add (the head holds the drivers of every test).
        assert noticed in [n.node_id for n in nodes], (noticed, [n.node_id for n in nodes])
        drain_ray_node(ray_cluster.address, noticed, time.time() + 8)
        snap = _wait_for(executor, handle, lambda s: any("spot notice" in line
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
        _remove_nodes(ray_cluster, nodes)


# ------------------------------------------------------------------ inference (task: infer)

def _infer_request(ckpt: Path, job: str, strategy: Strategy, *, attempt: int = 1, **infer: Any) -> RunRequest:
    """The catalog's tiny-llama preset (random init, 4 layers): a few ms per token on one CPU core."""
    from planner.spec import spec_from_dict

    section = {"batch": 2, "prompt_tokens": 4, "output_tokens": 3, "requests": 4, **infer}
    spec = spec_from_dict({"name": job, "task": "infer", "model": "tiny-llama", "infer": section})
    return RunRequest(job_id=job, attempt=attempt, spec=spec, strategy=strategy.model_copy(update={"task": "infer"}),
                      checkpoint_uri=str(ckpt), run_name=job)


def _output_ids(folder: Path) -> list[int]:
    import json

    return [json.loads(line)["id"] for line in (folder / "outputs.jsonl").read_text().splitlines()]


def test_runs_an_inference_job_and_a_new_attempt_redoes_nothing(ray_cluster: Any, tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    request = _infer_request(tmp_path / "out", "ray-gen", cpu_strategy())
    assert executor.feasibility(request) is None
    handle = executor.submit(request)
    status = executor.wait(handle, timeout=240)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "generated 4 requests"
    assert status.progress.step == 4 and status.progress.total_steps == 4
    assert status.metrics["tokens"] == 4 * 3 and status.metrics["resumes"] == 0
    assert sorted(_output_ids(tmp_path / "out")) == [0, 1, 2, 3]
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
    executor = _executor(tmp_path, gate)
    request = _infer_request(tmp_path / "out", "ray-gen-cancel", cpu_strategy(), batch=1, requests=8)
    gate.hold(2)  # the task waits after its second batch until cancelled
    handle = executor.submit(request)
    gate.wait_held(2)
    executor.cancel(handle)
    status = executor.wait(handle, timeout=120)
    assert status.state is RunState.CANCELLED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "cancelled after 2 of 8 requests"
    assert _output_ids(tmp_path / "out") == [0, 1]  # whole batches only: the kill left no torn line to read
    assert executor.active() == []
    executor.release(handle)
    gate.release()
    resumed = executor.wait(executor.submit(dataclasses.replace(request, attempt=2)), timeout=600)
    assert resumed.state is RunState.SUCCEEDED, resumed.message
    assert resumed.progress.resumed_from_step == 2
    assert sorted(_output_ids(tmp_path / "out")) == list(range(8))  # none redone, none missing
    executor.release(resumed.handle)


def test_an_inference_job_with_a_missing_prompts_file_fails_with_the_reason(ray_cluster: Any, tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    missing = tmp_path / "nope.jsonl"
    status = executor.wait(executor.submit(
        _infer_request(tmp_path / "out", "ray-gen-bad", cpu_strategy(), prompts=str(missing))), timeout=240)
    assert status.state is RunState.FAILED
    assert status.message.startswith(f"prompts file {missing} does not exist")
    assert any("error: prompts file" in line for line in executor.logs(status.handle))
    executor.release(status.handle)
    to_gcs = dataclasses.replace(_infer_request(tmp_path / "out", "ray-gen-gs", cpu_strategy()),
                                 checkpoint_uri="gs://bucket/gen")  # s3:// works (tests/workers/test_infer_s3.py)
    gcs = executor.wait(executor.submit(to_gcs), timeout=120)
    assert gcs.state is RunState.FAILED and "cannot go to 'gs://bucket/gen'" in gcs.message
    executor.release(gcs.handle)


def test_an_inference_job_holds_its_planned_gpu_waits_for_it_and_is_refused_when_none_fits(
        ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    node = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    holder: Any = None
    try:
        ray_cluster.wait_for_nodes()
        executor = _executor(tmp_path)
        h100 = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
        too_big = _infer_request(tmp_path / "out", "ray-gen-8", h100.model_copy(update={"gpu_count": 8}))
        with pytest.raises(Infeasible, match="needs 8 x accelerator_type:H100 per node; the biggest node has 1"):
            executor.submit(too_big)
        spread = _infer_request(tmp_path / "out", "ray-gen-2n", h100.model_copy(update={"gpu_count": 2, "nodes": 2}))
        assert "runs on one node, but the plan spreads it over 2 nodes" in str(executor.feasibility(spread))

        # The only H100 is taken: the attempt waits for it; a cancel stops it while it waits.
        holder = ray.remote(num_cpus=0, num_gpus=1, resources={"accelerator_type:H100": 1})(_Holder).remote()
        assert ray.get(holder.ready.remote())
        request = _infer_request(tmp_path / "out", "ray-gen-gpu", h100)
        first = executor.submit(request)
        status = executor.status(first)
        assert status.state is RunState.PENDING and status.message == "waiting for workers to start"
        executor.cancel(first)
        status = executor.wait(first, timeout=120)
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
        assert sorted(_output_ids(tmp_path / "out")) == [0, 1, 2, 3]
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
        executor = _executor(tmp_path, gate)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
        gate.hold(3)  # the node goes while the task waits after its third request
        handle = executor.submit(_infer_request(tmp_path / "out", "ray-gen-kill", strategy, batch=1, requests=10))
        gate.wait_held(3)
        snap = _wait_for(executor, handle, lambda s: s["progress"].step == 3)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        ray_cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        # Released only once the retry has started: the killed worker may outlive its raylet a moment.
        _wait_for(executor, handle, lambda s: s["resumes"] >= 1)
        gate.release()
        status = executor.wait(handle, timeout=600)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
        assert status.metrics["resumes"] == 1 and "resumed 1 time(s)" in status.message
        assert status.progress.resumed_from_step == 3
        assert executor.snapshot(handle)["node_id"] == nodes[0].node_id
        assert sorted(_output_ids(tmp_path / "out")) == list(range(10))  # none redone, none missing
        executor.release(handle)
    finally:
        gate.release()
        _remove_nodes(ray_cluster, nodes)


def test_executors_in_different_namespaces_do_not_see_each_others_attempts(ray_cluster: Any, tmp_path: Path) -> None:
    """Two servers of two databases on one cluster: neither may take the other's attempts for orphans."""
    gate = Gate(str(tmp_path / "gate"))  # both attempts wait after their first request until cancelled
    gate.hold(1)
    team_a = RayExecutor(storage_path=str(tmp_path / "ray"), cpu_threads=1, log_every_s=0.0, namespace="gpuplan-a",
                         step_hook=gate)
    team_b = RayExecutor(storage_path=str(tmp_path / "ray"), cpu_threads=1, log_every_s=0.0, namespace="gpuplan-b",
                         step_hook=gate)
    request = _infer_request(tmp_path / "out", "ray-gen-ns", cpu_strategy(), batch=1, requests=5)
    handle = team_a.submit(request)
    try:
        assert team_a.active() == [handle]
        assert team_b.active() == []
        with pytest.raises(NotFound, match="namespace 'gpuplan-b'"):
            team_b.status(handle)
        team_b.cancel(handle)  # what B's reconcile would do to an orphan: nothing reaches A's attempt
        # B submitting a job of the same run name does not stop A's either (never two at once is per database).
        other = team_b.submit(dataclasses.replace(request, checkpoint_uri=str(tmp_path / "out-b"), attempt=7))
        assert team_b.active() == [other] and team_a.active() == [handle]
        assert not team_a.status(handle).state.finished
        team_b.cancel(other)
        assert team_b.wait(other, timeout=120).state is RunState.CANCELLED
        team_b.release(other)
        assert not team_a.status(handle).state.finished
    finally:
        team_a.cancel(handle)
        assert team_a.wait(handle, timeout=120).state is RunState.CANCELLED
        team_a.release(handle)
        gate.release()


def test_on_a_gpuplan_cluster_an_attempt_runs_on_its_planned_market_and_zone(ray_cluster: Any, tmp_path: Path) -> None:
    """Nodes of `gpuplan cluster config` carry (GPU, market, zone) resources: an on-demand attempt runs on
    the on-demand node though a spot node of the same GPU is free, and a zone no node type has is refused;
    the autoscaler's node types count before their nodes join."""
    from workers.placement import pin_resources

    def pinned(market: str, zone: str) -> dict[str, float]:
        return {"accelerator_type:H100": 1, **pin_resources("H100-SXM", market, zone)}

    spot = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources=pinned("spot", "use1-az6"))
    on_demand = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources=pinned("on-demand", "use1-az6"))
    try:
        ray_cluster.wait_for_nodes()
        later = pinned("on-demand", "use1-az1")
        executor = RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                               node_types=[({"CPU": 1, "GPU": 1, **later}, 1)])
        h100 = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
        request = dataclasses.replace(_infer_request(tmp_path / "out", "ray-pinned", h100),
                                      market="on-demand", zone="use1-az6")
        assert executor.feasibility(dataclasses.replace(request, zone="use1-az1")) is None  # a node type has it
        elsewhere = executor.feasibility(dataclasses.replace(request, zone="use1-az4"))
        assert elsewhere is not None and "gpuplan-zone:use1-az4" in elsewhere
        handle = executor.submit(request)
        status = executor.wait(handle, timeout=240)
        assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
        assert executor.snapshot(handle)["node_id"] == on_demand.node_id != spot.node_id
        executor.release(handle)
    finally:
        ray_cluster.remove_node(spot)
        ray_cluster.remove_node(on_demand)
