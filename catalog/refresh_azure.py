"""Rebuild the Azure offers file from Azure's public Retail Prices API (no credentials).

The API (``GET https://prices.azure.com/api/retail/prices?$filter=...``) answers JSON pages of
``Items`` and a ``NextPageLink`` to the next page (null on the last). It prices a VM size
(``armSkuName``) per region (``armRegionName``) and meter (``skuName``: "... Spot" and
"... Low Priority" are the evictable markets) but says nothing of the size's hardware: the GPUs,
vCPUs and RAM come from ``catalog/data/cloud_names.yaml``. Azure publishes no zone prices, so every
offer's zone is empty.

Every page is fetched and checked before anything is written; the file is then written atomically
(:func:`catalog.offers_io.write_offers`), so a failed refresh leaves the previous file as it was.
Off the runtime path: only ``gpuplan catalog refresh azure`` calls this.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import httpx

from catalog.cloud_names import azure_skus, load_cloud_names
from catalog.loader import Catalog
from catalog.offers_io import write_offers
from catalog.schema import CloudNames, CloudSku, Offer, Source
from errors import ExternalServiceError

AZURE_PRICES_URL = "https://prices.azure.com/api/retail/prices"
AZURE_DEFAULT_REGIONS = ("eastus", "eastus2", "southcentralus", "westus2", "westus3", "westeurope", "northeurope")
SKUS_PER_QUERY = 8  # sizes OR-ed into one $filter: keeps each URL short
MAX_PAGES = 2000  # a NextPageLink chain longer than this is a server bug, not data
_ITEM_FIELDS: dict[str, type | tuple[type, ...]] = {
    "armSkuName": str, "armRegionName": str, "skuName": str, "productName": str, "meterName": str,
    "retailPrice": (int, float), "unitOfMeasure": str, "type": str,
}
_HINT = "retry later; if it persists, check --prices-api-url and network access to prices.azure.com"

Progress = Callable[[str], None]


@dataclass
class AzureRefreshResult:
    offers: list[Offer] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # VM size -> why it gave no offer
    regions: list[str] = field(default_factory=list)  # [] = every region
    pages: int = 0
    path: Path | None = None


@dataclass
class _Prices:
    """The meters of one (size, region): Linux pay-as-you-go, Spot and Low Priority."""

    on_demand: dict[str, Any] | None = None
    spot: dict[str, Any] | None = None
    low_priority: dict[str, Any] | None = None


def price_filter(skus: Sequence[str], regions: Sequence[str]) -> str:
    """The OData $filter for Consumption VM prices of ``skus`` in ``regions`` (all regions if empty)."""
    text = "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and ("
    text += " or ".join(f"armSkuName eq '{s}'" for s in skus) + ")"
    if regions:
        text += " and (" + " or ".join(f"armRegionName eq '{r}'" for r in regions) + ")"
    return text


def _bad_page(url: str, what: str) -> ExternalServiceError:
    return ExternalServiceError(f"Azure Retail Prices API page {url} {what}; nothing was written", hint=_HINT)


def _check_items(url: str, page: object) -> tuple[list[dict[str, Any]], str | None]:
    if not isinstance(page, dict) or not isinstance(page.get("Items"), list):
        raise _bad_page(url, "has no Items list")
    next_link = page.get("NextPageLink")
    if next_link is not None and not isinstance(next_link, str):
        raise _bad_page(url, f"has a NextPageLink that is not a URL: {next_link!r}")
    items: list[dict[str, Any]] = page["Items"]
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise _bad_page(url, f"item {i} is not an object")
        for key, kind in _ITEM_FIELDS.items():
            if not isinstance(item.get(key), kind) or isinstance(item.get(key), bool):
                raise _bad_page(url, f"item {i} has no valid {key} ({item.get(key)!r})")
    return items, next_link or None


def fetch_price_items(client: httpx.Client, api_url: str, filter_text: str,
                      progress: Progress | None = None) -> tuple[list[dict[str, Any]], int]:
    """Every item of the query, following NextPageLink; (items, pages)."""
    request: httpx.Request | None = client.build_request("GET", api_url, params={"$filter": filter_text})
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    pages = 0
    while request is not None:
        url = str(request.url)
        if url in seen or pages >= MAX_PAGES:
            raise _bad_page(url, "repeats an earlier page (a NextPageLink loop)")
        seen.add(url)
        try:
            response = client.send(request)
            body = response.read()
        except httpx.HTTPError as exc:
            raise ExternalServiceError(f"cannot read Azure Retail Prices API page {url}: {exc}; nothing was written",
                                       hint=_HINT) from exc
        if response.status_code != 200:
            raise _bad_page(url, f"answered HTTP {response.status_code}")
        try:
            page = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _bad_page(url, f"is not valid JSON (truncated or malformed: {exc})") from exc
        page_items, next_link = _check_items(url, page)
        items.extend(page_items)
        pages += 1
        if progress is not None:
            progress(f"{len(items)} prices from {pages} page(s)")
        request = client.build_request("GET", next_link) if next_link else None
    return items, pages


def _collect(items: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], _Prices]:
    """Linux hourly prices by (size, region); the newest meter wins where Azure lists several."""
    by_key: dict[tuple[str, str], _Prices] = {}
    for item in items:
        if (item["type"] != "Consumption" or item["unitOfMeasure"] != "1 Hour" or "Windows" in item["productName"]
                or float(item["retailPrice"]) <= 0):
            continue
        prices = by_key.setdefault((item["armSkuName"], item["armRegionName"]), _Prices())
        sku_name = item["skuName"]
        slot = "spot" if "Spot" in sku_name else "low_priority" if "Low Priority" in sku_name else "on_demand"
        current = getattr(prices, slot)
        if current is None or str(item.get("effectiveStartDate", "")) >= str(current.get("effectiveStartDate", "")):
            setattr(prices, slot, dict(item))
    return by_key


def _offer(sku: CloudSku, region: str, prices: _Prices, api_url: str, today: date) -> Offer | None:
    od = prices.on_demand
    evictable = prices.spot or prices.low_priority
    on_demand = float(od["retailPrice"]) if od else None
    spot = float(evictable["retailPrice"]) if evictable else None
    if on_demand is not None and spot is not None and spot >= on_demand:
        spot = None  # never worth taking; the integrity rules keep spot below on-demand
    if on_demand is None and spot is None:
        return None
    assert sku.gpu is not None and sku.gpu_count is not None and sku.vcpus is not None and sku.ram_gib is not None
    query = str(httpx.URL(api_url, params={"$filter": f"armSkuName eq '{sku.sku}' and armRegionName eq '{region}' "
                                                    "and priceType eq 'Consumption'"}))
    meters = [f"on-demand '{od['meterName']}' ({od['productName']})" if od else "no Linux on-demand price",
              f"spot '{evictable['skuName']}'" if evictable and spot is not None else "no spot price below on-demand"]
    return Offer(cloud="azure", instance_type=sku.sku, gpu=sku.gpu, gpu_count=sku.gpu_count, vcpus=sku.vcpus,
                 ram_gib=sku.ram_gib, region=region, zone=None, on_demand_usd_per_h=on_demand, spot_usd_per_h=spot,
                 network_gbps=sku.network_gbps,
                 source=Source(url=query, as_of=today, note=f"Azure Retail Prices API: {'; '.join(meters)}"))


def refresh_azure(
    catalog: Catalog,
    regions: Iterable[str],
    out_path: Path,
    *,
    today: date,
    api_url: str = AZURE_PRICES_URL,
    http_client: httpx.Client | None = None,
    names: CloudNames | None = None,
    progress: Progress | None = None,
) -> AzureRefreshResult:
    """Fetch Linux on-demand and spot prices of the GPU sizes in cloud_names.yaml and write ``out_path``."""
    sizes = azure_skus(names or load_cloud_names())
    result = AzureRefreshResult(regions=list(regions))
    result.skipped.update({s.sku: s.skip for s in sizes.values() if s.skip})
    wanted = sorted(s.sku for s in sizes.values() if not s.skip and catalog.has_gpu(s.gpu or ""))
    result.skipped.update({s.sku: f"GPU {s.gpu} is not in the catalog" for s in sizes.values()
                           if not s.skip and not catalog.has_gpu(s.gpu or "")})
    own_client = http_client is None
    client = http_client or httpx.Client(timeout=httpx.Timeout(30.0, read=120.0), follow_redirects=True)
    items: list[dict[str, Any]] = []
    try:
        for start in range(0, len(wanted), SKUS_PER_QUERY):
            chunk, pages = fetch_price_items(client, api_url, price_filter(wanted[start:start + SKUS_PER_QUERY],
                                                                           result.regions), progress)
            items.extend(chunk)
            result.pages += pages
    finally:
        if own_client:
            client.close()
    by_key = _collect(items)
    for (sku_name, region), prices in sorted(by_key.items()):
        sku = sizes.get(sku_name)
        if sku is None or sku.skip:
            continue  # the server answered a size the query did not ask for
        offer = _offer(sku, region, prices, api_url, today)
        if offer is not None:
            result.offers.append(offer)
    priced = {o.instance_type for o in result.offers}
    where = ", ".join(result.regions) or "any region"
    result.skipped.update({s: f"no Linux price in {where}" for s in wanted if s not in priced})
    if not result.offers:
        raise ExternalServiceError(f"the Azure Retail Prices API returned no Linux price for any known GPU size in "
                                   f"{where}; the offers file was left as it was",
                                   hint="check --regions (Azure region names such as eastus) and --prices-api-url")
    header = (f"Azure GPU offers rebuilt by `gpuplan catalog refresh azure` on {today.isoformat()} for {where}.\n"
              "Azure Retail Prices API (Linux pay-as-you-go; spot = Spot, else Low Priority); Azure gives no zones.")
    write_offers(out_path, result.offers, header_comment=header)
    result.path = out_path
    return result
