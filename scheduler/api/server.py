"""Serve the API: the app (with the scheduling loop, when an executor runs here) on one process's event loop.

The parts are assembled by the composition root (``scheduler.composition``); nothing here reads the
environment. ``serve`` runs the API on one process's event loop and the scheduling loop in a thread of it;
``scheduler.api.processes.serve_workers`` spreads the API over several processes.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI

from catalog.loader import Catalog
from errors import Conflict, InvalidInput
from planner.calibration import Calibration
from scheduler.api.app import create_app
from scheduler.composition import make_loop
from scheduler.service import SchedulerService
from workers.executors.protocol import Executor


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
