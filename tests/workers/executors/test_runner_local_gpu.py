"""gpuplan run's plan for a local GPU (workers.executors.local_runner.plan_locally): the driver's answer is the one
thing faked here (this machine has no GPU); the catalog match, the planner's estimate and the note are real."""

from __future__ import annotations

from pathlib import Path

import pytest

import catalog.local
from catalog.local import LocalDevice
from planner.spec import JobSpec
from workers.executors.local_runner import plan_locally

H200 = LocalDevice(name="NVIDIA H200", count=1, memory_bytes=150_110_011_392, backend="cuda")


@pytest.fixture
def an_h200(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: H200)


def _serve(model: str, batch: int, weights: str = "bf16") -> JobSpec:
    return JobSpec.model_validate({"name": "serve", "task": "infer", "model": model,
                                   "infer": {"requests": 1000, "prompt_tokens": 512, "output_tokens": 64,
                                             "batch": batch, "weights": weights}})


@pytest.mark.usefixtures("an_h200")
@pytest.mark.parametrize(("batch", "weights", "how"), [
    (8, "bf16", "grouped_mm in a CUDA graph"), (8, "fp16", "batched_mm"), (64, "fp16", "grouped_mm")])
def test_a_mixture_of_experts_plan_for_the_local_gpu_says_how_its_experts_decode(
        tmp_path: Path, batch: int, weights: str, how: str) -> None:
    plan = plan_locally(_serve("gpt-oss-20b", batch, weights), home=tmp_path)
    assert plan.device == "cuda" and plan.strategy.gpu == "H200" and plan.strategy.batch == batch
    assert plan.note == f"planned for the local H200, experts decoded with {how}"
    assert (plan.predicted.tokens_per_s or 0) > 0


@pytest.mark.usefixtures("an_h200")
def test_a_dense_plan_for_the_local_gpu_names_only_the_gpu(tmp_path: Path) -> None:
    assert plan_locally(_serve("llama-3.2-1b", 32), home=tmp_path).note == "planned for the local H200"
