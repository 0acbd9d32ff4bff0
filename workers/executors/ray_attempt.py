"""The driver of one Ray attempt: a detached, named actor that owns the ``TorchTrainer.fit()`` call
of a training job, or the Ray task of an inference job.

It lives in its executor's Ray namespace (default ``gpuplan``) under the attempt's handle, pinned
to the head node with no CPU, so the attempt outlives the process that submitted it: any process
connected to the cluster finds it by name (``ray.get_actor(handle, namespace=...)``) and asks it for status,
logs, or a cancel. Actors and placement groups that ``fit()`` creates descend from this detached
actor, so Ray keeps them when the submitting driver's job ends.

The actor is also the attempt's progress sink: rank 0 reports events and log lines to it and
polls its cancel flag (the methods of :class:`workers.executors.ray_loop.ProgressActor`).

Inference (``task: infer``) runs as one Ray task (``workers.executors.ray_loop.ray_infer_task``) that holds
the planned GPUs on one node (``accelerator_type`` from the strategy; the worker generates on the
first of them) and one CPU, or the planned CPUs with no GPU. It reports to this actor like rank 0.
Cancel force-cancels the task, pending or running: outputs are appended a batch at a time and
fsynced, and a torn last line is cut on resume, so killing it mid-batch loses at most that batch.
A lost process or node makes Ray retry the task (up to ``max_failures`` times) and the retry
skips the requests already in the outputs file; bad input comes back as an error, not retried. After ``fit()``
returns, the actor keeps the outcome and the final progress until the scheduler has read them
(``release``), or at most ``keep_finished_s``, then exits, so finished attempts do not pile up.
Before that it writes them, logs included, as a record next to the Ray Train run
(``{storage_path}/gpuplan-attempts/{handle}.json``, workers.executors.ray_outcome): what ``status`` and ``logs``
answer once the actor is gone.

Cost: one process per live attempt on the head node, next to Ray Train's controller (it imports
torch and Ray Train: about 0.35 GiB resident). Size the head node for the attempts that run at once.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from errors import GpuplanError
from planner.calibration import CostCalibration
from planner.types import Strategy
from workers.executors.cluster_fit import (
    WorkerLayout,
    infeasibility,
    launchable_nodes,
    node_labels,
    pin_resources,
    pins_markets,
    placement_for,
)
from workers.executors.cuda_env import allocator_env
from workers.executors.protocol import RunRequest, RunState
from workers.executors.ray_loop import ProgressActor, ray_infer_task, ray_train_loop
from workers.executors.ray_outcome import FAILED_PREFIX, failure_message, rank0_outcome, resume_note, write_record
from workers.train.hooks import StepHook
from workers.train.loop import TrainJob

NAMESPACE = "gpuplan"
HEAD_NODE_RESOURCE = "node:__internal_head__"  # what Ray Train pins its own detached helpers with
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"


@dataclass(frozen=True)
class DriverSettings:
    storage_path: str
    max_failures: int
    backend: str | None  # None: nccl on GPUs, gloo on CPUs
    cpu_threads: int | None
    log_every_s: float
    predicted: dict[str, float] = field(default_factory=dict)
    checkpoint_write_gbps: float = field(default_factory=lambda: CostCalibration().checkpoint_write_gbps)
    # A finished attempt's outcome is kept this long for a scheduler that never reads it (it died).
    keep_finished_s: float = 24 * 3600.0
    # While waiting for resources, Ray Train's controller blocks this long per try to place the
    # worker group and looks at the cancel flag between tries: it bounds how long cancelling a
    # pending attempt takes.
    start_timeout_s: float = 10.0
    step_hook: StepHook | None = None  # tests only: see workers.train.hooks.StepHook
    # the autoscaler's worker node types, each (resources, max_workers): see workers.cluster.config
    node_types: tuple[tuple[dict[str, float], int], ...] = ()


class AttemptDriver(ProgressActor):
    """One attempt, from ``start()`` to its outcome. Thread-safe: the actor serves calls concurrently."""

    def __init__(self, request: RunRequest, settings: DriverSettings) -> None:
        super().__init__()
        self._request = request
        self._settings = settings
        self._lock = threading.Lock()
        self._state = RunState.PENDING
        self._message = ""
        self._driver_logs: list[str] = []
        self._done = threading.Event()
        self._started = False
        self._released = False
        self._self: Any = None
        self._task: Any = None  # the ObjectRef of an inference attempt's task, once submitted
        self._gated = False  # the controller was told to end the run before placing its workers

    # -------------------------------------------------------------- called by the executor

    def start(self) -> str:
        self._self = ray.get_runtime_context().current_actor
        with self._lock:
            self._started = True
        threading.Thread(target=self._run, name="gpuplan-attempt", daemon=True).start()
        return self._request.run_name

    def info(self) -> dict[str, Any]:
        """State, message and progress in one picklable value (what ``RayExecutor.status`` reads)."""
        with self._lock:
            state, message = self._state, self._message
        return {"state": state.value, "message": message, "snapshot": self.snapshot(),
                "strategy": self._request.strategy, "run_name": self._request.run_name, "request": self._request,
                "task": self._request.spec.task, "done": self._done.is_set()}

    def all_logs(self, since: int = 0) -> list[str]:
        with self._lock:
            driver = list(self._driver_logs)
        return (self.logs(0) + driver)[since:]

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """Stop the attempt: rank 0 polls the flag every step, Ray Train's controller before each
        try to place the worker group (``_cancel_gate``), so a pending attempt stops too. An
        inference task is force-cancelled, whether it waits for resources or runs."""
        with self._lock:
            self._cancel = True
            task = self._task
        if task is not None:
            ray.cancel(task, force=True)

    def checkpoint_stop(self) -> None:
        """Stop for a changeover, keeping all work (``workers.executors.protocol.StopsForChangeover``): rank 0 reads
        the flag with the cancel flag and every rank takes the just-in-time checkpoint of the step, as on
        a spot notice; the run then ends STOPPED. An inference task stops after the batch it is writing;
        one not started yet, and a training run waiting for its workers, stop at once as a cancel would."""
        with self._lock:
            self._changeover = True
            task = self._task
        if task is not None and not self.snapshot().get("started_at"):  # not running: nothing to flush
            ray.cancel(task, force=True)

    def gate(self) -> bool:
        """Asked by Ray Train's controller before it places workers (``_cancel_gate``): whether to end the
        run there (cancelled, or stopped for a changeover), remembered so the error it ends with is not
        taken for a failure."""
        with self._lock:
            if self.stop_requested():
                self._gated = True
            return self._gated

    def release(self) -> None:
        """The scheduler has recorded the outcome: exit now, or as soon as the attempt ends."""
        with self._lock:
            self._released = True
            started = self._started
        if self._done.is_set() or not started:  # never started: its submitter died before ``start``
            self._exit()

    # -------------------------------------------------------------- the attempt

    def _run(self) -> None:
        request = self._request
        try:
            if request.spec.task == "infer":
                self._run_infer()
                return
            _preflight(request)
            if self.stop_requested():
                self._set_stopped_early("before it started")
                return
            result = build_trainer(request, self._settings, self._self).fit()
            outcome = rank0_outcome(result)
            snapshot = self.snapshot()
            finished = snapshot.get("result") or {}
            if outcome.startswith(FAILED_PREFIX):
                self._set(RunState.FAILED, outcome.removeprefix(FAILED_PREFIX))
            elif finished.get("status") == "cancelled" or self.cancelled():
                self._set(RunState.CANCELLED, f"cancelled at step {finished.get('steps', 0)}")
            elif finished.get("status") == "stopped":
                self._set(RunState.STOPPED, f"stopped for a changeover at step {finished.get('steps', 0)}; "
                          f"checkpoint of step {finished.get('checkpoint_step')} saved" + resume_note(snapshot))
            else:
                self._set(RunState.SUCCEEDED, f"finished {finished.get('steps')} steps" + resume_note(snapshot))
        except GpuplanError as exc:
            self._set(RunState.FAILED, str(exc))
        except Exception as exc:  # a job must never vanish: every failure becomes FAILED with its reason
            # the controller ends a stopped run that waits for workers by raising (_cancel_gate)
            if self.cancelled() or self._gated:
                self._set_stopped_early("while waiting for its workers")
            else:
                with self._lock:
                    self._driver_logs.append(traceback.format_exc())
                self._set(RunState.FAILED, failure_message(exc))
        finally:
            self._write_record()
            self._done.set()
            with self._lock:
                released = self._released
            if released:
                self._exit()
            else:
                timer = threading.Timer(self._settings.keep_finished_s, self._exit)
                timer.daemon = True
                timer.start()

    def _run_infer(self) -> None:
        from workers.infer.job import outputs_folder

        request = self._request
        outputs_folder(request)  # an unusable output location fails before anything is scheduled
        placement = request_placement(request, live_nodes(), self._settings.node_types)
        with self._lock:
            if self._cancel or self._changeover:
                if self._cancel:
                    self._set_locked(RunState.CANCELLED, "cancelled before it started")
                else:
                    self._set_locked(RunState.STOPPED, "stopped for a changeover before it started")
                return
            task = ray.remote(ray_infer_task).options(
                **infer_resources(request.strategy, placement), max_retries=self._settings.max_failures,
                retry_exceptions=False)
            self._task = task.remote(request, self._self, placement.use_gpu, self._settings.cpu_threads,
                                     self._settings.step_hook)
        try:
            outcome: dict[str, Any] = ray.get(self._task)
        except Exception:
            if not self.stop_requested():
                raise
            if self.cancelled():
                self._set(RunState.CANCELLED, self._infer_cancel_note())
            else:  # asked to stop before its first batch: force-cancelled, nothing was being written
                self._set(RunState.STOPPED, "stopped for a changeover " + self._infer_cancel_note().removeprefix(
                    "cancelled "))
            return
        snapshot = self.snapshot()
        if isinstance(outcome.get("error"), str):
            self._set(RunState.FAILED, outcome["error"])
        elif outcome.get("status") == "stopped":
            self._set(RunState.STOPPED, f"stopped for a changeover after {outcome.get('steps')} of "
                      f"{outcome.get('total_steps')} requests; outputs flushed" + resume_note(snapshot, "infer"))
        elif self.cancelled():  # the cancel came as the last batch was written: it did finish
            self._set(RunState.SUCCEEDED, f"generated {outcome.get('steps')} requests (cancelled as it finished)")
        else:
            self._set(RunState.SUCCEEDED, f"generated {outcome.get('steps')} requests"
                      + resume_note(snapshot, "infer"))

    def _infer_cancel_note(self) -> str:
        snapshot = self.snapshot()
        progress = snapshot["progress"]
        if not snapshot.get("started_at"):
            return "cancelled while waiting for resources"
        if progress.total_steps == 0:
            return "cancelled before its first batch was written"
        return f"cancelled after {progress.step} of {progress.total_steps} requests"

    def _write_record(self) -> None:
        with self._lock:
            state, message = self._state, self._message
        snapshot = self.snapshot()
        record = {"state": state.value, "message": message, "logs": self.all_logs(0),
                  "snapshot": {**snapshot, "progress": asdict(snapshot["progress"])}}
        try:
            write_record(self._settings.storage_path, self._handle(), record)
        except Exception as exc:  # only the after-release view is lost; the actor still answers
            with self._lock:
                self._driver_logs.append(f"could not write the attempt record: {exc}")

    def _handle(self) -> str:
        return str(ray.get_runtime_context().get_actor_name())

    def _set(self, state: RunState, message: str) -> None:
        with self._lock:
            self._set_locked(state, message)

    def _set_locked(self, state: RunState, message: str) -> None:
        self._state, self._message = state, message

    def _set_stopped_early(self, when: str) -> None:
        """A cancel, or a changeover, of a run with no training loop to take a checkpoint (not started, or
        waiting for new workers after a node loss): the newest checkpoint stands, and the next attempt
        starts from it, as this one would have."""
        if self.cancelled():
            self._set(RunState.CANCELLED, "cancelled before it started" if when == "before it started"
                      else self._cancel_note())
            return
        step = self.snapshot()["progress"].checkpoint_step
        newest = f"; its newest checkpoint (step {step}) stands" if step is not None else ""
        self._set(RunState.STOPPED, f"stopped for a changeover {when}{newest}")

    def _cancel_note(self) -> str:
        progress = self.snapshot()["progress"]
        if progress.total_steps == 0:
            return "cancelled while waiting for resources"
        return f"cancelled at step {progress.step} while waiting to restart its workers"

    def _exit(self) -> None:
        # Through the GCS, like any ray.kill: the name is freed and the actor is not restarted.
        ray.kill(self._self or ray.get_runtime_context().current_actor, no_restart=True)


def live_nodes() -> list[dict[str, float]]:
    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]


def infer_resources(strategy: Strategy, placement: WorkerLayout) -> dict[str, Any]:
    """Ray options of an inference task: all planned GPUs (and one CPU) on one node, or the planned CPUs."""
    if placement.use_gpu:
        options: dict[str, Any] = {"num_cpus": 1, "num_gpus": strategy.gpu_count}
        if placement.accelerator_request is not None:
            options["accelerator_type"] = placement.accelerator_request
        if placement.pins:
            options["resources"] = {k: v * strategy.gpu_count for k, v in placement.pins.items()}
        return options
    return {"num_cpus": strategy.gpu_count}


def request_pins(request: RunRequest, nodes: Sequence[Mapping[str, float]],
                 node_types: Sequence[tuple[Mapping[str, float], int]] = ()) -> dict[str, float]:
    """The (GPU, market, zone) resources each GPU worker asks for, where the cluster's nodes or node
    types follow that scheme (a cluster from ``gpuplan cluster config``); empty elsewhere."""
    if not placement_for(request.strategy).use_gpu:
        return {}
    if not pins_markets([*nodes, *(resources for resources, _ in node_types)]):
        return {}
    return pin_resources(request.strategy.gpu, request.market, request.zone)


def request_placement(request: RunRequest, nodes: Sequence[Mapping[str, float]],
                      node_types: Sequence[tuple[Mapping[str, float], int]] = ()) -> WorkerLayout:
    return placement_for(request.strategy, node_labels(nodes), pins=request_pins(request, nodes, node_types))


def attempt_infeasibility(request: RunRequest, nodes: Sequence[Mapping[str, float]],
                          node_types: Sequence[tuple[Mapping[str, float], int]] = ()) -> str | None:
    """None if some node(s) of ``nodes``, or the nodes the autoscaler can start (``node_types``),
    could ever run the attempt, else why not."""
    task, strategy = request.spec.task, request.strategy
    pins = request_pins(request, nodes, node_types)
    launchable = launchable_nodes(node_types)
    if task == "train":
        return infeasibility(strategy, nodes, pins=pins, launchable=launchable)
    if task != "infer":
        return f"the Ray executor runs train and infer jobs, not {task!r}"
    if strategy.nodes > 1:
        return (f"the inference worker runs on one node, but the plan spreads it over {strategy.nodes} nodes "
                f"({strategy.gpu_count} x {strategy.gpu})")
    per_gpu_cpus = 1.0 / strategy.gpu_count if placement_for(strategy).use_gpu else 1.0  # one CPU for the task
    return infeasibility(strategy, nodes, cpus_per_worker=per_gpu_cpus, pins=pins, launchable=launchable)


class CancelledWhilePending(Exception):
    """Raised in Ray Train's controller to end a cancelled run that has no training loop to stop."""


