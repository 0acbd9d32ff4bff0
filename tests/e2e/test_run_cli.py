"""`gpuplan run`: the embedded default end to end (in-process loop, local checkpoints, --json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from tests.workers.tiny import write_config


@pytest.fixture()
def spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    config = write_config(tmp_path / "model")
    spec = {"name": "e2e-tiny", "task": "train", "model": {"config": str(config)},
            "train": {"tokens": 10 * 2 * 16, "seq_len": 16, "micro_batch": 2, "checkpoint_interval_steps": 4}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_run_json_prints_the_finished_job_and_refuses_to_clobber_it(spec_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    ckpt = tmp_path / "ck"
    result = runner.invoke(app, ["run", str(spec_file), "--json", "--checkpoint-dir", str(ckpt)])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    assert job["status"] == "succeeded" and job["steps"] == 10 and job["total_steps"] == 10
    assert job["checkpoints_written"] == 3 and job["resumes"] == 0  # steps 4, 8 and the last, 10
    assert job["final_loss"] > 0 and job["engine"] == "in-process" and job["device"] == "cpu"
    assert job["measured"]["tokens_per_s"] > 0 and job["measured"]["peak_rss_bytes"] > 0
    assert job["measured"]["checkpoint_interval_steps"] == 4 and job["measured"]["checkpoint_durable_s"] > 0
    # the one predicted block of every predicted-vs-measured record (planner.prediction), as attempts keep it
    assert set(job["predicted"]) == {"peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s", "prefill_s",
                                     "decode_step_s", "wall_s", "hours", "micro_batch", "gpu", "gpu_count", "label"}
    # a training run has no prompt pass or decode step, planned or measured; a CPU plan prices no wall time
    assert job["predicted"]["prefill_s"] is None and job["measured"]["decode_step_s"] is None
    assert job["predicted"]["wall_s"] is None and job["predicted"]["hours"] > 0
    assert (job["predicted"]["gpu"], job["predicted"]["label"]) == ("cpu", job["strategy_label"])
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))[-1] == "step-000000010"
    saved = json.loads((tmp_path / "home" / "runs" / "e2e-tiny" / "result.json").read_text())
    assert saved["final_loss"] == job["final_loss"]

    again = runner.invoke(app, ["run", str(spec_file), "--json", "--checkpoint-dir", str(ckpt)])
    assert again.exit_code == 5
    assert "already holds checkpoints" in json.loads(again.stdout)["error"]["message"]

    resumed = runner.invoke(app, ["run", str(spec_file), "--json", "--checkpoint-dir", str(ckpt), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    job = json.loads(resumed.stdout)
    assert job["resumes"] == 1 and job["resumed_from_step"] == 10 and job["steps"] == 10


def test_run_table_output_and_bad_spec(spec_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["run", str(spec_file), "--checkpoint-dir", str(tmp_path / "ck2")])
    assert result.exit_code == 0, result.output
    assert "e2e-tiny: succeeded" in result.output and "10 / 10" in result.output

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"task": "train", "model": {"config": str(tmp_path / "missing.json")},
                                   "train": {"tokens": 100}}))
    failed = runner.invoke(app, ["run", str(bad), "--json"])
    assert failed.exit_code == 2
    assert "does not exist" in json.loads(failed.stdout)["error"]["message"]
