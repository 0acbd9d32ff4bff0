"""The API in several processes: ``gpuplan server --workers N``.

N spawned worker processes share one listening socket; the scheduling loop runs in the
supervising parent (it must stay in one process: attempts and their handles belong to it). Each
hot request runs its few database statements inline on the worker's event loop, so one process
serialises its requests on the database round trips; more processes overlap them. The database
(row locks, unique keys, the job log) is what keeps the workers consistent: nothing else is
shared between them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType

import uvicorn

from catalog.loader import Catalog
from errors import ExecutionError, InvalidInput
from planner.calibration import Calibration
from scheduler.api.app import Loop, create_app
from scheduler.api.server import listen
from scheduler.composition import make_service
from scheduler.service import Planner

log = logging.getLogger(__name__)
LOG_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"  # pid: which worker said it


@dataclass(frozen=True)
class ApiSettings:
    """Everything an API worker process needs to build its own service.

    Picklable: it is sent to spawned workers. ``planner`` must be a module-level function (or None
    for the real planner on ``catalog``), since closures do not pickle.
    """

    database_url: str
    checkpoint_root: str
    catalog: Catalog
    admin_token: str | None = None
    planner: Planner | None = None
    log_level: str = "info"
    calibration: Calibration | None = None  # the real planner's constants (None: the shipped ones)
    ui_secret: bytes | None = None  # signs dashboard sessions: one secret for every worker


def api_workers(requested: str, database_url: str, cpus: int | None) -> int:
    """``--workers``: a count, or ``auto``: 1 on SQLite (it takes one writer at a time, so more
    processes only queue on its lock), one per core up to 4 on PostgreSQL."""
    if requested == "auto":
        is_postgres = database_url.startswith(("postgres://", "postgresql"))
        return min(4, max(1, cpus or 1)) if is_postgres else 1
    try:
        count = int(requested)
    except ValueError:
        count = 0
    if not 1 <= count <= 64:
        raise InvalidInput(f"--workers must be auto or a whole number from 1 to 64, got {requested!r}",
                           path="workers", hint="e.g. --workers 4, or leave it at auto")
    return count


def _exit_with_parent(parent_pid: int, poll_s: float = 0.2) -> None:
    """Kill this worker when the supervisor dies, even by SIGKILL.

    Orphaned workers would keep serving the old socket (and block a restarted server's bind)
    while nobody runs the scheduling loop. The kill is immediate, not a graceful shutdown: a
    worker that stops accepting still holds the listening socket, and the connections queued
    there would be reset when it exits; closed at once, new clients are refused and retry
    against the restarted server. A request cut off mid-way is safe: its transaction rolls back
    and submits carry idempotency keys. Linux's parent-death signal acts at once; the polling
    thread covers other systems and a parent that died before the signal was armed.
    """
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gpuplan-parent-watch", daemon=True).start()


def _api_worker(settings: ApiSettings, sock: socket.socket, parent_pid: int) -> None:
    """Entry point of one spawned API worker: its own store, pool, plan and token caches."""
    _exit_with_parent(parent_pid)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    # Runs belong to the loop in the supervisor; their log lines reach these workers through the
    # database (scheduler.store.logbook).
    service = make_service(settings.database_url, checkpoint_root=settings.checkpoint_root,
                           admin_token=settings.admin_token, planner=settings.planner, catalog=settings.catalog,
                           migrate=False, calibration=settings.calibration)
    app = create_app(service, settings.catalog, ui_secret=settings.ui_secret)
    server = uvicorn.Server(uvicorn.Config(app, log_level=settings.log_level, access_log=False))
    server.run(sockets=[sock])


class WorkerPool:
    """Spawns the API workers on one socket and keeps ``size`` of them alive until ``stop``.

    A worker that dies is replaced. A worker that dies within ``min_uptime_s`` of its start counts
    as a crash loop (bad database URL, port trouble, ...); after ``max_quick_deaths`` in a row the
    pool gives up with ``ExecutionError`` instead of respawning forever.
    """

    def __init__(self, settings: ApiSettings, sock: socket.socket, size: int, *, min_uptime_s: float = 5.0,
                 max_quick_deaths: int = 5) -> None:
        if size < 1:
            raise InvalidInput(f"--workers must be at least 1, got {size}", path="workers")
        self._settings = settings
        self._sock = sock
        self._size = size
        self._min_uptime_s = min_uptime_s
        self._max_quick_deaths = max_quick_deaths
        self._context = multiprocessing.get_context("spawn")  # fork would copy the parent's pools and threads
        self.processes: list[multiprocessing.process.BaseProcess] = []
        self._started_at: list[float] = []
        self._quick_deaths = 0

    def start(self) -> None:
        for _ in range(self._size):
            self.processes.append(self._spawn())
            self._started_at.append(time.monotonic())

    def _spawn(self) -> multiprocessing.process.BaseProcess:
        process = self._context.Process(target=_api_worker, args=(self._settings, self._sock, os.getpid()),
                                        name="gpuplan-api", daemon=True)
        process.start()
        return process

    def check(self) -> None:
        """Replace dead workers; raise ExecutionError when they keep dying at start-up."""
        for i, process in enumerate(self.processes):
            if process.is_alive():
                if time.monotonic() - self._started_at[i] >= self._min_uptime_s:
                    self._quick_deaths = 0
                continue
            quick = time.monotonic() - self._started_at[i] < self._min_uptime_s
            self._quick_deaths = self._quick_deaths + 1 if quick else 0
            if self._quick_deaths >= self._max_quick_deaths:
                raise ExecutionError(
                    f"API workers keep exiting at start-up (last exit code {process.exitcode})",
                    hint="run with --workers 1 to see the error in this terminal, and check the database URL")
            log.warning("API worker %s exited with code %s; starting a new one", process.pid, process.exitcode)
            self.processes[i] = self._spawn()
            self._started_at[i] = time.monotonic()

    def stop(self, timeout_s: float = 10.0) -> None:
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # uvicorn finishes in-flight requests on SIGTERM
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)


def serve_workers(settings: ApiSettings, host: str, port: int, workers: int, *, loop: Loop | None = None,
                  check_every_s: float = 0.5, sock: socket.socket | None = None) -> None:
    """Serve the API from ``workers`` processes, run ``loop`` here; return on SIGINT/SIGTERM.
    ``sock``: the listening socket from :func:`scheduler.api.server.listen` (default: bound here)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    sock = sock if sock is not None else listen(host, port)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    thread = None
    pool = WorkerPool(settings, sock, workers)
    try:
        pool.start()
        if loop is not None:
            thread = threading.Thread(target=loop.run_forever, args=(stop,), name="gpuplan-loop", daemon=True)
            thread.start()
        while not stop.wait(check_every_s):
            pool.check()
    finally:
        stop.set()
        pool.stop()
        if thread is not None:
            thread.join(timeout=30)
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
