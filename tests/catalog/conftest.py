"""Fixtures for catalog tests: the packaged catalog, moto's EC2 server and a local AWS price-list server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog
from tests.moto_server import moto_server


def _product(sku: str, itype: str, **overrides: str) -> dict[str, Any]:
    attrs = {"instanceType": itype, "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
             "capacitystatus": "Used", "licenseModel": "No License required", "regionCode": "us-east-1",
             "location": "US East (N. Virginia)"}
    attrs.update(overrides)
    return {"sku": sku, "productFamily": "Compute Instance", "attributes": attrs}


def _term(sku: str, usd: str) -> dict[str, Any]:
    return {f"{sku}.JRTCKXETXF": {"offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z",
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "description": "On Demand",
                                                                   "pricePerUnit": {"USD": usd}}},
            "termAttributes": {}}}


def sample_offer_file() -> dict[str, Any]:
    """A small AmazonEC2 offer file in AWS's bulk price-list format, with the decoys the parser must skip."""
    rows = [
        ("A1", "p5.48xlarge", "55.0400000000", {}),
        ("A2", "p5.48xlarge", "98.3200000000", {"operatingSystem": "Windows"}),
        ("A3", "p5.48xlarge", "60.5440000000", {"tenancy": "Dedicated"}),
        ("A4", "p5.48xlarge", "0.0000000000", {"capacitystatus": "UnusedCapacityReservation"}),
        ("A5", "p5.48xlarge", "57.0000000000", {"preInstalledSw": "SQL Std"}),
        ("B1", "g6e.xlarge", "1.8610000000", {}),
        ("C1", "p4d.24xlarge", "21.9576420000", {}),
        ("D1", "m5.large", "0.0960000000", {}),
    ]
    return {
        "formatVersion": "v1.0", "disclaimer": "sample", "offerCode": "AmazonEC2", "version": "20261120000000",
        "publicationDate": "2026-11-20T00:00:00Z",
        "products": {sku: _product(sku, itype, **over) for sku, itype, _, over in rows},
        "terms": {"OnDemand": {sku: _term(sku, usd) for sku, _, usd, _ in rows}},
    }


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest.fixture(scope="session")
def price_server() -> Iterator[tuple[str, list[str]]]:
    """Serves /offers/v1.0/aws/AmazonEC2/current/<region>/index.json; /broken/... answers 500 or bad JSON."""
    body = json.dumps(sample_offer_file()).encode()
    requested: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requested.append(self.path)
            if self.path.startswith("/offers/") and self.path.endswith("/index.json"):
                status, payload = 200, body
            elif self.path.startswith("/garbage/"):
                status, payload = 200, b"{not json"
            else:
                status, payload = 500, b"internal error"
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        thread.join()


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)
