"""InProcessExecutor: runs attempts in threads of this process, with the same semantics as Ray.

Used by the scheduler's tests and by ``gpuplan run --no-ray``. It runs the real training loop
(or, for ``task: infer``, the real batch generation);
``preempt(handle)`` plays a spot notice (a just-in-time checkpoint, then PREEMPTED) so tests can
drive the resume path without a cluster; ``checkpoint_stop(handle)`` takes the same checkpoint and ends
the attempt STOPPED, for a changeover. A resubmission with the same ``checkpoint_uri`` resumes.
"""

from __future__ import annotations

import threading
import traceback
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from errors import GpuplanError, Infeasible
from planner.calibration import CostCalibration
from workers.checkpoint.interval import preemption_inputs
from workers.executors.cluster_fit import infeasibility, placement_for
from workers.executors.protocol import BootState, RunRequest, RunState, RunStatus
from workers.train.hooks import ProgressEvent, Signal, StepHook, StopReason, TrainHooks
from workers.train.loop import TrainJob, run_training
from workers.train.progress import ProgressTracker, result_backoffs, result_metrics

Predictor = Callable[[RunRequest], dict[str, float]]


@dataclass
class _Attempt:
    request: RunRequest
    tracker: ProgressTracker = field(default_factory=ProgressTracker)
    state: RunState = RunState.PENDING
    message: str = ""
    stop: StopReason | None = None
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)


class _Hooks(TrainHooks):
    def __init__(self, attempt: _Attempt, step_hook: StepHook | None = None) -> None:
        self.attempt = attempt
        self.step_hook = step_hook

    def on_log(self, line: str) -> None:
        self.attempt.tracker.log(line)

    def on_progress(self, progress: ProgressEvent) -> None:
        self.attempt.tracker.event(progress)

    def poll(self) -> Signal | None:
        return Signal(self.attempt.stop) if self.attempt.stop is not None else None

    def fault(self, step: int, where: str) -> None:
        if self.step_hook is not None:
            self.step_hook(step, where)

    def on_batch(self, progress: ProgressEvent) -> None:
        """``on_progress`` of an inference run: the step hook runs after each batch."""
        self.on_progress(progress)
        if self.step_hook is not None and progress["event"] == "step":
            self.step_hook(progress["step"], "batch")


