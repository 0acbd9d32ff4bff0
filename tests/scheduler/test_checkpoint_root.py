"""The server's checkpoint root: s3://bucket/prefix end to end (no Path mangling), Ray's storage next to it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from errors import InvalidInput
from scheduler.composition import checkpoint_root_for, make_executor, ray_storage_for
from scheduler.service import ADMIN, SchedulerService
from scheduler.store.database import Store
from scheduler.store.models import JobCreate, TeamCreate
from tests.moto_server import moto_s3, moto_server, use_moto
from tests.scheduler.conftest import spec_dict, toy_plan
from workers.executors.ray_executor import RayExecutor

BUCKET = "gpuplan-root-test"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        moto_s3(url).create_bucket(Bucket=BUCKET)
        yield url


@pytest.fixture
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    use_moto(monkeypatch, moto_url)
    return moto_url


def test_roots_keep_their_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert checkpoint_root_for(f"s3://{BUCKET}/team/runs/", tmp_path) == f"s3://{BUCKET}/team/runs"
    assert checkpoint_root_for(f"s3://{BUCKET}", tmp_path) == f"s3://{BUCKET}"
    assert checkpoint_root_for(None, tmp_path) == str(tmp_path / "checkpoints")
    monkeypatch.chdir(tmp_path)
    assert checkpoint_root_for("ckpt", Path("/nowhere")) == str(tmp_path / "ckpt")
    assert checkpoint_root_for(f"file://{tmp_path}/x", Path("/nowhere")) == str(tmp_path / "x")
    with pytest.raises(InvalidInput, match="unsupported checkpoint root"):
        checkpoint_root_for("gs://bucket/x", tmp_path)
    with pytest.raises(InvalidInput, match="names no bucket"):
        checkpoint_root_for("s3:///x", tmp_path)
    assert ray_storage_for(f"s3://{BUCKET}/runs") == f"s3://{BUCKET}/runs/_ray"
    assert ray_storage_for(str(tmp_path)) is None


@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
def test_jobs_checkpoint_under_the_s3_root_and_ray_stores_next_to_it(store: Store, tmp_path: Path) -> None:
    root = checkpoint_root_for(f"s3://{BUCKET}/runs/", tmp_path)
    service = SchedulerService(store, toy_plan, checkpoint_root=root, admin_token="admin")
    service.create_team(ADMIN, TeamCreate(name="ml"))
    ml = service.authenticate(service.create_token(ADMIN, "ml").token)
    job = service.submit(ml, JobCreate(spec=spec_dict()))
    assert job.checkpoint_uri == f"s3://{BUCKET}/runs/{job.id}"
    cluster_yaml = tmp_path / "ray_bootstrap_config.yaml"
    cluster_yaml.write_text("head_node_type: head\navailable_node_types:\n  head: {resources: {}, node_config: {}}\n"
                            "  w: {max_workers: 2, resources: {GPU: 8, 'gpuplan-market:spot': 8}, node_config: {}}\n")
    executor = make_executor("ray", storage_path=ray_storage_for(root), ray_cluster_config=str(cluster_yaml))
    assert isinstance(executor, RayExecutor)
    assert executor._storage_path == f"s3://{BUCKET}/runs/_ray"
    assert executor._node_types == (({"GPU": 8.0, "gpuplan-market:spot": 8.0}, 2),)


def test_the_server_refuses_a_missing_bucket_before_serving(aws_env: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path))
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = CliRunner().invoke(app, ["server", "--port", str(port), "--executor", "none",
                                      "--checkpoint-root", "s3://no-such-gpuplan-root/x"])
    assert result.exit_code != 0
    assert "no-such-gpuplan-root" in result.output and "does not exist" in result.output
