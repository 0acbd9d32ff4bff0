"""Ports on 127.0.0.1 for the servers and process groups tests start, and a quiet handler for their fakes."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A fake endpoint's handler: no request log on stderr, and one way to answer with a body."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# Ports below the kernel's ephemeral range (32768-60999 on Linux): a port the kernel picks for a listener
# (bind to port 0) is also one it may hand any process as the source port of an outgoing connection in the
# moment before the test's server binds it, and a busy Ray cluster makes many. Above Ray's worker ports
# (10002-19999). Each pytest-xdist worker draws from its own slice, so two test processes never race for one.
_LOW, _HIGH, _SLICES = 20000, 32000, 8


def _ports() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _SLICES if worker.isdigit() else 0
    size = (_HIGH - _LOW) // _SLICES
    start = _LOW + index * size
    first = random.randrange(size)  # two sessions on one machine (a developer's and CI's) rarely collide
    return (start + (first + i) % size for i in itertools.count())


_next_ports: Iterator[int] | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now, outside the range the kernel picks source ports from."""
    global _next_ports
    if _next_ports is None:
        _next_ports = _ports()
    for port in itertools.islice(_next_ports, (_HIGH - _LOW) // _SLICES):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in this test process's slice of 20000-32000")
