"""This machine's CPU as one more placement: described like a GPU, measured once, offered at $0/h.

The planner sees the CPU as a :class:`GpuSpec` with vendor ``cpu`` (cores, RAM as its memory,
measured fp32 TFLOPS and memory bandwidth) and one local :class:`Offer` of it, so it weighs the
CPU against every cloud GPU under the job's constraints and picks it only where it wins. Datasheet
figures do not exist for "whatever this box is", so both rates are measured with torch at the
thread count the in-process executor trains with (a fraction of a second) and cached per machine
under the gpuplan home. Detection and measurement are edge work: the CLI and the server call this,
never the planner.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path

from catalog.loader import Catalog
from catalog.local import LOCAL_CLOUD, LocalDevice
from catalog.schema import GpuSpec, Interconnect, Offer, Source

CPU_ID = "cpu"
CPU_INSTANCE = "local-cpu"
CACHE_FILE = "cpu-probe.json"
PROBE_VERSION = 1  # bump when the probe measures differently, so old caches are redone
_MATMUL_N = 512  # the size of a small model's matmuls (hidden 256-1024): what training sees
_COPY_BYTES = 64 * 2**20  # well past the last-level cache, so the copy streams from RAM
_PROBE_S = 0.1  # per rate: best of as many repetitions as fit (a shared box has noisy moments)


def training_threads(cores: int | None = None) -> int:
    """Torch threads a CPU training run uses: half the cores (at least one).

    On a small shared box OpenMP spin-waiting across busy cores costs far more than the extra
    core gains; the probe measures at this count, so the planner predicts the run that happens.
    """
    return max(1, (cores if cores is not None else os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class CpuProbe:
    """What one machine's CPU does, measured; the cache file holds one of these as JSON."""

    machine: str  # hostname + model name + cores: another machine (or VM size) is measured anew
    model_name: str
    cores: int
    threads: int
    ram_bytes: int
    fp32_gflops: float
    memory_gbps: float
    measured_s: float
    version: int = PROBE_VERSION


def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what platform reports."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def ram_bytes() -> tuple[int, int | None]:
    """(total, available) physical memory; available is None where it cannot be read."""
    total = 0
    with contextlib.suppress(ValueError, OSError, AttributeError):  # non-POSIX: the floor below
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return max(total, available or 0, 2**30), available


def machine_key(cores: int, model_name: str) -> str:
    return f"{socket.gethostname() or 'localhost'}|{model_name}|{cores} cores"


def measure_cpu(threads: int) -> tuple[float, float]:
    """(fp32 matmul GFLOP/s, memory copy GB/s) at ``threads`` torch threads; well under a second."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(_MATMUL_N, _MATMUL_N)
        b = torch.randn(_MATMUL_N, _MATMUL_N)
        flops = _best_rate(lambda: torch.mm(a, b), 2.0 * _MATMUL_N**3, threads)
        src = torch.empty(_COPY_BYTES // 4)
        dst = torch.empty_like(src)
        src.fill_(1.0)
        dst.fill_(0.0)  # commit the pages before timing: first touch is not bandwidth
        moved = _best_rate(lambda: dst.copy_(src), 2.0 * _COPY_BYTES, threads)  # read + write
    finally:
        torch.set_num_threads(before)
    return flops / 1e9, moved / 1e9


def _best_rate(work: object, units: float, threads: int) -> float:
    """Units per second of the fastest of the repetitions that fit in the probe's time.

    A repetition's time is the CPU time it used per thread where that is less than its wall time:
    the rate of the part itself, like a datasheet's, not of the share other processes on a busy
    machine left it at that moment (a cached probe outlives that moment).
    """
    assert callable(work)
    work()  # warm-up: allocator, kernel choice
    best = 0.0
    began = time.perf_counter()
    while True:
        start, cpu = time.perf_counter(), time.process_time()
        work()
        wall = time.perf_counter() - start
        used = (time.process_time() - cpu) / threads
        took = min(wall, used) if used > 0 else wall
        best = max(best, units / took if took > 0 else 0.0)
        if start - began >= _PROBE_S:
            return best


def probe_cpu(home: Path, *, threads: int | None = None) -> CpuProbe:
    """This machine's probe: from ``home``/cpu-probe.json when it was measured on this machine at this
    thread count, else measured now and cached there (a cache that cannot be written is skipped)."""
    cores = os.cpu_count() or 1
    threads = threads or training_threads(cores)
    name = cpu_model_name()
    key = machine_key(cores, name)
    total, _ = ram_bytes()
    cached = _read_cache(home / CACHE_FILE, key, threads)
    if cached is not None:
        return CpuProbe(**{**asdict(cached), "ram_bytes": total})
    began = time.perf_counter()
    gflops, gbps = measure_cpu(threads)
    probe = CpuProbe(machine=key, model_name=name, cores=cores, threads=threads, ram_bytes=total,
                     fp32_gflops=round(gflops, 2), memory_gbps=round(gbps, 2),
                     measured_s=round(time.perf_counter() - began, 3))
    _write_cache(home / CACHE_FILE, probe)
    return probe


def _read_cache(path: Path, key: str, threads: int) -> CpuProbe | None:
    try:
        probe = CpuProbe(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None  # absent, unreadable or from an older layout: measure again
    if probe.machine != key or probe.threads != threads or probe.version != PROBE_VERSION:
        return None
    return probe


def _write_cache(path: Path, probe: CpuProbe) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(probe), indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # a read-only home measures each start; nothing else depends on the file


def cpu_spec(probe: CpuProbe, *, available_bytes: int | None = None, today: date) -> GpuSpec:
    """The CPU as the planner's GPU: RAM is its memory (what is free now is what a job can use)."""
    usable = min(available_bytes, probe.ram_bytes) if available_bytes else None
    return GpuSpec(
        id=CPU_ID,
        aliases=["CPU", CPU_INSTANCE],
        vendor="cpu",
        architecture=f"{probe.model_name} ({probe.cores} cores, {probe.threads} training threads)",
        memory_gib=round(probe.ram_bytes / 2**30, 3),
        torch_total_gib=round(usable / 2**30, 3) if usable else None,
        memory_bandwidth_gbps=probe.memory_gbps,
        # not rounded again: the probe rounds GFLOP/s already, and a second rounding here (to 10 MFLOP/s) made a
        # machine twice as fast plan more than twice the throughput on slow probes (tests/planner/test_cpu_placement)
        tflops={"fp32": probe.fp32_gflops / 1000},
        interconnect=Interconnect(kind="none", gbps_per_gpu=0),
        dtypes=["fp32"],
        source=Source(url="local://cpu", as_of=today,
                      note=f"measured on this machine at {probe.threads} thread(s): {probe.fp32_gflops:g} fp32 "
                           f"GFLOP/s ({_MATMUL_N}^3 matmul), {probe.memory_gbps:g} GB/s copy"),
    )


