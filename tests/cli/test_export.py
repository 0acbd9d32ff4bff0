"""`gpuplan export` through the CLI: each stage reported on stderr as it starts, the result alone on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config
from workers.train.loop import TrainJob, run_training

RUNNER = CliRunner()


def _lora_checkpoint(tmp_path: Path) -> str:
    uri = str(tmp_path / "ck")
    spec = tiny_spec(write_config(tmp_path / "m"), steps=2, interval=2, seed=5, finetune="lora", lora_rank=4)
    result = run_training(TrainJob(job_id="cli-exp", spec=spec, checkpoint_uri=uri, device="cpu", cpu_threads=1,
                                   strategy=cpu_strategy(finetune="lora", lora_rank=4)))
    assert result.status == "succeeded"
    return uri


def test_export_reports_each_stage_on_stderr_and_keeps_json_on_stdout(tmp_path: Path) -> None:
    uri = _lora_checkpoint(tmp_path)
    merged = RUNNER.invoke(app, ["export", uri, "--out", str(tmp_path / "merged"), "--merge", "--json"])
    assert merged.exit_code == 0, merged.output
    body = json.loads(merged.stdout)
    assert body["kind"] == "merged" and body["adapter"] == str(tmp_path / "merged" / "adapter")
    stages = _stages(merged.stderr)
    assert [stage.split(" ")[0] for stage in stages] == ["reading", "writing", "building", "merging", "writing"]
    assert stages[2].startswith("building the base model") and stages[2].endswith("on cpu ...")

    adapter = RUNNER.invoke(app, ["export", uri, "--out", str(tmp_path / "adapter")])
    assert adapter.exit_code == 0, adapter.output
    assert "peft adapter on a random init of" in adapter.stdout and "(seed 5;" in adapter.stdout
    assert [stage.split(" ")[0] for stage in _stages(adapter.stderr)] == ["reading", "writing"]


def _stages(stderr: str) -> list[str]:
    """The stage lines ("[   1.2 s] building the base model ... on cuda ..."), without libraries' warnings."""
    return [line.split(" s] ", 1)[1] for line in stderr.splitlines() if line.startswith("[") and " s] " in line]
