"""Fine-grained MoE, MLA and head_dim shapes read from published config.json files (tests/data/hf_configs),
counted against the published parameter figures (within 2%)."""

from __future__ import annotations

import pytest

from catalog.hf_config import model_from_hf_config
from catalog.params import count_params
from errors import InvalidInput
from tests.hf_configs import CONFIGS, hf_config

# config file -> (published total, published active per token), from each model card / paper
PUBLISHED = {
    "qwen3-30b-a3b": (30.5e9, 3.3e9),
    "qwen3-235b-a22b": (235e9, 22e9),
    "deepseek-v3": (671e9, 37e9),
    "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9),
    "qwen3-0.6b": (0.6e9, 0.6e9),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_total_and_active_params_match_published(name: str) -> None:
    total, active = PUBLISHED[name]
    pc = count_params(model_from_hf_config(CONFIGS / f"{name}.json"))
    assert pc.total == pytest.approx(total, rel=0.02)
    assert pc.active == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_modeled_configs_carry_no_assumptions(name: str) -> None:
    assert model_from_hf_config(hf_config(name)).assumptions == []


def test_qwen3_head_dim_is_not_hidden_over_heads() -> None:
    m = model_from_hf_config(hf_config("qwen3-0.6b"))
    assert m.head_size == 128 != m.hidden_size // m.num_attention_heads
    pc = count_params(m)
    assert pc.non_embedding == pytest.approx(0.44e9, rel=0.02)
    assert pc.lm_head == 0  # tied: the 155.6M embedding is counted once


def test_qwen3_moe_experts_use_moe_intermediate_size() -> None:
    m = model_from_hf_config(hf_config("qwen3-30b-a3b"))
    assert m.moe is not None and m.moe.expert_intermediate_size == 768
    assert (m.num_experts, m.experts_per_token, m.moe.dense_layers) == (128, 8, 0)


def test_deepseek_v3_shared_expert_dense_layers_and_mla() -> None:
    m = model_from_hf_config(hf_config("deepseek-v3"))
    assert m.moe is not None and m.mla is not None
    assert (m.num_experts, m.moe.shared_intermediate_size, m.moe.dense_layers) == (256, 2048, 3)
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.head_size) == (1536, 512, 192)


def test_qwen2_moe_shared_expert_and_its_gate() -> None:
    m = model_from_hf_config(hf_config("qwen1.5-moe-a2.7b"))
    assert m.moe is not None and m.moe.shared_intermediate_size == 5632 and m.moe.shared_expert_gate


def test_qwen_moe_dense_layers_from_sparse_step_and_mlp_only_layers() -> None:
    base = hf_config("qwen3-30b-a3b")
    every_other = model_from_hf_config({**base, "decoder_sparse_step": 2})
    listed = model_from_hf_config({**base, "mlp_only_layers": [0, 1, 47]})
    assert every_other.moe is not None and every_other.moe.dense_layers == 24
    assert listed.moe is not None and listed.moe.dense_layers == 3
    # a dense layer (intermediate_size 6144, 37.7M) is much smaller than a sparse one (all 128 experts, 604M)
    assert count_params(every_other).total < count_params(model_from_hf_config(base)).total


def test_mla_without_q_lora_rank_uses_a_full_q_proj() -> None:
    base = hf_config("deepseek-v3")
    full_q = model_from_hf_config({**base, "q_lora_rank": None})
    low_rank = model_from_hf_config(base)
    h, heads = 7168, 128
    per_layer_diff = h * heads * 192 - (h * 1536 + 1536 + 1536 * heads * 192)
    assert count_params(full_q).total - count_params(low_rank).total == 61 * per_layer_diff


def test_mla_missing_head_dim_is_named() -> None:
    cfg = {k: v for k, v in hf_config("deepseek-v3").items() if k != "v_head_dim"}
    with pytest.raises(InvalidInput, match="v_head_dim"):
        model_from_hf_config(cfg)


