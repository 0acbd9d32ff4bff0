"""This machine's CPU as a catalog part: measured by a real probe, cached per machine, offered at $0/h."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import date
from pathlib import Path

import pytest

import catalog.local_cpu as local_cpu
from catalog.loader import PACKAGED_DATA_DIR, load_catalog
from catalog.local_cpu import (
    CACHE_FILE,
    CpuProbe,
    cpu_offer,
    cpu_spec,
    measure_cpu,
    probe_cpu,
    training_threads,
    with_this_machine,
)

TODAY = date(2026, 12, 1)
GIB = 2**30
PROBE = CpuProbe(machine="box|AMD EPYC|2 cores", model_name="AMD EPYC", cores=2, threads=1, ram_bytes=24 * GIB,
                 fp32_gflops=60.0, memory_gbps=12.0, measured_s=0.3)


def test_the_probe_measures_this_cpu_at_the_training_thread_count() -> None:
    gflops, gbps = measure_cpu(1)
    assert gflops > 0.1 and gbps > 0.1  # real rates of this machine, whatever its load


def test_the_probe_is_cached_per_machine_and_redone_for_another(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    first = probe_cpu(tmp_path)
    cached = json.loads((tmp_path / CACHE_FILE).read_text())
    assert cached["fp32_gflops"] == first.fp32_gflops and cached["threads"] == training_threads()

    def refuse(threads: int) -> tuple[float, float]:
        raise AssertionError("a cached probe of this machine must not be measured again")

    monkeypatch.setattr(local_cpu, "measure_cpu", refuse)
    assert probe_cpu(tmp_path) == first
    (tmp_path / CACHE_FILE).write_text(json.dumps({**cached, "machine": "another|box|64 cores"}))
    monkeypatch.setattr(local_cpu, "measure_cpu", lambda threads: (1.5, 2.5))
    again = probe_cpu(tmp_path)
    assert (again.fp32_gflops, again.memory_gbps) == (1.5, 2.5)
    assert json.loads((tmp_path / CACHE_FILE).read_text())["machine"] == first.machine


def test_an_unreadable_cache_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / CACHE_FILE).write_text("{not json")
    monkeypatch.setattr(local_cpu, "measure_cpu", lambda threads: (3.0, 4.0))
    assert probe_cpu(tmp_path).fp32_gflops == 3.0


def test_the_cpu_is_a_part_like_a_gpu_and_free_on_premise() -> None:
    spec = cpu_spec(PROBE, available_bytes=22 * GIB, today=TODAY)
    assert (spec.id, spec.vendor, spec.dtypes) == ("cpu", "cpu", ["fp32"])
    assert spec.tflops == {"fp32": 0.06} and spec.memory_bandwidth_gbps == 12.0
    assert spec.memory_gib == 24.0 and spec.torch_total_gib == 22.0  # a job gets what is free
    offer = cpu_offer(spec, PROBE, today=TODAY)
    assert (offer.cloud, offer.gpu, offer.gpu_count, offer.vcpus) == ("local", "cpu", 1, 2)
    assert offer.on_demand_usd_per_h is None and offer.spot_usd_per_h is None  # the local label means $0/h


def test_with_this_machine_adds_the_cpu_once(tmp_path: Path) -> None:
    base = load_catalog(PACKAGED_DATA_DIR)
    extended = with_this_machine(base, tmp_path, today=TODAY, probe=PROBE)
    assert extended.gpu("CPU").id == "cpu" and extended.gpu("local-cpu").id == "cpu"
    assert [o.instance_type for o in extended.offers_for("cpu")] == ["local-cpu"]
    assert len(extended.gpus) == len(base.gpus) + 1
    assert extended.stale_offers(date(2030, 1, 1)) == base.stale_offers(date(2030, 1, 1))
    again = with_this_machine(extended, tmp_path, today=TODAY, probe=replace(PROBE, fp32_gflops=1.0))
    assert again.gpu("cpu") == extended.gpu("cpu") and len(again.offers_for("cpu")) == 1
