"""Rebuild the AWS offers file from AWS itself.

- Instance types and their GPUs: EC2 ``DescribeInstanceTypes`` (``GpuInfo``: GPU name, count, MiB).
- Spot prices per zone: EC2 ``DescribeSpotPriceHistory`` (latest Linux/UNIX price per zone).
- On-demand prices: AWS's public bulk price-list offer file, one JSON per region (the Pricing API
  needs extra permissions and is not in moto; the offer file is public HTTPS and has the same data).

Off the runtime path: only ``gpuplan catalog refresh aws`` calls this. Endpoints are injectable so
tests point boto3 at moto's server and httpx at a local HTTP server.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import boto3
import httpx
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from catalog.cloud_names import gpu_by_name_and_memory
from catalog.loader import Catalog
from catalog.offers_io import write_offers
from catalog.schema import GpuSpec, Offer, Source
from errors import ExternalServiceError

PRICE_LIST_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
# Every NVIDIA GPU family on EC2 is p* or g*; filtering server-side keeps the answer small.
GPU_FAMILY_PATTERNS = ("p*", "g*")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class AwsEndpoints:
    """Where to talk to. Defaults are AWS itself; tests override both."""

    ec2_endpoint_url: str | None = None
    price_list_url: str = PRICE_LIST_URL  # "{region}" is replaced


@dataclass(frozen=True)
class GpuInstance:
    instance_type: str
    gpu: GpuSpec
    gpu_count: int
    vcpus: int
    ram_gib: float
    network_gbps: float


@dataclass
class RefreshResult:
    offers: list[Offer] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # instance type -> why it was left out
    regions: list[str] = field(default_factory=list)
    path: Path | None = None


def aws_gpu_to_catalog(name: str, memory_mib: int, catalog: Catalog) -> GpuSpec | None:
    """Map EC2's GpuInfo (e.g. "A100", 40960) to a catalog GPU, disambiguating by memory."""
    return gpu_by_name_and_memory(name, memory_mib, catalog)


def _network_gbps(text: str) -> float:
    """EC2's NetworkPerformance ("Up to 25 Gigabit", "3200 Gigabit", "High") as Gbit/s."""
    match = re.search(r"([\d.]+)\s*Gigabit", text)
    return float(match.group(1)) if match else 10.0


def _aws_error(action: str, region: str, exc: Exception) -> ExternalServiceError:
    if isinstance(exc, NoCredentialsError):
        hint = "configure AWS credentials (aws configure, AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
    elif isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            hint = "grant ec2:DescribeInstanceTypes and ec2:DescribeSpotPriceHistory to these credentials"
        elif code in ("AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch"):
            hint = "the AWS credentials were rejected; check the access key, secret and clock"
        elif code == "OptInRequired":
            hint = f"region {region} is not enabled for this account; drop it from --regions"
        else:
            hint = "retry later or drop this region from --regions"
    else:
        hint = "check network access to the EC2 endpoint (or --ec2-endpoint-url) and retry"
    return ExternalServiceError(f"AWS EC2 {action} failed in {region}: {exc}", hint=hint)


def list_gpu_instances(
    ec2: Any, region: str, catalog: Catalog, skipped: dict[str, str], patterns: Iterable[str] = GPU_FAMILY_PATTERNS
) -> list[GpuInstance]:
    found: list[GpuInstance] = []
    filters = [{"Name": "instance-type", "Values": list(patterns)}]
    try:
        for page in ec2.get_paginator("describe_instance_types").paginate(Filters=filters):
            for it in page["InstanceTypes"]:
                gpu_info = it.get("GpuInfo")
                if not gpu_info or not gpu_info.get("Gpus"):
                    continue
                first = gpu_info["Gpus"][0]
                name, mib = str(first.get("Name", "")), int(first.get("MemoryInfo", {}).get("SizeInMiB", 0))
                spec = aws_gpu_to_catalog(name, mib, catalog)
                if spec is None:
                    skipped[it["InstanceType"]] = f"GPU {name} ({mib} MiB) is not in the catalog"
                    continue
                found.append(
                    GpuInstance(
                        instance_type=it["InstanceType"],
                        gpu=spec,
                        gpu_count=sum(int(g.get("Count", 0)) for g in gpu_info["Gpus"]),
                        vcpus=int(it["VCpuInfo"]["DefaultVCpus"]),
                        ram_gib=round(int(it["MemoryInfo"]["SizeInMiB"]) / 1024, 3),
                        network_gbps=_network_gbps(str(it.get("NetworkInfo", {}).get("NetworkPerformance", ""))),
                    )
                )
    except (ClientError, BotoCoreError) as exc:
        raise _aws_error("DescribeInstanceTypes", region, exc) from exc
    return sorted(found, key=lambda g: g.instance_type)


