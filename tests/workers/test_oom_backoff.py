"""CUDA OOM back-off and the allocator setting, on CPU: an injected torch.OutOfMemoryError plays the GPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from errors import GpuplanError
from planner.prediction import Prediction
from tests.workers.tiny import assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.executors.cuda_env import ALLOC_CONF_ENV, DEFAULT_ALLOC_CONF, allocator_env, configure_allocator
from workers.executors.local_runner import LocalPlan, LocalRun
from workers.executors.protocol import RunProgress, RunState, RunStatus
from workers.train.hooks import Signal, TrainHooks
from workers.train.loop import TrainJob, run_training
from workers.train.progress import ProgressTracker, result_backoffs, result_metrics
from workers.train.result import TrainResult


class InjectOOM(TrainHooks):
    """Raises torch.OutOfMemoryError on the first ``times`` forward passes at a micro-batch above
    ``above``, from step ``at_step`` on (the n-th forward of a step with ``on_forward``)."""

    def __init__(self, *, above: int, times: int, at_step: int = 0, on_forward: int = 0) -> None:
        self.above, self.left, self.at_step, self.on_forward = above, times, at_step, on_forward
        self.tracker = ProgressTracker()
        self.lines: list[str] = []
        self._forwards: dict[tuple[int, int], int] = {}
        self.alloc_conf_seen: str | None = None

    def before_forward(self, step: int, micro_batch: int) -> None:
        self.alloc_conf_seen = os.environ.get(ALLOC_CONF_ENV)
        key = (step, micro_batch)
        n = self._forwards[key] = self._forwards.get(key, 0) + 1
        if self.left > 0 and micro_batch > self.above and step >= self.at_step and n > self.on_forward:
            self.left -= 1
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {micro_batch * 4} GiB")

    def on_log(self, line: str) -> None:
        self.lines.append(line)

    def on_progress(self, progress: dict[str, Any]) -> None:
        self.tracker.event(progress)


def _job(tmp_path: Path, name: str, *, micro_batch: int, grad_accum: int, steps: int = 6,
         predicted: dict[str, float] | None = None) -> TrainJob:
    config = write_config(tmp_path / "m")
    # the same global batch (4 sequences) whatever the split, so every run has the same steps and data
    spec = tiny_spec(config, steps=steps, micro_batch=4, grad_accum=1, interval=steps)
    return TrainJob(job_id=name, spec=spec, strategy=cpu_strategy(micro_batch=micro_batch, grad_accum=grad_accum),
                    checkpoint_uri=str(tmp_path / name), device="cpu", cpu_threads=1, predicted=predicted or {})


def test_oom_mid_accumulation_halves_until_it_fits_and_trains_exactly_as_the_smaller_micro_batch(
        tmp_path: Path) -> None:
    # The plan's 2 x 2 runs out of memory on the step's second micro-batch (the first one's gradients
    # already accumulated), then again at 2: the worker ends at 1 x 4 with the same global batch.
    hooks = InjectOOM(above=1, times=2, on_forward=1)
    result = run_training(_job(tmp_path, "backed", micro_batch=2, grad_accum=2), hooks)
    reference = run_training(_job(tmp_path, "plain", micro_batch=1, grad_accum=4))

    assert result.status == "succeeded" and result.steps == reference.steps == 6
    assert (result.micro_batch, result.grad_accum) == (1, 4)
    assert result.oom_backoffs == [
        {"step": 1, "from_micro_batch": 2, "to_micro_batch": 1, "from_grad_accum": 2, "to_grad_accum": 4}]
    # the second injected OOM never came: at micro-batch 1 there is nothing above ``above`` to fail
    assert hooks.left == 1
    assert_same_weights(final_state(str(tmp_path / "backed"))[1], final_state(str(tmp_path / "plain"))[1])
    assert result.final_loss == reference.final_loss
    assert any("CUDA out of memory at micro-batch 2; retrying the step at micro-batch 1 x 4" in line
               for line in hooks.lines)
    # recorded where the executors read it: the progress sink's result, its metrics and the back-off list
    recorded = hooks.tracker.result()
    assert result_backoffs(recorded) == result.oom_backoffs
    metrics = result_metrics(recorded, 0)
    assert (metrics["oom_backoffs"], metrics["micro_batch"], metrics["grad_accum"]) == (1.0, 1.0, 4.0)


class PreemptAfter(InjectOOM):
    """InjectOOM that is also preempted (save, then stop) after ``steps`` steps of this attempt."""

    def __init__(self, steps: int, **oom: int) -> None:
        super().__init__(**oom)
        self.polls_left = steps

    def poll(self) -> Signal | None:
        self.polls_left -= 1
        return Signal("preempt") if self.polls_left == 0 else None


def test_a_resumed_run_starts_at_the_backed_off_micro_batch_instead_of_running_out_of_memory_again(
        tmp_path: Path) -> None:
    # attempt 1: the plan's 2 x 2 runs out of memory at step 1 and backs off to 1 x 4; preempted after step 3
    first = PreemptAfter(3, above=1, times=1)
    job = _job(tmp_path, "resumed", micro_batch=2, grad_accum=2)
    stopped = run_training(job, first)
    assert stopped.status == "preempted" and stopped.steps == 3 and (stopped.micro_batch, stopped.grad_accum) == (1, 4)
    # attempt 2, same plan: any micro-batch above 1 would run out of memory again
    second = InjectOOM(above=1, times=99)
    resumed = run_training(job, second)
    assert resumed.status == "succeeded" and resumed.resumed_from_step == 3 and resumed.steps == 6
    assert resumed.oom_backoffs == [] and second.left == 99  # no OOM to learn it again
    assert (resumed.micro_batch, resumed.grad_accum) == (1, 4)
    assert any("resuming at micro-batch 1 x 4 accumulation steps, where an earlier attempt backed off" in line
               for line in second.lines)
    # and it trains exactly as a run at 1 x 4 throughout
    run_training(_job(tmp_path, "plain", micro_batch=1, grad_accum=4))
    assert_same_weights(final_state(str(tmp_path / "resumed"))[1], final_state(str(tmp_path / "plain"))[1])


def test_the_resume_split_keeps_the_global_batch_or_takes_the_plans() -> None:
    from workers.train.recovery import resume_split

    plan = cpu_strategy(micro_batch=4, grad_accum=2)
    assert resume_split(plan, None) == (4, 2)
    assert resume_split(plan, (2, 4)) == (2, 4)  # backed off: same 8 sequences per step
    assert resume_split(plan, (2, 2)) == (4, 2)  # another global batch: a different plan, not a back-off
    assert resume_split(plan, (8, 1)) == (4, 2)  # never larger than the plan


def test_two_back_offs_in_a_row_reach_a_quarter(tmp_path: Path) -> None:
    hooks = InjectOOM(above=1, times=2)
    result = run_training(_job(tmp_path, "q", micro_batch=4, grad_accum=1), hooks)
    run_training(_job(tmp_path, "r", micro_batch=1, grad_accum=4))
    assert [(b["to_micro_batch"], b["to_grad_accum"]) for b in result.oom_backoffs] == [(2, 2), (1, 4)]
    assert_same_weights(final_state(str(tmp_path / "q"))[1], final_state(str(tmp_path / "r"))[1])


def test_an_oom_later_in_the_run_keeps_the_maths_of_the_planned_micro_batch(tmp_path: Path) -> None:
    hooks = InjectOOM(above=2, times=1, at_step=3)
    result = run_training(_job(tmp_path, "late", micro_batch=4, grad_accum=1), hooks)
    run_training(_job(tmp_path, "planned", micro_batch=4, grad_accum=1))
    assert result.oom_backoffs == [
        {"step": 4, "from_micro_batch": 4, "to_micro_batch": 2, "from_grad_accum": 1, "to_grad_accum": 2}]
    late, plain = final_state(str(tmp_path / "late"))[1], final_state(str(tmp_path / "planned"))[1]
    assert_same_weights(late, plain, rtol=1e-4, atol=1e-5)  # only the summation order of the loss differs


def test_an_oom_at_micro_batch_one_fails_clearly_and_keeps_what_it_measured(tmp_path: Path) -> None:
    hooks = InjectOOM(above=0, times=10, at_step=2)
    job = _job(tmp_path, "dies", micro_batch=2, grad_accum=1,
               predicted={"peak_allocated_bytes": 1e9, "peak_reserved_bytes": 1.1e9, "tokens_per_s": 500.0})
    with pytest.raises(GpuplanError, match=r"at micro-batch 1 .*does not fit this GPU even at the smallest"):
        run_training(job, hooks)
    # what it measured up to the failure sits next to the prediction
    failed = hooks.tracker.result()
    assert failed is not None and failed["status"] == "failed" and failed["steps"] == 2
    assert "micro-batch 1" in failed["error"]
    metrics = result_metrics(failed, 0)
    assert metrics["measured_peak_rss_bytes"] > 0 and metrics["steps"] == 2
    assert metrics["predicted_peak_allocated_bytes"] == 1e9 and metrics["predicted_tokens_per_s"] == 500.0
    status = RunStatus(handle="h", state=RunState.FAILED, progress=RunProgress(step=2), message=failed["error"],
                       metrics=metrics, oom_backoffs=result_backoffs(failed))
    summary = LocalRun(job_id="dies", checkpoint_dir=tmp_path, status=status, wall_s=1.0, engine="in-process",
                       plan=LocalPlan(strategy=job.strategy, device="cpu",
                                      predicted=Prediction.model_validate(job.predicted))).to_dict()
    assert summary["status"] == "failed" and summary["measured"]["peak_rss_bytes"] > 0
    assert summary["predicted"]["tokens_per_s"] == 500.0
    assert summary["oom_backoffs"] == [
        {"step": 3, "from_micro_batch": 2, "to_micro_batch": 1, "from_grad_accum": 1, "to_grad_accum": 2}]


def test_a_failed_run_that_never_reported_still_shows_the_plans_prediction(tmp_path: Path) -> None:
    plan = LocalPlan(strategy=cpu_strategy(), device="cuda",
                     predicted=Prediction(peak_allocated_bytes=2_000_000_000, tokens_per_s=10.0))
    status = RunStatus(handle="h", state=RunState.FAILED, message="model build failed", metrics={"resumes": 0.0})
    summary = LocalRun(job_id="x", checkpoint_dir=tmp_path, plan=plan, status=status, wall_s=0.1,
                       engine="in-process").to_dict()
    assert summary["predicted"]["peak_allocated_bytes"] == 2e9 and summary["predicted"]["tokens_per_s"] == 10.0
    assert summary["measured"]["peak_allocated_bytes"] is None and summary["oom_backoffs"] == []


def test_an_odd_micro_batch_backs_off_to_a_divisor_so_the_global_batch_holds(tmp_path: Path) -> None:
    from workers.train.recovery import back_off

    assert back_off(0, 6, 1, 1, "oom") == (3, 2)
    assert back_off(0, 5, 2, 1, "oom") == (1, 10)
    with pytest.raises(GpuplanError, match="only on one GPU"):
        back_off(0, 4, 1, 2, "oom")


def test_the_worker_sees_expandable_segments_unless_the_user_set_the_allocator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    hooks = InjectOOM(above=99, times=0)
    result: TrainResult = run_training(_job(tmp_path, "env", micro_batch=4, grad_accum=1, steps=1), hooks)
    assert hooks.alloc_conf_seen == DEFAULT_ALLOC_CONF == "expandable_segments:True"
    assert result.cuda_alloc_conf == DEFAULT_ALLOC_CONF

    monkeypatch.setenv(ALLOC_CONF_ENV, "max_split_size_mb:512")
    hooks = InjectOOM(above=99, times=0)
    result = run_training(_job(tmp_path, "user", micro_batch=4, grad_accum=1, steps=1), hooks)
    assert hooks.alloc_conf_seen == "max_split_size_mb:512" and result.cuda_alloc_conf == "max_split_size_mb:512"


def test_ray_workers_and_tasks_get_the_setting_through_their_environment() -> None:
    # what the attempt's driver actor puts in its runtime env (inherited by Ray Train's workers)
    assert allocator_env({}) == {ALLOC_CONF_ENV: DEFAULT_ALLOC_CONF}
    assert allocator_env({ALLOC_CONF_ENV: "expandable_segments:False"}) == {ALLOC_CONF_ENV: "expandable_segments:False"}
    env: dict[str, str] = {}
    assert configure_allocator(env) == DEFAULT_ALLOC_CONF and env == {ALLOC_CONF_ENV: DEFAULT_ALLOC_CONF}
    env = {ALLOC_CONF_ENV: "backend:cudaMallocAsync"}
    assert configure_allocator(env) == "backend:cudaMallocAsync" and env[ALLOC_CONF_ENV] == "backend:cudaMallocAsync"
