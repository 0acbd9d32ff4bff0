"""Two ranks over gloo on CPU (the way TorchTrainer runs them): DDP and FSDP2 train, checkpoint a full
state dict from rank 0, and resume exactly after both ranks die mid-run."""

from __future__ import annotations

import multiprocessing
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(rank: int, port: int, folder: str, sharding: str, results: Any) -> None:
    import torch.distributed as dist

    from workers.hooks import TrainHooks
    from workers.train import TrainJob, run_training

    class KillAt(TrainHooks):
        def fault(self, step: int, where: str) -> None:
            if (step, where) == (5, "backward"):
                raise RuntimeError("killed")

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=8, interval=3, world=2)
        strategy = cpu_strategy(workers=2, sharding=sharding)

        def job(uri: str) -> TrainJob:
            return TrainJob(job_id="dist", spec=spec, strategy=strategy, checkpoint_uri=uri, device="cpu",
                            cpu_threads=1, log_every_s=60.0)

        run_training(job(str(root / "ref")))
        killed = False
        try:
            run_training(job(str(root / "ck")), KillAt())
        except RuntimeError:
            killed = True
        assert killed
        resumed = run_training(job(str(root / "ck")))
        results.put((rank, resumed.resumed_from_step, resumed.steps, resumed.world_size))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sharding", ["ddp", "fsdp"])
def test_two_ranks_resume_exactly(tmp_path: Path, sharding: str) -> None:
    write_config(tmp_path / "m")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, port, str(tmp_path), sharding, results)) for rank in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    assert [p.exitcode for p in procs] == [0, 0]
    got = sorted(results.get(timeout=5) for _ in range(2))
    assert got == [(0, 3, 8, 2), (1, 3, 8, 2)]
    assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])
