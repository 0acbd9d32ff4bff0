"""Inference under an S3 checkpoint root (moto's server): the outputs reach s3://bucket/prefix/outputs.jsonl,
and an attempt on another node resumes from that object, not from a node's disk."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from errors import InvalidInput
from planner.spec import spec_from_dict
from tests.moto_server import moto_server
from tests.workers.tiny import cpu_strategy, write_config
from workers.executors.inprocess import InProcessExecutor
from workers.executors.protocol import RunRequest, RunState
from workers.infer.job import outputs_folder
from workers.infer.s3_outputs import S3Outputs

BUCKET = "gpuplan-test-outputs"


@pytest.fixture()
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    with moto_server() as url:
        for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            monkeypatch.delenv(key, raising=False)
        for key, value in {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(key, value)
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        yield client


def _on_node(monkeypatch: pytest.MonkeyPatch, disk: Path) -> None:
    """Run as if on a node whose local disk (temp directory) is ``disk``."""
    disk.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(disk))


def _request(tmp_path: Path, uri: str, requests: int = 5) -> RunRequest:
    config = write_config(tmp_path / "m")
    spec = spec_from_dict({"name": "gen", "task": "infer", "model": {"config": str(config)},
                           "infer": {"batch": 2, "prompt_tokens": 6, "output_tokens": 3, "requests": requests}})
    return RunRequest(job_id="gen", attempt=1, spec=spec, strategy=cpu_strategy(), checkpoint_uri=uri, run_name="gen")


def _object_lines(client: object, key: str) -> list[str]:
    body = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()  # type: ignore[attr-defined]
    return [line for line in body.decode().splitlines() if line]


def test_outputs_reach_s3_and_another_node_resumes_from_them(s3: object, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    uri = f"s3://{BUCKET}/runs/gen"
    request = _request(tmp_path, uri)
    _on_node(monkeypatch, tmp_path / "node-a")
    executor = InProcessExecutor()
    first = executor.wait(executor.submit(request), 120)
    assert first.state is RunState.SUCCEEDED, first.message
    lines = _object_lines(s3, "runs/gen/outputs.jsonl")
    assert sorted(json.loads(line)["index"] for line in lines) == [0, 1, 2, 3, 4]
    # node A is gone; node B keeps only the first two records (as if A's last puts never came)
    s3.put_object(Bucket=BUCKET, Key="runs/gen/outputs.jsonl",  # type: ignore[attr-defined]
                  Body=("\n".join(lines[:2]) + "\n").encode())
    _on_node(monkeypatch, tmp_path / "node-b")
    again = executor.wait(executor.submit(dataclasses.replace(request, attempt=2)), 120)
    assert again.state is RunState.SUCCEEDED, again.message
    assert again.progress.resumed_from_step == 2
    resumed = _object_lines(s3, "runs/gen/outputs.jsonl")
    assert resumed[:2] == lines[:2] and len(resumed) == 5  # none redone twice, none missing
    assert resumed == lines  # same seed, same requests: the redone three are the same records
    assert outputs_folder(request).is_relative_to(tmp_path / "node-b")  # the node's copy, not the root


def test_puts_follow_the_interval(s3: object, tmp_path: Path) -> None:
    """After a batch the copy is put only once ``every_s`` has passed (a clock the test moves)."""
    now = [0.0]
    local = tmp_path / "outputs.jsonl"
    remote = S3Outputs(f"s3://{BUCKET}/clock", local, every_s=30.0, clock=lambda: now[0])
    assert remote.download() == 0 and not local.exists()
    local.write_text('{"id": "a"}\n')
    remote.upload_if_due()
    with pytest.raises(Exception, match=r"NoSuchKey|Not Found|404"):
        s3.head_object(Bucket=BUCKET, Key="clock/outputs.jsonl")  # type: ignore[attr-defined]
    now[0] = 30.0
    remote.upload_if_due()
    assert _object_lines(s3, "clock/outputs.jsonl") == ['{"id": "a"}']
    local.write_text('{"id": "a"}\n{"id": "b"}\n')
    now[0] = 40.0
    remote.upload_if_due()
    assert len(_object_lines(s3, "clock/outputs.jsonl")) == 1
    remote.upload()
    assert len(_object_lines(s3, "clock/outputs.jsonl")) == 2
    assert remote.download() == local.stat().st_size > 0


def test_a_missing_bucket_and_other_stores_are_refused(s3: object, tmp_path: Path) -> None:
    executor = InProcessExecutor()
    status = executor.wait(executor.submit(_request(tmp_path, "s3://no-such-gpuplan-bucket/x")), 120)
    assert status.state is RunState.FAILED and "does not exist" in status.message
    with pytest.raises(InvalidInput, match="cannot go to"):
        outputs_folder(_request(tmp_path, "gs://bucket/x"))
