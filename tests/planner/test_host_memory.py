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
    host_bytes_per_node,
    host_memory_problem,
)
from planner.memory import usable_bytes
from planner.search import plan
from planner.spec import JobSpec
from planner.types import Strategy

CATALOG = load_catalog()
L70 = count_params(resolve_model(CATALOG, "llama-3-70b"))


def strategy(**knobs: object) -> Strategy:
    base: dict[str, object] = {"task": "train", "gpu": "H200", "gpu_count": 8, "precision": "bf16",
                               "sharding": "fsdp", "finetune": "full", "micro_batch": 1}
    return Strategy.model_validate({**base, **knobs})


def test_fp32_master_weights_of_70b_are_built_on_the_host_by_every_rank_of_the_node() -> None:
    h100 = CATALOG.gpu("H100-SXM")
    fp32 = build_bytes(L70.total, "amp-bf16")
    assert fp32 == L70.total * 4 and builds_on_host(fp32, usable_bytes(h100))
    need = host_bytes_per_node(L70, strategy(gpu="H100-SXM", precision="amp-bf16"), h100, 8)
    assert need == 8 * fp32 + 8 * HOST_PROCESS_BYTES  # the build outweighs the 1/8-per-rank snapshot
    why = host_memory_problem(L70, strategy(gpu="H100-SXM", precision="amp-bf16"), h100, 8, 2048, "p5.48xlarge")
    assert why is not None and "p5.48xlarge's 2,048 GiB" in why and "8 rank(s)" in why


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


def test_a_plan_keeps_only_offers_whose_nodes_hold_the_host_side_and_says_why_of_the_others() -> None:
    spec = JobSpec.model_validate({"name": "big", "task": "train", "model": "llama-3-70b",
                                   "train": {"tokens": 2e8, "seq_len": 2048, "finetune": "full"},
                                   "resources": {"max_gpus": 64, "spot": "never"}})
    p = plan(spec, CATALOG, calibration=load_calibration())
    for c in p.candidates:
        gpu = CATALOG.gpu(c.estimate.strategy.gpu)
        ranks = min(c.estimate.strategy.gpu_count, c.offer.gpu_count)
        assert host_memory_problem(L70, c.estimate.strategy, gpu, ranks, c.offer.ram_gib, "x") is None
    short = [r for r in p.rejections if r.constraint == "host-memory"]
    assert short and all("GiB of host memory per node" in r.reason for r in short)
    assert any("amp-bf16" in r.option for r in short)  # fp32 master weights built by 8 ranks per node
