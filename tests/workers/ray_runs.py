"""What the RayExecutor tests share: requests for the tiny models, an executor on the shared local Ray
cluster, fake-GPU nodes and waits on an attempt's progress (never on how fast it runs)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from planner.types import Strategy
from tests.workers.tiny import Gate, tiny_spec
from workers.executors.protocol import RunRequest
from workers.executors.ray_executor import RayExecutor


def train_request(config: Path, ckpt: Path, job: str, strategy: Strategy, **spec_args: Any) -> RunRequest:
    return RunRequest(job_id=job, attempt=1, spec=tiny_spec(config, **spec_args), strategy=strategy,
                      checkpoint_uri=str(ckpt), run_name=job)


def executor_on(tmp_path: Path, gate: Gate | None = None) -> RayExecutor:
    return RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                       max_failures=2, step_hook=gate)


class Holder:
    """Holds resources (here the only fake H100) for as long as it lives."""

    def ready(self) -> bool:
        return True


FAKE_GPU: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}  # no CUDA behind


def remove_nodes(ray_cluster: Any, nodes: list[Any]) -> None:
    """Take a test's extra nodes away again (those it has not killed itself)."""
    for node in nodes:
        if node in ray_cluster.worker_nodes:
            ray_cluster.remove_node(node)


def wait_for(executor: RayExecutor, handle: str, until: Any, timeout: float = 600) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        snap = executor.snapshot(handle)
        if until(snap):
            return snap
        assert not executor.status(handle).state.finished, executor.status(handle).message
        time.sleep(0.05)
    raise AssertionError(f"timed out; last progress {snap['progress']}")


def infer_request(ckpt: Path, job: str, strategy: Strategy, *, attempt: int = 1, **infer: Any) -> RunRequest:
    """The catalog's tiny-llama preset (random init, 4 layers): a few ms per token on one CPU core."""
    from planner.spec import spec_from_dict

    section = {"batch": 2, "prompt_tokens": 4, "output_tokens": 3, "requests": 4, **infer}
    spec = spec_from_dict({"name": job, "task": "infer", "model": "tiny-llama", "infer": section})
    return RunRequest(job_id=job, attempt=attempt, spec=spec, strategy=strategy.model_copy(update={"task": "infer"}),
                      checkpoint_uri=str(ckpt), run_name=job)


def output_ids(folder: Path) -> list[int]:
    import json

    return [json.loads(line)["id"] for line in (folder / "outputs.jsonl").read_text().splitlines()]
