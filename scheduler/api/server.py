"""Assemble the server from explicit parts: store, service, catalog, executor, loop.

Nothing here reads the environment; ``gpuplan server`` (cli.py) reads it and passes values in.

``serve`` runs the API on one process's event loop and the scheduling loop in a thread of it;
``scheduler.api.processes.serve_workers`` spreads the API over several processes.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from catalog.loader import Catalog, load_catalog
from errors import Conflict, InvalidInput
from planner.calibration import Calibration, CostCalibration, load_calibration
from planner.spec import JobSpec
from planner.types import Plan
from scheduler.api.app import create_app
from scheduler.loop.admission import Feasibility
from scheduler.loop.attempt_placement import MarketChooser, ObservedZones, SpotChooser, market_chooser
from scheduler.loop.network_status import planner_relink
from scheduler.loop.scheduling import Scheduler
from scheduler.service import Clock, Planner, SchedulerService, utcnow
from scheduler.store.database import Store
from workers.executors.protocol import BootsAhead, Executor

EXECUTORS = ("inprocess", "ray", "none")


def catalog_planner(catalog: Catalog, calibration: Calibration | None = None) -> Planner:
    """The real planner bound to one catalog (the service caches its plans by spec hash) and to
    ``calibration`` (default: the shipped one, read here once)."""
    from planner.search import plan

    cal = calibration or load_calibration()

    def run(spec: JobSpec) -> Plan:
        return plan(spec, catalog, calibration=cal)

    return run


def machine_planner(home: Path, catalog: Catalog | None = None, calibration: Calibration | None = None) -> Planner:
    """The real planner on ``catalog`` (default: the packaged one) plus this machine's $0/h GPUs
    and CPU, detected at the first plan (it imports torch: seconds a `gpuplan list` need not pay).
    ``calibration`` None: the shipped one with ``gpuplan calibrate``'s refit under ``home`` over it."""
    from datetime import date

    from catalog.local_cpu import with_this_machine
    from planner.calibration import user_calibration_path
    from planner.search import plan

    built: list[tuple[Catalog, Calibration]] = []

    def run(spec: JobSpec) -> Plan:
        if not built:
            built.append((with_this_machine(catalog or load_catalog(), home, today=date.today()),
                          calibration or load_calibration(overlay=user_calibration_path(home))))
        return plan(spec, built[0][0], calibration=built[0][1])

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
                  ray_cluster_config: str | None = None, local_gpus: tuple[str, int] | None = None) -> Executor | None:
    """The executor ``gpuplan server --executor KIND`` runs. Only for ``ray``: ``ray_namespace`` (None:
    RayExecutor's default, ``gpuplan``), ``storage_path`` (Ray Train's; None: a local default) and
    ``ray_cluster_config`` (the autoscaler's YAML: its node types count as capacity, and pin the
    (GPU, market, zone) each run asks for). Only for ``inprocess``: ``local_gpus``, this machine's (catalog
    GPU id, count), which it then runs plans for besides the CPU's."""
    if kind == "inprocess":
        import os

        from catalog.local_cpu import training_threads
        from workers.executors.cluster_fit import ACCELERATOR_PREFIX
        from workers.executors.inprocess import InProcessExecutor

        threads = training_threads()  # the threads the CPU probe measured
        if local_gpus is None:
            return InProcessExecutor(cpu_threads=threads)
        # this machine's GPUs (catalog id, count), which the server's catalog offers at $0/h: it runs plans for them
        gpu, count = local_gpus
        return InProcessExecutor(device="cuda", cpu_threads=threads, resources={
            "CPU": float(os.cpu_count() or 1), "GPU": float(count), ACCELERATOR_PREFIX + gpu: float(count)})
    if kind == "ray":
        from workers.executors.ray_executor import RayExecutor, autoscaler_node_type_names, autoscaler_node_types

        options: dict[str, Any] = {}
        if ray_namespace is not None:
            options["namespace"] = ray_namespace
        if storage_path is not None:
            options["storage_path"] = storage_path
        if ray_cluster_config is not None:
            options["node_types"] = autoscaler_node_types(ray_cluster_config)
            options["node_type_names"] = autoscaler_node_type_names(ray_cluster_config)
        return RayExecutor(**options)
    if kind == "none":
        return None
    raise InvalidInput(f"unknown executor {kind!r}", path="executor", hint="one of " + ", ".join(EXECUTORS))


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


def make_app(service: SchedulerService, catalog: Catalog, executor: Executor | None, *, poll_s: float = 1.0,
             max_running: int | None = None, backoff_base_s: float = 30.0,
             calibration: Calibration | None = None, ui_secret: bytes | None = None,
             spot_zones: Sequence[str] = (), launch_timeout_s: float = 300.0) -> FastAPI:
    """The API; with an executor it also runs the scheduling loop (reconcile first) while serving."""
    loop = make_loop(service, executor, poll_s=poll_s, max_running=max_running, backoff_base_s=backoff_base_s,
                     calibration=calibration, spot_zones=spot_zones, launch_timeout_s=launch_timeout_s)
    return create_app(service, catalog, loop=loop, ui_secret=ui_secret)


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before anything starts.

    uvicorn binds only after the app's startup, which runs the scheduling loop's reconcile: a
    second server started on a taken port would close the live server's running attempts as
    lost (and requeue them) before failing. Binding first makes it fail with nothing touched.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family=family)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise Conflict(f"port {port} on {host} is already in use (another gpuplan server?)",
                           hint="stop it or pick another --port") from None
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}", path="host",
                           hint="give an address of this machine with --host") from None
    listener.set_inheritable(True)  # the API worker processes inherit it
    return listener


def serve(app: FastAPI, host: str, port: int, *, log_level: str = "info", sock: socket.socket | None = None) -> None:
    """Serve ``app`` on ``sock`` (from :func:`listen`), or on ``host:port`` bound here first."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = sock if sock is not None else listen(host, port)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
