"""`gpuplan cluster check` and `gpuplan cluster config` through the real CLI: a missing credential or an
unreachable endpoint is one line and its own exit code, never a traceback; check lists what to fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from tests.moto_server import moto_server, use_moto

runner = CliRunner()


@contextmanager
def fresh_account() -> Iterator[str]:
    """moto's server with an empty account: moto keeps its state per process, across servers, so what
    another test made (or this one makes) is reset on the way in and out."""
    import httpx

    with moto_server() as url:
        httpx.post(f"{url}/moto-api/reset").raise_for_status()
        try:
            yield url
        finally:
            httpx.post(f"{url}/moto-api/reset").raise_for_status()


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    resources = {"clouds": ["aws"], "regions": ["us-east-1"], "accelerators": ["H200:16"]}
    path.write_text(yaml.safe_dump({"name": "demo", "task": "train", "model": "llama-3-8b",
                                    "train": {"tokens": 1.0e9}, "resources": resources}))
    return path


def _no_aws_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to find either
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")


def _commands(spec: Path, tmp_path: Path) -> dict[str, list[str]]:
    wheel = tmp_path / "gpuplan-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    return {"check": ["cluster", "check", str(spec)],
            "config": ["cluster", "config", str(spec), "--wheel", str(wheel), "--out", str(tmp_path / "c.yaml")]}


def test_no_credentials_is_one_line_and_exit_8(spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_config(monkeypatch, tmp_path)
    for name, args in _commands(spec, tmp_path).items():
        result = runner.invoke(app, args)
        assert result.exit_code == 8, (name, result.output)
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
        assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "no AWS credentials" in result.stderr and "AWS_PROFILE" in result.stderr
        as_json = runner.invoke(app, [*args, "--json"])
        assert as_json.exit_code == 8 and json.loads(as_json.stdout)["error"]["code"] == "cloud_credentials_missing"


def test_an_unreachable_endpoint_is_one_line_and_exit_9(spec: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _no_aws_config(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard: nothing listens
    for name, args in _commands(spec, tmp_path).items():
        result = runner.invoke(app, args)
        assert result.exit_code == 9, (name, result.output)
        assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "cannot reach AWS" in result.stderr


def test_check_lists_what_to_fix_and_exits_1(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    with fresh_account() as url:
        use_moto(monkeypatch, url)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        ami = boto3.client("ec2").register_image(Name="gpuplan-test-dlami", RootDeviceName="/dev/sda1")["ImageId"]
        result = runner.invoke(app, ["cluster", "check", str(spec), "--ami", ami, "--json"])
        table = runner.invoke(app, ["cluster", "check", str(spec), "--ami", ami])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    items = {item["name"]: item for item in doc["items"]}
    assert doc["ready"] is False
    assert items["GPU AMI"]["status"] == "ok" and items["spot service-linked role"]["status"] == "fix"
    assert items["instance profile"]["status"] == "fix" and "does not exist" in items["instance profile"]["detail"]
    assert table.exit_code == 1 and "not ready" in table.stdout and "Traceback" not in table.output


def test_config_resolves_a_relative_wheel_and_check_reads_its_yaml(spec: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The YAML is read by `ray up` from wherever it runs: the wheel's mount is this folder's file; `cluster check`
    takes that YAML as written."""
    import boto3

    from tests.workers.cluster_setup import FakePlacementGroups

    monkeypatch.setattr("workers.cluster.aws.Ec2PlacementGroups", lambda ec2, cluster: FakePlacementGroups())
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "gpuplan-0.1.0-py3-none-any.whl").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with fresh_account() as url:
        use_moto(monkeypatch, url)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
        iam = boto3.client("iam")
        iam.create_role(RoleName="gpuplan-node", AssumeRolePolicyDocument="{}")
        iam.create_instance_profile(InstanceProfileName="gpuplan-node")
        iam.add_role_to_instance_profile(InstanceProfileName="gpuplan-node", RoleName="gpuplan-node")
        ami = boto3.client("ec2").register_image(Name="gpuplan-test-dlami", RootDeviceName="/dev/sda1")["ImageId"]
        result = runner.invoke(app, ["cluster", "config", str(spec), "--ami", ami, "--out", "c.yaml",
                                     "--wheel", "dist/gpuplan-0.1.0-py3-none-any.whl"])
        checked = runner.invoke(app, ["cluster", "check", "c.yaml", "--json"])  # the YAML as written
    assert result.exit_code == 0, result.output
    items = {item["name"]: item for item in json.loads(checked.stdout)["items"]}
    assert checked.exit_code == 1 and items["AMIs"]["status"] == "ok" and ami in items["AMIs"]["detail"]
    assert items["spot service-linked role"]["status"] == "fix"
    mounts = yaml.safe_load((tmp_path / "c.yaml").read_text())["file_mounts"]
    wheels = [source for source in mounts.values() if source.endswith(".whl")]
    assert wheels == [str(tmp_path / "dist" / "gpuplan-0.1.0-py3-none-any.whl")]
