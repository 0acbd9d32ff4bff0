"""Real servers for API tests: uvicorn on 127.0.0.1 in a thread, or a server process awaited on /healthz."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI

from tests.net import free_port


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """Yield the base URL of ``app`` served by uvicorn until the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # a guard against a hang, not a speed limit
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_for(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.1) -> None:
    """Poll ``predicate`` until it is truthy; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def start_process(argv: list[str], port: int, log_path: Path, *, cwd: Path, timeout: float = 180,
                  env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a server process (output to ``log_path``) and return once /healthz answers on ``port``.

    Fails with the process's log if it exits first, and kills it if it never answers.
    """
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(argv, cwd=cwd, env=dict(env) if env is not None else None, stdout=log,
                                stderr=subprocess.STDOUT)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{argv[:4]} exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout, f"the server on port {port} to answer", every=0.2)
    except AssertionError:
        proc.kill()
        raise
    return proc
