"""Two ranks over gloo on CPU (the way TorchTrainer runs them): DDP and FSDP2 train, checkpoint a full
state dict from rank 0, and resume exactly after both ranks die mid-run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.workers.ranks import KillAt, gloo, run_ranks
from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config

pytestmark = pytest.mark.slow


def _rank_main(rank: int, port: int, results: Any, folder: str, sharding: str, extra: dict[str, Any]) -> None:
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=8, interval=3, world=2)
        strategy = cpu_strategy(workers=2, sharding=sharding, **extra)

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


# QLoRA's NF4 needs weights that fill whole 64 x 256 blocks on each rank: a wider tiny model has them
QLORA = ({"finetune": "qlora", "precision": "bf16", "lora_rank": 4}, {"hidden_size": 256, "intermediate_size": 512})
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "ddp": ("ddp", {}, {}), "fsdp": ("fsdp", {}, {}), "fsdp-grad-op": ("fsdp-grad-op", {}, {}),
    "ddp-qlora": ("ddp", *QLORA), "fsdp-qlora": ("fsdp", *QLORA),
    # bf16 weights sharded by FSDP2 (DTensor parameters), AdamW steps rounded stochastically on each shard
    "fsdp-bf16-sr": ("fsdp", {"precision": "bf16"}, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_resume_exactly(tmp_path: Path, case: str) -> None:
    sharding, extra, config = CASES[case]
    write_config(tmp_path / "m", **config)
    got = sorted(run_ranks(_rank_main, str(tmp_path), sharding, extra, results=2))
    assert got == [(0, 3, 8, 2), (1, 3, 8, 2)]
    assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])


def _losses_main(rank: int, port: int, results: Any, folder: str) -> None:
    """fsdp and fsdp-grad-op on the same data: every step's loss, and the final weights."""
    from workers.train.hooks import TrainHooks
    from workers.train.loop import TrainJob, run_training

    class Losses(TrainHooks):
        def __init__(self) -> None:
            self.losses: list[float] = []

        def on_progress(self, progress: dict[str, Any]) -> None:
            if progress.get("event") == "step":
                self.losses.append(float(progress["loss"]))

    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=6, interval=6, world=2, grad_accum=2)
        for sharding in ("fsdp", "fsdp-grad-op"):
            hooks = Losses()
            strategy = cpu_strategy(workers=2, sharding=sharding, grad_accum=2)
            job = TrainJob(job_id=sharding, spec=spec, strategy=strategy, checkpoint_uri=str(root / sharding),
                           device="cpu", cpu_threads=1, log_every_s=0.0)
            run_training(job, hooks)
            if rank == 0:
                results.put((sharding, hooks.losses))


def test_fsdp_grad_op_trains_like_fsdp(tmp_path: Path) -> None:
    """Keeping parameters gathered between forward and backward changes when they are gathered, not
    the arithmetic: the same losses step by step (to float rounding) and the same final weights."""

    write_config(tmp_path / "m")
    losses = dict(run_ranks(_losses_main, str(tmp_path), results=2))
    assert len(losses["fsdp"]) == 6
    assert losses["fsdp-grad-op"] == pytest.approx(losses["fsdp"], rel=1e-5)
    assert losses["fsdp"][-1] < losses["fsdp"][0]  # it did train
    assert_same_weights(final_state(str(tmp_path / "fsdp-grad-op"))[1], final_state(str(tmp_path / "fsdp"))[1],
                        rtol=1e-5, atol=1e-6)


def _fsdp_reference_main(rank: int, port: int, _results: Any, folder: str) -> None:
    """Two FSDP ranks, micro-batch 2: 8 steps, a checkpoint every 4."""
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=8, interval=4, world=2)
        run_training(TrainJob(job_id="reshard", spec=spec, strategy=cpu_strategy(workers=2, sharding="fsdp"),
                              checkpoint_uri=str(root / "ref"), device="cpu", cpu_threads=1, log_every_s=60.0))


def test_an_fsdp_checkpoint_resumes_on_another_world_size(tmp_path: Path) -> None:
    """Two FSDP ranks write their own shards; one process without FSDP resumes from them (each tensor
    put back together) and, with the same global batch (grad_accum 2 instead of 2 ranks: the same
    sequences per step), ends where the two ranks did."""
    import shutil

    from workers.checkpoint.local import step_dirname
    from workers.train.loop import TrainJob, run_training

    write_config(tmp_path / "m")
    run_ranks(_fsdp_reference_main, str(tmp_path))
    shutil.copytree(tmp_path / "ref", tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck" / step_dirname(8))  # as if the two ranks had stopped after step 4

    spec = tiny_spec(tmp_path / "m" / "config.json", steps=8, interval=4, world=2)  # the same tokens
    one = TrainJob(job_id="reshard", spec=spec, strategy=cpu_strategy(workers=1, grad_accum=2),
                   checkpoint_uri=str(tmp_path / "ck"), device="cpu", cpu_threads=1, log_every_s=60.0)
    result = run_training(one)
    assert (result.resumed_from_step, result.steps, result.world_size) == (4, 8, 1)
    ref, got = final_state(str(tmp_path / "ref")), final_state(str(tmp_path / "ck"))
    assert ref[0] == got[0] == 8
    assert_same_weights(got[1], ref[1], rtol=1e-4, atol=1e-5)  # the same arithmetic in another order


def _fsdp_resume_main(rank: int, port: int, _results: Any, folder: str) -> None:
    """Two FSDP ranks resume a run that one process without FSDP checkpointed."""
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=8, interval=4, world=2)
        result = run_training(TrainJob(job_id="grow", spec=spec, strategy=cpu_strategy(workers=2, sharding="fsdp"),
                                       checkpoint_uri=str(root / "ck"), device="cpu", cpu_threads=1,
                                       log_every_s=60.0))
        assert (result.resumed_from_step, result.steps) == (4, 8)


def test_a_checkpoint_without_fsdp_resumes_on_two_fsdp_ranks(tmp_path: Path) -> None:
    """The other way: one process (grad_accum 2) checkpoints, two FSDP ranks (the same sequences per
    step) resume from it, each taking its part of the full state, and end where the one process did."""
    import shutil

    from workers.checkpoint.local import step_dirname
    from workers.train.loop import TrainJob, run_training

    write_config(tmp_path / "m")
    spec = tiny_spec(tmp_path / "m" / "config.json", steps=8, interval=4, world=2)
    run_training(TrainJob(job_id="grow", spec=spec, strategy=cpu_strategy(workers=1, grad_accum=2),
                          checkpoint_uri=str(tmp_path / "ref"), device="cpu", cpu_threads=1, log_every_s=60.0))
    shutil.copytree(tmp_path / "ref", tmp_path / "ck")
    shutil.rmtree(tmp_path / "ck" / step_dirname(8))
    run_ranks(_fsdp_resume_main, str(tmp_path))
    ref, got = final_state(str(tmp_path / "ref")), final_state(str(tmp_path / "ck"))
    assert ref[0] == got[0] == 8
    assert_same_weights(got[1], ref[1], rtol=1e-4, atol=1e-5)