def _cancel_gate(driver: Any) -> Any:
    """A Ray Train controller callback that ends the run, before it places a worker group, once
    the attempt is cancelled.

    While the worker group waits for resources no training loop polls the cancel flag, and the
    controller's own ``abort`` is not heard: it blocks in the placement group wait. Between two
    tries it runs this hook; raising here makes it shut down cleanly with no placement group left.
    """
    from ray.train.v2._internal.execution.callback import ControllerCallback

    class _CancelGate(ControllerCallback):
        def __init__(self, driver: Any) -> None:
            self._driver = driver

        def before_controller_execute_resize_decision(self, decision: Any) -> None:
            if ray.get(self._driver.gate.remote()):
                raise CancelledWhilePending("the attempt was stopped before its workers were placed")

    return _CancelGate(driver)


def build_trainer(request: RunRequest, settings: DriverSettings, driver: Any) -> Any:
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.train.v2.api.config import FailureConfig, RunConfig

    placement = request_placement(request, live_nodes(), settings.node_types)
    job = TrainJob(job_id=request.job_id, spec=request.spec, strategy=request.strategy,
                   checkpoint_uri=request.checkpoint_uri, device="auto", cpu_threads=settings.cpu_threads,
                   log_every_s=settings.log_every_s, predicted=settings.predicted,
                   checkpoint_write_gbps=settings.checkpoint_write_gbps)
    scaling = scaling_config(placement)
    backend = settings.backend or ("nccl" if placement.use_gpu else "gloo")
    return TorchTrainer(
        train_loop_per_worker=ray_train_loop,  # type: ignore[arg-type]
        train_loop_config={"job": job, "progress": driver, "step_hook": settings.step_hook},
        scaling_config=scaling,
        torch_config=TorchConfig(backend=backend),
        run_config=RunConfig(  # type: ignore[arg-type]
            name=request.run_name,
            storage_path=settings.storage_path,
            failure_config=FailureConfig(max_failures=settings.max_failures, max_preemption_failures=-1),
            callbacks=[_cancel_gate(driver)],
        ),
    )


