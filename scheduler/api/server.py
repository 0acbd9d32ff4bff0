"""Assemble the server from explicit parts: store, service, catalog, executor, loop.

Nothing here reads the environment; ``gpuplan server`` (cli.py) reads it and passes values in.
"""

from __future__ import annotations

import logging
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from catalog.errors import InvalidInput
from catalog.loader import Catalog, load_catalog
from planner.spec import JobSpec
from planner.types import Plan
from scheduler.api.app import create_app
from scheduler.loop import Scheduler
from scheduler.service import Clock, Planner, SchedulerService, utcnow
from scheduler.store import Store
from workers.executor import Executor

EXECUTORS = ("inprocess", "ray", "none")


def catalog_planner(catalog: Catalog) -> Planner:
    """The real planner bound to one catalog (the service caches its plans by spec hash)."""
    from planner.search import plan

    def run(spec: JobSpec) -> Plan:
        return plan(spec, catalog)

    return run


def make_executor(kind: str) -> Executor | None:
    if kind == "inprocess":
        from workers.inprocess import InProcessExecutor

        return InProcessExecutor()
    if kind == "ray":
        from workers.ray_executor import RayExecutor

        return RayExecutor()
    if kind == "none":
        return None
    raise InvalidInput(f"unknown executor {kind!r}", path="executor", hint="one of " + ", ".join(EXECUTORS))


def make_service(database_url: str, *, checkpoint_root: str | Path, admin_token: str | None = None,
                 planner: Planner | None = None, catalog: Catalog | None = None, executor: Executor | None = None,
                 clock: Clock = utcnow, migrate: bool = True) -> SchedulerService:
    store = Store(database_url)
    if migrate:
        store.migrate()
    catalog = catalog if catalog is not None else load_catalog()
    return SchedulerService(store, planner or catalog_planner(catalog), clock=clock,
                            checkpoint_root=str(checkpoint_root), executor=executor, admin_token=admin_token)


def make_app(service: SchedulerService, catalog: Catalog, executor: Executor | None, *, poll_s: float = 1.0,
             max_running: int | None = None, backoff_base_s: float = 30.0) -> FastAPI:
    """The API; with an executor it also runs the scheduling loop (reconcile first) while serving."""
    loop = None
    if executor is not None:
        loop = Scheduler(service.store, executor, clock=service.clock, poll_s=poll_s, max_running=max_running,
                         backoff_base_s=backoff_base_s)
    return create_app(service, catalog, loop=loop)


def serve(app: FastAPI, host: str, port: int, *, log_level: str = "info") -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
