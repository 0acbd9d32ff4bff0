"""Checkpoint-and-stop on the shared local Ray cluster: real Ray Train V2, real PyTorch on CPU, tiny models.

A changeover (scheduler.loop.changeover) asks a running attempt to checkpoint at its next step boundary and
stop (``RayExecutor.checkpoint_stop``); the attempt ends STOPPED with a checkpoint of that step, and the
next attempt resumes there. Every test holds its run at a known step with a Gate: nothing here races
a fast job. The next attempt runs in this process (InProcessExecutor): a resume reads the same store
whichever executor runs it, and a second Ray start would double each test's time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from planner.spec import JobSpec
from planner.types import Strategy
from tests.waits import RUN_END_S
from tests.workers.tiny import Gate, assert_same_weights, cpu_strategy, final_state, tiny_spec, write_config
from workers.checkpoint.local import open_store
from workers.executors.inprocess import InProcessExecutor
from workers.executors.protocol import RunRequest, RunState, StopsForChangeover
from workers.executors.ray_executor import RayExecutor


def _executor(tmp_path: Path, gate: Gate | None = None) -> RayExecutor:
    return RayExecutor(storage_path=str(tmp_path / "ray"), backend="gloo", cpu_threads=1, log_every_s=0.0,
                       max_failures=1, start_timeout_s=2.0, step_hook=gate)


def _request(spec: JobSpec, ckpt: Path, job: str, strategy: Strategy, attempt: int = 1) -> RunRequest:
    return RunRequest(job_id=job, attempt=attempt, spec=spec, strategy=strategy, checkpoint_uri=str(ckpt),
                      run_name=job)


@pytest.mark.ray
def test_checkpoint_stop_saves_the_step_it_stops_at_and_the_next_attempt_ends_as_an_uninterrupted_run(
        ray_cluster: Any, tmp_path: Path) -> None:
    spec = tiny_spec(write_config(tmp_path / "m"), steps=8, interval=3)  # periodic checkpoints at 3 and 6
    reference = InProcessExecutor()
    ref = reference.wait(reference.submit(_request(spec, tmp_path / "ref", "ref", cpu_strategy())), 120)
    assert ref.state is RunState.SUCCEEDED, ref.message

    gate = Gate(str(tmp_path / "gate"))
    executor = _executor(tmp_path, gate)
    assert isinstance(executor, StopsForChangeover)
    request = _request(spec, tmp_path / "ck", "ray-co", cpu_strategy())
    gate.hold(4)  # held before step 5 is computed: 4 steps done, the checkpoint of step 3 the newest
    handle = executor.submit(request)
    gate.wait_held(4)
    executor.checkpoint_stop(handle)  # the flag is set before the run may go on: no race
    gate.release()
    status = executor.wait(handle, timeout=RUN_END_S)
    assert status.state is RunState.STOPPED, (status.message, executor.logs(handle)[-5:])
    # stopped at the next step boundary, with a checkpoint of exactly that step (not the periodic one of 3)
    assert status.progress.step == 5 and status.progress.checkpoint_step == 5
    assert status.message == "stopped for a changeover at step 5; checkpoint of step 5 saved"
    assert any("step 5: checkpoint saved; stopped for a changeover" in line for line in executor.logs(handle))
    latest = open_store(str(tmp_path / "ck")).latest()
    assert latest is not None and latest.step == 5
    assert executor.active() == []
    executor.checkpoint_stop(handle)  # a finished attempt: nothing to do
    executor.release(handle)

    # The next attempt resumes from the store, whatever runs it: in this process, to keep the test short
    # (a second Ray Train start costs ~20 s here; tests/workers/executors/test_executor_ray.py resumes on Ray).
    again = reference.wait(reference.submit(dataclasses.replace(request, attempt=2)), timeout=RUN_END_S)
    assert again.state is RunState.SUCCEEDED, again.message
    assert again.progress.resumed_from_step == 5 and again.progress.step == 8
    assert_same_weights(final_state(str(tmp_path / "ck"))[1], final_state(str(tmp_path / "ref"))[1])


def _infer_request(ckpt: Path, job: str, attempt: int = 1) -> RunRequest:
    from planner.spec import spec_from_dict

    spec = spec_from_dict({"name": job, "task": "infer", "model": "tiny-llama",
                           "infer": {"batch": 1, "prompt_tokens": 4, "output_tokens": 3, "requests": 6}})
    return RunRequest(job_id=job, attempt=attempt, spec=spec, strategy=cpu_strategy().model_copy(
        update={"task": "infer"}), checkpoint_uri=str(ckpt), run_name=job)


@pytest.mark.ray
def test_checkpoint_stop_of_an_inference_attempt_flushes_its_outputs_and_the_next_attempt_finishes_them(
        ray_cluster: Any, tmp_path: Path) -> None:
    import json

    gate = Gate(str(tmp_path / "gate"))
    executor = _executor(tmp_path, gate)
    request = _infer_request(tmp_path / "out", "ray-gen-co")
    gate.hold(2)  # the task waits after its second batch
    handle = executor.submit(request)
    gate.wait_held(2)
    executor.checkpoint_stop(handle)
    gate.release()
    status = executor.wait(handle, timeout=RUN_END_S)
    assert status.state is RunState.STOPPED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "stopped for a changeover after 2 of 6 requests; outputs flushed"
    outputs = tmp_path / "out" / "outputs.jsonl"
    assert [json.loads(line)["id"] for line in outputs.read_text().splitlines()] == [0, 1]
    executor.release(handle)
    local = InProcessExecutor()  # the next attempt, here (see above): it answers only the other 4
    again = local.wait(local.submit(dataclasses.replace(request, attempt=2)), timeout=RUN_END_S)
    assert again.state is RunState.SUCCEEDED and again.progress.resumed_from_step == 2, again.message
    assert sorted(json.loads(line)["id"] for line in outputs.read_text().splitlines()) == list(range(6))


def test_in_process_an_inference_attempt_asked_to_checkpoint_and_stop_ends_stopped_after_its_batch(
        tmp_path: Path) -> None:
    """The same stop without Ray (InProcessExecutor: what `gpuplan run` and the scheduler's tests use)."""
    import json

    gate = Gate(str(tmp_path / "gate"))
    executor = InProcessExecutor(step_hook=gate)
    request = _infer_request(tmp_path / "out", "gen-co")
    gate.hold(3)
    handle = executor.submit(request)
    gate.wait_held(3)
    executor.checkpoint_stop(handle)
    gate.release()
    status = executor.wait(handle, timeout=RUN_END_S)
    assert status.state is RunState.STOPPED, (status.message, executor.logs(handle)[-5:])
    assert status.message == "stopped for a changeover after 3 of 6 requests; outputs flushed"
    outputs = tmp_path / "out" / "outputs.jsonl"
    assert [json.loads(line)["id"] for line in outputs.read_text().splitlines()] == [0, 1, 2]
    assert any("stopped for a changeover after 3 of 6 requests: outputs flushed" in line
               for line in executor.logs(handle))
