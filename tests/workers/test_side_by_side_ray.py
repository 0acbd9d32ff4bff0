"""Jobs side by side on the Ray executor (the shared local cluster: 2 CPU slots) give, bit for bit, what each
gives alone: a seeded training run beside another training run and an inference run matches its solo run
(run in-process: the same CPU kernels, one thread, no distributed wrapper at one worker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.workers.ray_runs import executor_on
from tests.workers.side_by_side import generated, infer_request, run_together, train_request, trained
from tests.workers.tiny import assert_same_weights, write_config
from workers.executors.inprocess import InProcessExecutor

pytestmark = pytest.mark.ray


def test_a_seeded_training_run_beside_a_training_run_and_an_inference_run_matches_its_solo_run(
        ray_cluster: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path / "m")
    run_together(InProcessExecutor(cpu_threads=1), [train_request(config, tmp_path / "solo", "solo", finetune="lora")])
    run_together(InProcessExecutor(cpu_threads=1), [infer_request(config, tmp_path / "solo-gen", "solo-gen")])

    run_together(executor_on(tmp_path), [
        train_request(config, tmp_path / "pair", "sbs-pair", finetune="lora"),
        train_request(config, tmp_path / "other", "sbs-other", finetune="lora", seed=99),
        infer_request(config, tmp_path / "gen", "sbs-gen")])
    assert_same_weights(trained(tmp_path / "pair"), trained(tmp_path / "solo"))
    assert generated(tmp_path / "gen") == generated(tmp_path / "solo-gen")
