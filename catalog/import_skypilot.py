"""Import a skypilot-catalog v8 ``vms.csv`` (any cloud) as that cloud's offers file.

skypilot-catalog (github.com/skypilot-org/skypilot-catalog, ``catalogs/v8/<cloud>/vms.csv``) prices
one instance type per row and region or zone: ``Price`` is on-demand $/h per instance, ``SpotPrice``
the spot price of that zone. Rows are mapped to catalog GPUs by ``AcceleratorName`` (through
``cloud_names.yaml`` first, then the catalog's ids and aliases, disambiguated by the per-GPU memory in
``GpuInfo`` where the file gives it). Rows whose accelerator is not in the catalog are skipped and
counted by name; CPU-only, fractional-GPU, GPU-only (no VM) and unpriced rows are skipped and counted
by reason. The result is written atomically (:func:`catalog.offers_io.write_offers`).
"""

from __future__ import annotations

import ast
import csv
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import httpx

from catalog.cloud_names import gpu_for_accelerator, load_cloud_names
from catalog.loader import Catalog
from catalog.offers_io import write_offers
from catalog.schema import CloudNames, Offer, Source
from errors import ExternalServiceError, InvalidInput

REQUIRED_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "GpuInfo", "Price",
                    "SpotPrice", "Region", "AvailabilityZone")
# Cloud directory names of skypilot-catalog: a file at catalogs/v8/<cloud>/vms.csv names its cloud.
SKYPILOT_CLOUDS = ("aws", "azure", "gcp", "lambda", "runpod", "oci", "ibm", "scp", "fluidstack", "cudo", "paperspace",
                   "vast", "do", "nebius", "hyperbolic", "vsphere")
_NOTE = ("skypilot-catalog v8 vms.csv row (Price per instance; SpotPrice of this zone); the file gives no "
         "network speed, so 25 Gbit/s is assumed")


@dataclass
class ImportResult:
    cloud: str
    rows: int = 0
    offers: list[Offer] = field(default_factory=list)
    unknown_accelerators: Counter[str] = field(default_factory=Counter)  # AcceleratorName -> rows skipped
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> rows skipped
    path: Path | None = None


class _Skip(Exception):
    """A row that gives no offer, with the reason it is counted under."""


def cloud_from_path(path: str) -> str | None:
    """The cloud of ``.../catalogs/v8/<cloud>/vms.csv``, a path or URL (None when it does not say)."""
    if path.startswith(("http://", "https://")):
        parts = httpx.URL(path).path.rstrip("/").split("/")
        parent = parts[-2] if len(parts) >= 2 else ""
    else:
        parent = Path(path).expanduser().resolve().parent.name
    return parent.lower() if parent.lower() in SKYPILOT_CLOUDS else None


def download_vms_csv(url: str, dest: Path, client: httpx.Client | None = None) -> Path:
    """Fetch a vms.csv over HTTP(S) into ``dest`` (a file in a temp directory); ExternalServiceError on failure."""
    own = client is None
    client = client or httpx.Client(timeout=httpx.Timeout(30.0, read=120.0), follow_redirects=True)
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        raise ExternalServiceError(f"cannot download {url}: {exc}; nothing was written",
                                   hint="check the URL and network access, or download the file yourself") from exc
    finally:
        if own:
            client.close()
    if response.status_code != 200:
        raise ExternalServiceError(f"{url} answered HTTP {response.status_code}; nothing was written",
                                   hint="check the URL (raw file, e.g. raw.githubusercontent.com/.../vms.csv)")
    dest.write_bytes(response.content)
    return dest


def _number(row: dict[str, str], column: str) -> float | None:
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise _Skip(f"{column} is not a number") from None
    return value if value == value else None  # NaN (pandas writes "nan") counts as blank


def _memory_mib(gpu_info: str) -> int | None:
    """Per-GPU MiB from GpuInfo (a Python- or JSON-literal dict on AWS/Azure rows; a bare name elsewhere)."""
    text = gpu_info.strip()
    if not text.startswith("{"):
        return None
    parsed: object = None
    for parse in (json.loads, ast.literal_eval):
        try:
            parsed = parse(text)
            break
        except (ValueError, SyntaxError):
            continue
    try:
        mib = parsed["Gpus"][0]["MemoryInfo"]["SizeInMiB"]  # type: ignore[index]
        return int(mib) if mib else None
    except (TypeError, KeyError, IndexError, ValueError):
        return None


