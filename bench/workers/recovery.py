"""Recovery time on a local Ray cluster: from node loss to the first training step after resume.

Starts its own ``ray.cluster_utils.Cluster`` (head + two worker nodes with one fake H100 each),
runs a tiny training job through RayExecutor, kills the node running it with no warning once a
checkpoint exists, and reads the progress actor's clock for: the kill; the new rank 0 entering
the train function (Ray noticed the loss and started a worker group on the other node); the loop
ready (torch and transformers imported, model built, checkpoint restored); its first step.

    python bench/workers/recovery.py --repeats 2 --json recovery.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def one_run(cluster: Any, folder: Path, index: int) -> dict[str, float]:
    from planner.types import Strategy
    from tests.workers.tiny import tiny_spec, write_config
    from workers.executors.protocol import RunRequest, RunState
    from workers.executors.ray_executor import RayExecutor

    fake_gpu = {"num_cpus": 1, "num_gpus": 1, "resources": {"accelerator_type:H100": 1}}
    nodes = [cluster.add_node(**fake_gpu) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        executor = RayExecutor(storage_path=str(folder / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0)
        job = f"recovery-{index}"
        spec = tiny_spec(write_config(folder / "m"), steps=400, interval=5)
        request = RunRequest(job_id=job, attempt=1, spec=spec, checkpoint_uri=str(folder / job), run_name=job,
                             strategy=Strategy(gpu="H100-SXM", gpu_count=1, precision="fp32", micro_batch=2))
        handle = executor.submit(request)
        while True:
            snap = executor.snapshot(handle)
            if snap["progress"].checkpoints >= 1:
                break
            time.sleep(0.05)
        victim = next(n for n in nodes if n.node_id == snap["node_id"])
        killed_at = time.time()
        cluster.remove_node(victim, allow_graceful=False)
        nodes.remove(victim)
        while True:
            snap = executor.snapshot(handle)
            firsts = snap["first_step_at"]
            if len(firsts) >= 2 and firsts[1] is not None:
                break
            time.sleep(0.05)
        executor.cancel(handle)
        status = executor.wait(handle, timeout=300)
        assert status.state in (RunState.CANCELLED, RunState.SUCCEEDED), status.message
        restarted = snap["started_at"][1]
        booted = snap["booting_at"][1]
        return {"kill_to_worker_up_s": booted - killed_at, "worker_up_to_loop_ready_s": restarted - booted,
                "loop_ready_to_first_step_s": firsts[1] - restarted, "kill_to_first_step_s": firsts[1] - killed_at,
                "resumed_from_step": float(snap["progress"].resumed_from_step or 0)}
    finally:
        for node in nodes:
            cluster.remove_node(node)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()

    import logging

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "object_store_memory": 80 * 1024 * 1024,
                                                            "include_dashboard": False})
    ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
    runs: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpuplan-recovery-") as tmp:
            for i in range(args.repeats):
                runs.append(one_run(cluster, Path(tmp), i))
                print(json.dumps(runs[-1]), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    keys = ("kill_to_worker_up_s", "worker_up_to_loop_ready_s", "loop_ready_to_first_step_s", "kill_to_first_step_s")
    report = {"runs": runs, "median": {k: round(statistics.median(r[k] for r in runs), 2) for k in keys},
              "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
