"""Local GPU detection and the mapping of real driver device names to catalog GPUs."""

from __future__ import annotations

from datetime import date

import pytest

from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog
from catalog.local import LocalDevice, detect_local_device, local_offer, match_device_name

GiB = 2**30


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)


# Names exactly as torch.cuda.get_device_name / nvidia-smi / rocm-smi print them.
REAL_NAMES = [
    ("NVIDIA H200", None, "H200"),
    ("NVIDIA H200", 150_109_880_320, "H200"),
    ("NVIDIA H100 80GB HBM3", None, "H100-SXM"),
    ("NVIDIA H100 80GB HBM3", 85_021_163_520, "H100-SXM"),
    ("NVIDIA H100 PCIe", 85_021_163_520, "H100-PCIe"),
    ("NVIDIA H100 NVL", 100_485_038_080, "H100-NVL"),
    ("NVIDIA A100-SXM4-80GB", 85_198_045_184, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", None, "A100-40GB"),
    ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
    ("NVIDIA A100-PCIE-40GB", None, "A100-40GB"),
    ("NVIDIA A10G", 23_837_802_496, "A10G"),
    ("NVIDIA L4", None, "L4"),
    ("NVIDIA L40S", None, "L40S"),
    ("Tesla T4", 15_828_320_256, "T4"),
    ("Tesla V100-SXM2-16GB", None, "V100-16GB"),
    ("Tesla V100-SXM2-32GB", None, "V100-32GB"),
    ("Tesla V100-PCIE-32GB", None, "V100-32GB"),
    ("NVIDIA GeForce RTX 4090", 25_385_107_456, "RTX4090"),
    ("NVIDIA RTX 6000 Ada Generation", None, "RTX6000-Ada"),
    ("NVIDIA B200", 191_468_191_744, "B200"),
    ("NVIDIA GB200", None, "GB200"),
    ("AMD Instinct MI300X", 205_822_885_888, "MI300X"),
    ("AMD Instinct MI250X/MI250", None, "MI250X"),
    ("Orin", None, "Jetson-AGX-Orin"),
    ("Apple M3 Max", None, "M3-Max"),
    ("Apple M4 Max", None, "M4-Max"),
]


@pytest.mark.parametrize("name,memory,expected", REAL_NAMES)
def test_real_device_names_map_to_catalog(catalog: Catalog, name: str, memory: int | None, expected: str) -> None:
    found = match_device_name(name, catalog, memory)
    assert found is not None and found.id == expected


@pytest.mark.parametrize("name,memory", [("NVIDIA H800", None), ("NVIDIA GeForce GTX 1080 Ti", None),
                                         ("NVIDIA H100 80GB HBM3", 40 * GiB), ("", None)])
def test_unknown_or_inconsistent_devices_are_not_guessed(catalog: Catalog, name: str, memory: int | None) -> None:
    assert match_device_name(name, catalog, memory) is None


def test_local_offer_is_free_and_valid(catalog: Catalog) -> None:
    offer = local_offer(catalog, LocalDevice("NVIDIA H200", 2, 150_109_880_320, "cuda"), today=date(2026, 11, 30))
    assert offer is not None
    assert (offer.cloud, offer.gpu, offer.gpu_count) == ("local", "H200", 2)
    assert offer.on_demand_usd_per_h is None and offer.spot_usd_per_h is None
    extended = catalog.with_offers([offer])
    assert offer in extended.offers_for("H200")
    assert extended.stale_offers(date(2030, 1, 1)) == catalog.stale_offers(date(2030, 1, 1))


def test_local_offer_none_for_cpu_or_unknown_device(catalog: Catalog) -> None:
    assert local_offer(catalog, None, today=date(2026, 11, 30)) is None
    assert local_offer(catalog, LocalDevice("NVIDIA H800", 1, None, "cuda"), today=date(2026, 11, 30)) is None


def test_detection_matches_this_machine() -> None:
    import torch

    device = detect_local_device()
    if torch.cuda.is_available():
        assert device is not None and device.count == torch.cuda.device_count()
    elif not torch.backends.mps.is_available():
        assert device is None  # this CPU-only box: no offer, the planner uses the clouds
