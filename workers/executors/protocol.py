"""The Executor protocol: how the scheduler hands a job to something that runs it.

The scheduler never imports Ray; it talks to an ``Executor``. ``RayExecutor`` (workers.executors.ray_executor)
runs jobs on a Ray cluster; ``InProcessExecutor`` (workers.executors.inprocess) runs them in threads for tests
and for the embedded default without Ray.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from planner.spec import JobSpec
from planner.types import Strategy


class RunState(enum.StrEnum):
    PENDING = "pending"  # accepted, waiting for resources
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"  # lost its node; resubmit to resume from the checkpoint
    CANCELLED = "cancelled"
    # checkpointed and stopped at the scheduler's request (``StopsForChangeover.checkpoint_stop``): training
    # saved a checkpoint of the step it stopped at, inference flushed its outputs; the next attempt resumes there
    STOPPED = "stopped"

    @property
    def finished(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.PREEMPTED, RunState.CANCELLED,
                        RunState.STOPPED)


@dataclass(frozen=True)
class RunRequest:
    """One attempt at a job. ``run_name`` is stable across attempts so a resubmission resumes."""

    job_id: str
    attempt: int
    spec: JobSpec
    strategy: Strategy
    checkpoint_uri: str  # local directory or s3://bucket/prefix, shared by all attempts of the job
    run_name: str  # Ray Train RunConfig name: the job id, never reused for another job
    market: str = "on-demand"
    # AWS zone id the plan priced (e.g. "use1-az1"); on a gpuplan cluster the workers ask for that zone's
    # node type (workers.executors.cluster_fit). None: any zone. A zone-switching policy sets another zone here.
    zone: str | None = None
    # spot: the mean time to preemption the plan priced this placement at; the checkpoint interval
    # is chosen for it (workers.checkpoint.interval). None: the catalog's default hazard.
    mean_time_to_preemption_h: float | None = None


@dataclass
class RunProgress:
    step: int = 0
    total_steps: int = 0
    tokens: int = 0
    loss: float | None = None
    tokens_per_s: float | None = None
    checkpoints: int = 0
    resumed_from_step: int | None = None
    # the newest step with a durable checkpoint that this attempt knows of (one it wrote, or the one it
    # resumed from); None: none yet. A changeover that has to stop without a checkpoint loses the steps after it.
    checkpoint_step: int | None = None


@dataclass
class RunStatus:
    handle: str
    state: RunState
    progress: RunProgress = field(default_factory=RunProgress)
    message: str = ""  # why it failed / was preempted / is pending
    metrics: dict[str, float] = field(default_factory=dict)  # measured peak memory, tokens/s, ...
    # each CUDA OOM the worker survived by halving the micro-batch: step, from/to micro_batch and grad_accum
    oom_backoffs: list[dict[str, int]] = field(default_factory=list)
    # pending only: why the nodes it waits for are not coming (the cloud refused their launch, in the
    # autoscaler's words); the scheduler moves the job down its planned placements after a while
    launch_failure: str = ""


@runtime_checkable
class Executor(Protocol):
    def feasibility(self, request: RunRequest) -> str | None:
        """None if some node can ever run it; otherwise the reason it never could."""

    def submit(self, request: RunRequest) -> str:
        """Start the attempt; returns a handle. Raises Infeasible when no node ever could."""

    def status(self, handle: str) -> RunStatus: ...

    def logs(self, handle: str, since: int = 0) -> list[str]:
        """Log lines from index ``since`` on."""

    def cancel(self, handle: str) -> None: ...

    def active(self) -> list[str]:
        """Handles of attempts still pending or running (used to reconcile after a restart).

        An executor whose attempts outlive its process (RayExecutor) answers from what really runs,
        so a new instance after a restart returns the attempts the old one started.
        """


@runtime_checkable
class StopsForChangeover(Protocol):
    """An executor that can stop an attempt without losing work, for the scheduler to move it
    (scheduler.loop.changeover)."""

    def checkpoint_stop(self, handle: str) -> None:
        """Ask the attempt to stop at its next step boundary and end STOPPED: training first saves a
        checkpoint of that step (the loop's just-in-time checkpoint, as on a spot notice) and reports
        the step (``progress.checkpoint_step``); inference stops after the batch it is writing, its
        outputs flushed. One still waiting for resources stops at once. Returns at once (the attempt
        answers through ``status``); idempotent; a finished or unknown attempt is left alone. A cancel
        takes precedence."""


class BootState(enum.StrEnum):
    BOOTING = "booting"  # the nodes are being started (or wait for capacity)
    READY = "ready"  # up and held: an attempt submitted now starts on them without a restart's wait
    GONE = "gone"  # the hold is no more (released, or its nodes were lost)


@runtime_checkable
class BootsAhead(Protocol):
    """An executor that can bring up the nodes an attempt would run on before it runs there, so that a
    running attempt moves onto them without waiting for a restart (make-before-break changeovers:
    scheduler.spot.policy's BOOT_SPOT, docs/SPOT.md)."""

    def boot(self, request: RunRequest) -> str:
        """Start (and hold, unused) the nodes ``request`` would run on; returns a token for them. Returns at
        once; ``boot_state`` says when they are up."""

    def boot_state(self, token: str) -> BootState:
        """Where the nodes of ``token`` are; an unknown token is GONE."""

    def unboot(self, token: str) -> None:
        """Release the hold (the nodes stay up for the cluster's idle timeout, for an attempt submitted
        next); idempotent."""


@runtime_checkable
class ReleasesAttempts(Protocol):
    """An executor that keeps finished attempts (their outcome) until the scheduler has read them."""

    def release(self, handle: str) -> None:
        """The outcome of ``handle`` is recorded: drop it once it has ended (``status`` may then
        raise NotFound). Called after the attempt's row is closed; unknown handles are ignored."""

    def held(self) -> list[str]:
        """Finished attempts still kept for their outcome (not released yet). After a crash between
        closing an attempt's row and releasing it, the scheduler's reconcile releases these."""
