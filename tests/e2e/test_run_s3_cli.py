"""`gpuplan run --checkpoint-dir s3://...`, `--resume` and `gpuplan export` on S3 (moto's server), as the
server's S3 checkpoint root does: the checkpoints land in the bucket, not in a local folder named "s3:"."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from tests.moto_server import moto_s3, moto_server, use_moto
from tests.workers.tiny import write_config


def test_run_resume_and_export_on_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    config = write_config(tmp_path / "model")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "s3-tiny", "task": "train", "model": {"config": str(config)},
                                    "train": {"tokens": 6 * 2 * 16, "seq_len": 16, "micro_batch": 2,
                                              "checkpoint_interval_steps": 3}}))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    runner = CliRunner()
    with moto_server() as url:
        use_moto(monkeypatch, url)
        s3 = moto_s3(url)
        bucket = f"gpuplan-runs-{uuid.uuid4().hex[:8]}"  # moto's buckets outlive its server, within the process
        s3.create_bucket(Bucket=bucket)
        uri = f"s3://{bucket}/team/s3-tiny"
        result = runner.invoke(app, ["run", str(spec), "--json", "--checkpoint-dir", uri])
        assert result.exit_code == 0, result.output
        job = json.loads(result.stdout)
        assert job["status"] == "succeeded" and job["checkpoint_dir"] == uri and job["checkpoints_written"] == 2
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        assert "team/s3-tiny/step-000000006/COMMIT" in keys
        assert list(work.iterdir()) == []  # nothing local: no folder named "s3:"

        again = runner.invoke(app, ["run", str(spec), "--json", "--checkpoint-dir", uri])
        assert again.exit_code == 5 and "already holds checkpoints" in json.loads(again.stdout)["error"]["message"]
        resumed = runner.invoke(app, ["run", str(spec), "--json", "--checkpoint-dir", uri + "/", "--resume"])
        assert resumed.exit_code == 0, resumed.output
        assert json.loads(resumed.stdout)["resumed_from_step"] == 6

        exported = runner.invoke(app, ["export", uri, "--out", str(tmp_path / "model-out"), "--json"])
        assert exported.exit_code == 0, exported.output
        assert json.loads(exported.stdout)["step"] == 6
        missing = runner.invoke(app, ["run", str(spec), "--json", "--checkpoint-dir", "s3://no-such-gpuplan-bucket/x"])
        assert missing.exit_code != 0 and "does not exist" in json.loads(missing.stdout)["error"]["message"]
