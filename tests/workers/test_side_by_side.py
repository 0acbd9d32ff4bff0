"""Jobs side by side in one in-process executor (one process, one thread each, as `gpuplan server --executor
inprocess` runs them) give, bit for bit, what each gives alone, and start together without an import error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.waits import RUN_END_S
from tests.workers.side_by_side import generated, infer_request, run_together, train_request, trained
from tests.workers.tiny import assert_same_weights, write_config
from workers.executors.inprocess import InProcessExecutor

ROOT = Path(__file__).resolve().parents[2]


def test_twenty_attempts_starting_together_meet_no_import_error() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.workers.side_by_side", "20"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2 * RUN_END_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    ends = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(ends) == 20
    assert [message for state, message in ends if state != "succeeded"] == []


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_a_seeded_training_run_beside_inference_runs_matches_its_solo_run(tmp_path: Path, finetune: str) -> None:
    config = write_config(tmp_path / "m")
    executor = InProcessExecutor(cpu_threads=1)
    run_together(executor, [train_request(config, tmp_path / "solo", "solo", finetune=finetune)])
    run_together(executor, [infer_request(config, tmp_path / "solo-gen", "solo-gen")])

    besides = [infer_request(config, tmp_path / f"gen{i}", f"gen{i}") for i in range(3)]
    run_together(executor, [besides[0], train_request(config, tmp_path / "pair", "pair", finetune=finetune),
                            *besides[1:]])
    assert_same_weights(trained(tmp_path / "pair"), trained(tmp_path / "solo"))
    for i in range(3):
        assert generated(tmp_path / f"gen{i}") == generated(tmp_path / "solo-gen")


def test_a_seeded_training_run_beside_other_training_runs_matches_its_solo_run(tmp_path: Path) -> None:
    config = write_config(tmp_path / "m")
    executor = InProcessExecutor(cpu_threads=1)
    run_together(executor, [train_request(config, tmp_path / "solo", "solo", finetune="lora")])
    others = [train_request(config, tmp_path / f"other{i}", f"other{i}", finetune="lora", seed=100 + i)
              for i in range(3)]
    run_together(executor, [others[0], train_request(config, tmp_path / "pair", "pair", finetune="lora"),
                            *others[1:]])
    assert_same_weights(trained(tmp_path / "pair"), trained(tmp_path / "solo"))
