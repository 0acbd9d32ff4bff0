"""`refresh_aws` against real servers: moto's EC2 endpoint and a local HTTP server with an AWS offer file."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from catalog.errors import ExternalServiceError, UnknownName
from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog
from catalog.offers_io import read_offers
from catalog.refresh import check_cloud, default_offers_path
from catalog.refresh_aws import AwsEndpoints, aws_gpu_to_catalog, parse_on_demand_prices, refresh_aws

TODAY = date(2026, 11, 30)


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


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest.fixture(scope="module")
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


def _endpoints(moto: str, prices: str, prefix: str = "offers") -> AwsEndpoints:
    return AwsEndpoints(ec2_endpoint_url=moto,
                        price_list_url=prices + f"/{prefix}/v1.0/aws/AmazonEC2/current/{{region}}/index.json")


def test_refresh_writes_offers_the_loader_reads(
    catalog: Catalog, moto_endpoint: str, price_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, requested = price_server
    out = tmp_path / "user" / "offers" / "aws.csv"
    seen: list[str] = []
    result = refresh_aws(catalog, ["us-east-1"], out, today=TODAY, now=datetime.now(UTC),
                         endpoints=_endpoints(moto_endpoint, url), progress=seen.append)
    assert "/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json" in requested
    assert seen and out.is_file()
    by_type = {o.instance_type: o for o in result.offers}
    p5 = by_type["p5.48xlarge"]
    assert (p5.gpu, p5.gpu_count, p5.vcpus, p5.ram_gib) == ("H100-SXM", 8, 192, 2048)
    assert p5.on_demand_usd_per_h == pytest.approx(55.04)  # not the Windows/Dedicated/SQL decoys
    assert by_type["p4d.24xlarge"].gpu == "A100-40GB" and by_type["p4de.24xlarge"].gpu == "A100-80GB"
    assert by_type["p5en.48xlarge"].gpu == "H200" and by_type["p6-b200.48xlarge"].gpu == "B200"
    assert by_type["g6e.xlarge"].gpu == "L40S" and by_type["g6e.xlarge"].on_demand_usd_per_h == pytest.approx(1.861)
    assert {o.zone for o in result.offers if o.instance_type == "p5.48xlarge"} >= {"us-east-1a"}
    assert any(o.spot_usd_per_h is not None for o in result.offers)  # moto's spot history
    assert "p6-b300.48xlarge" in result.skipped  # B300 is not in the catalog: said why, not guessed
    assert all(o.source.as_of == TODAY and o.source.url.endswith("us-east-1/index.json") for o in result.offers)

    assert read_offers(out) == result.offers
    merged = load_catalog(user_dir=tmp_path / "user")
    assert sorted(o.instance_type for o in merged.offers if o.cloud == "aws") == sorted(
        o.instance_type for o in result.offers)


def test_price_list_http_error_is_external_service_error(
    catalog: Catalog, moto_endpoint: str, price_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    with pytest.raises(ExternalServiceError, match="HTTP 500") as info:
        refresh_aws(catalog, ["us-east-1"], tmp_path / "aws.csv", today=TODAY,
                    endpoints=_endpoints(moto_endpoint, price_server[0], prefix="missing"))
    assert "--price-list-url" in str(info.value)
    assert not (tmp_path / "aws.csv").exists()  # nothing half-written


def test_price_list_bad_json_is_external_service_error(
    catalog: Catalog, moto_endpoint: str, price_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    with pytest.raises(ExternalServiceError, match="not valid JSON"):
        refresh_aws(catalog, ["us-east-1"], tmp_path / "aws.csv", today=TODAY,
                    endpoints=_endpoints(moto_endpoint, price_server[0], prefix="garbage"))


def test_unreachable_ec2_endpoint_is_actionable(
    catalog: Catalog, price_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    def ec2(region: str) -> Any:
        return boto3.client("ec2", region_name=region, endpoint_url="http://127.0.0.1:9",
                            config=__import__("botocore.config").config.Config(retries={"max_attempts": 1},
                                                                               connect_timeout=2))

    with pytest.raises(ExternalServiceError, match="DescribeInstanceTypes failed in us-east-1") as info:
        refresh_aws(catalog, ["us-east-1"], tmp_path / "aws.csv", today=TODAY, ec2_factory=ec2,
                    http_client=httpx.Client(), endpoints=_endpoints("unused", price_server[0]))
    assert "network" in str(info.value)


@pytest.mark.parametrize("name,mib,expected", [
    ("H100", 81920, "H100-SXM"), ("A100", 40960, "A100-40GB"), ("A100", 81920, "A100-80GB"),
    ("V100", 16384, "V100-16GB"), ("V100", 32768, "V100-32GB"), ("L4", 22888, "L4"), ("L40S", 45776, "L40S"),
    ("A10G", 22888, "A10G"), ("T4", 16384, "T4"), ("H200", 144384, "H200"), ("B200", 183359, "B200"),
    ("L4", 2861, None), ("B300", 275040, None), ("Radeon Pro V520", 8192, None),
])
def test_aws_gpu_names_map_to_catalog(catalog: Catalog, name: str, mib: int, expected: str | None) -> None:
    found = aws_gpu_to_catalog(name, mib, catalog)
    assert (found.id if found else None) == expected


def test_offer_file_without_terms_is_rejected() -> None:
    with pytest.raises(ExternalServiceError, match=r"terms\.OnDemand"):
        parse_on_demand_prices({"products": {}}, ["p5.48xlarge"])


def test_refresh_cloud_names(tmp_path: Path) -> None:
    assert default_offers_path("AWS", tmp_path) == tmp_path / "offers" / "aws.csv"
    with pytest.raises(UnknownName):
        check_cloud("gcpp")
    assert check_cloud("aws") == "aws"
