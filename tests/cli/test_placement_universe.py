"""One placement universe: plan, estimate, report dry-run, submit and run choose the same placement for the
same spec on the same machine, for every example spec, on a CPU-only machine and on one with a local GPU.

The driver's answer is the one thing faked (this machine has no GPU); the catalog, the CPU probe, the planner,
the local database and the runner's planning are real. Each command runs in this process through CliRunner.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import catalog.local
from catalog.local import LocalDevice
from cli import app
from commands.specfile import load_spec
from errors import InvalidInput
from workers.executors.local_runner import plan_locally

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
L4 = LocalDevice(name="NVIDIA L4", count=1, memory_bytes=23_580_639_232, backend="cuda")
runner = CliRunner()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")  # one CPU probe for the module: every command sees the same CPU


def _json(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("device", [None, L4], ids=["cpu-only", "local-L4"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_command_chooses_the_plans_placement(path: Path, device: LocalDevice | None, home: Path,
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: device)
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    monkeypatch.setenv("GPUPLAN_DATABASE_URL", f"sqlite:///{tmp_path / 'jobs.db'}")
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_TEAM", "ml")
    assert runner.invoke(app, ["team", "create", "ml", "--budget", "100000", "--quota", "64"]).exit_code == 0
    plan = _json("plan", str(path), "--json")
    chosen = plan["chosen"]
    s, offer = chosen["estimate"]["strategy"], chosen["offer"]
    where = (s["gpu"], s["gpu_count"])
    [summary] = _json("report", "dry-run", str(path), "--out", str(tmp_path / "report"), "--json")["jobs"]
    assert summary["chosen"]["option"].startswith(f"{_label(plan)} on {offer['instance_type']}")
    est = _json("estimate", str(path), "--json")
    assert (est["strategy"]["gpu"], est["strategy"]["gpu_count"]) == where
    assert est["cost"]["offer"].startswith(f"{offer['cloud']} {offer['instance_type']}")
    job = _json("submit", str(path), "--json")
    assert (job["gpu"], job["gpus"], job["market"]) == (*where, chosen["cost"]["market"])
    assert _json("status", job["id"], "--json")["plan"]["chosen"]["offer"] == offer
    # run: the plan's placement where it is this machine's; else the best of this machine's, or a refusal
    local = [c for c in plan["candidates"] if c["offer"]["cloud"] == "local"]
    try:
        ran = plan_locally(load_spec(path), home=home).strategy
    except InvalidInput:
        assert offer["cloud"] != "local"  # a plan for this machine always runs here
        return
    if offer["cloud"] == "local":
        assert (ran.gpu, ran.gpu_count) == where
    elif local:
        assert ran.gpu == local[0]["estimate"]["strategy"]["gpu"]
    if path.stem.startswith("tiny"):  # the tiny examples run on this machine (its CPU, or its GPU)
        assert offer["cloud"] == "local"


def _label(plan: dict[str, Any]) -> str:
    from planner.types import Strategy

    return Strategy.model_validate(plan["chosen"]["estimate"]["strategy"]).label()


@pytest.mark.parametrize("gpu", ["cpu", "CPU"])
def test_accelerators_cpu_pins_this_machines_cpu_in_plan_and_estimate(gpu: str, home: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: None)
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    spec = tmp_path / "pinned.yaml"
    spec.write_text(f"name: pinned\ntask: train\nmodel: tiny-llama\ntrain: {{tokens: 32768, seq_len: 128}}\n"
                    f"resources: {{accelerators: [{gpu}]}}\n")
    plan = _json("plan", str(spec), "--json")
    assert plan["chosen"]["offer"]["cloud"] == "local" and plan["chosen"]["estimate"]["strategy"]["gpu"] == "cpu"
    est = _json("estimate", str(spec), "--gpu", gpu, "--json")
    assert est["strategy"]["gpu"] == "cpu" and est["cost"]["usd"] == 0


def test_cpu_inference_is_planned_in_fp32_as_the_worker_runs_it(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: None)
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    infer = next(p for p in EXAMPLES if p.name == "tiny-infer.yaml")
    plan = _json("plan", str(infer), "--json", "--objective", "cheapest")
    strategy = plan["chosen"]["estimate"]["strategy"]
    assert (strategy["gpu"], strategy["weights"]) == ("cpu", "fp32")
    assert plan_locally(load_spec(infer), home=home).strategy.weights == "fp32"
