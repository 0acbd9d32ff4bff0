"""EC2's vCPU quota of each instance family class and market (catalog/data/aws_quotas.yaml)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from pydantic import Field

from catalog.loader import PACKAGED_DATA_DIR, read_data_record
from catalog.schema import Source, _Record

QUOTA_CODE = r"^L-[0-9A-F]{8}$"


class VcpuQuotaClass(_Record):
    """Instance families that share one running on-demand and one spot vCPU quota."""

    name: str
    families: list[str] = Field(min_length=1)
    on_demand: str = Field(pattern=QUOTA_CODE)
    spot: str = Field(pattern=QUOTA_CODE)

    def code(self, market: str) -> str:
        return self.spot if market == "spot" else self.on_demand


class AwsQuotas(_Record):
    source: Source
    classes: list[VcpuQuotaClass] = Field(min_length=1)

    def of(self, instance_type: str) -> VcpuQuotaClass | None:
        """The class of ``instance_type`` (p5en.48xlarge: P; g6e.12xlarge: G and VT); None if unknown."""
        family = family_of(instance_type)
        return next((c for c in self.classes if family in c.families), None)


def family_of(instance_type: str) -> str:
    """The family letters of an instance type: ``p`` of p5en.48xlarge, ``vt`` of vt1.3xlarge."""
    match = re.match(r"[a-z]+", instance_type.lower())
    return match.group(0) if match else instance_type


@functools.cache
def load_aws_quotas(data_dir: Path = PACKAGED_DATA_DIR) -> AwsQuotas:
    return read_data_record(data_dir / "aws_quotas.yaml", AwsQuotas, "catalog/aws_quotas.py AwsQuotas")
