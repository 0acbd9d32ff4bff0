"""RayExecutor: runs an attempt on a Ray cluster: training as a Ray Train V2 ``TorchTrainer``,
inference (``task: infer``) as one Ray task holding the planned GPUs (see ``workers.executors.ray_attempt``).

How failures surface (what the scheduler sees in ``status()``):

- Node loss with no warning, or a spot notice (a node drained with reason PREEMPTION): the
  attempt **resumes in place**. Ray Train restarts the worker group on the nodes that remain
  (``FailureConfig(max_failures=N, max_preemption_failures=-1)``) and the loop continues from the
  newest checkpoint in the job's store. The state stays RUNNING; ``progress.resumed_from_step``
  and ``metrics['resumes']`` count the resumes, and ``message`` says so. This executor never
  reports PREEMPTED: that state is for executors that cannot move a run by themselves.
- Inference: a lost node or process makes Ray retry the task (up to N times); the retry skips the
  requests already in the outputs file, so ``progress.resumed_from_step`` is the number of
  requests an earlier try wrote. The state stays RUNNING.
- More than N real failures, or a bad input (missing data file, invalid model config, a
  checkpoint of a different model shape, an unreachable store, a missing or malformed prompts file):
  FAILED with the reason. Bad input
  is not retried: the same input would fail the same way.
- A pending attempt whose node type the cloud refuses to launch (the autoscaler records the launch as
  failed, e.g. no spot capacity): ``status`` stays PENDING with ``launch_failure`` set to the cloud's reason
  (``autoscaler_launch_failures``), which the scheduler uses to move the job down its planned placements.
- A job that no node of the cluster could ever hold: ``submit`` raises ``Infeasible`` with the
  reason instead of pending silently; while a submitted run waits for resources, ``message`` says
  which.

Attempts outlive the process that submitted them. Each attempt's driver (the ``fit()`` call and
the outcome bookkeeping) runs in a detached, named actor (``workers.executors.ray_attempt``: name = the
handle) on the head node, in this executor's Ray namespace (``namespace``, default ``gpuplan``).
``status``, ``logs``, ``cancel`` and ``active`` find attempts through Ray by name in that
namespace, so a new ``RayExecutor`` in a restarted scheduler, or any other process connected to
the cluster, sees exactly what Ray is running; this object keeps no state. Executors with
different namespaces share a cluster without seeing each other's attempts: ``gpuplan server``
gives each database its own (``scheduler.composition.ray_namespace_for``), since a scheduler cancels
every attempt it sees and has no row for as an orphan.
A finished attempt keeps its outcome and final progress until ``release`` (the scheduler calls
it once the outcome is recorded; at most ``keep_finished_s`` otherwise), then its actor exits;
its record in the Ray storage path answers ``status`` and ``logs`` from then on.

Checkpoint-and-stop (``checkpoint_stop``, what a changeover of the scheduler asks for): rank 0 reads
the request with the cancel flag, every rank saves the spot notice's just-in-time checkpoint of the
step it has finished, and the attempt ends STOPPED with that step (``progress.checkpoint_step``);
the next attempt resumes there. An inference task stops after the batch it is writing (outputs are
fsynced per batch). An attempt still waiting for resources stops as a cancel would, nothing lost.

Cancel: a running training loop stops at its next step (rank 0 polls the flag); an inference task
is force-cancelled at once, running or pending; a training attempt still waiting for resources
(for its first workers, or for new ones after a node loss) stops at Ray Train's next try to place
its workers, within about ``start_timeout_s``, with no placement group left behind. Never two
at once: ``submit`` first stops any attempt of the same ``run_name`` still alive (an orphan of a
crashed scheduler), by cancel and, failing that, by killing its driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from errors import ExecutionError, Infeasible, NotFound
from planner.calibration import CostCalibration
from workers.checkpoint.interval import preemption_inputs
from workers.executors.cluster_fit import first_zone, placement_for
from workers.executors.protocol import BootState, RunProgress, RunRequest, RunState, RunStatus
from workers.executors.ray_attempt import (
    NAMESPACE,
    DriverSettings,
    attempt_driver,
    attempt_infeasibility,
    live_nodes,
    request_pins,
    request_placement,
)
from workers.executors.ray_outcome import read_record, resume_note
from workers.train.hooks import StepHook
from workers.train.progress import result_backoffs, result_metrics

__all__ = ["NAMESPACE", "RayExecutor", "live_nodes"]

Predictor = Callable[[RunRequest], dict[str, float]]
# One connection per process: the server's API threads and its scheduler loop each connect on first use, and at
# a start they do so at once (a second ray.init while the first connects fails: "called ray.init twice")
_CONNECTING = threading.Lock()


class RayExecutor:
    """Executor on a Ray cluster (connects to ``address``, or uses the one this process joined)."""

    def __init__(self, *, address: str | None = None, storage_path: str | None = None, max_failures: int = 3,
                 backend: str | None = None, cpu_threads: int | None = None, predict: Predictor | None = None,
                 log_every_s: float = 2.0, init_kwargs: dict[str, Any] | None = None,
                 keep_finished_s: float = 24 * 3600.0, start_timeout_s: float = 10.0,
                 call_timeout_s: float = 30.0, namespace: str = NAMESPACE, step_hook: StepHook | None = None,
                 node_types: Sequence[tuple[Mapping[str, float], int]] = (),
                 node_type_names: Mapping[str, Mapping[str, float]] | None = None,
                 cost: CostCalibration | None = None) -> None:
        self._address = address
        self._namespace = namespace
        self._storage_path = storage_path or str(Path.home() / ".gpuplan" / "ray")
        self._max_failures = max_failures
        self._backend = backend  # None: nccl on GPUs, gloo on CPUs; tests with fake GPUs pass "gloo"
        self._cpu_threads = cpu_threads
        self._predict = predict
        self._log_every_s = log_every_s
        self._init_kwargs = init_kwargs or {}
        self._keep_finished_s = keep_finished_s
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._step_hook = step_hook  # tests only: see workers.train.hooks.StepHook
        # the calibration's checkpoint write speed and default spot hazard: each run's checkpoint interval
        self._cost = cost or CostCalibration()
        # the autoscaler's worker node types (autoscaler_node_types): feasibility counts the nodes it can
        # start, and their (GPU, market, zone) resources make each run ask for the node type it was planned on
        self._node_types = tuple((dict(resources), int(count)) for resources, count in node_types)
        # name -> resources of the same node types: which of them a pending run waits for, when the
        # autoscaler reports their launches failing
        self._node_type_names = {name: dict(resources) for name, resources in (node_type_names or {}).items()}
        # make-before-break boots: token -> the placement group holding the nodes. In memory only: a placement
        # group shares the fate of the process that made it, so after a restart neither is left.
        self._boots: dict[str, Any] = {}

    def _connect(self) -> None:
        with _CONNECTING:
            if not ray.is_initialized():
                ray.init(address=self._address, **self._init_kwargs)

    def pinned(self, request: RunRequest) -> RunRequest:
        """The request as this executor runs it: on a gpuplan cluster, a GPU run that names no zone is pinned to
        the zone of the first node type (the config's order: the planner's) of its GPU and market, so every
        node of a multi-node run comes from one worker type, in one zone and one placement group."""
        if request.zone is not None or not placement_for(request.strategy).use_gpu:
            return request
        if self._node_types:
            nodes = [resources for resources, _ in self._node_types]
        else:
            self._connect()
            nodes = sorted(live_nodes(), key=lambda node: sorted(node))
        zone = first_zone(request.strategy.gpu, request.market, nodes)
        return request if zone is None else dataclasses.replace(request, zone=zone)

    def feasibility(self, request: RunRequest) -> str | None:
        self._connect()
        return attempt_infeasibility(self.pinned(request), live_nodes(), self._node_types)

    def submit(self, request: RunRequest) -> str:
        request = self.pinned(request)
        reason = self.feasibility(request)
        if reason is not None:
            raise Infeasible(f"job {request.job_id} can never run on this cluster: {reason}",
                             hint="add such nodes to the cluster, or plan the job for the GPUs it has")
        self._stop_others(request.run_name)
        handle = f"{request.run_name}.{request.attempt}.{uuid.uuid4().hex[:8]}"
        settings = DriverSettings(
            storage_path=self._storage_path, max_failures=self._max_failures, backend=self._backend,
            cpu_threads=self._cpu_threads, log_every_s=self._log_every_s,
            predicted=preemption_inputs(request.market, self._predict(request) if self._predict is not None else {},
                                        request.mean_time_to_preemption_h, self._cost),
            checkpoint_write_gbps=self._cost.checkpoint_write_gbps,
            keep_finished_s=self._keep_finished_s, start_timeout_s=self._start_timeout_s, step_hook=self._step_hook,
            node_types=self._node_types)
        driver = attempt_driver(request, settings, handle, self._namespace)
        try:
            ray.get(driver.start.remote(), timeout=self._call_timeout_s * 4)  # the first actor may import a lot
        except Exception as exc:
            ray.kill(driver, no_restart=True)
            raise ExecutionError(f"could not start the driver of job {request.job_id} on Ray: {exc}",
                                 hint="check that the head node is up and has memory for one more actor") from exc
        return handle

    def _stop_others(self, run_name: str) -> None:
        """Stop every live attempt of ``run_name``: a job never runs twice at once."""
        for handle in self._handles():
            if _run_name_of(handle) != run_name:
                continue
            try:
                driver = self._driver(handle)
                info = self._call(driver.info)
            except NotFound:
                continue
            if info["done"]:
                continue
            driver.cancel.remote()
            grace = self._call_timeout_s + 2 * self._start_timeout_s  # a step, or one try to place workers
            try:
                done = bool(ray.get(driver.wait.remote(grace), timeout=grace + self._call_timeout_s))
            except Exception:
                done = False
            if not done:  # the run would not stop: take its driver down, and with it what fit() started
                ray.kill(driver, no_restart=True)

    # -------------------------------------------------------------- finding attempts through Ray

    @property
    def namespace(self) -> str:
        """The Ray namespace this executor's attempts live in (and the only one it looks at)."""
        return self._namespace

    def _handles(self) -> list[str]:
        self._connect()
        return sorted(entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                      if entry["namespace"] == self._namespace)

    def _driver(self, handle: str) -> Any:
        self._connect()
        try:
            return ray.get_actor(handle, namespace=self._namespace)
        except ValueError:
            raise NotFound(f"no attempt with handle {handle!r} in Ray namespace {self._namespace!r}",
                           hint="it ended and was released, or its driver was lost with the head node") from None

    def _call(self, method: Any, *args: Any) -> Any:
        """One call on a driver; a driver that died meanwhile is NotFound (the attempt is lost)."""
        try:
            return ray.get(method.remote(*args), timeout=self._call_timeout_s)
        except ray.exceptions.RayActorError:
            raise NotFound("the attempt's driver died",
                           hint="its node was lost; the scheduler requeues the job to resume") from None

    def snapshot(self, handle: str) -> dict[str, Any]:
        """The attempt's raw progress snapshot (``ProgressTracker.snapshot``): node, timings, resumes."""
        snapshot: dict[str, Any] = self._call(self._driver(handle).snapshot)
        return snapshot

    # -------------------------------------------------------------- the Executor protocol

    def _info(self, handle: str) -> dict[str, Any]:
        """The live driver's view, or the record of a finished, released attempt."""
        try:
            info: dict[str, Any] = self._call(self._driver(handle).info)
            return info
        except NotFound:
            record = read_record(self._storage_path, handle)
            if record is None:
                raise
            return {**record, "done": True}

    def status(self, handle: str) -> RunStatus:
        info = self._info(handle)
        snapshot: dict[str, Any] = info["snapshot"]
        progress: RunProgress = snapshot["progress"]
        state, message = RunState(info["state"]), str(info["message"])
        launch_failure = ""
        task = str(info.get("task", "train"))
        if not state.finished:
            started = progress.total_steps > 0 or bool(snapshot.get("started_at"))
            state = RunState.RUNNING if started else RunState.PENDING
            message = "running" + resume_note(snapshot, task) if started else "waiting for workers to start"
            request = info.get("request")  # None from a driver of an older gpuplan: no reason then
            reason = attempt_infeasibility(request, live_nodes(), self._node_types) if request is not None else None
            if reason is not None:
                message = f"{message}; waiting for resources: {reason}"
            if not started and request is not None:
                launch_failure = self._launch_failure(request)
                if launch_failure:
                    message = f"{message}; waiting for resources: {launch_failure}"
        metrics = result_metrics(snapshot.get("result"), int(snapshot.get("resumes", 0))) if state.finished else {}
        if not state.finished:
            metrics = {"resumes": float(snapshot.get("resumes", 0))}
        backoffs = result_backoffs(snapshot.get("result")) if state.finished else []
        return RunStatus(handle=handle, state=state, progress=progress, message=message, metrics=metrics,
                         oom_backoffs=backoffs, launch_failure=launch_failure)

    def _launch_failure(self, request: RunRequest) -> str:
        """Why the autoscaler cannot launch the node type(s) this run asks for ("" if it can, or if no
        type is known): its record of each node type's last launch, which a cloud's refusal (no spot
        capacity) marks unavailable with the cloud's words."""
        pins = request_pins(request, live_nodes(), self._node_types)
        wanted = [name for name, resources in self._node_type_names.items()
                  if pins and all(resources.get(key, 0) > 0 for key in pins)]
        if not wanted:
            return ""
        failures = autoscaler_launch_failures()
        found = [f"launches of node type {name} fail ({failures[name]})" for name in wanted if name in failures]
        return "; ".join(found) if len(found) == len(wanted) else ""

    def logs(self, handle: str, since: int = 0) -> list[str]:
        try:
            lines: list[str] = self._call(self._driver(handle).all_logs, since)
            return lines
        except NotFound:
            record = read_record(self._storage_path, handle)
            if record is None:
                raise
            return list(record["logs"])[since:]

    def cancel(self, handle: str) -> None:
        """Stop the attempt (see the module docstring); one that no longer exists has nothing to stop."""
        with contextlib.suppress(NotFound):
            self._call(self._driver(handle).cancel)

    def checkpoint_stop(self, handle: str) -> None:
        """Stop the attempt for a changeover with nothing lost (``workers.executors.protocol.StopsForChangeover``): a
        training run checkpoints the step it is at and ends STOPPED; an inference task stops after its
        current batch. One that no longer exists has nothing to stop."""
        with contextlib.suppress(NotFound):
            self._call(self._driver(handle).checkpoint_stop)

    def release(self, handle: str) -> None:
        """The outcome is recorded: the driver exits once the attempt has ended (at once if it has)."""
        with contextlib.suppress(NotFound):
            self._call(self._driver(handle).release)

    def active(self) -> list[str]:
        """Attempts pending or running on the cluster, whoever submitted them."""
        return [handle for handle, done in self._states() if not done]

    def held(self) -> list[str]:
        """Finished attempts whose driver still keeps the outcome (not released yet)."""
        return [handle for handle, done in self._states() if done]

    def _states(self) -> list[tuple[str, bool]]:
        """(handle, finished) of every attempt driver alive in this namespace."""
        states = []
        for handle in self._handles():
            try:
                states.append((handle, bool(self._call(self._driver(handle).info)["done"])))
            except NotFound:  # released and gone between the listing and the call
                continue
        return states

    def boot(self, request: RunRequest) -> str:
        """Hold a placement group of the attempt's worker bundles (its (GPU, market, zone) resources on a
        gpuplan cluster): the autoscaler starts nodes of that type for it
        (``workers.executors.protocol.BootsAhead``)."""
        from ray.util.placement_group import placement_group

        request = self.pinned(request)
        reason = self.feasibility(request)
        if reason is not None:
            raise Infeasible(f"job {request.job_id} can never run on this cluster: {reason}",
                             hint="add such nodes to the cluster, or plan the job for the GPUs it has")
        placement = request_placement(request, live_nodes(), self._node_types)
        token = f"boot-{request.run_name}-{uuid.uuid4().hex[:8]}"
        try:
            self._boots[token] = placement_group([placement.worker_resources()] * placement.num_workers,
                                                 strategy="PACK", name=token)
        except Exception as exc:  # Ray's own errors: one kind for the scheduler loop to log
            raise ExecutionError(f"could not ask Ray for the nodes of job {request.job_id}: {exc}",
                                 hint="check that the head node is up") from exc
        return token

    def boot_state(self, token: str) -> BootState:
        """READY once Ray has placed every bundle (the nodes are up), GONE if unknown or removed."""
        from ray.util.placement_group import placement_group_table

        pg = self._boots.get(token)
        if pg is None:
            return BootState.GONE
        try:
            state = placement_group_table(pg).get("state")
        except Exception as exc:  # the GCS did not answer: the loop asks again next tick
            raise ExecutionError(f"could not read the boot {token} from Ray: {exc}") from exc
        return BootState.READY if state == "CREATED" else BootState.GONE if state == "REMOVED" else BootState.BOOTING

    def unboot(self, token: str) -> None:
        from ray.util.placement_group import remove_placement_group

        pg = self._boots.pop(token, None)
        if pg is not None:
            with contextlib.suppress(Exception):  # already removed with its creator's job: nothing held
                remove_placement_group(pg)

    def wait(self, handle: str, timeout: float | None = None) -> RunStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        driver = self._driver(handle)
        while deadline is None or time.monotonic() < deadline:
            step = 10.0 if deadline is None else max(0.0, min(10.0, deadline - time.monotonic()))
            if self._call(driver.wait, step):
                break
        return self.status(handle)


