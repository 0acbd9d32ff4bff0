"""Offers files: one CSV per cloud, one row per (instance type, region/zone), read and written here.

CSV keeps hundreds of priced rows reviewable in a diff; the loader and the AWS refresher share
these two functions so what ``gpuplan catalog refresh`` / ``import`` write is exactly what the loader reads.
"""

from __future__ import annotations

import csv
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError

from catalog.schema import Offer, Source
from errors import CatalogError

COLUMNS = (
    "cloud",
    "instance_type",
    "gpu",
    "gpu_count",
    "vcpus",
    "ram_gib",
    "region",
    "zone",
    "on_demand_usd_per_h",
    "spot_usd_per_h",
    "network_gbps",
    "source_url",
    "as_of",
    "source_note",
)


def _blank_to_none(value: str | None) -> str | None:
    return None if value is None or value.strip() == "" else value.strip()


def offer_from_row(row: dict[str, str], where: str) -> Offer:
    missing = [c for c in COLUMNS if c not in row]
    if missing:
        raise CatalogError(f"{where}: missing column(s) {', '.join(missing)}", hint=f"columns: {','.join(COLUMNS)}")
    try:
        return Offer(
            cloud=row["cloud"].strip(),
            instance_type=row["instance_type"].strip(),
            gpu=row["gpu"].strip(),
            gpu_count=row["gpu_count"],  # pydantic parses the CSV text
            vcpus=row["vcpus"],
            ram_gib=row["ram_gib"],
            region=row["region"].strip(),
            zone=_blank_to_none(row["zone"]),
            on_demand_usd_per_h=_blank_to_none(row["on_demand_usd_per_h"]),
            spot_usd_per_h=_blank_to_none(row["spot_usd_per_h"]),
            network_gbps=_blank_to_none(row["network_gbps"]) or 25,
            source=Source(url=row["source_url"], as_of=row["as_of"], note=row["source_note"] or ""),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise CatalogError(
            f"{where}: {field}: {first['msg']}", hint="fix the row; schema: catalog/schema.py Offer"
        ) from exc


def read_offers(path: Path) -> list[Offer]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.DictReader(line for line in fh if not line.startswith("#"))]
    except OSError as exc:
        raise CatalogError(f"cannot read offers file {path}: {exc}", hint="fix or delete the file") from exc
    # CSV line numbers: +2 for the header and 1-based counting (comment lines are not counted).
    return [offer_from_row(row, f"{path} row {i + 2}") for i, row in enumerate(rows)]


def _fmt(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return str(value)


def write_offers(path: Path, offers: Iterable[Offer], header_comment: str | None = None) -> int:
    """Write offers atomically so a failed refresh or import never leaves half a file.

    The rows go to a temp file in the same directory (same filesystem), which ``os.replace`` then
    renames over ``path`` in one step; on any error the temp file is removed and ``path`` is untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            count = _write_rows(fh, offers, header_comment)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def _write_rows(fh: TextIO, offers: Iterable[Offer], header_comment: str | None) -> int:
    if header_comment:
        for line in header_comment.splitlines():
            fh.write(f"# {line}\n")
    writer = csv.writer(fh)
    writer.writerow(COLUMNS)
    count = 0
    for o in offers:
        writer.writerow(
            [
                o.cloud,
                o.instance_type,
                o.gpu,
                o.gpu_count,
                o.vcpus,
                _fmt(o.ram_gib),
                o.region,
                o.zone or "",
                _fmt(o.on_demand_usd_per_h),
                _fmt(o.spot_usd_per_h),
                _fmt(o.network_gbps),
                o.source.url,
                o.source.as_of.isoformat(),
                o.source.note,
            ]
        )
        count += 1
    return count
