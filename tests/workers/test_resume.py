"""Exact resume: killed at random points (mid-step, mid-checkpoint), the run ends with the same
weights, bit for bit, as a run that was never interrupted."""

from __future__ import annotations

import multiprocessing
import os
import random
from pathlib import Path
from typing import Any

import pytest

from planner.spec import JobSpec
from planner.types import Strategy
from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.checkpoint.local import open_store
from workers.train.hooks import TrainHooks
from workers.train.loop import TrainJob, run_training
from workers.train.result import TrainResult

PHASES = ("forward", "backward", "optimizer", "checkpoint")


class Killed(Exception):
    """Stands for the process dying: nothing after the raise runs."""


class KillAt(TrainHooks):
    def __init__(self, step: int, phase: str) -> None:
        self.step, self.phase = step, phase

    def fault(self, step: int, where: str) -> None:
        if (step, where) == (self.step, self.phase):
            raise Killed(f"killed at step {step} during {where}")


def _job(spec: JobSpec, strategy: Strategy, uri: Path) -> TrainJob:
    return TrainJob(job_id="resume", spec=spec, strategy=strategy, checkpoint_uri=str(uri), device="cpu",
                    cpu_threads=1, log_every_s=60.0)


def _kill_points(rng: random.Random, steps: int, interval: int) -> list[tuple[int, str]]:
    """Three kills at increasing steps; a 'checkpoint' kill lands on a step that saves one."""
    points: list[tuple[int, str]] = []
    for step in sorted(rng.sample(range(1, steps), 3)):
        phase = rng.choice(PHASES)
        if phase == "checkpoint":
            step = min(steps, -(-step // interval) * interval)
        if not points or step > points[-1][0]:
            points.append((step, phase))
    return points


CASES: dict[str, tuple[dict[str, int], dict[str, Any]]] = {
    "fp32-accum": ({"steps": 14, "interval": 3}, {"grad_accum": 2}),
    "amp-bf16-actckpt-sgd": ({"steps": 12, "interval": 4},
                             {"precision": "amp-bf16", "activation_checkpointing": True, "optimizer": "sgd"}),
    "lora": ({"steps": 12, "interval": 5}, {"finetune": "lora", "lora_rank": 4}),
    # bf16 weights with stochastically rounded AdamW steps: the random bits continue across a resume
    "bf16-sr": ({"steps": 12, "interval": 4}, {"precision": "bf16"}),
    "qlora": ({"steps": 10, "interval": 4}, {"finetune": "qlora", "lora_rank": 4, "precision": "bf16"}),
}
# NF4 quantises only weights that fill whole blocks of 64 x 256: a wider tiny model has some
CONFIGS: dict[str, dict[str, int]] = {"qlora": {"hidden_size": 128, "intermediate_size": 256}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_several_kills_at_random_points_give_the_uninterrupted_weights(tmp_path: Path, case: str) -> None:
    spec_args, strategy_args = CASES[case]
    config = write_config(tmp_path / "m", **CONFIGS.get(case, {}))
    spec = tiny_spec(config, grad_accum=strategy_args.get("grad_accum", 1), **spec_args)
    strategy = cpu_strategy(**strategy_args)
    reference = run_training(_job(spec, strategy, tmp_path / "ref"))
    assert reference.status == "succeeded" and reference.steps == spec_args["steps"]

    rng = random.Random(f"{case}-kills")
    steps = spec_args["steps"]
    kills = _kill_points(rng, steps, spec_args["interval"])
    killed = 0
    for step, phase in kills:
        try:
            # A run that passes its kill point without dying (already behind a checkpoint) just finishes.
            run_training(_job(spec, strategy, tmp_path / "ck"), KillAt(step, phase))
        except Killed:
            killed += 1
    assert killed == len(kills), kills  # every kill point lies ahead of where the previous run resumed
    final = run_training(_job(spec, strategy, tmp_path / "ck"))
    assert final.status == "succeeded" and final.steps == steps
    assert final.final_loss == reference.final_loss
    assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])


def _train_and_die_in_second_save(spec_json: str, strategy_json: str, uri: str) -> None:
    from planner.spec import JobSpec

    class DieInSave(TrainHooks):
        saves = 0

        def checkpoint_file(self, relpath: str) -> None:
            if relpath.endswith("state-meta.pt"):  # one per save
                DieInSave.saves += 1
            if DieInSave.saves == 2:  # a file of the second checkpoint has landed; its marker has not
                os._exit(137)

    job = _job(JobSpec.model_validate_json(spec_json), Strategy.model_validate_json(strategy_json), Path(uri))
    run_training(job, DieInSave())


def test_killed_while_writing_a_checkpoint_resumes_from_the_previous_one(tmp_path: Path) -> None:
    spec = tiny_spec(write_config(tmp_path / "m"), steps=9, interval=3)
    strategy = cpu_strategy()
    run_training(_job(spec, strategy, tmp_path / "ref"))

    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_train_and_die_in_second_save,
                        args=(spec.model_dump_json(), strategy.model_dump_json(), str(tmp_path / "ck")))
    child.start()
    child.join(timeout=300)
    assert child.exitcode == 137
    store = open_store(str(tmp_path / "ck"))
    latest = store.latest()
    assert latest is not None and latest.step == 3  # the torn step-6 save is never offered

    result = run_training(_job(spec, strategy, tmp_path / "ck"))
    assert result.status == "succeeded" and result.resumed_from_step == 3
    assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])


def test_a_resumed_run_reports_what_it_did(tmp_path: Path) -> None:
    spec = tiny_spec(write_config(tmp_path / "m"), steps=6, interval=2)
    with pytest.raises(Killed):
        run_training(_job(spec, cpu_strategy(), tmp_path / "ck"), KillAt(4, "backward"))
    result: TrainResult = run_training(_job(spec, cpu_strategy(), tmp_path / "ck"))
    assert result.resumed_from_step == 4
    assert result.checkpoints_written == 1  # step 6 only: 4 was already saved
    assert result.tokens == 6 * 2 * 16
    info: dict[str, Any] = result.to_dict()
    assert info["status"] == "succeeded" and info["peak_rss_bytes"] > 0
