"""InProcessExecutor: real training in threads; same states and messages as the Ray executor."""

from __future__ import annotations

from pathlib import Path

import pytest

from errors import Infeasible
from planner.types import Strategy
from tests.waits import RUN_END_S
from tests.workers.tiny import Gate, assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.executors.inprocess import InProcessExecutor
from workers.executors.protocol import Executor, RunRequest, RunState


def _request(spec_path: Path, ckpt: Path, *, attempt: int = 1, strategy: Strategy | None = None,
             **spec_args: object) -> RunRequest:
    spec = tiny_spec(spec_path, **spec_args)  # type: ignore[arg-type]
    return RunRequest(job_id="job-1", attempt=attempt, spec=spec, strategy=strategy or cpu_strategy(),
                      checkpoint_uri=str(ckpt), run_name="job-1")


def test_runs_a_job_to_success_with_metrics_and_logs(tmp_path: Path) -> None:
    executor = InProcessExecutor()
    assert isinstance(executor, Executor)
    request = _request(write_config(tmp_path / "m"), tmp_path / "ck", steps=8, interval=4)
    handle = executor.submit(request)
    status = executor.wait(handle, timeout=RUN_END_S)
    assert status.state is RunState.SUCCEEDED, status.message
    assert status.progress.step == 8 and status.progress.total_steps == 8
    assert status.progress.checkpoints == 2
    assert status.progress.loss is not None and status.metrics["final_loss"] == pytest.approx(status.progress.loss)
    assert status.metrics["steps"] == 8 and status.metrics["resumes"] == 0
    assert status.metrics["measured_tokens_per_s"] > 0 and status.metrics["measured_peak_rss_bytes"] > 0
    assert executor.active() == []
    lines = executor.logs(handle)
    assert any("checkpoint saved" in line for line in lines)
    assert executor.logs(handle, since=len(lines)) == []
    step, _ = final_state(str(tmp_path / "ck"))
    assert step == 8


def test_preempt_then_resubmit_resumes_and_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    config = write_config(tmp_path / "m")
    gate = Gate(str(tmp_path / "gate"))
    executor = InProcessExecutor(log_every_s=0.0, step_hook=gate)
    reference = executor.wait(executor.submit(_request(config, tmp_path / "ref", steps=30, interval=10)), 120)
    assert reference.state is RunState.SUCCEEDED

    gate.hold(3)
    first = executor.submit(_request(config, tmp_path / "ck", steps=30, interval=10))
    gate.wait_held(3)
    executor.preempt(first)
    gate.release()  # the notice is read at the end of the next step
    preempted = executor.wait(first, 120)
    assert preempted.state is RunState.PREEMPTED
    assert "just-in-time checkpoint" in preempted.message
    jit_step, _ = final_state(str(tmp_path / "ck"))
    assert jit_step == preempted.progress.step == 4  # the notice cost no step: the checkpoint is where it stopped

    second = executor.wait(executor.submit(_request(config, tmp_path / "ck", attempt=2, steps=30, interval=10)), 120)
    assert second.state is RunState.SUCCEEDED, second.message
    assert second.progress.resumed_from_step == jit_step and second.metrics["resumes"] == 1
    assert_same_weights(final_state(str(tmp_path / "ref"))[1], final_state(str(tmp_path / "ck"))[1])


def test_cancel_stops_the_run(tmp_path: Path) -> None:
    gate = Gate(str(tmp_path / "gate"))
    executor = InProcessExecutor(step_hook=gate)
    gate.hold(2)
    handle = executor.submit(_request(write_config(tmp_path / "m"), tmp_path / "ck", steps=1000, interval=1000))
    gate.wait_held(2)
    assert executor.status(handle).state is RunState.RUNNING
    executor.cancel(handle)
    gate.release()  # the cancel is read at the end of the next step
    status = executor.wait(handle, 120)
    assert status.state is RunState.CANCELLED
    assert status.message == "cancelled at step 3"


def test_a_job_no_node_can_run_fails_fast_with_the_reason(tmp_path: Path) -> None:
    executor = InProcessExecutor(resources={"CPU": 2, "GPU": 2, "accelerator_type:H100": 2})
    strategy = Strategy(gpu="H100-SXM", gpu_count=8, precision="bf16")
    request = _request(write_config(tmp_path / "m"), tmp_path / "ck", strategy=strategy)
    reason = executor.feasibility(request)
    assert reason is not None
    assert reason.startswith("needs 8 x accelerator_type:H100 per node; the biggest node has 2; ")
    assert "--executor ray" in reason and "gpuplan run" in reason  # where such a job can run instead
    with pytest.raises(Infeasible, match="the biggest node has 2"):
        executor.submit(request)
    assert executor.active() == []


def test_missing_data_file_fails_the_job_with_the_path(tmp_path: Path) -> None:
    executor = InProcessExecutor()
    missing = tmp_path / "nope.npy"
    status = executor.wait(executor.submit(
        _request(write_config(tmp_path / "m"), tmp_path / "ck", data=str(missing))), 120)
    assert status.state is RunState.FAILED
    assert str(missing) in status.message and "does not exist" in status.message


def test_runs_an_inference_job_and_a_resubmission_redoes_nothing(tmp_path: Path) -> None:
    from planner.spec import spec_from_dict

    config = write_config(tmp_path / "m")
    spec = spec_from_dict({"name": "gen", "task": "infer", "model": {"config": str(config)},
                           "infer": {"batch": 2, "prompt_tokens": 6, "output_tokens": 3, "requests": 5}})
    request = RunRequest(job_id="gen", attempt=1, spec=spec, strategy=cpu_strategy(),
                         checkpoint_uri=str(tmp_path / "o"),
                         run_name="gen")
    executor = InProcessExecutor()
    first = executor.wait(executor.submit(request), 120)
    assert first.state is RunState.SUCCEEDED, first.message
    assert first.progress.step == 5 and first.progress.total_steps == 5
    lines = (tmp_path / "o" / "outputs.jsonl").read_text().splitlines()
    assert len(lines) == 5
    again = executor.wait(executor.submit(request), 120)
    assert again.state is RunState.SUCCEEDED
    assert (tmp_path / "o" / "outputs.jsonl").read_text().splitlines() == lines
