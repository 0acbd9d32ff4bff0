"""The planner's resident weight bytes for torchao-quantized inference weights equal what the workers'
quantize pass really leaves on a model transformers builds, dense and mixture-of-experts alike: a
mixture's routed experts are fused 3-D parameters, not ``nn.Linear``, so torchao leaves them bf16."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from catalog.hf_config import model_from_hf_config
from catalog.params import count_params
from planner.memory import expert_weight_params, resident_weight_bytes
from workers.infer.model_load import quantize_weights

pytest.importorskip("torchao")

BASE: dict[str, Any] = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "tie_word_embeddings": False,
                        "max_position_embeddings": 1024,
                        "torch_dtype": "bfloat16"}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
    "mixtral": {"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "qwen3_moe": {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8,
                  "num_experts_per_tok": 2, "moe_intermediate_size": 128, "decoder_sparse_step": 1,
                  "mlp_only_layers": []},
}


def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of a tensor, through torchao's subclasses (their inner data, scales and zero points)."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None or type(t) in (torch.Tensor, torch.nn.Parameter):
        return t.numel() * t.element_size()
    names, _ = flatten()
    return sum(_tensor_bytes(getattr(t, name)) for name in names)


def _resident_bytes(model: torch.nn.Module) -> int:
    return sum(_tensor_bytes(p) for p in model.parameters())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_int8_weights_are_what_the_planner_counts(name: str) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = {**BASE, **CONFIGS[name]}
    planned = model_from_hf_config(raw)
    pc = count_params(planned)
    config = AutoConfig.for_model(**raw)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == pc.total  # the same model on both sides
    quantize_weights(model, "int8")
    real = _resident_bytes(model)
    # int8 with one bf16 scale per output row: at hidden 256 the scales are ~1% of the int8 bytes
    assert resident_weight_bytes(planned, pc, "int8") == pytest.approx(real, rel=0.02)
    if expert_weight_params(planned):
        # counting the experts as int8 would be far off: they stayed bf16
        experts = expert_weight_params(planned)
        assert real - resident_weight_bytes(planned, pc, "int8") < experts * 0.1
        assert _resident_bytes(model) > 2 * experts