class InProcessExecutor:
    """Executor that trains in a background thread per attempt.

    ``resources`` is the one node this process offers, in Ray's resource names (default: one CPU
    worker slot per core). Jobs that need more fail fast in ``submit`` as with RayExecutor.
    """

    def __init__(self, *, resources: Mapping[str, float] | None = None, device: str = "cpu",
                 cpu_threads: int | None = 1, predict: Predictor | None = None, log_every_s: float = 1.0,
                 step_hook: StepHook | None = None, cost: CostCalibration | None = None) -> None:
        """``cost``: the calibration's checkpoint write speed and default spot hazard, which the attempts'
        checkpoint interval is chosen from (None: the calibration type's defaults)."""
        import os

        self._resources = dict(resources) if resources is not None else {"CPU": float(os.cpu_count() or 1)}
        self._device = device
        self._cpu_threads = cpu_threads
        self._predict = predict
        self._log_every_s = log_every_s
        self._step_hook = step_hook  # tests only: see workers.train.hooks.StepHook
        self._cost = cost or CostCalibration()
        self._attempts: dict[str, _Attempt] = {}
        self._lock = threading.Lock()
        self._boots: set[str] = set()

    def _device_for(self, request: RunRequest) -> str:
        """The executor's device, except for a plan for the CPU (a server on a GPU machine runs both)."""
        return "cpu" if not placement_for(request.strategy).use_gpu else self._device

    def feasibility(self, request: RunRequest) -> str | None:
        reason = infeasibility(request.strategy, [self._resources])
        if reason is None:
            return None
        # The job's log shows this to a user of `gpuplan server`, for whom "the cluster" is this
        # one machine: say so, and where such a job can run.
        return (f"{reason}; the in-process executor runs jobs on this server's machine only: serve with "
                "--executor ray to use a Ray cluster's GPUs, or train on this machine with `gpuplan run SPEC`")

    def submit(self, request: RunRequest) -> str:
        reason = self.feasibility(request)
        if reason is not None:
            raise Infeasible(f"job {request.job_id} can never run here: {reason}")
        handle = f"{request.job_id}.{request.attempt}.{uuid.uuid4().hex[:8]}"
        attempt = _Attempt(request=request)
        # the job's name first: a thread dump (and a test's step hook) tells attempts apart by it
        thread = threading.Thread(target=self._run, args=(attempt,), name=f"gpuplan-{request.spec.name}-{handle}",
                                  daemon=True)
        attempt.thread = thread
        with self._lock:
            self._attempts[handle] = attempt
        thread.start()
        return handle

    def _run(self, attempt: _Attempt) -> None:
        request = attempt.request
        try:
            if attempt.stop == "cancel":
                attempt.state = RunState.CANCELLED
                attempt.message = "cancelled before it started"
                return
            if attempt.stop == "changeover":
                attempt.state = RunState.STOPPED
                attempt.message = "stopped for a changeover before it started"
                return
            attempt.state = RunState.RUNNING
            if request.spec.task == "infer":
                from workers.infer.job import run_infer_attempt

                hooks = _Hooks(attempt, self._step_hook)
                outcome = run_infer_attempt(request, device=self._device_for(request), on_progress=hooks.on_batch,
                                            on_log=hooks.on_log, cpu_threads=self._cpu_threads,
                                            should_stop=lambda: attempt.stop == "changeover")
                if outcome.get("status") == "stopped":
                    attempt.state = RunState.STOPPED
                    attempt.message = (f"stopped for a changeover after {outcome['steps']} of "
                                       f"{outcome['total_steps']} requests; outputs flushed")
                    return
                attempt.state = RunState.SUCCEEDED
                attempt.message = f"generated {attempt.tracker.progress().step} requests"
                return
            predicted = preemption_inputs(request.market, self._predict(request) if self._predict is not None else {},
                                          request.mean_time_to_preemption_h, self._cost)
            job = TrainJob(job_id=request.job_id, spec=request.spec, strategy=request.strategy,
                           checkpoint_uri=request.checkpoint_uri, device=self._device_for(request),
                           cpu_threads=self._cpu_threads, log_every_s=self._log_every_s, predicted=predicted,
                           checkpoint_write_gbps=self._cost.checkpoint_write_gbps)
            result = run_training(job, _Hooks(attempt, self._step_hook))
            if result.status == "preempted":
                attempt.state = RunState.PREEMPTED
                attempt.message = (f"preempted at step {result.steps}; a just-in-time checkpoint was saved, "
                                   "resubmit to resume")
            elif result.status == "stopped":
                attempt.state = RunState.STOPPED
                attempt.message = (f"stopped for a changeover at step {result.steps}; checkpoint of step "
                                   f"{result.checkpoint_step} saved")
            elif result.status == "cancelled":
                attempt.state = RunState.CANCELLED
                attempt.message = f"cancelled at step {result.steps}"
            else:
                attempt.state = RunState.SUCCEEDED
                attempt.message = f"finished {result.steps} steps, final loss {result.final_loss:.4f}" \
                    if result.final_loss is not None else f"finished {result.steps} steps"
        except GpuplanError as exc:
            attempt.tracker.log(f"error: {exc}")
            attempt.state = RunState.FAILED
            attempt.message = str(exc)
        except Exception as exc:  # a job must never vanish: every failure becomes FAILED with its reason
            attempt.tracker.log(traceback.format_exc())
            attempt.state = RunState.FAILED
            attempt.message = f"{type(exc).__name__}: {exc}"
        finally:
            attempt.done.set()

    def _get(self, handle: str) -> _Attempt:
        from errors import NotFound

        with self._lock:
            attempt = self._attempts.get(handle)
        if attempt is None:
            raise NotFound(f"no attempt with handle {handle!r} in this executor")
        return attempt

    def status(self, handle: str) -> RunStatus:
        attempt = self._get(handle)
        state = attempt.state
        tracker = attempt.tracker
        result = tracker.result() if state.finished else None
        metrics = result_metrics(result, tracker.resumes) if state.finished else {}
        return RunStatus(handle=handle, state=state, progress=tracker.progress(), message=attempt.message,
                         metrics=metrics, oom_backoffs=result_backoffs(result))

    def logs(self, handle: str, since: int = 0) -> list[str]:
        return self._get(handle).tracker.logs(since)

    def cancel(self, handle: str) -> None:
        attempt = self._get(handle)
        if not attempt.state.finished:
            attempt.stop = "cancel"

    def preempt(self, handle: str) -> None:
        """Play a spot notice: the loop saves a just-in-time checkpoint and the attempt ends PREEMPTED."""
        attempt = self._get(handle)
        if not attempt.state.finished:
            attempt.stop = "preempt"

    def checkpoint_stop(self, handle: str) -> None:
        """Stop for a changeover (``workers.executors.protocol.StopsForChangeover``): training saves a checkpoint of the
        step it finishes and ends STOPPED; inference stops after the batch it writes. A cancel wins."""
        attempt = self._get(handle)
        if not attempt.state.finished and attempt.stop is None:
            attempt.stop = "changeover"

    def active(self) -> list[str]:
        with self._lock:
            return [h for h, a in self._attempts.items() if not a.done.is_set()]

    # Make-before-break (``workers.executors.protocol.BootsAhead``): this process is the only node, always up, so a
    # boot is ready at once; what it keeps is whether the token is held.

    def boot(self, request: RunRequest) -> str:
        reason = self.feasibility(request)
        if reason is not None:
            raise Infeasible(f"job {request.job_id} cannot boot here: {reason}")
        token = f"boot-{request.run_name}-{uuid.uuid4().hex[:8]}"
        with self._lock:
            self._boots.add(token)
        return token

    def boot_state(self, token: str) -> BootState:
        with self._lock:
            return BootState.READY if token in self._boots else BootState.GONE

    def unboot(self, token: str) -> None:
        with self._lock:
            self._boots.discard(token)

    def wait(self, handle: str, timeout: float | None = None) -> RunStatus:
        """Block until the attempt finishes (or ``timeout`` seconds pass); returns its status."""
        self._get(handle).done.wait(timeout)
        return self.status(handle)
