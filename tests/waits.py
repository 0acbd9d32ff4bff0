"""How long a test waits for an event it then asserts on, and the wait itself.

``RUN_END_S``: the limit for ``executor.wait(handle, ...)`` calls whose result is a terminal state the test
asserts. The wait returns at the event, so the limit costs nothing when things work; it is a safety net for
a stuck run, not a speed assumption. 300 s is 3-4x the slowest such run on a 2-core box with a busy core
(60-120 s limits broke a busy run in session 5; docs/lab-notes/test-suite-runs.md, sixth series).

:func:`wait_until` polls a check until it holds: it returns at the event, and ``timeout`` (``RUN_END_S``
unless told) only guards against a hang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

RUN_END_S = 300.0

T = TypeVar("T")


def wait_until(what: str, check: Callable[[], T | None], timeout: float = RUN_END_S, every: float = 0.2) -> T:
    """The first truthy value of ``check()``; AssertionError naming ``what`` if none comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
