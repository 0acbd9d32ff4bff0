"""How price sources name hardware (catalog/data/cloud_names.yaml), and matching their names to catalog GPUs.

Used only by the price refreshers and importers (``gpuplan catalog refresh azure``, ``gpuplan catalog
import``); the planner never reads it.
"""

from __future__ import annotations

import functools
from pathlib import Path

from catalog.loader import PACKAGED_DATA_DIR, Catalog, normalize_name, read_data_record
from catalog.schema import CloudNames, CloudSku, GpuSpec

# A GPU whose reported memory is far below the catalog's is a fractional slice (AWS g6f): not the same offer.
MIN_MEMORY_RATIO = 0.9


@functools.cache
def load_cloud_names(data_dir: Path = PACKAGED_DATA_DIR) -> CloudNames:
    """``cloud_names.yaml`` of ``data_dir``, validated (read once; the value is immutable)."""
    return read_data_record(data_dir / "cloud_names.yaml", CloudNames, "catalog/schema.py CloudNames")


def azure_skus(names: CloudNames) -> dict[str, CloudSku]:
    """Azure VM sizes by armSkuName (case as Azure spells it)."""
    return {row.sku: row for row in names.azure_skus}


def gpu_by_name_and_memory(name: str, memory_mib: int, catalog: Catalog) -> GpuSpec | None:
    """A cloud's GPU name and per-GPU memory (e.g. "A100", 40960) as a catalog GPU, disambiguated by memory.

    Exact id/alias matches are tried before prefix matches; a part whose memory is not within 10% of the
    catalog's (a fractional slice, another variant) matches nothing.
    """
    key = normalize_name(name)
    exact: list[GpuSpec] = []
    prefixed: list[GpuSpec] = []
    for gpu in catalog.gpus:
        keys = [normalize_name(n) for n in (gpu.id, *gpu.aliases)]
        if key in keys:
            exact.append(gpu)
        elif any(k.startswith(key) for k in keys):
            prefixed.append(gpu)
    memory_gib = memory_mib / 1024
    for gpu in (*exact, *prefixed):
        ratio = memory_gib / gpu.memory_gib
        if MIN_MEMORY_RATIO <= ratio <= 1 / MIN_MEMORY_RATIO:
            return gpu
    return None


def gpu_for_accelerator(name: str, memory_mib: int | None, catalog: Catalog, names: CloudNames,
                        instance_type: str = "") -> GpuSpec | None:
    """A skypilot-catalog AcceleratorName (with the per-GPU memory where the file gives it) as a catalog GPU;
    an instance type listed in ``skypilot_instances`` names its part outright."""
    mapped = names.skypilot_instances.get(instance_type) or names.skypilot_accelerators.get(name)
    if mapped is not None:
        return catalog.gpu(mapped)
    if memory_mib:
        return gpu_by_name_and_memory(name, memory_mib, catalog)
    return catalog.gpu(name) if catalog.has_gpu(name) else None
