"""Integrity of catalog/data/cloud_names.yaml: every mapped size and name points at a catalog GPU."""

from __future__ import annotations

from collections import Counter
from datetime import date
from pathlib import Path

import pytest

from catalog.cloud_names import load_cloud_names
from catalog.loader import Catalog
from catalog.schema import CloudSku, Source
from errors import CatalogError


def test_azure_sizes_map_to_catalog_gpus_or_say_why_not(catalog: Catalog) -> None:
    names = load_cloud_names()
    skus = Counter(s.sku for s in names.azure_skus)
    assert [s for s, n in skus.items() if n > 1] == []
    for row in names.azure_skus:
        assert row.sku.startswith("Standard_") and row.source.url.startswith("https://"), row.sku
        if row.skip:
            continue
        assert row.gpu is not None and catalog.gpu(row.gpu).id == row.gpu, row.sku  # an id, not an alias
    mapped = {s.sku: (s.gpu, s.gpu_count) for s in names.azure_skus if not s.skip}
    assert mapped["Standard_ND96isr_H100_v5"] == ("H100-SXM", 8)
    assert mapped["Standard_ND96isr_H200_v5"] == ("H200", 8)
    assert mapped["Standard_NC24ads_A100_v4"] == ("A100-80GB", 1)
    assert mapped["Standard_ND96amsr_A100_v4"] == ("A100-80GB", 8)
    assert mapped["Standard_ND96is_MI300X_v5"] == ("MI300X", 8)


def test_the_packaged_azure_offers_agree_with_the_size_table(catalog: Catalog) -> None:
    sizes = {s.sku: s for s in load_cloud_names().azure_skus}
    for offer in (o for o in catalog.offers if o.cloud == "azure"):
        size = sizes[offer.instance_type]
        assert (size.gpu, size.gpu_count, size.vcpus) == (offer.gpu, offer.gpu_count, offer.vcpus), offer


def test_skypilot_names_point_at_catalog_ids(catalog: Catalog) -> None:
    names = load_cloud_names()
    for name, gpu_id in (names.skypilot_accelerators | names.skypilot_instances).items():
        assert catalog.gpu(gpu_id).id == gpu_id, name


def test_a_size_without_hardware_must_say_why() -> None:
    src = Source(url="https://example.test", as_of=date(2026, 12, 1))
    with pytest.raises(ValueError, match="or skip with the reason"):
        CloudSku(sku="Standard_X", gpu="H100-SXM", source=src)
    assert CloudSku(sku="Standard_X", skip="fractional", source=src).gpu is None


def test_a_broken_names_file_is_a_catalog_error(tmp_path: Path) -> None:
    (tmp_path / "cloud_names.yaml").write_text("azure_skus:\n  - sku: Standard_X\n    gpu: H100-SXM\n")
    with pytest.raises(CatalogError, match=r"azure_skus\.0\.source"):
        load_cloud_names(tmp_path)
