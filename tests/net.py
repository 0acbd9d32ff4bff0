"""Ports on 127.0.0.1 for the servers and process groups tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