def scaling_config(placement: WorkerLayout) -> Any:
    """Ray Train's ScalingConfig for ``placement``: what each worker's placement-group bundle asks for."""
    from ray.train.v2.api.config import ScalingConfig

    return ScalingConfig(num_workers=placement.num_workers, use_gpu=placement.use_gpu,
                         accelerator_type=placement.accelerator_request,
                         resources_per_worker=placement.worker_resources())


def attempt_driver(request: RunRequest, settings: DriverSettings, handle: str, namespace: str = NAMESPACE) -> Any:
    """Create the detached driver actor of one attempt (not started yet).

    Ray Train hands its settings (``RAY_TRAIN_*``: preemption poll, health check, ...) from the
    environment of the process that calls ``fit()`` to the controller and the workers. That process
    is now the driver actor, so the submitter's values travel with it, as if it had called ``fit()``.
    """
    from ray.train.v2._internal.constants import get_env_vars_to_propagate

    # the allocator setting travels too (the submitter's own value if it set one): Ray Train's workers
    # inherit it and have it before they initialise CUDA
    env = {**get_env_vars_to_propagate(), START_TIMEOUT_ENV: str(settings.start_timeout_s), **allocator_env()}
    cls = ray.remote(AttemptDriver)
    return cls.options(
        name=handle, namespace=namespace, lifetime="detached", num_cpus=0, max_restarts=0, max_concurrency=16,
        resources={HEAD_NODE_RESOURCE: 0.001}, runtime_env={"env_vars": env},
    ).remote(request, settings)


def _preflight(request: RunRequest) -> None:
    """Checks worth doing once on the driver rather than once per worker and retry: the store."""
    from workers.checkpoint.local import open_store

    open_store(request.checkpoint_uri)