def cpu_offer(spec: GpuSpec, probe: CpuProbe, *, today: date) -> Offer:
    """The CPU at $0/h under the local cloud label: the machine is already paid for."""
    return Offer(
        cloud=LOCAL_CLOUD,
        instance_type=CPU_INSTANCE,
        gpu=spec.id,
        gpu_count=1,
        vcpus=probe.cores,
        ram_gib=spec.memory_gib,
        region=socket.gethostname() or "localhost",
        on_demand_usd_per_h=None,
        spot_usd_per_h=None,
        source=Source(url="local://cpu", as_of=today, note=f"this machine's CPU: {probe.model_name}"),
    )


def local_cpu(home: Path, *, today: date, probe: CpuProbe | None = None) -> tuple[GpuSpec, Offer]:
    """This machine's CPU as (spec, $0 offer), from the cached or a fresh probe."""
    probe = probe or probe_cpu(home)
    _, available = ram_bytes()
    spec = cpu_spec(probe, available_bytes=available, today=today)
    return spec, cpu_offer(spec, probe, today=today)


def with_this_machine(catalog: Catalog, home: Path, *, today: date, probe: CpuProbe | None = None,
                      detect: Callable[[], LocalDevice | None] | None = None) -> Catalog:
    """``catalog`` plus the placements of the machine it runs on, all at $0/h: its GPUs (when the
    catalog knows them) and its CPU. A catalog that already names a ``cpu`` part keeps its own.

    The one placement universe of a machine: ``plan``, ``estimate``, ``report dry-run``, ``submit``
    (in-process and on ``gpuplan server``) and ``run`` all plan over it, so one spec gets one placement.
    ``detect``: the local-accelerator probe (default :func:`catalog.local.detect_local_device`)."""
    from catalog.local import detect_local_device, local_offer

    device = (detect or detect_local_device)()
    gpu_offer = local_offer(catalog, device, today=today)
    extended = catalog.with_offers([gpu_offer]) if gpu_offer is not None else catalog
    if extended.has_gpu(CPU_ID):
        return extended
    spec, offer = local_cpu(home, today=today, probe=probe)
    return extended.with_gpus([spec], [offer])


def local_offers(catalog: Catalog) -> Catalog:
    """Only the machine's own ($0/h, cloud ``local``) offers of a :func:`with_this_machine` catalog:
    what ``gpuplan run`` and the in-process executor can run."""
    return Catalog(gpus=catalog.gpus, offers=tuple(o for o in catalog.offers if o.cloud == LOCAL_CLOUD),
                   models=catalog.models, support=catalog.support)
