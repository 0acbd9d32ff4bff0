"""`refresh_aws` against real servers: moto's EC2 endpoint and a local HTTP server with an AWS offer file."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

from catalog.loader import Catalog, load_catalog
from catalog.offers_io import read_offers
from catalog.refresh import check_cloud, default_offers_path
from catalog.refresh_aws import AwsEndpoints, aws_gpu_to_catalog, parse_on_demand_prices, refresh_aws
from errors import ExternalServiceError, UnknownName

TODAY = date(2026, 11, 30)


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
    assert by_type["p6-b300.48xlarge"].gpu == "B300"  # in the catalog since issue 12 (275040 MiB = its 268.6 GiB)
    assert result.skipped["g5g.2xlarge"] == "GPU T4g (16384 MiB) is not in the catalog"  # said why, not guessed
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
    ("L4", 2861, None), ("B300", 275040, "B300"), ("Radeon Pro V520", 8192, None),
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
