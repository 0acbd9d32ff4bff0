"""The training loop on CPU: data sources, precision choices, and bad input failing clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from errors import InvalidInput
from tests.moto_server import moto_server, use_moto
from tests.workers.tiny import cpu_strategy, final_state, tiny_spec, write_config
from workers.executors.inprocess import InProcessExecutor
from workers.executors.protocol import RunRequest, RunState
from workers.train.batches import DataLayout, TokenSource
from workers.train.loop import TrainJob, run_training


def _job(tmp_path: Path, uri: Path | None = None, *, strategy: Any = None, **spec_args: Any) -> TrainJob:
    config = spec_args.pop("config", None) or write_config(tmp_path / "m")
    return TrainJob(job_id="t", spec=tiny_spec(config, **spec_args), strategy=strategy or cpu_strategy(),
                    checkpoint_uri=str(uri or tmp_path / "ck"), device="cpu", cpu_threads=1)


def test_synthetic_stream_is_a_pure_function_of_seed_and_index() -> None:
    a = TokenSource(seq_len=8, vocab_size=50, seed=1)
    b = TokenSource(seq_len=8, vocab_size=50, seed=1)
    assert np.array_equal(a.batch(10, 3).numpy(), b.batch(10, 3).numpy())
    assert np.array_equal(a.batch(11, 1).numpy()[0], b.batch(10, 2).numpy()[1])
    assert not np.array_equal(a.batch(10, 1).numpy(), TokenSource(seq_len=8, vocab_size=50, seed=2).batch(10, 1))
    assert int(a.batch(0, 64).max()) < 50


def test_ranks_and_accumulation_slots_read_disjoint_sequences() -> None:
    layout = DataLayout(micro_batch=2, grad_accum=3, world_size=2)
    starts = {layout.first_index(5, accum, rank) for accum in range(3) for rank in range(2)}
    covered = {s + i for s in starts for i in range(2)}
    assert covered == set(range(5 * 12, 6 * 12))


def test_trains_on_a_token_file_and_the_loss_falls(tmp_path: Path) -> None:
    # A repeating sequence is learnable: the loss must drop well below the uniform ln(128) = 4.85.
    tokens = np.tile(np.arange(16, dtype=np.uint16), 64)
    np.save(tmp_path / "tokens.npy", tokens)
    job = _job(tmp_path, steps=40, interval=40, data=str(tmp_path / "tokens.npy"))
    result = run_training(job)
    assert result.status == "succeeded" and result.final_loss is not None
    assert result.final_loss < 2.0


def test_bin_files_are_read_as_uint16(tmp_path: Path) -> None:
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "t.bin")
    source = TokenSource(seq_len=10, vocab_size=128, seed=0, path=str(tmp_path / "t.bin"))
    assert source.batch(2, 1).tolist() == [list(range(20, 30))]
    assert source.batch(10, 1).tolist() == [list(range(0, 10))]  # wraps around after the last window


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "big.npy", np.array([1, 2, 500] * 20))
    with pytest.raises(InvalidInput, match="token id 500, outside the model's vocabulary of 128"):
        run_training(_job(tmp_path, data=str(tmp_path / "big.npy")))


@pytest.mark.parametrize("precision", ["bf16", "amp-bf16"])
def test_reduced_precisions_train(tmp_path: Path, precision: str) -> None:
    result = run_training(_job(tmp_path, strategy=cpu_strategy(precision=precision), steps=3, interval=3))
    assert result.status == "succeeded" and result.final_loss is not None
    _, weights = final_state(str(tmp_path / "ck"))
    dtype = next(iter(weights.values())).dtype
    assert str(dtype) == ("torch.bfloat16" if precision == "bf16" else "torch.float32")


def test_fp8_on_cpu_is_refused_with_what_to_use_instead(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"fp8 training needs an NVIDIA GPU.*use precision fp32, amp-bf16 or bf16"):
        run_training(_job(tmp_path, strategy=cpu_strategy(precision="fp8")))
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


def _fail(tmp_path: Path, job: TrainJob) -> str:
    executor = InProcessExecutor()
    request = RunRequest(job_id=job.job_id, attempt=1, spec=job.spec, strategy=job.strategy,
                         checkpoint_uri=job.checkpoint_uri, run_name=job.job_id)
    status = executor.wait(executor.submit(request), timeout=300)
    assert status.state is RunState.FAILED
    return status.message


def test_an_invalid_model_config_fails_the_job_naming_the_key(tmp_path: Path) -> None:
    config = write_config(tmp_path / "bad", hidden_size=30)  # 30 is not divisible by 4 heads
    message = _fail(tmp_path, _job(tmp_path, config=config))
    assert "not divisible by 4 attention heads" in message


def test_a_checkpoint_from_another_model_shape_fails_and_is_left_intact(tmp_path: Path) -> None:
    run_training(_job(tmp_path, steps=2, interval=2))
    before = sorted(p.name for p in (tmp_path / "ck").iterdir())
    wider = write_config(tmp_path / "wide", hidden_size=64)
    message = _fail(tmp_path, _job(tmp_path, config=wider, steps=4, interval=2))
    assert "different shape" in message and "model.embed_tokens.weight is [128, 32]" in message
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == before
    assert final_state(str(tmp_path / "ck"))[0] == 2


def test_an_s3_bucket_that_does_not_exist_fails_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with moto_server() as url:
        use_moto(monkeypatch, url)
        job = _job(tmp_path)
        job = TrainJob(**{**job.__dict__, "checkpoint_uri": "s3://no-such-bucket-gpuplan/run"})
        message = _fail(tmp_path, job)
        assert "no-such-bucket-gpuplan" in message
