"""Two ranks, each on its own "node" (its own home and working directory, nothing shared on disk),
checkpoint to s3://bucket/prefix on moto's server; both die mid-run and both resume from the step in S3.

This is what a cluster from `gpuplan cluster config --checkpoint-root s3://...` relies on: a rank on
another node, or a node that replaced a preempted rank-0 node, finds the step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.moto_server import moto_server, use_moto
from tests.workers.ranks import KillAt, gloo, run_ranks
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config

pytestmark = pytest.mark.slow
BUCKET = "gpuplan-resume-test"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with moto_server() as url:
        yield url


def _rank_main(rank: int, port: int, results: Any, model: str, nodes: list[str], uri: str, sharding: str) -> None:
    os.environ["HOME"] = nodes[rank]  # this rank's node: nothing of the other rank's disk is reachable by path
    os.chdir(nodes[rank])
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
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


def test_ranks_on_different_nodes_resume_from_the_step_in_s3(moto_url: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP: rank 0 alone writes the checkpoint, and rank 1, on another node, resumes from it. (FSDP ranks
    write their own shards through the same store; ~55 s a case here, so one case.)"""
    sharding = "ddp"
    use_moto(monkeypatch, moto_url)  # the spawned ranks inherit it
    s3 = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    write_config(tmp_path / "m")
    nodes = [tmp_path / f"node{rank}" for rank in range(2)]
    for node in nodes:
        node.mkdir()
    uri = f"s3://{BUCKET}/runs/{sharding}"
    results = run_ranks(_rank_main, str(tmp_path / "m"), [str(node) for node in nodes], uri, sharding, results=2)
    assert sorted(results) == [(0, 3, 8), (1, 3, 8)]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{sharding}/")["Contents"]]
    assert any(k.endswith("COMMIT") for k in keys), keys
    assert not any(any(node.rglob("*.pt")) or any(node.rglob("COMMIT")) for node in nodes), "nothing on a node's disk"
