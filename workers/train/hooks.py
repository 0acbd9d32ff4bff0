"""How the outside world talks to a running training loop (no torch here: Ray workers import this
before the heavy libraries, so recovery time can be split at that point)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

# cancel: stop at once, no checkpoint; preempt: a spot notice (just-in-time checkpoint); changeover: the
# scheduler moves the attempt (the same just-in-time checkpoint, then the attempt ends STOPPED)
StopReason = Literal["cancel", "preempt", "changeover"]

# Test hook an executor injects into its runs (default: none): called with (step, where) wherever a
# training loop calls ``TrainHooks.fault``, and with (requests done, "batch") after each batch an
# inference run writes. Tests pass one that blocks to hold a run at a known point, so that they
# never race a fast job. Under Ray it is pickled to the workers: it must be importable there.
StepHook = Callable[[int, str], None]


# Progress events: what a running loop reports (rank 0 only), to the executor's ProgressTracker.
class BootingEvent(TypedDict):
    """A Ray worker has started and is about to import the heavy libraries."""

    event: Literal["booting"]


class StartedEvent(TypedDict):
    event: Literal["started"]
    step: int  # train: the step it starts from; infer: requests already written
    total_steps: int  # infer: 0 until the first batch says
    tokens: int
    resumed_from_step: int | None
    world_size: NotRequired[int]
    node_id: NotRequired[str]  # added by the Ray executor: where rank 0 runs


class StepEvent(TypedDict):
    event: Literal["step"]
    step: int  # infer: requests done
    total_steps: int
    tokens: int
    loss: float | None
    tokens_per_s: float | None


class CheckpointEvent(TypedDict):
    """A checkpoint is durable."""

    event: Literal["checkpoint"]
    step: int
    checkpoints: int  # written so far in this attempt


class OomBackoffEvent(TypedDict):
    """A CUDA OOM survived by halving the micro-batch (same global batch)."""

    event: Literal["oom_backoff"]
    step: int
    from_micro_batch: int
    to_micro_batch: int
    from_grad_accum: int
    to_grad_accum: int


class ResultEvent(TypedDict):
    """The run ended: what it measured (workers.train.result.TrainResult.to_dict(), or the inference run's), next
    to the prediction. "failed" carries what it measured up to the failure."""

    event: Literal["finished", "failed"]
    result: dict[str, Any]


ProgressEvent = BootingEvent | StartedEvent | StepEvent | CheckpointEvent | OomBackoffEvent | ResultEvent


class StopRequested(Exception):
    """Raised by an inference run's progress callback after a batch is written, when the scheduler asked the
    attempt to stop for a changeover: the run ends there with its outputs flushed."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__(f"stopped for a changeover after {done} of {total} requests")
        self.done, self.total = done, total


@dataclass(frozen=True)
class Signal:
    """What the outside world asks of a running loop, agreed by all ranks."""

    kind: StopReason
    # preempt: when the node will be taken (unix s). The loop saves a just-in-time checkpoint,
    # then idles until then (Ray Train restarts it elsewhere). None: save and return at once.
    deadline: float | None = None


class TrainHooks:
    """Callbacks from the loop. Defaults do nothing; executors override what they need.

    ``poll`` is called by every rank exactly once per step and must return the same answer on
    every rank: under Ray it wraps ``ray.train.get_preemption_info()``, which is a barrier.
    """

    def on_log(self, line: str) -> None:
        pass

    def on_progress(self, progress: ProgressEvent) -> None:
        pass

    def poll(self) -> Signal | None:
        return None

    def fault(self, step: int, where: str) -> None:
        """Test hook: raise here to simulate the process dying at this point of the step, or block
        to hold the run here."""

    def before_forward(self, step: int, micro_batch: int) -> None:
        """Test hook, before each micro-batch's forward pass: raise ``torch.OutOfMemoryError`` here to
        play a step that runs out of GPU memory (the loop then halves the micro-batch)."""

    def checkpoint_file(self, relpath: str) -> None:
        """Called after each file of a checkpoint save is written (tests kill a save here)."""
