"""`gpuplan calibrate`: recorded runs in, ~/.gpuplan/calibration.json out, then used by plan/estimate/run.

Team records go through the real store: jobs planned by the real planner, attempts closed by the
real scheduling loop with what a (scripted) executor measured. Local records come from real tiny
`gpuplan run`s on this CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import load_catalog
from cli import app
from commands.settings import Settings
from planner.calibration import apply_overrides, load_calibration
from planner.refit import Observation, predict
from planner.types import Strategy
from scheduler.client import local_client
from scheduler.loop.scheduling import Scheduler
from scheduler.store.models import JobCreate
from tests.scheduler.fakes import ScriptedExecutor
from tests.workers.tiny import write_config
from workers.executors.protocol import RunState

runner = CliRunner()
CATALOG = load_catalog()
SHIPPED = load_calibration()
TRUE = apply_overrides(SHIPPED, {"memory": {"activation_scale": 1.1},
                                 "throughput": {"mfu_max": {"bf16": 0.6}}})


def _spec(name: str, model: str, seq: int, mb: int) -> dict[str, object]:
    return {"name": name, "task": "train", "model": model,
            "train": {"tokens": 1e8, "seq_len": seq, "micro_batch": mb, "precision": "bf16"},
            "resources": {"accelerators": ["H200:1"], "spot": "never"}}


def _team_records(home: Path) -> None:
    """Nine jobs on one H200 that ran as the TRUE constants predict, closed through the real loop."""
    client = local_client(Settings.from_env({"GPUPLAN_HOME": str(home)}).database_url,
                          checkpoint_root=str(home / "checkpoints"))
    # Every one of these has activations in its peak (so a wrong activation_scale shows in each): job
    # ids are random, so which three are held out is too, and each must show the shipped error.
    specs = [_spec(f"job-{m[-2:]}-{seq}-{mb}", m, seq, mb) for m in ("llama-3.2-1b", "llama-3.2-3b")
             for seq in (2048, 4096) for mb in (2, 4, 8)][:9]
    jobs = [client.submit(JobCreate(spec=s)) for s in specs]
    ex = ScriptedExecutor()
    loop = Scheduler(client.service.store, ex)
    loop.tick()
    for job, spec in zip(jobs, specs, strict=True):
        detail = client.status(job.id)
        obs = Observation(id=job.id, gpu=CATALOG.gpu("H200"), model=CATALOG.model(str(spec["model"])),
                          strategy=detail.planned_run().strategy, measured={}, seq_len=int(spec["train"]["seq_len"]))  # type: ignore[index]
        truth = predict(obs, TRUE)
        ex.finish(ex.handle_of(job.id), RunState.SUCCEEDED,
                  {"measured_peak_allocated_bytes": truth["peak_allocated_bytes"],
                   "measured_peak_reserved_bytes": truth["peak_reserved_bytes"],
                   "measured_tokens_per_s": truth["tokens_per_s"]})
    loop.tick()
    assert all(client.status(j.id).attempt_list[0].metrics for j in jobs)


def test_team_attempts_refit_the_calibration_that_plan_and_estimate_then_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    _team_records(home)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec("probe", "llama-3.2-1b", 2048, 2)))
    estimate = ["estimate", str(spec), "--gpu", "H200", "--count", "1", "--json"]
    before = json.loads(runner.invoke(app, estimate).stdout)

    dry = runner.invoke(app, ["calibrate", "--source", "team", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "9 recorded runs: fitted on 6, judged on 3 held out" in dry.output and "not written" in dry.output
    assert not (home / "calibration.json").exists()

    result = runner.invoke(app, ["calibrate", "--source", "team", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["written"] and out["records"] == 9 and out["held_out"] == 3
    report = {r["quantity"]: r for r in out["report"]}
    assert report["tokens_per_s"]["kept"] and report["peak_allocated_bytes"]["kept"]
    assert report["tokens_per_s"]["median_after"] < 0.01 < report["tokens_per_s"]["median_before"]
    assert report["peak_allocated_bytes"]["median_after"] < 0.01 < report["peak_allocated_bytes"]["median_before"]
    saved = json.loads((home / "calibration.json").read_text())
    assert saved["overrides"]["throughput"]["mfu_max"]["bf16"] == pytest.approx(0.6, rel=0.03)
    assert sorted(saved["held_out_ids"]) == sorted(r["id"] for r in out["rows"] if r["quantity"] == "tokens_per_s")

    # estimate (and plan) now predict with the refit: what the TRUE constants say for this job
    after = json.loads(runner.invoke(app, estimate).stdout)
    strategy = Strategy.model_validate(after["strategy"])
    truth = predict(Observation(id="probe", gpu=CATALOG.gpu("H200"), model=CATALOG.model("llama-3.2-1b"),
                                strategy=strategy, measured={}, seq_len=2048), TRUE)
    assert after["throughput"]["tokens_per_s"] == pytest.approx(truth["tokens_per_s"], rel=0.01)
    assert after["throughput"]["tokens_per_s"] != pytest.approx(before["throughput"]["tokens_per_s"], rel=0.05)
    assert after["memory"]["peak_allocated_bytes"] == pytest.approx(truth["peak_allocated_bytes"], rel=0.01)
    planned = json.loads(runner.invoke(app, ["plan", str(spec), "--json"]).stdout)
    assert planned["chosen"]["estimate"]["throughput"]["tokens_per_s"] == pytest.approx(
        after["throughput"]["tokens_per_s"])

    table = runner.invoke(app, ["calibrate", "--source", "team"])
    assert table.exit_code == 0 and "held-out error" in table.output and "throughput.mfu_max.bf16" in table.output
    reset = runner.invoke(app, ["calibrate", "--reset"])
    assert reset.exit_code == 0 and "shipped calibration" in reset.output
    assert not (home / "calibration.json").exists()
    assert json.loads(runner.invoke(app, estimate).stdout)["throughput"] == before["throughput"]


def test_real_cpu_runs_are_records_and_too_few_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    config = write_config(tmp_path / "model")

    def run(i: int, mb: int) -> None:
        spec = {"name": f"tiny-{i}", "task": "train", "model": {"config": str(config)},
                "train": {"tokens": 6 * mb * 16, "seq_len": 16, "micro_batch": mb, "checkpoint_interval_steps": 100}}
        path = tmp_path / f"spec-{i}.yaml"
        path.write_text(yaml.safe_dump(spec))
        done = runner.invoke(app, ["run", str(path), "--json", "--checkpoint-dir", str(tmp_path / f"ck-{i}")])
        assert done.exit_code == 0, done.output

    for i, mb in enumerate((1, 2, 4)):
        run(i, mb)
    refused = runner.invoke(app, ["calibrate", "--json"])
    assert refused.exit_code == 2
    message = json.loads(refused.stdout)["error"]["message"]
    assert "needs at least 6 finished runs" in message and "found 3 (3 from local runs under" in message
    saved = json.loads((home / "runs" / "tiny-0" / "result.json").read_text())
    assert saved["planner_inputs"]["gpu"]["vendor"] == "cpu" and saved["planner_inputs"]["seq_len"] == 16

    for i, mb in enumerate((1, 2, 4), start=3):
        run(i, mb)
    result = runner.invoke(app, ["calibrate", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["records"] == 6 and out["fit"] == 4 and out["held_out"] == 2
    report = {r["quantity"]: r for r in out["report"]}
    assert report["tokens_per_s"]["held_out"] == 2  # a CPU run measures its rate, not CUDA memory
    assert report["peak_allocated_bytes"]["held_out"] == 0
    assert all(c["name"].startswith("cpu.throughput.") for c in out["changes"] + out["reverted"])
    if out["written"]:  # whether the refit beats the shipped CPU constants on held-out runs depends on this box
        cal = load_calibration(overlay=home / "calibration.json")
        for c in out["changes"]:
            section, key, *rest = c["name"].split(".")[1:]
            value = getattr(getattr(cal.cpu, section), key)
            assert (value[rest[0]] if rest else value) == pytest.approx(c["after"])
