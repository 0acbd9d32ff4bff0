"""Two ranks, each on its own "node" (its own home and working directory, nothing shared on disk),
checkpoint to s3://bucket/prefix on moto's server; both die mid-run and both resume from the step in S3.

This is what a cluster from `gpuplan cluster config --checkpoint-root s3://...` relies on: a rank on
another node, or a node that replaced a preempted rank-0 node, finds the step.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.moto_server import moto_server
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config

pytestmark = pytest.mark.slow
BUCKET = "gpuplan-resume-test"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, port: int, model: str, node_dir: str, uri: str, sharding: str, results: Any) -> None:
    os.environ["HOME"] = node_dir  # this rank's node: nothing of the other rank's disk is reachable by path
    os.chdir(node_dir)
    import torch.distributed as dist

    from workers.hooks import TrainHooks
    from workers.train import TrainJob, run_training

    class KillAt(TrainHooks):
        def fault(self, step: int, where: str) -> None:
            if (step, where) == (5, "backward"):
                raise RuntimeError("killed")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        spec = tiny_spec(Path(model) / "config.json", steps=8, interval=3, world=2)
        job = TrainJob(job_id="s3", spec=spec, strategy=cpu_strategy(workers=2, sharding=sharding), checkpoint_uri=uri,
                       device="cpu", cpu_threads=1, log_every_s=60.0)
        try:
            run_training(job, KillAt())
        except RuntimeError:
            pass
        else:
            raise AssertionError("the first run was not killed")
        resumed = run_training(job)
        results.put((rank, resumed.resumed_from_step, resumed.steps))
    finally:
        dist.destroy_process_group()


def test_ranks_on_different_nodes_resume_from_the_step_in_s3(moto_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP: rank 0 alone writes the checkpoint, and rank 1, on another node, resumes from it. (FSDP ranks
    write their own shards through the same store; ~55 s a case here, so one case.)"""
    sharding = "ddp"
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {"AWS_ENDPOINT_URL": moto_url, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)  # the spawned ranks inherit it
    s3 = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    write_config(tmp_path / "m")
    nodes = [tmp_path / f"node{rank}" for rank in range(2)]
    for node in nodes:
        node.mkdir()
    uri = f"s3://{BUCKET}/runs/{sharding}"
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, port, str(tmp_path / "m"), str(nodes[rank]), uri, sharding,
                                                  results)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0]
    assert sorted(results.get(timeout=5) for _ in range(2)) == [(0, 3, 8), (1, 3, 8)]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{sharding}/")["Contents"]]
    assert any(k.endswith("COMMIT") for k in keys), keys
    assert not any(any(node.rglob("*.pt")) or any(node.rglob("COMMIT")) for node in nodes), "nothing on a node's disk"