def latest_spot_prices(ec2: Any, region: str, instance_types: list[str], now: datetime) -> dict[tuple[str, str], float]:
    """Latest Linux/UNIX spot price per (instance type, zone)."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    try:
        # The API accepts up to ~100 instance types per call; chunk to stay well inside it.
        for start in range(0, len(instance_types), 50):
            chunk = instance_types[start : start + 50]
            pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=chunk, ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], StartTime=now
            )
            for page in pages:
                for row in page["SpotPriceHistory"]:
                    key = (row["InstanceType"], row["AvailabilityZone"])
                    stamp, price = row["Timestamp"], float(row["SpotPrice"])
                    if price > 0 and (key not in latest or stamp > latest[key][0]):
                        latest[key] = (stamp, price)
    except (ClientError, BotoCoreError) as exc:
        raise _aws_error("DescribeSpotPriceHistory", region, exc) from exc
    return {k: v[1] for k, v in latest.items()}


def parse_on_demand_prices(offer_file: Mapping[str, Any], instance_types: Iterable[str]) -> dict[str, float]:
    """Linux, shared-tenancy, no pre-installed software, "Used" capacity on-demand $/h per instance type."""
    wanted = set(instance_types)
    products = offer_file.get("products")
    terms = offer_file.get("terms", {}).get("OnDemand")
    if not isinstance(products, Mapping) or not isinstance(terms, Mapping):
        raise ExternalServiceError(
            "the AWS price-list file has no products/terms.OnDemand sections",
            hint="check --price-list-url points at an AmazonEC2 offer file (index.json)",
        )
    prices: dict[str, float] = {}
    for sku, product in products.items():
        attrs = product.get("attributes", {})
        itype = attrs.get("instanceType")
        if (
            itype not in wanted
            or attrs.get("operatingSystem") != "Linux"
            or attrs.get("tenancy") != "Shared"
            or attrs.get("preInstalledSw") != "NA"
            or attrs.get("capacitystatus", "Used") != "Used"
            or attrs.get("licenseModel", "No License required") != "No License required"
        ):
            continue
        for term in terms.get(sku, {}).values():
            for dim in term.get("priceDimensions", {}).values():
                usd = dim.get("pricePerUnit", {}).get("USD")
                if usd is not None and float(usd) > 0:
                    prices[itype] = float(usd)
    return prices


def fetch_offer_file(client: httpx.Client, url: str, progress: Progress | None = None) -> dict[str, Any]:
    """Download (streamed to a temp file: the us-east-1 file is hundreds of MB) and parse one offer file."""
    try:
        with client.stream("GET", url) as response:
            if response.status_code != 200:
                raise ExternalServiceError(
                    f"AWS price list {url} answered HTTP {response.status_code}",
                    hint="check the region name and --price-list-url",
                )
            with tempfile.TemporaryFile() as tmp:
                received = 0
                for chunk in response.iter_bytes(1 << 20):
                    tmp.write(chunk)
                    received += len(chunk)
                    if progress is not None:
                        progress(f"{received / 2**20:.0f} MiB of {url}")
                tmp.seek(0)
                loaded = json.load(tmp)
    except httpx.HTTPError as exc:
        raise ExternalServiceError(
            f"cannot download the AWS price list {url}: {exc}", hint="check network access and retry"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ExternalServiceError(f"the AWS price list {url} is not valid JSON: {exc}", hint="retry later") from exc
    if not isinstance(loaded, dict):
        raise ExternalServiceError(f"the AWS price list {url} is not a JSON object", hint="check --price-list-url")
    return loaded


def refresh_aws(
    catalog: Catalog,
    regions: Iterable[str],
    out_path: Path,
    *,
    today: date,
    now: datetime | None = None,
    endpoints: AwsEndpoints | None = None,
    http_client: httpx.Client | None = None,
    ec2_factory: Callable[[str], Any] | None = None,
    progress: Progress | None = None,
) -> RefreshResult:
    """Fetch GPU instance types, spot and on-demand prices for ``regions`` and write ``out_path``."""
    endpoints = endpoints or AwsEndpoints()
    now = now or datetime.now(UTC)
    if ec2_factory is None:
        def ec2_factory(region: str) -> Any:
            return boto3.session.Session().client("ec2", region_name=region, endpoint_url=endpoints.ec2_endpoint_url)

    own_client = http_client is None
    client = http_client or httpx.Client(timeout=httpx.Timeout(30.0, read=300.0), follow_redirects=True)
    result = RefreshResult(regions=list(regions))
    try:
        for region in result.regions:
            url = endpoints.price_list_url.format(region=region)
            if progress:
                progress(f"{region}: on-demand price list")
            offer_file = fetch_offer_file(client, url, progress)
            if progress:
                progress(f"{region}: instance types")
            ec2 = ec2_factory(region)
            instances = list_gpu_instances(ec2, region, catalog, result.skipped)
            if not instances:
                continue
            types = [i.instance_type for i in instances]
            if progress:
                progress(f"{region}: spot prices for {len(types)} GPU instance types")
            spot = latest_spot_prices(ec2, region, types, now)
            on_demand = parse_on_demand_prices(offer_file, types)
            del offer_file  # the real file is hundreds of MB parsed; free it before the next region
            result.offers.extend(_offers_for_region(region, instances, spot, on_demand, url, today, result.skipped))
    finally:
        if own_client:
            client.close()
    header = (
        f"AWS GPU offers rebuilt by `gpuplan catalog refresh aws` on {today.isoformat()} for "
        f"{', '.join(result.regions)}.\nOn-demand: AWS price-list offer files; spot: EC2 DescribeSpotPriceHistory."
    )
    write_offers(out_path, result.offers, header_comment=header)
    result.path = out_path
    return result


def _offers_for_region(
    region: str,
    instances: list[GpuInstance],
    spot: Mapping[tuple[str, str], float],
    on_demand: Mapping[str, float],
    url: str,
    today: date,
    skipped: dict[str, str],
) -> list[Offer]:
    offers: list[Offer] = []
    for inst in instances:
        od = on_demand.get(inst.instance_type)
        zones = sorted(z for (t, z) in spot if t == inst.instance_type)
        if od is None and not zones:
            skipped.setdefault(inst.instance_type, f"no on-demand or spot price in {region}")
            continue
        note = "on-demand: AWS price list; spot: DescribeSpotPriceHistory (latest in zone)"
        common = {
            "cloud": "aws",
            "instance_type": inst.instance_type,
            "gpu": inst.gpu.id,
            "gpu_count": inst.gpu_count,
            "vcpus": inst.vcpus,
            "ram_gib": inst.ram_gib,
            "region": region,
            "network_gbps": inst.network_gbps,
            "source": Source(url=url, as_of=today, note=note),
        }
        if not zones:
            offers.append(Offer(zone=None, on_demand_usd_per_h=od, spot_usd_per_h=None, **common))
        for zone in zones:
            price: float | None = spot[(inst.instance_type, zone)]
            # A spot price at or above on-demand is never worth taking; record the zone as on-demand only.
            if od is not None and price is not None and price >= od:
                price = None
            offers.append(Offer(zone=zone, on_demand_usd_per_h=od, spot_usd_per_h=price, **common))
    return offers
