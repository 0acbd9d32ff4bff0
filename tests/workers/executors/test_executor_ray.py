"""RayExecutor on the shared local Ray cluster: real Ray Train V2, real PyTorch on CPU, tiny models.

Node loss is in test_executor_ray_loss.py and inference in test_executor_ray_infer.py: three files, so
that `pytest -n 2 --dist loadfile` shares them between its two workers."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from errors import Infeasible, NotFound
from planner.types import Strategy
from tests.waits import RUN_END_S
from tests.workers.ray_runs import Holder, executor_on, infer_request, train_request
from tests.workers.tiny import Gate, cpu_strategy, write_config
from workers.executors.protocol import Executor, RunState
from workers.executors.ray_executor import RayExecutor

pytestmark = pytest.mark.ray


def test_runs_a_cpu_job_and_reports_progress(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    gate = Gate(str(tmp_path / "gate"))
    executor = executor_on(tmp_path, gate)
    assert isinstance(executor, Executor)
    gate.hold(3)  # still running when asked
    handle = executor.submit(train_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-cpu", cpu_strategy(),
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
    other = executor_on(tmp_path)
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
        executor = executor_on(tmp_path)
        request = train_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-8",
                           Strategy(gpu="H100-SXM", gpu_count=8, precision="bf16"))
        assert executor.feasibility(request) == "needs 8 x accelerator_type:H100 per node; the biggest node has 2"
        with pytest.raises(Infeasible, match="the biggest node has 2"):
            executor.submit(request)
        other = train_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-a100",
                         Strategy(gpu="A100-80GB", gpu_count=1, precision="bf16"))
        assert "no node has accelerator_type:A100" in str(executor.feasibility(other))
    finally:
        ray_cluster.remove_node(node)


def test_cancelling_an_attempt_that_waits_for_resources_stops_it(ray_cluster: Any, tmp_path: Path) -> None:
    import ray

    node = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources={"accelerator_type:H100": 1})
    holder: Any = None
    try:
        ray_cluster.wait_for_nodes()
        holder = ray.remote(num_cpus=0, num_gpus=1, resources={"accelerator_type:H100": 1})(Holder).remote()
        assert ray.get(holder.ready.remote())
        executor = RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                               start_timeout_s=2.0)
        strategy = Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2)
        # Feasible (a node has an H100) but the H100 is taken: the attempt waits for it.
        request = train_request(write_config(tmp_path / "m"), tmp_path / "ck", "ray-wait", strategy)
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
        status = executor.wait(handle, timeout=RUN_END_S)
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


def test_executors_in_different_namespaces_do_not_see_each_others_attempts(ray_cluster: Any, tmp_path: Path) -> None:
    """Two servers of two databases on one cluster: neither may take the other's attempts for orphans."""
    gate = Gate(str(tmp_path / "gate"))  # both attempts wait after their first request until cancelled
    gate.hold(1)
    team_a = RayExecutor(storage_path=str(tmp_path / "ray"), cpu_threads=1, log_every_s=0.0, namespace="gpuplan-a",
                         step_hook=gate)
    team_b = RayExecutor(storage_path=str(tmp_path / "ray"), cpu_threads=1, log_every_s=0.0, namespace="gpuplan-b",
                         step_hook=gate)
    request = infer_request(tmp_path / "out", "ray-gen-ns", cpu_strategy(), batch=1, requests=5)
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
        assert team_b.wait(other, timeout=RUN_END_S).state is RunState.CANCELLED
        team_b.release(other)
        assert not team_a.status(handle).state.finished
    finally:
        team_a.cancel(handle)
        assert team_a.wait(handle, timeout=RUN_END_S).state is RunState.CANCELLED
        team_a.release(handle)
        gate.release()


def test_on_a_gpuplan_cluster_an_attempt_runs_on_its_planned_market_and_zone(ray_cluster: Any, tmp_path: Path) -> None:
    """Nodes of `gpuplan cluster config` carry (GPU, market, zone) resources: an on-demand attempt runs on
    the on-demand node though a spot node of the same GPU is free, and a zone no node type has is refused;
    the autoscaler's node types count before their nodes join."""
    from workers.executors.cluster_fit import pin_resources

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
        request = dataclasses.replace(infer_request(tmp_path / "out", "ray-pinned", h100),
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


def test_a_boot_holds_the_nodes_of_a_market_and_zone_until_it_is_given_back(ray_cluster: Any, tmp_path: Path) -> None:
    """Make-before-break: a boot asks Ray for the attempt's pinned bundles without running anything; it is
    BOOTING until a node of that (GPU, market, zone) joins (the autoscaler's job on a real cluster), READY
    while it holds that node, GONE once given back, which frees the node for the next attempt."""
    import ray

    from workers.executors.cluster_fit import ZONE_PREFIX, pin_resources
    from workers.executors.protocol import BootsAhead, BootState

    pins = {"accelerator_type:H100": 1, **pin_resources("H100-SXM", "spot", "use1-az2")}
    executor = RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                           node_types=[({"CPU": 1, "GPU": 1, **pins}, 1)])
    assert isinstance(executor, BootsAhead)
    h100 = Strategy(gpu="H100-SXM", gpu_count=1, precision="bf16")
    request = dataclasses.replace(infer_request(tmp_path / "out", "ray-boot", h100), market="spot", zone="use1-az2")
    token = executor.boot(request)
    node = None
    try:
        assert executor.boot_state(token) is BootState.BOOTING  # no such node yet
        node = ray_cluster.add_node(num_cpus=1, num_gpus=1, resources=pins)
        ray_cluster.wait_for_nodes()
        deadline = time.time() + 60
        while executor.boot_state(token) is not BootState.READY:
            assert time.time() < deadline, "the boot did not take the node that joined"
            time.sleep(0.1)
        zone = ZONE_PREFIX + "use1-az2"
        assert ray.available_resources().get(zone, 0.0) == 0.0  # held for the attempt that moves there
        executor.unboot(token)
        assert executor.boot_state(token) is BootState.GONE
        while ray.available_resources().get(zone, 0.0) < 1.0:
            assert time.time() < deadline, "the node was not freed when the boot was given back"
            time.sleep(0.1)
    finally:
        executor.unboot(token)
        if node is not None:
            ray_cluster.remove_node(node)
