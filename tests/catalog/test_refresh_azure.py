"""`refresh_azure` against a real local HTTP server answering like Azure's Retail Prices API: paging,
meter selection, and failures mid-refresh that must leave the previous offers file untouched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest

from catalog.loader import Catalog, load_catalog
from catalog.offers_io import read_offers
from catalog.refresh_azure import price_filter, refresh_azure
from errors import ExternalServiceError
from tests.catalog.azure_server import API_PATH, azure_price_server

TODAY = date(2026, 12, 1)


@pytest.fixture(scope="module")
def azure_server() -> Iterator[tuple[str, list[str]]]:
    with azure_price_server() as server:
        yield server


def _api(server: tuple[str, list[str]], mode: str = "ok") -> str:
    return f"{server[0]}/{mode}{API_PATH}"


def test_refresh_writes_offers_the_loader_reads(
    catalog: Catalog, azure_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    out = tmp_path / "user" / "offers" / "azure.csv"
    seen: list[str] = []
    result = refresh_azure(catalog, ["eastus", "eastus2", "westus2"], out, today=TODAY, api_url=_api(azure_server),
                           progress=seen.append)
    assert any("%24skip=3" in p for p in azure_server[1])  # followed NextPageLink past the first page
    assert seen and result.pages > 1
    by_key = {(o.instance_type, o.region): o for o in result.offers}
    h100 = by_key[("Standard_ND96isr_H100_v5", "eastus")]
    assert (h100.gpu, h100.gpu_count, h100.vcpus, h100.ram_gib, h100.zone) == ("H100-SXM", 8, 96, 1900, None)
    assert (h100.on_demand_usd_per_h, h100.spot_usd_per_h) == (98.32, 39.328)  # not Windows/DevTest/Reservation
    assert by_key[("Standard_ND96isr_H200_v5", "eastus2")].gpu == "H200"
    assert by_key[("Standard_ND96is_MI300X_v5", "eastus")].gpu_count == 8
    a100 = by_key[("Standard_NC24ads_A100_v4", "eastus")]
    assert (a100.gpu, a100.gpu_count) == ("A100-80GB", 1)
    assert (a100.on_demand_usd_per_h, a100.spot_usd_per_h) == (3.673, 0.5)  # newest meter; Spot over Low Priority
    nd_a100 = by_key[("Standard_ND96amsr_A100_v4", "westus2")]
    assert nd_a100.spot_usd_per_h == 6.5536 and "Low Priority" in nd_a100.source.note  # Low Priority when no Spot
    assert by_key[("Standard_NC40ads_H100_v5", "eastus")].spot_usd_per_h is None  # spot above on-demand: dropped
    assert {r for _, r in by_key} == {"eastus", "eastus2", "westus2"}  # westus3/japaneast were not asked for
    assert "fractional" in result.skipped["Standard_NV6ads_A10_v5"]
    assert "not in the catalog" in result.skipped["Standard_NV36ads_A10_v5"]
    assert result.skipped["Standard_NC4as_T4_v3"].startswith("no Linux price")  # only a monthly meter
    for o in result.offers:
        assert o.source.as_of == TODAY and o.source.url.startswith(_api(azure_server) + "?")
        assert o.instance_type in o.source.url.replace("%27", "'").replace("+", " ")

    assert read_offers(out) == result.offers
    merged = load_catalog(user_dir=tmp_path / "user")
    assert sorted(o.instance_type for o in merged.offers if o.cloud == "azure") == sorted(
        o.instance_type for o in result.offers)  # the refreshed file replaced the packaged azure.csv


def test_all_regions(catalog: Catalog, azure_server: tuple[str, list[str]], tmp_path: Path) -> None:
    result = refresh_azure(catalog, [], tmp_path / "azure.csv", today=TODAY, api_url=_api(azure_server))
    assert {o.region for o in result.offers if o.instance_type == "Standard_ND96isr_H100_v5"} == {
        "eastus", "westus3", "japaneast"}


@pytest.mark.parametrize("mode,message", [
    ("http500", "answered HTTP 500"),
    ("malformed", "has no valid"),
    ("truncated", "is not valid JSON"),
    ("partial", "cannot read Azure Retail Prices API page"),
    ("empty", "returned no Linux price"),
])
def test_a_failed_refresh_leaves_the_previous_file(
    catalog: Catalog, azure_server: tuple[str, list[str]], tmp_path: Path, mode: str, message: str
) -> None:
    out = tmp_path / "offers" / "azure.csv"
    good = refresh_azure(catalog, ["eastus"], out, today=TODAY, api_url=_api(azure_server))
    before = out.read_bytes()
    with pytest.raises(ExternalServiceError, match=message) as info:
        refresh_azure(catalog, ["eastus"], out, today=date(2026, 12, 2), api_url=_api(azure_server, mode))
    assert "--prices-api-url" in str(info.value) or "--regions" in str(info.value)  # says what to check
    assert out.read_bytes() == before and read_offers(out) == good.offers
    assert sorted(p.name for p in out.parent.iterdir()) == ["azure.csv"]  # no temp file left behind


def test_a_failed_first_refresh_writes_nothing(
    catalog: Catalog, azure_server: tuple[str, list[str]], tmp_path: Path
) -> None:
    with pytest.raises(ExternalServiceError):
        refresh_azure(catalog, ["eastus"], tmp_path / "azure.csv", today=TODAY, api_url=_api(azure_server, "malformed"))
    assert list(tmp_path.iterdir()) == []


def test_price_filter_is_odata() -> None:
    assert price_filter(["Standard_A", "Standard_B"], ["eastus"]) == (
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and "
        "(armSkuName eq 'Standard_A' or armSkuName eq 'Standard_B') and (armRegionName eq 'eastus')")
    assert "armRegionName" not in price_filter(["Standard_A"], [])
