"""A job the planner put on the CPU runs on a Ray node by its CPUs alone (the shared local cluster's
head node has 2 CPUs and no GPU)."""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pytest

from catalog.loader import PACKAGED_DATA_DIR, load_catalog, resolve_model
from catalog.local_cpu import CpuProbe, cpu_offer, cpu_spec
from planner.calibration import load_calibration
from planner.search import plan
from planner.spec import spec_from_dict
from planner.types import Strategy
from tests.workers.tiny import write_config
from workers.executors.protocol import RunRequest, RunState
from workers.executors.ray_executor import RayExecutor

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

pytestmark = pytest.mark.ray
PROBE = CpuProbe(machine="node", model_name="test CPU", cores=2, threads=1, ram_bytes=8 * 2**30, fp32_gflops=50.0,
                 memory_gbps=10.0, measured_s=0.2)


def test_a_cpu_planned_job_runs_on_a_cpu_only_node(ray_cluster: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path / "m")
    spec = spec_from_dict({"name": "tiny", "task": "train", "model": {"config": str(config)},
                           "train": {"tokens": 6 * 2 * 16, "seq_len": 16, "micro_batch": 2,
                                     "checkpoint_interval_steps": 3, "learning_rate": 1e-2},
                           "resources": {"accelerators": ["cpu"]}})
    cpu = cpu_spec(PROBE, today=date(2026, 12, 1))
    catalog = load_catalog(PACKAGED_DATA_DIR).with_gpus([cpu], [cpu_offer(cpu, PROBE, today=date(2026, 12, 1))])
    chosen = plan(spec, catalog, model=resolve_model(catalog, config), calibration=CAL).chosen
    assert chosen is not None and chosen.estimate.strategy.gpu == "cpu"
    request = RunRequest(job_id="ray-cpu-planned", attempt=1, spec=spec, strategy=chosen.estimate.strategy,
                         checkpoint_uri=str(tmp_path / "ck"), run_name="ray-cpu-planned")
    executor = RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0)
    assert executor.feasibility(request) is None
    on_gpu = RunRequest(job_id="ray-l4", attempt=1, spec=spec, strategy=Strategy(gpu="L4", gpu_count=1),
                        checkpoint_uri=str(tmp_path / "ck-l4"), run_name="ray-l4")
    assert "no node has accelerator_type:L4" in str(executor.feasibility(on_gpu))
    handle = executor.submit(request)
    status = executor.wait(handle, timeout=600)
    assert status.state is RunState.SUCCEEDED, (status.message, executor.logs(handle)[-5:])
    assert status.progress.step == 6
    assert any("on 1 x cpu" in line for line in executor.logs(handle))
    executor.release(handle)
