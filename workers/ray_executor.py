"""RayExecutor: runs an attempt as a Ray Train V2 ``TorchTrainer`` on a Ray cluster.

How failures surface (what the scheduler sees in ``status()``):

- Node loss with no warning, or a spot notice (a node drained with reason PREEMPTION): the
  attempt **resumes in place**. Ray Train restarts the worker group on the nodes that remain
  (``FailureConfig(max_failures=N, max_preemption_failures=-1)``) and the loop continues from the
  newest checkpoint in the job's store. The state stays RUNNING; ``progress.resumed_from_step``
  and ``metrics['resumes']`` count the resumes, and ``message`` says so. This executor never
  reports PREEMPTED: that state is for executors that cannot move a run by themselves.
- More than N real failures, or a bad input (missing data file, invalid model config, a
  checkpoint of a different model shape, an unreachable store): FAILED with the reason. Bad input
  is not retried: the same input would fail the same way.
- A job that no node of the cluster could ever hold: ``submit`` raises ``Infeasible`` with the
  reason instead of pending silently; while a submitted run waits for resources, ``message`` says
  which.

``fit()`` runs in a background thread of this process so ``submit`` returns at once.
"""

from __future__ import annotations

import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from catalog.errors import GpuplanError, Infeasible, NotFound
from workers.executor import RunProgress, RunRequest, RunState, RunStatus
from workers.placement import infeasibility, node_labels, placement_for
from workers.progress import result_metrics
from workers.ray_loop import progress_actor, ray_train_loop
from workers.train import TrainJob

Predictor = Callable[[RunRequest], dict[str, float]]
_FAILED_PREFIX = "gpuplan-failed: "


@dataclass
class _RayAttempt:
    request: RunRequest
    progress: Any  # ProgressActor handle
    state: RunState = RunState.PENDING
    message: str = ""
    cancelled: bool = False
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    driver_logs: list[str] = field(default_factory=list)
    # Kept when the attempt ends, then the progress actor is released (one per attempt would leak).
    final_snapshot: dict[str, Any] | None = None
    final_logs: list[str] | None = None


def live_nodes() -> list[dict[str, float]]:
    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]


