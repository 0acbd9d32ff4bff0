"""A local stand-in for Azure's Retail Prices API: filters recorded items by the $filter's armSkuName and
armRegionName terms and pages them by NextPageLink, as the real API does; other paths fail on page 2."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlencode, urlsplit

RECORDED = Path(__file__).parent / "data" / "azure_retail_prices.json"
PAGE_SIZE = 3
API_PATH = "/api/retail/prices"
# Path prefix -> what the second page is (the first page is always good, so a failure is mid-refresh).
MODES = ("ok", "http500", "malformed", "truncated", "partial", "empty")


def _matching(items: list[dict[str, Any]], filter_text: str) -> list[dict[str, Any]]:
    skus = set(re.findall(r"armSkuName eq '([^']+)'", filter_text))
    regions = set(re.findall(r"armRegionName eq '([^']+)'", filter_text))
    return [i for i in items
            if (not skus or i["armSkuName"] in skus) and (not regions or i["armRegionName"] in regions)]


class _Handler(BaseHTTPRequestHandler):
    items: ClassVar[list[dict[str, Any]]] = []
    requested: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requested.append(self.path)
        parts = urlsplit(self.path)
        mode = parts.path.split("/")[1]
        query = parse_qs(parts.query)
        skip = int(query.get("$skip", ["0"])[0])
        if mode not in MODES or not parts.path.endswith(API_PATH):
            return self._send(404, b"not found")
        if mode == "http500" or (mode != "ok" and skip > 0 and mode != "empty"):
            return self._fail(mode)
        found = [] if mode == "empty" else _matching(self.items, query.get("$filter", [""])[0])
        page = found[skip:skip + PAGE_SIZE]
        next_link = None
        if skip + PAGE_SIZE < len(found) or (mode not in ("ok", "empty") and skip == 0):
            host = self.headers["Host"]
            next_link = f"http://{host}{parts.path}?" + urlencode({"$filter": query["$filter"][0],
                                                                   "$skip": skip + PAGE_SIZE})
        body = {"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
                "Items": page, "NextPageLink": next_link, "Count": len(page)}
        self._send(200, json.dumps(body).encode())

    def _fail(self, mode: str) -> None:
        good = json.dumps({"Items": self.items[:PAGE_SIZE], "NextPageLink": None}).encode()
        if mode == "http500":
            self._send(500, b'{"error": {"code": "InternalServerError"}}')
        elif mode == "malformed":
            self._send(200, json.dumps({"Items": [{"armSkuName": "Standard_ND96isr_H100_v5", "retailPrice": "cheap"}],
                                        "NextPageLink": None}).encode())
        elif mode == "truncated":
            self._send(200, good[: len(good) // 2])  # a page cut short, delivered as complete
        else:  # partial: the connection closes before the promised Content-Length arrives
            self.send_response(200)
            self.send_header("Content-Length", str(len(good)))
            self.end_headers()
            self.wfile.write(good[: len(good) // 2])
            self.wfile.flush()
            self.close_connection = True

    def _send(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def azure_price_server() -> Iterator[tuple[str, list[str]]]:
    """(base URL, requested paths); the API is at f"{base}/<mode>{API_PATH}"."""
    handler: type[_Handler] = type("Handler", (_Handler,), {"items": json.loads(RECORDED.read_text())["Items"],
                                                             "requested": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requested
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