def _row_offer(row: dict[str, str], cloud: str, catalog: Catalog, names: CloudNames, source: Source,
               unknown: Counter[str]) -> Offer:
    name = (row["AcceleratorName"] or "").strip()
    count = _number(row, "AcceleratorCount")
    if not name or not count or count <= 0:
        raise _Skip("no accelerator (CPU-only instance)")
    if not (row["InstanceType"] or "").strip():
        raise _Skip("GPU-only row with no instance type (priced apart from a VM)")
    if count != int(count):
        raise _Skip("fractional GPU")
    gpu = gpu_for_accelerator(name, _memory_mib(row["GpuInfo"] or ""), catalog, names, row["InstanceType"].strip())
    if gpu is None:
        unknown[name] += 1
        raise _Skip("accelerator not in the catalog")
    price, spot = _number(row, "Price"), _number(row, "SpotPrice")
    price, spot = (price if price and price > 0 else None), (spot if spot and spot > 0 else None)
    if price is not None and spot is not None and spot >= price:
        spot = None
    if price is None and spot is None:
        raise _Skip("no price")
    vcpus, ram = _number(row, "vCPUs"), _number(row, "MemoryGiB")
    if not vcpus or vcpus < 1 or not ram or ram <= 0 or not (row["Region"] or "").strip():
        raise _Skip("no vCPUs, memory or region")
    return Offer(cloud=cloud, instance_type=row["InstanceType"].strip(), gpu=gpu.id, gpu_count=int(count),
                 vcpus=round(vcpus), ram_gib=ram, region=row["Region"].strip(),
                 zone=(row["AvailabilityZone"] or "").strip() or None, on_demand_usd_per_h=price,
                 spot_usd_per_h=spot, source=source)


def read_skypilot_vms(path: Path, catalog: Catalog, *, cloud: str, today: date, source_url: str | None = None,
                      names: CloudNames | None = None) -> ImportResult:
    """The offers of a skypilot-catalog v8 vms.csv; InvalidInput if it is not one."""
    names = names or load_cloud_names()
    source = Source(url=source_url or path.resolve().as_uri(), as_of=today, note=_NOTE)
    result = ImportResult(cloud=cloud)
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(f"{path} is not a skypilot-catalog v8 vms.csv: missing column(s) "
                                   f"{', '.join(missing)}", path="FILE",
                                   hint=f"the file needs the columns {', '.join(REQUIRED_COLUMNS)}")
            seen: set[tuple[str, str, str | None]] = set()
            for row in reader:
                result.rows += 1
                try:
                    offer = _row_offer(row, cloud, catalog, names, source, result.unknown_accelerators)
                except _Skip as skip:
                    result.skipped[str(skip)] += 1
                    continue
                key = (offer.instance_type, offer.region, offer.zone)
                if key in seen:
                    result.skipped["duplicate instance type and zone (first row kept)"] += 1
                    continue
                seen.add(key)
                result.offers.append(offer)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInput(f"cannot read {path}: {exc}", path="FILE", hint="give a skypilot-catalog vms.csv") from exc
    return result


def import_skypilot(path: Path, catalog: Catalog, out_path: Path, *, cloud: str, today: date,
                    source_url: str | None = None, names: CloudNames | None = None) -> ImportResult:
    """Read ``path`` and write its offers to ``out_path`` (atomically); nothing is written if none map."""
    result = read_skypilot_vms(path, catalog, cloud=cloud, today=today, source_url=source_url, names=names)
    if not result.offers:
        raise InvalidInput(f"{path}: none of its {result.rows} rows maps to a priced catalog GPU; nothing was written",
                           path="FILE", hint="check the file is a GPU vms.csv (`gpuplan catalog gpus` lists the "
                           "GPUs the catalog knows)")
    header = (f"{cloud} GPU offers imported by `gpuplan catalog import` on {today.isoformat()} from "
              f"{source_url or path.name}.")
    write_offers(out_path, result.offers, header_comment=header)
    result.path = out_path
    return result
