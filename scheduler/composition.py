"""The composition root: the one place the scheduler's parts are wired together (the store, the planner on a
catalog and a calibration, the service over them, the executor, the scheduling loop), for the in-process CLI
(``scheduler.client.local_client``) and for ``gpuplan server`` (``commands.server``, which serves what
:func:`server_parts` builds through ``scheduler.api``).

Nothing here reads the environment; the edges read it and pass values in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from catalog.loader import Catalog, load_catalog
from errors import InvalidInput
from planner.calibration import Calibration, CostCalibration, load_calibration, load_user_calibration
from planner.spec import JobSpec
from planner.types import Plan
from scheduler.loop.admission import Feasibility
from scheduler.loop.attempt_placement import MarketChooser, ObservedZones, SpotChooser, market_chooser
from scheduler.loop.network_status import planner_relink
from scheduler.loop.scheduling import Scheduler
from scheduler.service import Clock, Planner, SchedulerService, utcnow
from scheduler.store.database import Store
from workers.executors.protocol import BootsAhead, Executor
from workers.spec_files import spec_model

EXECUTORS = ("inprocess", "ray", "none")


def catalog_planner(catalog: Catalog, calibration: Calibration | None = None) -> Planner:
    """The real planner bound to one catalog (the service caches its plans by spec hash) and to
    ``calibration`` (default: the shipped one, read here once)."""
    from planner.search import plan

    cal = calibration or load_calibration()

    def run(spec: JobSpec) -> Plan:
        return plan(spec, catalog, calibration=cal, model=spec_model(spec, catalog))

    return run


def machine_planner(home: Path, catalog: Catalog | None = None, calibration: Calibration | None = None) -> Planner:
    """The real planner on ``catalog`` (default: the packaged one) plus this machine's $0/h GPUs
    and CPU, detected at the first plan (it imports torch: seconds a `gpuplan list` need not pay).
    ``calibration`` None: the shipped one with ``gpuplan calibrate``'s refit under ``home`` over it."""
    from datetime import date

    from catalog.local_cpu import with_this_machine
    from planner.search import plan

    built: list[tuple[Catalog, Calibration]] = []

    def run(spec: JobSpec) -> Plan:
        if not built:
            built.append((with_this_machine(catalog or load_catalog(), home, today=date.today()),
                          calibration or load_user_calibration(home)))
        return plan(spec, built[0][0], calibration=built[0][1], model=spec_model(spec, built[0][0]))

    return run


