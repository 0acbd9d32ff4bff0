"""A child process killed with SIGKILL at a moment it chooses: a crash nothing can clean up after."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Any


def kill_9_when_ready(target: Callable[..., None], *args: Any, timeout_s: float, waiting_for: str) -> None:
    """Run ``target(*args, ready)`` in a fresh interpreter; once it sets the event ``ready`` (at the moment
    to crash), kill it with SIGKILL. Fails when it never gets there or did not die of the signal."""
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=target, args=(*args, ready))
    child.start()
    try:
        assert ready.wait(timeout_s), f"child never {waiting_for}"
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