def test_mixtral_and_llama_counts_unchanged() -> None:
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
             "max_position_embeddings": 8192, "tie_word_embeddings": False}
    mixtral = {**llama, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8,
               "num_experts_per_tok": 2}
    assert count_params(model_from_hf_config(llama)).total == 8_030_261_248
    mx = count_params(model_from_hf_config(mixtral))
    assert model_from_hf_config(mixtral).moe is None
    assert mx.total == pytest.approx(46.7e9, rel=0.01) and mx.active == pytest.approx(12.9e9, rel=0.01)


def test_unknown_model_type_is_counted_generically_with_a_warning() -> None:
    cfg = {**hf_config("qwen3-0.6b"), "model_type": "fancy_lm"}
    m = model_from_hf_config(cfg)
    assert len(m.assumptions) == 1 and "'fancy_lm'" in m.assumptions[0] and "llama-style" in m.assumptions[0]


def test_unknown_shape_keys_are_named_in_a_warning() -> None:
    cfg = {**hf_config("qwen3-30b-a3b"), "num_expert_groups": 4, "moe_latent_size": 256, "moe_extra_off": None}
    (note,) = model_from_hf_config(cfg).assumptions
    assert "moe_latent_size, num_expert_groups" in note and "moe_extra_off" not in note


def _shrunk(name: str) -> dict[str, object]:
    """The published config with fewer layers, experts and a small vocabulary, so a real model builds on CPU
    while every kind of layer (dense first layers, shared experts, MLA) is still there."""
    cfg = hf_config(name)
    cfg.update(num_hidden_layers=4, vocab_size=1000, max_position_embeddings=2048)
    for key in ("num_experts", "n_routed_experts"):
        if key in cfg:
            cfg[key] = 16
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [
    ("qwen3-30b-a3b", {}), ("qwen3-30b-a3b", {"mlp_only_layers": [1]}), ("qwen3-0.6b", {}),
    ("qwen1.5-moe-a2.7b", {"decoder_sparse_step": 2}), ("deepseek-v3", {}), ("deepseek-v3", {"q_lora_rank": None}),
])
def test_count_equals_a_real_transformers_model(name: str, extra: dict[str, object]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = {**_shrunk(name), **extra}
    with torch.device("meta"):
        config = AutoConfig.for_model(**cfg)  # type: ignore[arg-type]  # model_type is in the dict
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    real = sum(p.numel() for p in model.parameters())
    assert count_params(model_from_hf_config(cfg)).total == real


# Published configs written inline (the keys that shape the model).
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2", "hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_routed_experts": 64,
    "n_shared_experts": 2, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 102400, "max_position_embeddings": 163840, "tie_word_embeddings": False, "topk_method": "greedy",
}
QWEN2_57B_A14B = {
    "model_type": "qwen2_moe", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "intermediate_size": 18944, "moe_intermediate_size": 2560,
    "shared_expert_intermediate_size": 20480, "num_experts": 64, "num_experts_per_tok": 8, "vocab_size": 151936,
    "max_position_embeddings": 131072, "tie_word_embeddings": False,
}


def test_deepseek_v2_lite_full_rank_q_and_two_shared_experts() -> None:
    m = model_from_hf_config(DEEPSEEK_V2_LITE)
    assert m.moe is not None and m.mla is not None and m.mla.q_lora_rank is None
    assert (m.moe.shared_intermediate_size, m.moe.dense_layers) == (2 * 1408, 1)
    pc = count_params(m)
    assert pc.total == pytest.approx(15.7e9, rel=0.02)
    # DeepSeek's "2.4B activated" leaves out the input embedding lookup
    assert pc.active - pc.embedding == pytest.approx(2.4e9, rel=0.03)


def test_qwen2_57b_a14b() -> None:
    pc = count_params(model_from_hf_config(QWEN2_57B_A14B))
    assert pc.total == pytest.approx(57.4e9, rel=0.02) and pc.active == pytest.approx(14.2e9, rel=0.02)


def test_moe_layer_freq_other_than_one_is_named_as_ignored() -> None:
    (note,) = model_from_hf_config({**DEEPSEEK_V2_LITE, "moe_layer_freq": 2}).assumptions
    assert "moe_layer_freq" in note
