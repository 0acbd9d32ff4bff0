"""The machine we run on: detect its GPU, map it to a catalog entry, offer it at zero cost.

Detection reads the environment (torch / NVML), so it is called by the CLI and the scheduler, never
by the planner: the planner receives the resulting :class:`Offer` like any other.
"""

from __future__ import annotations

import os
import platform
import re
import socket
import subprocess
from dataclasses import dataclass
from datetime import date
from typing import Literal

from catalog.loader import Catalog, normalize_name
from catalog.schema import GpuSpec, Offer, Source

Backend = Literal["cuda", "rocm", "mps", "nvml"]
LOCAL_CLOUD = "local"

# Words device names carry that catalog names do not ("NVIDIA GeForce RTX 4090", "AMD Instinct MI300X").
_NOISE = re.compile(r"\b(nvidia|amd|instinct|tesla|geforce|apple|generation|graphics|\(tm\)|\(r\))\b", re.I)
_FORM_FACTORS = ("pcie", "nvl", "sxm")


@dataclass(frozen=True)
class LocalDevice:
    """What the driver says about the local accelerator(s) of one kind."""

    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    count: int
    memory_bytes: int | None  # per device, as the runtime reports it (torch total_memory / NVML total)
    backend: Backend


def match_device_name(name: str, catalog: Catalog, memory_bytes: int | None = None) -> GpuSpec | None:
    """Map a driver's device name ("NVIDIA A100-SXM4-80GB", "Tesla T4", "AMD Instinct MI300X") to a GPU."""
    stripped = " ".join(_NOISE.sub(" ", name).split())
    if not stripped:
        return None
    if catalog.has_gpu(stripped):
        return catalog.gpu(stripped)
    base = re.split(r"[\s/_-]+", stripped)[0]
    base_key = normalize_name(base)
    candidates = [g for g in catalog.gpus if any(normalize_name(n).startswith(base_key) for n in (g.id, *g.aliases))]
    if not candidates:
        return None
    lowered = stripped.lower()
    form = next((f for f in _FORM_FACTORS if f in lowered), None)
    if form is not None and any(form in g.id.lower() for g in candidates):
        candidates = [g for g in candidates if form in g.id.lower()]
    elif form is None or form == "sxm":
        # No form factor in the name: the bare model name's own alias wins ("H100" -> H100-SXM).
        preferred = [g for g in candidates if base_key in {normalize_name(a) for a in (g.id, *g.aliases)}]
        candidates = preferred + [g for g in candidates if g not in preferred]
    memory_gib = memory_bytes / 2**30 if memory_bytes else None
    if memory_gib is None:
        size = re.search(r"(\d+)\s*GB", stripped, re.I)
        memory_gib = float(size.group(1)) * 0.98 if size else None  # "80GB" devices report ~79-80 GiB
    if memory_gib is not None:
        fitting = [g for g in candidates if 0.9 <= memory_gib / g.memory_gib <= 1.1]
        return fitting[0] if fitting else None
    return candidates[0]


def _apple_chip_name() -> str | None:
    if platform.system() != "Darwin":
        return None
    try:
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def detect_local_device() -> LocalDevice | None:
    """The local accelerator through torch (CUDA/ROCm/MPS), else NVML; None on a CPU-only machine."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency; NVML is the fallback
        torch = None  # type: ignore[assignment]
    if torch is not None and torch.cuda.is_available() and torch.cuda.device_count() > 0:
        name = torch.cuda.get_device_name(0)
        count = sum(1 for i in range(torch.cuda.device_count()) if torch.cuda.get_device_name(i) == name)
        backend: Backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        return LocalDevice(name, count, int(torch.cuda.get_device_properties(0).total_memory), backend)
    if torch is not None and torch.backends.mps.is_available():
        chip = _apple_chip_name()
        return LocalDevice(chip, 1, None, "mps") if chip else None
    return _detect_with_nvml()


def _detect_with_nvml() -> LocalDevice | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError when there is no driver: a CPU machine
        return None
    try:
        total = pynvml.nvmlDeviceGetCount()
        if total == 0:
            return None
        first = pynvml.nvmlDeviceGetHandleByIndex(0)
        raw = pynvml.nvmlDeviceGetName(first)
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(first).total)
        same = 0
        for i in range(total):
            other = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            same += (other.decode() if isinstance(other, bytes) else str(other)) == name
        return LocalDevice(name, same, memory, "nvml")
    finally:
        pynvml.nvmlShutdown()


def _ram_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1.0


def local_offer(catalog: Catalog, device: LocalDevice | None, *, today: date) -> Offer | None:
    """A zero-cost offer for the local GPU(s), or None on CPU or an accelerator the catalog lacks.

    Both prices are None: the planner treats ``cloud == "local"`` as free (the machine is already
    paid for) rather than as "no price known".
    """
    if device is None:
        return None
    gpu = match_device_name(device.name, catalog, device.memory_bytes)
    if gpu is None:
        return None
    return Offer(
        cloud=LOCAL_CLOUD,
        instance_type=f"local-{device.count}x{gpu.id}",
        gpu=gpu.id,
        gpu_count=device.count,
        vcpus=os.cpu_count() or 1,
        ram_gib=round(max(_ram_gib(), 0.001), 3),
        region=socket.gethostname() or "localhost",
        zone=None,
        on_demand_usd_per_h=None,
        spot_usd_per_h=None,
        source=Source(url=f"local://{device.backend}", as_of=today,
                      note=f"detected {device.count} x {device.name!r} via {device.backend}"),
    )