def _run_name_of(handle: str) -> str:
    """``run_name.attempt.suffix`` -> ``run_name`` (a run name may itself hold dots)."""
    return handle.rsplit(".", 2)[0]


def autoscaler_node_types(path: str | Path) -> tuple[tuple[dict[str, float], int], ...]:
    """The worker node types of a Ray cluster-launcher config, each (resources, max_workers).

    On a head started by ``ray up`` this is ``~/ray_bootstrap_config.yaml``, the config its autoscaler
    runs (``gpuplan server --ray-cluster-config``). The head node type is left out.
    """
    import yaml

    from errors import InvalidInput

    file = Path(path).expanduser()
    try:
        config = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read the Ray cluster config {str(file)!r}: {exc}", path="ray_cluster_config",
                           hint="give the cluster-launcher YAML the autoscaler runs "
                           "(~/ray_bootstrap_config.yaml on the head)") from None
    types = config.get("available_node_types") if isinstance(config, dict) else None
    if not isinstance(types, dict):
        raise InvalidInput(f"{str(file)!r} has no available_node_types", path="ray_cluster_config",
                           hint="give a Ray cluster-launcher YAML (see `gpuplan cluster config`)")
    head = config.get("head_node_type")
    return tuple((({str(k): float(v) for k, v in (t.get("resources") or {}).items()}), int(t.get("max_workers", 0)))
                 for name, t in types.items() if name != head)


def autoscaler_launch_failures() -> dict[str, str]:
    """Node type -> the cloud's reason, for each type whose last launch failed, from the status Ray's
    autoscaler publishes (what ``ray status`` shows under "Recent failures"); {} without an autoscaler."""
    import json

    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():  # type: ignore[no-untyped-call]
        return {}
    raw = _internal_kv_get("__autoscaling_status")  # ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS
    try:
        report = json.loads(raw)["autoscaler_report"] if raw else {}
        records = (report.get("node_availability_summary") or {}).get("node_availabilities") or {}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    failures = {}
    for name, record in records.items():
        info = record.get("unavailable_node_information") or {}
        if not record.get("is_available", True):
            failures[str(name)] = ": ".join(str(x) for x in (info.get("category"), info.get("description")) if x)
    return failures


def autoscaler_node_type_names(path: str | Path) -> dict[str, dict[str, float]]:
    """Name -> resources of the worker node types in a Ray cluster-launcher config (head left out)."""
    import yaml

    config = yaml.safe_load(Path(path).expanduser().read_text())
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    return {str(name): {str(k): float(v) for k, v in (t.get("resources") or {}).items()}
            for name, t in types.items() if name != head}
