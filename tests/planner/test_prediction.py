"""planner.prediction: the predicted block of every predicted-vs-measured record, from a real plan's estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.plan_record import load_planned_run
from planner.prediction import PREDICTED_NUMBERS, Prediction, inference_split, predict, prediction_of
from planner.types import Estimate

PLANS = Path(__file__).resolve().parents[1] / "data" / "plans"


def _estimate(case: str) -> Estimate:
    return load_planned_run(json.loads((PLANS / f"v2_{case}.json").read_text())["plan"]).chosen.estimate


def test_a_served_model_predicts_one_workers_prompt_pass_and_decode_step() -> None:
    est = _estimate("infer_serve")
    split = inference_split(est.throughput, est.strategy)
    replicas, rate = est.strategy.gpu_count // est.strategy.tensor_parallel, est.throughput.decode_tokens_per_s
    assert rate is not None and split.prefill_s == est.throughput.breakdown_s["prefill"]
    assert split.decode_step_s == pytest.approx(est.strategy.batch * replicas / rate)
    p = prediction_of(est)
    assert (p.prefill_s, p.decode_step_s) == split and p.label == est.strategy.label()
    assert p.wall_s == pytest.approx(est.hours * 3600) and p.hours == est.hours


def test_training_predicts_no_batch_split_and_a_cpu_plan_no_wall_clock() -> None:
    est = _estimate("train_spot_auto")
    assert inference_split(est.throughput, est.strategy) == (None, None)
    untimed = predict(est.strategy, est.memory, est.throughput, 2.0, timed_start=False)
    assert untimed.wall_s is None and untimed.hours == 2.0
    assert untimed.peak_allocated_bytes == est.memory.peak_allocated_bytes


def test_the_workers_get_the_predicted_numbers_as_floats() -> None:
    p = prediction_of(_estimate("train_two_nodes"))
    numbers = p.numbers()
    assert set(numbers) == {k for k in PREDICTED_NUMBERS if getattr(p, k) is not None}
    assert "prefill_s" not in numbers and all(isinstance(v, float) for v in numbers.values())
    assert numbers["peak_reserved_bytes"] == float(p.peak_reserved_bytes or 0)


def test_a_stored_block_reads_back_and_an_empty_one_predicts_nothing() -> None:
    p = prediction_of(_estimate("train_spot_auto"))
    assert Prediction.model_validate(p.record()) == p
    assert Prediction.model_validate({**p.record(), "a_later_key": 1}) == p  # written by a newer gpuplan
    assert p.predicts_anything and not Prediction().predicts_anything
    assert not Prediction(label="1xcpu fp32 mb=1", gpu="cpu").predicts_anything  # names a strategy, predicts nothing
