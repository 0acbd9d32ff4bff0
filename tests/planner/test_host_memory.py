"""Host memory per node (planner.host_memory): the checkpoint snapshot the workers pin, or the model build
they do in host memory when the whole model would not fit the GPU; plan() rejects offers whose RAM is short."""

from __future__ import annotations

from catalog.loader import load_catalog, resolve_model
from catalog.params import count_params
from planner.calibration import load_calibration
from planner.host_memory import (
    HOST_PROCESS_BYTES,
    build_bytes,
    builds_on_host,
    builds_once,
    host_bytes_per_node,
    host_memory_problem,
)
from planner.memory import usable_bytes
from planner.search import plan
from planner.spec import JobSpec
from planner.types import Plan, Strategy

CATALOG = load_catalog()
L70 = count_params(resolve_model(CATALOG, "llama-3-70b"))


def strategy(**knobs: object) -> Strategy:
    base: dict[str, object] = {"task": "train", "gpu": "H200", "gpu_count": 8, "precision": "bf16",
                               "sharding": "fsdp", "finetune": "full", "micro_batch": 1}
    return Strategy.model_validate({**base, **knobs})


def test_fp32_master_weights_of_a_sharded_70b_are_built_once_on_the_host_by_rank_0() -> None:
    h100 = CATALOG.gpu("H100-SXM")
    fp32 = build_bytes(L70.total, "amp-bf16")
    amp = strategy(gpu="H100-SXM", precision="amp-bf16")
    assert fp32 == L70.total * 4 and builds_on_host(fp32, usable_bytes(h100)) and builds_once(amp)
    snapshot = L70.total * (4 + 2 * 4)  # fp32 master weights + AdamW's two fp32 states, all on this one node
    need = host_bytes_per_node(L70, amp, h100, 8)
    assert need == max(fp32, snapshot) + 8 * HOST_PROCESS_BYTES  # 1 x 282 GB build, not 8 x (2.2 TB)
    assert host_memory_problem(L70, amp, h100, 8, 2048, "p5.48xlarge") is None
    why = host_memory_problem(L70, amp, h100, 8, 512, "small")
    assert why is not None and "small's 512 GiB" in why


def test_qlora_and_fp8_still_build_the_whole_model_on_every_rank_of_the_node() -> None:
    h100 = CATALOG.gpu("H100-SXM")
    bf16 = build_bytes(L70.total, "bf16")
    assert builds_on_host(bf16, usable_bytes(h100))
    for knobs in ({"finetune": "qlora"}, {"precision": "fp8"}):
        s = strategy(gpu="H100-SXM", **knobs)
        assert not builds_once(s)
        assert host_bytes_per_node(L70, s, h100, 8) >= 8 * bf16
        why = host_memory_problem(L70, s, h100, 8, 1024, "p4de.24xlarge")
        assert why is not None and "8 rank(s)" in why
    assert not builds_once(strategy(sharding="ddp")) and not builds_once(strategy(gpu_count=1))


def test_bf16_70b_builds_on_an_h200_and_its_node_holds_the_fsdp_snapshot_of_its_ranks() -> None:
    h200 = CATALOG.gpu("H200")
    assert not builds_on_host(build_bytes(L70.total, "bf16"), usable_bytes(h200))
    full = L70.total * (2 + 2 * 2)  # bf16 params + AdamW's two bf16 states
    one_node = host_bytes_per_node(L70, strategy(), h200, 8)
    assert one_node == full + 8 * HOST_PROCESS_BYTES
    two_nodes = host_bytes_per_node(L70, strategy(gpu_count=16), h200, 8)
    assert two_nodes == full / 2 + 8 * HOST_PROCESS_BYTES
    assert host_memory_problem(L70, strategy(), h200, 8, 2048, "p5en.48xlarge") is None
    assert host_memory_problem(L70, strategy(), h200, 8, 256, "small") is not None


def test_under_ddp_rank_0_snapshots_the_whole_state_and_lora_only_its_adapters() -> None:
    h200 = CATALOG.gpu("H200")
    l8 = count_params(resolve_model(CATALOG, "llama-3-8b"))
    ddp = host_bytes_per_node(l8, strategy(sharding="ddp"), h200, 8)
    assert ddp == l8.total * 6 + 8 * HOST_PROCESS_BYTES
    lora = host_bytes_per_node(l8, strategy(sharding="ddp", finetune="lora"), h200, 8)
    assert lora < ddp / 100 + 8 * HOST_PROCESS_BYTES


def _plan_70b(**train: object) -> Plan:
    spec = JobSpec.model_validate({"name": "big", "task": "train", "model": "llama-3-70b",
                                   "train": {"tokens": 2e8, "seq_len": 2048, **train},
                                   "resources": {"max_gpus": 64, "spot": "never"}})
    return plan(spec, CATALOG, calibration=load_calibration())


def test_a_plan_keeps_only_offers_whose_nodes_hold_the_host_side_and_says_why_of_the_others() -> None:
    for train in ({"finetune": "full", "precision": "amp-bf16"}, {"finetune": "full", "precision": "fp8"}):
        p = _plan_70b(**train)
        for c in p.candidates:
            gpu = CATALOG.gpu(c.estimate.strategy.gpu)
            ranks = min(c.estimate.strategy.gpu_count, c.offer.gpu_count)
            assert host_memory_problem(L70, c.estimate.strategy, gpu, ranks, c.offer.ram_gib, "x") is None
        short = [r for r in p.rejections if r.constraint == "host-memory"]
        assert all("GiB of host memory per node" in r.reason for r in short)
        if train["precision"] == "amp-bf16":  # built once: 8-GPU nodes of 1-2 TB hold it (refused before 2026-12-04)
            assert not short and any(c.offer.gpu_count == 8 for c in p.candidates)
        else:  # fp8's conversion still needs every rank's own bf16 copy
            assert short and all("rank(s)" in r.reason and "rank 0" not in r.reason for r in short)
