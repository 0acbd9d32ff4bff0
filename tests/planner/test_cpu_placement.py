"""The planner weighs this machine's CPU (a $0 local part) against the clouds under the job's constraints."""

from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog
from catalog.local_cpu import CpuProbe, cpu_offer, cpu_spec
from commands.specfile import load_spec
from errors import NoFeasiblePlan
from planner.calibration import load_calibration
from planner.search import estimate, plan
from planner.spec import spec_from_dict
from tests.planner.factory import llama

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

GIB = 2**30
TODAY = date(2026, 12, 1)
BASE = load_catalog(PACKAGED_DATA_DIR)


def machine(gflops: float = 60.0, gbps: float = 12.0, ram_gib: float = 23.5, free_gib: float = 22.0) -> Catalog:
    probe = CpuProbe(machine="box", model_name="AMD EPYC", cores=2, threads=1, ram_bytes=int(ram_gib * GIB),
                     fp32_gflops=gflops, memory_gbps=gbps, measured_s=0.3)
    spec = cpu_spec(probe, available_bytes=int(free_gib * GIB), today=TODAY)
    return BASE.with_gpus([spec], [cpu_offer(spec, probe, today=TODAY)])


CAT = machine()


def test_the_tiny_example_runs_on_the_cpu_in_seconds_for_nothing() -> None:
    p = plan(load_spec("examples/tiny-train.yaml"), CAT, calibration=CAL)
    assert p.chosen is not None
    assert (p.chosen.offer.cloud, p.chosen.estimate.strategy.gpu, p.chosen.cost.usd) == ("local", "cpu", 0.0)
    assert p.chosen.estimate.strategy.precision == "fp32" and p.chosen.cost.hours * 3600 < 600


def test_an_8b_fine_tune_is_rejected_for_the_cpu_with_its_ram() -> None:
    p = plan(load_spec("examples/llama3-8b-sft.yaml"), CAT, calibration=CAL)
    assert p.chosen is not None and p.chosen.offer.cloud != "local"
    [why] = [r for r in p.rejections if r.option.startswith("1xcpu")]
    assert why.constraint == "memory"
    assert why.reason.startswith("needs ") and "> 20.9 GiB RAM (22.0 GiB usable less 5% headroom)" in why.reason


def test_a_job_that_fits_but_would_take_too_long_is_rejected_by_its_deadline() -> None:
    spec = spec_from_dict({"name": "gpt2-pretrain", "task": "train", "model": "gpt2",
                           "train": {"tokens": 2e9, "seq_len": 1024},
                           "resources": {"deadline": "48h", "spot": "never"}})
    p = plan(spec, CAT, calibration=CAL)
    assert p.chosen is not None and p.chosen.offer.cloud != "local"
    [why] = [r for r in p.rejections if r.option.startswith("1xcpu")]
    assert why.constraint == "deadline" and why.reason.startswith("takes ") and "h > deadline 48 h" in why.reason
    hours = float(why.reason.split()[1].replace(",", ""))
    assert hours > 1000  # a 2B-token pretraining on two cores takes years, not hours


def test_pinning_cpu_plans_only_the_cpu_and_says_why_when_it_cannot() -> None:
    p = plan(spec_from_dict({"name": "t", "task": "train", "model": "tiny-llama",
                             "train": {"tokens": 1e6, "seq_len": 512}, "resources": {"accelerators": ["cpu"]}}), CAT,
             calibration=CAL)
    assert {c.estimate.strategy.gpu for c in p.candidates} == {"cpu"}
    with pytest.raises(NoFeasiblePlan, match="RAM"):
        plan(spec_from_dict({"name": "t", "task": "train", "model": "llama-3-8b", "train": {"tokens": 1e6},
                             "resources": {"accelerators": ["cpu"]}}), CAT, calibration=CAL)
    with pytest.raises(NoFeasiblePlan, match="one device"):
        plan(spec_from_dict({"name": "t", "task": "train", "model": "tiny-llama",
                             "train": {"tokens": 1e6, "seq_len": 512}, "resources": {"accelerators": ["cpu:2"]}}), CAT,
             calibration=CAL)


def test_the_cpu_uses_its_own_calibration() -> None:
    cal = load_calibration()
    assert cal.for_vendor("nvidia") is cal
    cpu = cal.for_vendor("cpu")
    assert cpu.throughput == cal.cpu.throughput and cpu.memory == cal.cpu.memory and cpu.cost == cal.cost
    assert cpu.memory.workspace_bytes == 0 and cpu.memory.nccl_bytes == 0  # no CUDA on a CPU


@settings(max_examples=25, deadline=None)
@given(gflops=st.floats(1.0, 5000.0), gbps=st.floats(1.0, 500.0))
def test_a_faster_cpu_never_predicts_a_slower_run(gflops: float, gbps: float) -> None:
    spec = load_spec("examples/tiny-train.yaml")
    slow = estimate(spec, machine(gflops, gbps), "cpu", 1, calibration=CAL).throughput.tokens_per_s
    fast = estimate(spec, machine(gflops * 2, gbps * 2), "cpu", 1, calibration=CAL).throughput.tokens_per_s
    assert 0 < slow < fast <= 2 * slow * (1 + 1e-9)


def test_the_cpu_and_a_gpu_with_the_same_knobs_keep_their_own_memory_constants() -> None:
    """The per-plan memo of memory lines and moments is per calibration section: the CPU's memory constants
    differ from the GPUs', so a GPU placement with the CPU's very knobs (fp32, one device, micro-batch 2) must
    not hand it its numbers, whichever is planned first."""
    # two wide layers, a small vocabulary: the peak is at the end of backward, where the CPU's constants
    # (one layer of backward working memory) and the GPUs' (none) differ
    model = llama("two-wide-layers", 2048, 2, 16, 16, 8192, 1000)
    spec = spec_from_dict({"task": "train", "model": "two-wide-layers",
                           "train": {"tokens": 1e5, "seq_len": 512, "precision": "fp32", "micro_batch": 4,
                                     "activation_checkpointing": False},
                           "resources": {"accelerators": ["cpu", "L4"], "max_gpus": 1}})
    p = plan(spec, CAT, calibration=CAL, model=model)
    by_gpu = {c.estimate.strategy.gpu: c.estimate for c in p.candidates}
    assert set(by_gpu) == {"cpu", "L4"}
    assert by_gpu["cpu"].memory.peak_moment == "backward end"
    for gpu, planned in by_gpu.items():
        alone = estimate(spec, CAT, gpu, 1, calibration=CAL, model=model)
        assert planned.memory == alone.memory and planned.strategy == alone.strategy, gpu
