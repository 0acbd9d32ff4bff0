"""RayExecutor connects its process to Ray once, however many threads ask first at once.

``gpuplan server`` calls the executor from its API threads (a submit's feasibility) and from its scheduler
loop (reconcile), each connecting on first use; at a start they come together, and Ray refuses a second
``ray.init`` while the first is connecting ("Perhaps you called ray.init twice by accident?"): the first
submit failed with a 500 (seen in tests/e2e/test_autoscaler.py). Ray's connect is stood in for here by one that
refuses a second connect the same way and, the first time, waits until every thread has looked whether the
process is connected: without one connect at a time they all have, and all connect.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import ray

from workers.executors.ray_executor import RayExecutor

THREADS = 4


def test_threads_that_connect_at_once_connect_once(monkeypatch: pytest.MonkeyPatch) -> None:
    looked = threading.Semaphore(0)
    lock = threading.Lock()
    inits: list[dict[str, Any]] = []
    connected = threading.Event()

    def is_initialized() -> bool:
        looked.release()
        return connected.is_set()

    def init(**kwargs: Any) -> None:
        with lock:
            if inits:
                raise AssertionError("Perhaps you called ray.init twice by accident?")
            inits.append(kwargs)
        # every thread looks meanwhile (this one has), unless the others wait for this connect: then it goes on
        for _ in range(THREADS):
            looked.acquire(timeout=0.5)
        connected.set()

    monkeypatch.setattr(ray, "is_initialized", is_initialized)
    monkeypatch.setattr(ray, "init", init)
    executor = RayExecutor(address="127.0.0.1:1")
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def connect() -> None:
        start.wait()
        try:
            executor._connect()
        except BaseException as exc:  # the test reports whatever a thread raised
            errors.append(exc)

    threads = [threading.Thread(target=connect) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert inits == [{"address": "127.0.0.1:1"}] and connected.is_set()