def ray_namespace_for(database_url: str) -> str:
    """The Ray namespace of one database's attempts: ``gpuplan-`` and 8 hex digits of its URL.

    A scheduler cancels, as orphans, the attempts it sees in its namespace and has no row for, so
    two servers of different databases on one Ray cluster must not share one. The URL is taken
    without its password (a rotated password keeps the namespace) and without its driver
    (``postgres://`` and ``postgresql+psycopg://`` are the same database); a SQLite path is made
    absolute. PostgreSQL's ``options`` (a ``search_path``: another schema is another gpuplan
    database, as for the loop lock) are part of it.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(database_url)
    except ArgumentError:
        key = database_url
    else:
        backend = "postgresql" if url.get_backend_name() == "postgres" else url.get_backend_name()
        database = url.database or ""
        if backend == "sqlite" and database and database != ":memory:":
            database = str(Path(database).expanduser().resolve())
        port = url.port or (5432 if backend == "postgresql" else "")
        options = url.query.get("options", "")
        key = f"{backend}://{url.username or ''}@{url.host or ''}:{port}/{database}?{options}"
    return "gpuplan-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def checkpoint_root_for(value: str | None, home: Path) -> str:
    """The server's checkpoint root, as the string every job's ``checkpoint_uri`` starts with.

    ``s3://bucket/prefix`` stays as given (through ``Path`` it would become ``s3:/bucket``); a local
    directory is made absolute; None: ``home/checkpoints``. Each job checkpoints under ``ROOT/<job id>``.
    """
    if value is None or not value.strip():
        return str(home / "checkpoints")
    value = value.strip().rstrip("/")
    if value.startswith("s3://"):
        from workers.checkpoint.s3 import parse_s3_uri

        bucket, prefix = parse_s3_uri(value)
        return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    if value.startswith("file://"):
        value = value[len("file://"):]
    elif "://" in value:
        raise InvalidInput(f"unsupported checkpoint root {value!r}", path="checkpoint_root",
                           hint="give a local directory or s3://bucket/prefix")
    return str(Path(value).expanduser().resolve())


def ray_storage_for(checkpoint_root: str) -> str | None:
    """Ray Train's storage path for a checkpoint root: next to the checkpoints when they are on S3
    (``ROOT/_ray``, which every node reads), else None (RayExecutor's local default)."""
    return f"{checkpoint_root}/_ray" if checkpoint_root.startswith("s3://") else None


def make_executor(kind: str, *, ray_namespace: str | None = None, storage_path: str | None = None,
                  ray_cluster_config: str | None = None, local_gpus: tuple[str, int] | None = None,
                  calibration: Calibration | None = None) -> Executor | None:
    """The executor ``gpuplan server --executor KIND`` runs. Only for ``ray``: ``ray_namespace`` (None:
    RayExecutor's default, ``gpuplan``), ``storage_path`` (Ray Train's; None: a local default) and
    ``ray_cluster_config`` (the autoscaler's YAML: its node types count as capacity, and pin the
    (GPU, market, zone) each run asks for). Only for ``inprocess``: ``local_gpus``, this machine's (catalog
    GPU id, count), which it then runs plans for besides the CPU's. ``calibration``: where the attempts' checkpoint
    interval takes its write speed and default spot hazard (None: the shipped one)."""
    if kind not in EXECUTORS:
        raise InvalidInput(f"unknown executor {kind!r}", path="executor", hint="one of " + ", ".join(EXECUTORS))
    if kind == "none":
        return None
    cost = (calibration or load_calibration()).cost
    if kind == "inprocess":
        import os

        from catalog.local_cpu import training_threads
        from workers.executors.cluster_fit import ACCELERATOR_PREFIX
        from workers.executors.inprocess import InProcessExecutor

        threads = training_threads()  # the threads the CPU probe measured
        if local_gpus is None:
            return InProcessExecutor(cpu_threads=threads, cost=cost)
        # this machine's GPUs (catalog id, count), which the server's catalog offers at $0/h: it runs plans for them
        gpu, count = local_gpus
        return InProcessExecutor(device="cuda", cpu_threads=threads, cost=cost, resources={
            "CPU": float(os.cpu_count() or 1), "GPU": float(count), ACCELERATOR_PREFIX + gpu: float(count)})
    from workers.executors.ray_executor import RayExecutor, autoscaler_node_type_names, autoscaler_node_types

    options: dict[str, Any] = {"cost": cost}
    if ray_namespace is not None:
        options["namespace"] = ray_namespace
    if storage_path is not None:
        options["storage_path"] = storage_path
    if ray_cluster_config is not None:
        options["node_types"] = autoscaler_node_types(ray_cluster_config)
        options["node_type_names"] = autoscaler_node_type_names(ray_cluster_config)
    return RayExecutor(**options)


def make_service(database_url: str, *, checkpoint_root: str | Path, admin_token: str | None = None,
                 planner: Planner | None = None, catalog: Catalog | None = None,
                 clock: Clock = utcnow, migrate: bool = True,
                 calibration: Calibration | None = None, feasibility: Feasibility | None = None) -> SchedulerService:
    """``calibration``: the planner's constants when no ``planner`` is given (None: the shipped ones).
    ``feasibility``: the executor's (``Executor.feasibility``), asked at submit so a job it could never run is
    refused then (scheduler.loop.admission); None where no executor runs here."""
    store = Store(database_url)
    if migrate:
        store.migrate()
    catalog = catalog if catalog is not None else load_catalog()
    return SchedulerService(store, planner or catalog_planner(catalog, calibration), clock=clock,
                            checkpoint_root=str(checkpoint_root), admin_token=admin_token,
                            relink=planner_relink(catalog, calibration or load_calibration()), feasibility=feasibility)


def make_loop(service: SchedulerService, executor: Executor | None, *, poll_s: float = 1.0,
              max_running: int | None = None, backoff_base_s: float = 30.0,
              calibration: Calibration | None = None, spot_zones: Sequence[str] = (),
              launch_timeout_s: float = 300.0) -> Scheduler | None:
    """The scheduling loop over the service's store, or None without an executor (API only); the spot
    policy takes its restart delay and checkpoint speed from ``calibration`` (default: the shipped one).

    With spot node types in two or more zones (``spot_zones``, from the Ray cluster config) the loop
    places, waits and changes attempts over between zones with :class:`scheduler.loop.attempt_placement.SpotChooser`
    on what it observes of each zone (:class:`scheduler.loop.attempt_placement.ObservedZones`); otherwise each
    attempt goes to the zone its plan priced (:func:`scheduler.loop.attempt_placement.plan_market`).

    Takes the database's loop lock first (Conflict if another server runs a loop on it), so two
    servers can never reconcile away each other's running attempts. ``launch_timeout_s``: how long an
    attempt waits on nodes the cloud refuses to launch before its job moves to its next planned placement
    (scheduler.loop.fallback)."""
    if executor is None:
        return None
    return Scheduler(service.store, executor, clock=service.clock, poll_s=poll_s, max_running=max_running,
                     backoff_base_s=backoff_base_s, lock=service.store.loop_lock(), launch_timeout_s=launch_timeout_s,
                     choose_market=loop_chooser((calibration or load_calibration()).cost, spot_zones,
                                                make_before_break=isinstance(executor, BootsAhead)))


def loop_chooser(cost: CostCalibration, spot_zones: Sequence[str] = (), *,
                 make_before_break: bool = False) -> MarketChooser:
    """The zone-moving spot policy when the cluster has spot capacity in several zones, else the plan's zone;
    ``make_before_break``: the executor can boot spot beside a running attempt (``BootsAhead``)."""
    if len(set(spot_zones)) < 2:
        return market_chooser(cost)
    return SpotChooser(ObservedZones(tuple(sorted(set(spot_zones)))), cost=cost, make_before_break=make_before_break)


def spot_zones_of(ray_cluster_config: str | None) -> tuple[str, ...]:
    """The zones the cluster config has spot node types in (``gpuplan cluster config --every-zone``):
    with two or more, the loop's spot policy moves jobs between them."""
    if not ray_cluster_config:
        return ()
    from scheduler.loop.attempt_placement import spot_zones
    from workers.executors.ray_executor import autoscaler_node_types

    return spot_zones([resources for resources, _ in autoscaler_node_types(ray_cluster_config)])


@dataclass(frozen=True)
class ServerParts:
    """What ``gpuplan server`` serves: the service over its store, the catalog it plans on, the executor and
    the calibration the loop takes, the zones its spot policy moves jobs between, and its Ray namespace."""

    service: SchedulerService
    catalog: Catalog
    executor: Executor | None
    calibration: Calibration
    spot_zones: tuple[str, ...]
    ray_namespace: str


def server_parts(database_url: str, home: Path, *, executor: str, admin_token: str | None,
                 checkpoint_root: str | None, ray_namespace: str | None, ray_cluster_config: str | None,
                 api_processes: int) -> ServerParts:
    """The server's parts, wired: the checkpoint root (an S3 one checked now: a missing bucket or no credentials
    fail here, not in every job), the catalog with the Ray cluster's link speeds and this machine's $0/h GPUs and
    CPU (where an executor runs here), the user's calibration, the executor, and the service (migrated). With one
    API process the service asks the executor at submit whether it could ever run a job."""
    namespace = ray_namespace or ray_namespace_for(database_url)
    root = checkpoint_root_for(checkpoint_root, home)
    if root.startswith("s3://"):
        from workers.checkpoint.local import open_store

        open_store(root)
    catalog = load_catalog()
    if ray_cluster_config:  # the cluster's link speeds (EFA or one TCP interface) replace the catalog's
        from workers.cluster.net import with_link_speeds

        catalog = with_link_speeds(catalog, ray_cluster_config)
    local_gpus = None
    if executor != "none":  # this machine's GPUs, if any, and its CPU as $0/h placements the planner may pick
        from datetime import date

        from catalog.local import LOCAL_CLOUD
        from catalog.local_cpu import CPU_ID, with_this_machine

        catalog = with_this_machine(catalog, home, today=date.today())
        # the in-process executor runs on them too: what the plan picks here, it can run
        local_gpus = next(((o.gpu, o.gpu_count) for o in catalog.offers if o.cloud == LOCAL_CLOUD and o.gpu != CPU_ID),
                          None)
    calibration = load_user_calibration(home)  # gpuplan calibrate's refit, if any
    run = make_executor(executor, ray_namespace=namespace, storage_path=ray_storage_for(root),
                        ray_cluster_config=ray_cluster_config, local_gpus=local_gpus, calibration=calibration)
    zones = spot_zones_of(ray_cluster_config) if executor == "ray" else ()
    # one API process holds the executor: it refuses at submit a job the executor could never run
    service = make_service(database_url, checkpoint_root=root, admin_token=admin_token, catalog=catalog,
                           calibration=calibration, feasibility=run.feasibility if run and api_processes == 1 else None)
    return ServerParts(service=service, catalog=catalog, executor=run, calibration=calibration, spot_zones=zones,
                       ray_namespace=namespace)
