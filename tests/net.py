"""Ports on 127.0.0.1 for the servers and process groups tests start, and a quiet handler for their fakes."""

from __future__ import annotations

import socket
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


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
