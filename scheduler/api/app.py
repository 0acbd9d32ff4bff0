"""The app factory. Everything is passed in: service, catalog and (optionally) the loop to run."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import Depends, FastAPI

from catalog.loader import Catalog
from scheduler.api import deps, errors
from scheduler.api.routers import catalog as catalog_router
from scheduler.api.routers import jobs, reports, teams
from scheduler.service import SchedulerService
from scheduler.ui import create_ui


class Loop(Protocol):
    def run_forever(self, stop: threading.Event) -> None: ...


def create_app(service: SchedulerService, catalog: Catalog, *, loop: Loop | None = None,
               ui_secret: bytes | None = None) -> FastAPI:
    """The REST API and the dashboard at /ui; with ``loop`` it also runs the scheduling loop in a thread
    while serving. ``ui_secret`` signs dashboard sessions (None: a random one, valid in this process only)."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if loop is not None:
            thread = threading.Thread(target=loop.run_forever, args=(stop,), name="gpuplan-loop", daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=30)

    app = FastAPI(
        title="gpuplan scheduler",
        version="0.1.0",
        description="Plan, queue and run GPU jobs per team with budgets, quotas and a spend ledger. "
        "Authenticate with `Authorization: Bearer <team token>`; team management needs the admin token. "
        'Every error is `{"error": {"code", "message", "path"?}}`.',
        lifespan=lifespan,
        responses=errors.ERROR_RESPONSES,
        dependencies=[Depends(deps.utf8_url)],
    )
    app.state.service = service
    app.state.catalog = catalog
    errors.install(app)
    for router in (jobs.router, teams.router, catalog_router.router, reports.router):
        app.include_router(router)
    app.mount("/ui", create_ui(service, catalog, ui_secret))
    return app
