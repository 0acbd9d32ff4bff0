"""Loader behaviour: lookups by id/alias, did-you-mean errors, offers index, overrides, staleness."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog, stale_offer_warning
from catalog.offers_io import read_offers, write_offers
from catalog.schema import Offer, Source
from errors import CatalogError, UnknownName


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)


def test_gpu_lookup_by_id_and_alias_is_case_insensitive(catalog: Catalog) -> None:
    assert catalog.gpu("H100").id == "H100-SXM"
    assert catalog.gpu("h100-80gb").id == "H100-SXM"
    assert catalog.gpu("a100").id == "A100-80GB"
    assert catalog.gpu("H100 SXM").id == "H100-SXM"


def test_unknown_gpu_suggests_close_names(catalog: Catalog) -> None:
    with pytest.raises(UnknownName) as info:
        catalog.gpu("H1000")
    assert "H100" in str(info.value)
    assert info.value.kind == "GPU"


def test_unknown_model_suggests_close_names(catalog: Catalog) -> None:
    with pytest.raises(UnknownName) as info:
        catalog.model("llama-3-7b")
    assert "llama-3-8b" in info.value.suggestions


def test_offers_for_alias_returns_only_that_gpu(catalog: Catalog) -> None:
    offers = catalog.offers_for("H100")
    assert offers
    assert {o.gpu for o in offers} == {"H100-SXM"}


def _offer(gpu: str = "H100-SXM", as_of: date = date(2026, 1, 1), cloud: str = "test") -> Offer:
    return Offer(
        cloud=cloud, instance_type="x.big", gpu=gpu, gpu_count=1, vcpus=8, ram_gib=64, region="r1",
        on_demand_usd_per_h=2.0, spot_usd_per_h=1.0, source=Source(url="https://example.invalid", as_of=as_of),
    )


def test_with_offers_adds_and_indexes(catalog: Catalog) -> None:
    extended = catalog.with_offers([_offer()])
    assert len(extended.offers) == len(catalog.offers) + 1
    assert any(o.cloud == "test" for o in extended.offers_for("H100-SXM"))
    assert not any(o.cloud == "test" for o in catalog.offers_for("H100-SXM"))


def test_offer_with_unknown_gpu_is_a_catalog_error(catalog: Catalog) -> None:
    with pytest.raises(CatalogError, match="unknown GPU 'H101'"):
        catalog.with_offers([_offer(gpu="H101")])


def test_stale_offers_and_warning(catalog: Catalog) -> None:
    cat = Catalog(gpus=catalog.gpus, offers=(_offer(as_of=date(2026, 1, 1)), _offer(as_of=date(2026, 3, 1))),
                  models=())
    stale = cat.stale_offers(date(2026, 3, 15))
    assert [o.source.as_of for o in stale] == [date(2026, 1, 1)]
    text = stale_offer_warning(stale, date(2026, 3, 15))
    assert text is not None and "older than 30 days" in text and "2026-01-01" in text
    assert stale_offer_warning([], date(2026, 3, 15)) is None
    # the command that renews each stale cloud: refresh where gpuplan refreshes it, an import elsewhere
    assert "`gpuplan catalog import vms.csv --cloud test`" in text and "refresh aws" not in text
    mixed = [_offer(cloud="azure"), _offer(cloud="lambda"), _offer(cloud="aws"), _offer(cloud="runpod")]
    text = stale_offer_warning(mixed, date(2026, 3, 15))
    assert text is not None and text.endswith(
        "run `gpuplan catalog refresh aws`, `gpuplan catalog refresh azure` and `gpuplan catalog import vms.csv "
        "--cloud <cloud>` for lambda, runpod (skypilot-catalog's catalogs/v8/<cloud>/vms.csv)")
    only_azure = stale_offer_warning([_offer(cloud="azure")], date(2026, 3, 15))
    assert only_azure is not None and only_azure.endswith("run `gpuplan catalog refresh azure`")
    local = _offer(as_of=date(2000, 1, 1), cloud="local")
    assert cat.with_offers([local]).stale_offers(date(2026, 3, 15)) == stale


def test_offers_csv_round_trip(tmp_path: Path) -> None:
    rows = [_offer(), _offer(as_of=date(2026, 2, 2)).model_copy(update={"zone": "r1a", "spot_usd_per_h": None})]
    path = tmp_path / "offers" / "test.csv"
    assert write_offers(path, rows, header_comment="test rows") == 2
    assert read_offers(path) == rows


def test_user_dir_offers_replace_packaged_cloud_file(tmp_path: Path, catalog: Catalog) -> None:
    write_offers(tmp_path / "offers" / "aws.csv", [_offer(cloud="aws")])
    merged = load_catalog(user_dir=tmp_path)
    aws = [o for o in merged.offers if o.cloud == "aws"]
    assert [o.instance_type for o in aws] == ["x.big"]
    others = [o for o in catalog.offers if o.cloud != "aws"]
    assert [o for o in merged.offers if o.cloud != "aws"] == others


def test_bad_offer_row_names_file_row_and_field(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "offers").mkdir(parents=True)
    (data / "gpus.yaml").write_text((PACKAGED_DATA_DIR / "gpus.yaml").read_text())
    (data / "offers" / "x.csv").write_text(
        "cloud,instance_type,gpu,gpu_count,vcpus,ram_gib,region,zone,on_demand_usd_per_h,spot_usd_per_h,"
        "network_gbps,source_url,as_of,source_note\n"
        "x,i,H100-SXM,8,1,1,r,,-3,,,https://e,2026-01-01,\n"
    )
    with pytest.raises(CatalogError, match=r"x.csv row 2: on_demand_usd_per_h"):
        load_catalog(data)
