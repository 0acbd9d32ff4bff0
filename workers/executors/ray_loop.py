"""Ray side of a run: the ``train_loop_per_worker`` for TorchTrainer, the inference task, and the
progress sink.

:class:`ProgressActor` is what rank 0 reports to; the attempt's driver actor
(``workers.executors.ray_attempt.AttemptDriver``) is one. It lives on the head node, not on a worker node
(a lost worker node must not take the job's progress and logs with it), and outlives Ray Train's
restarts of the worker group, so it sees every resume of the attempt.
"""

from __future__ import annotations

import time
import traceback
from typing import TYPE_CHECKING, Any

import ray

from errors import GpuplanError, InvalidInput
from workers.train.hooks import ProgressEvent, Signal, StepHook, StopReason, TrainHooks
from workers.train.progress import ProgressTracker

if TYPE_CHECKING:
    from workers.executors.protocol import RunRequest
    from workers.train.loop import TrainJob


class ProgressActor:
    """Collects events and logs from rank 0 and carries the cancel and changeover flags to it."""

    def __init__(self) -> None:
        self._tracker = ProgressTracker()
        self._cancel = False
        self._changeover = False

    def event(self, event: ProgressEvent) -> None:
        self._tracker.event(event)

    def log(self, line: str) -> None:
        self._tracker.log(line)

    def logs(self, since: int = 0) -> list[str]:
        return self._tracker.logs(since)

    def snapshot(self) -> dict[str, Any]:
        return self._tracker.snapshot()

    def cancel(self) -> None:
        self._cancel = True

    def cancelled(self) -> bool:
        return self._cancel

    def checkpoint_stop(self) -> None:
        self._changeover = True

    def requested(self) -> StopReason | None:
        """What the scheduler asks of the run: a cancel (it wins), a checkpoint-and-stop, or nothing."""
        if self._cancel:
            return "cancel"
        return "changeover" if self._changeover else None

    def stop_requested(self) -> bool:
        """Whether the run is to end (cancelled, or asked to checkpoint and stop)."""
        return self._cancel or self._changeover


class _RayHooks(TrainHooks):
    """Rank 0 reports; every rank polls the same two collectives once per step.

    Rank 0 reads the driver's flags (``ProgressActor.requested``) at most every ``cancel_poll_s`` and
    broadcasts them, so every rank acts on a cancel or a changeover at the same step."""

    def __init__(self, progress: Any, rank: int, cancel_poll_s: float = 1.0, step_hook: StepHook | None = None) -> None:
        self._progress = progress
        self._rank = rank
        self._step_hook = step_hook
        self._cancel_poll_s = cancel_poll_s
        self._last_cancel_poll = 0.0
        self._requested: StopReason | None = None

    def on_log(self, line: str) -> None:
        self._progress.log.remote(line)

    def on_progress(self, progress: ProgressEvent) -> None:
        if progress["event"] == "started":  # where rank 0 runs: what a node loss would hit
            progress = {**progress, "node_id": ray.get_runtime_context().get_node_id()}
        self._progress.event.remote(progress)

    def fault(self, step: int, where: str) -> None:
        if self._step_hook is not None:
            self._step_hook(step, where)
            self._last_cancel_poll = 0.0  # a test's hold may have outlasted a cancel: read the flag this step

    def poll(self) -> Signal | None:
        import ray.train
        from ray.train.collective import broadcast_from_rank_zero

        info = ray.train.get_preemption_info()  # a barrier: every rank, every step
        if self._rank == 0 and time.monotonic() - self._last_cancel_poll >= self._cancel_poll_s:
            self._last_cancel_poll = time.monotonic()
            self._requested = ray.get(self._progress.requested.remote())
        requested: StopReason | None = broadcast_from_rank_zero(self._requested)
        if requested is not None:  # a cancel, or a changeover: the spot notice's just-in-time checkpoint, then stop
            return Signal(requested)
        if info is None:
            return None
        deadline = info.deadline_ms / 1000 if info.deadline_ms is not None else time.time() + 120
        return Signal("preempt", deadline=deadline)


def ray_train_loop(config: dict[str, Any]) -> dict[str, Any]:
    """``train_loop_per_worker``: the same loop as bare runs, with Ray's hooks."""
    import ray.train

    from workers.executors.cuda_env import configure_allocator

    configure_allocator()  # the driver's runtime env normally brings it; this covers a bare worker
    rank = ray.train.get_context().get_world_rank()
    if rank == 0:  # before torch and transformers load: recovery time splits here
        config["progress"].event.remote({"event": "booting"})
    from workers.train.loop import run_training

    job: TrainJob = config["job"]
    hooks = _RayHooks(config["progress"], rank, step_hook=config.get("step_hook"))
    try:
        return run_training(job, hooks).to_dict()
    except InvalidInput as exc:
        # Bad input fails the same way on every retry: end the run with the reason instead of raising,
        # which would make Ray Train restart the worker group max_failures times first.
        if rank == 0:
            hooks.on_log(f"error: {exc}")
        return {"error": str(exc)}


def ray_infer_task(request: RunRequest, progress: Any, use_gpu: bool, cpu_threads: int | None,
                   step_hook: StepHook | None = None) -> dict[str, Any]:
    """An inference attempt as one Ray task holding the planned GPUs (or one CPU).

    Reports to ``progress`` like rank 0 of a training run. Bad input (a missing prompts file, an
    object-store output path, ...) and any other error of the worker itself come back as
    ``{"error": ...}`` rather than raised: Ray retries the task only when its process or node is
    lost, and the retry resumes from the outputs file.
    """
    from workers.executors.cuda_env import configure_allocator

    configure_allocator()
    import torch

    from workers.infer.job import run_infer_attempt

    device = "cuda" if use_gpu and torch.cuda.is_available() else "cpu"
    if device == "cpu" and cpu_threads:
        torch.set_num_threads(cpu_threads)
    hooks = _InferHooks(progress, step_hook)
    try:
        return run_infer_attempt(request, device=device, on_progress=hooks.on_progress, on_log=hooks.on_log,
                                 should_stop=hooks.should_stop)
    except GpuplanError as exc:
        hooks.on_log(f"error: {exc}")
        return {"error": str(exc)}
    except Exception as exc:  # the traceback goes to the logs, the one-line reason to the status
        hooks.on_log(traceback.format_exc())
        return {"error": f"{type(exc).__name__}: {exc}"}


class _InferHooks:
    """Blocking calls (one per batch, not per step): the driver has every line and event before it
    sees the task's result, and the sink serves calls on several threads, in no set order."""

    def __init__(self, progress: Any, step_hook: StepHook | None = None) -> None:
        self._progress = progress
        self._step_hook = step_hook

    def on_log(self, line: str) -> None:
        ray.get(self._progress.log.remote(line))

    def on_progress(self, progress: ProgressEvent) -> None:
        if progress["event"] == "started":  # where it runs: what a node loss would hit
            progress = {**progress, "node_id": ray.get_runtime_context().get_node_id()}
        ray.get(self._progress.event.remote(progress))
        if self._step_hook is not None and progress["event"] == "step":
            self._step_hook(progress["step"], "batch")

    def should_stop(self) -> bool:
        """After each batch: has the scheduler asked this attempt to stop for a changeover?"""
        return bool(ray.get(self._progress.requested.remote()) == "changeover")
