"""Integrity of catalog/data/aws_quotas.yaml: every AWS instance type the catalog can plan on has its vCPU
quota class, each family is in one class, and each quota code belongs to one class and market."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog.aws_quotas import family_of, load_aws_quotas
from catalog.loader import load_catalog
from errors import CatalogError


def test_every_aws_offer_has_a_quota_class() -> None:
    quotas = load_aws_quotas()
    types = {o.instance_type for o in load_catalog().offers if o.cloud.lower() == "aws"}
    assert types
    assert sorted(t for t in types if quotas.of(t) is None) == []
    assert quotas.of("m5.2xlarge") is not None  # the default head


def test_families_and_codes_are_unique() -> None:
    quotas = load_aws_quotas()
    families = [f for c in quotas.classes for f in c.families]
    codes = [code for c in quotas.classes for code in (c.on_demand, c.spot)]
    assert len(families) == len(set(families)) and len(codes) == len(set(codes))


def test_family_of_instance_types() -> None:
    assert [family_of(t) for t in ("p5en.48xlarge", "g6e.12xlarge", "vt1.3xlarge", "trn1.32xlarge")] == [
        "p", "g", "vt", "trn"]
    quotas = load_aws_quotas()
    assert quotas.of("p5.48xlarge").spot == "L-7212CCBC"  # type: ignore[union-attr]


def test_a_bad_row_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "aws_quotas.yaml").write_text(
        "source: {url: 'x', as_of: '2026-12-05'}\nclasses:\n  - {name: P, families: [p], on_demand: L-1, spot: L-2}\n")
    with pytest.raises(CatalogError, match="on_demand"):
        load_aws_quotas.__wrapped__(tmp_path)