class RayExecutor:
    """Executor on a Ray cluster (connects to ``address``, or uses the one this process joined)."""

    def __init__(self, *, address: str | None = None, storage_path: str | None = None, max_failures: int = 3,
                 backend: str | None = None, cpu_threads: int | None = None, predict: Predictor | None = None,
                 log_every_s: float = 2.0, init_kwargs: dict[str, Any] | None = None) -> None:
        self._address = address
        self._storage_path = storage_path or str(Path.home() / ".gpuplan" / "ray")
        self._max_failures = max_failures
        self._backend = backend  # None: nccl on GPUs, gloo on CPUs; tests with fake GPUs pass "gloo"
        self._cpu_threads = cpu_threads
        self._predict = predict
        self._log_every_s = log_every_s
        self._init_kwargs = init_kwargs or {}
        self._attempts: dict[str, _RayAttempt] = {}
        self._lock = threading.Lock()

    def _connect(self) -> None:
        if not ray.is_initialized():
            ray.init(address=self._address, **self._init_kwargs)

    def feasibility(self, request: RunRequest) -> str | None:
        self._connect()
        if request.spec.task != "train":
            return f"the Ray executor runs training jobs only, not {request.spec.task!r}"
        return infeasibility(request.strategy, live_nodes())

    def submit(self, request: RunRequest) -> str:
        reason = self.feasibility(request)
        if reason is not None:
            raise Infeasible(f"job {request.job_id} can never run on this cluster: {reason}",
                             hint="add such nodes to the cluster, or plan the job for the GPUs it has")
        handle = f"{request.run_name}.{request.attempt}.{uuid.uuid4().hex[:8]}"
        attempt = _RayAttempt(request=request, progress=progress_actor(ray.get_runtime_context().get_node_id()))
        attempt.thread = threading.Thread(target=self._run, args=(attempt,), name=f"gpuplan-{handle}", daemon=True)
        with self._lock:
            self._attempts[handle] = attempt
        attempt.thread.start()
        return handle

    def _trainer(self, request: RunRequest, attempt: _RayAttempt) -> Any:
        from ray.train.torch import TorchConfig, TorchTrainer
        from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig

        placement = placement_for(request.strategy, node_labels(live_nodes()))
        predicted = self._predict(request) if self._predict is not None else {}
        job = TrainJob(job_id=request.job_id, spec=request.spec, strategy=request.strategy,
                       checkpoint_uri=request.checkpoint_uri, device="auto", cpu_threads=self._cpu_threads,
                       log_every_s=self._log_every_s, predicted=predicted)
        scaling = ScalingConfig(num_workers=placement.num_workers, use_gpu=placement.use_gpu,
                                accelerator_type=placement.accelerator,
                                resources_per_worker={"CPU": 1, **({"GPU": 1} if placement.use_gpu else {})})
        backend = self._backend or ("nccl" if placement.use_gpu else "gloo")
        return TorchTrainer(
            train_loop_per_worker=ray_train_loop,  # type: ignore[arg-type]
            train_loop_config={"job": job, "progress": attempt.progress},
            scaling_config=scaling,
            torch_config=TorchConfig(backend=backend),
            run_config=RunConfig(  # type: ignore[arg-type]
                name=request.run_name,
                storage_path=self._storage_path,
                failure_config=FailureConfig(max_failures=self._max_failures, max_preemption_failures=-1),
            ),
        )

    def _run(self, attempt: _RayAttempt) -> None:
        request = attempt.request
        try:
            _preflight(request)
            trainer = self._trainer(request, attempt)
            result = trainer.fit()
            outcome = _rank0_outcome(result)
            snapshot = ray.get(attempt.progress.snapshot.remote(), timeout=30)
            finished = snapshot.get("result") or {}
            if outcome.startswith(_FAILED_PREFIX):
                attempt.state, attempt.message = RunState.FAILED, outcome.removeprefix(_FAILED_PREFIX)
            elif finished.get("status") == "cancelled" or attempt.cancelled:
                attempt.state, attempt.message = RunState.CANCELLED, f"cancelled at step {finished.get('steps', 0)}"
            else:
                attempt.state = RunState.SUCCEEDED
                attempt.message = f"finished {finished.get('steps')} steps" + _resume_note(snapshot)
        except GpuplanError as exc:
            attempt.state, attempt.message = RunState.FAILED, str(exc)
        except Exception as exc:  # a job must never vanish: every failure becomes FAILED with its reason
            attempt.driver_logs.append(traceback.format_exc())
            attempt.state, attempt.message = RunState.FAILED, _failure_message(exc)
        finally:
            self._release(attempt)
            attempt.done.set()

    def _release(self, attempt: _RayAttempt) -> None:
        try:
            attempt.final_snapshot = ray.get(attempt.progress.snapshot.remote(), timeout=30)
            attempt.final_logs = ray.get(attempt.progress.logs.remote(0), timeout=30)
            ray.kill(attempt.progress)
        except Exception as exc:  # progress is lost, the outcome is not: state and message are set
            attempt.driver_logs.append(f"could not read the final progress: {exc}")

    def _get(self, handle: str) -> _RayAttempt:
        with self._lock:
            attempt = self._attempts.get(handle)
        if attempt is None:
            raise NotFound(f"no attempt with handle {handle!r} in this executor")
        return attempt

    def _snapshot(self, attempt: _RayAttempt) -> dict[str, Any]:
        if attempt.final_snapshot is not None:
            return attempt.final_snapshot
        try:
            snapshot: dict[str, Any] = ray.get(attempt.progress.snapshot.remote(), timeout=10)
            return snapshot
        except Exception:  # the actor lives on the driver's node; if it is gone only progress is lost
            return {"progress": RunProgress(), "resumes": 0, "restarts": 0, "result": None}

    def status(self, handle: str) -> RunStatus:
        attempt = self._get(handle)
        snapshot = self._snapshot(attempt)
        progress: RunProgress = snapshot["progress"]
        state, message = attempt.state, attempt.message
        if not state.finished:
            started = progress.total_steps > 0
            state = RunState.RUNNING if started else RunState.PENDING
            message = "running" + _resume_note(snapshot) if started else "waiting for workers to start"
            reason = infeasibility(attempt.request.strategy, live_nodes())
            if reason is not None:
                message = f"{message}; waiting for resources: {reason}"
        metrics = result_metrics(snapshot.get("result"), int(snapshot.get("resumes", 0))) if state.finished else {}
        if not state.finished:
            metrics = {"resumes": float(snapshot.get("resumes", 0))}
        return RunStatus(handle=handle, state=state, progress=progress, message=message, metrics=metrics)

    def logs(self, handle: str, since: int = 0) -> list[str]:
        attempt = self._get(handle)
        if attempt.final_logs is not None:
            lines = attempt.final_logs
        else:
            try:
                lines = ray.get(attempt.progress.logs.remote(0), timeout=10)
            except Exception:
                lines = []
        return (lines + attempt.driver_logs)[since:]

    def cancel(self, handle: str) -> None:
        attempt = self._get(handle)
        if not attempt.done.is_set():
            attempt.cancelled = True
            attempt.progress.cancel.remote()

    def active(self) -> list[str]:
        with self._lock:
            return [h for h, a in self._attempts.items() if not a.done.is_set()]

    def wait(self, handle: str, timeout: float | None = None) -> RunStatus:
        self._get(handle).done.wait(timeout)
        return self.status(handle)


def _preflight(request: RunRequest) -> None:
    """Checks worth doing once on the driver rather than once per worker and retry: the store."""
    from workers.checkpoint import open_store

    open_store(request.checkpoint_uri)


def _rank0_outcome(result: Any) -> str:
    value = getattr(result, "return_value", None)
    if isinstance(value, dict) and isinstance(value.get("error"), str):
        return _FAILED_PREFIX + str(value["error"])
    return "ok"


def _resume_note(snapshot: dict[str, Any]) -> str:
    resumes = int(snapshot.get("resumes", 0))
    progress: RunProgress = snapshot["progress"]
    if not resumes:
        return ""
    return f"; resumed {resumes} time(s), last from the checkpoint of step {progress.resumed_from_step}"


def _failure_message(exc: BaseException) -> str:
    """The root cause of a Ray Train failure in one line, without Ray's wrapping."""
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, dict) and failures:
        rank, error = sorted(failures.items())[0]
        cause = getattr(error, "cause", None) or error
        text = str(cause).strip().splitlines()
        return f"training failed on rank {rank}: {text[-1] if text else type(cause).__name__}"
    controller = getattr(exc, "controller_failure", None)
    if controller is not None:
        return f"Ray Train controller failed: {controller}"
    return f"{type(exc).__name__}: {exc}"

