"""LoRA of a mixture of experts on the workers' stack (transformers 5, peft 0.21), what the planner assumes of it:
the routed experts are adapted through their merged weight, which autograd keeps for backward
(planner.memory.merged_expert_bytes), and a DeepSeek-like model's dense and shared MLPs are not adapted; and two
gloo ranks train LoRA and QLoRA of a MoE under DDP and FSDP2, as the planner's MoE plans ask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from catalog.hf_config import model_from_hf_config
from planner.activations import merged_expert_bytes
from tests.workers.ranks import gloo, run_ranks
from tests.workers.tiny import cpu_strategy, tiny_spec, write_config

# DeepSeek-V2's shape, tiny: latent attention, 4 routed experts of width 32 (top-2), a shared expert, layer 0 dense
DEEPSEEK = {"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 4,
            "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16,
            "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8, "n_group": 1,
            "topk_group": 1, "topk_method": "greedy", "vocab_size": 128, "max_position_embeddings": 64}


def _lora_model() -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    from workers.model.build import apply_lora

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**DEEPSEEK), dtype=torch.float32)  # type: ignore[no-untyped-call, arg-type]
    return apply_lora(model, rank=4)


def test_lora_adapts_the_routed_experts_not_the_dense_or_shared_mlps() -> None:
    trained = {name for name, p in _lora_model().named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert any(".mlp.experts." in name for name in trained)  # the fused experts, through their parameters
    assert not any("shared_experts" in name or "layers.0.mlp" in name for name in trained)
    assert any("self_attn.kv_b_proj" in name for name in trained)


def test_autograd_keeps_each_sparse_layers_merged_expert_weights_as_the_planner_counts() -> None:
    """Every saved tensor of the sparse layer's shape (experts, ., .) is a merged weight: their bytes are
    merged_expert_bytes for the same config, in the weights' dtype (fp32 here)."""
    model = _lora_model()
    experts = DEEPSEEK["n_routed_experts"]
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if t.dim() == 3 and t.shape[0] == experts and ptr not in params and t.shape[1] > 4 and t.shape[2] > 4:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, 128, (2, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    planned = merged_expert_bytes(model_from_hf_config({**DEEPSEEK, "architectures": ["DeepseekV2ForCausalLM"]}),
                                  "lora", precision="fp32")
    assert planned > 0 and sum(seen.values()) == planned  # one sparse layer (layer 1)


def _rank_main(rank: int, port: int, results: Any, folder: str, sharding: str, extra: dict[str, Any]) -> None:
    from workers.train.loop import TrainJob, run_training

    with gloo(rank, port):
        root = Path(folder)
        spec = tiny_spec(root / "m" / "config.json", steps=4, interval=2, world=2)
        strategy = cpu_strategy(workers=2, sharding=sharding, **extra)
        out = run_training(TrainJob(job_id="moe", spec=spec, strategy=strategy, checkpoint_uri=str(root / "ck"),
                                    device="cpu", cpu_threads=1, log_every_s=60.0))
        results.put((rank, out.steps, out.final_loss is not None))


QWEN3_MOE = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
             "decoder_sparse_step": 1, "mlp_only_layers": [], "head_dim": 8}
# QLoRA's NF4 needs weights that fill whole 64 x 256 blocks on each rank: a wider tiny model has them
MIXTRAL = {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "ddp-lora-qwen3-moe": ("ddp", QWEN3_MOE, {"finetune": "lora", "lora_rank": 4}),
    "fsdp-lora-qwen3-moe": ("fsdp", QWEN3_MOE, {"finetune": "lora", "lora_rank": 4}),
    "ddp-qlora-mixtral": ("ddp", MIXTRAL, {"finetune": "qlora", "precision": "bf16", "lora_rank": 4}),
    "fsdp-qlora-mixtral": ("fsdp", MIXTRAL, {"finetune": "qlora", "precision": "bf16", "lora_rank": 4}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_train_lora_of_a_mixture_of_experts(tmp_path: Path, case: str) -> None:
    sharding, config, extra = CASES[case]
    write_config(tmp_path / "m", **config)
    assert sorted(run_ranks(_rank_main, str(tmp_path), sharding, extra, results=2)) == [(0, 4, True), (1, 4, True)]
