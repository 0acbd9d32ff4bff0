"""Sliding-window, sink, eager-only and q/k-norm architectures read from published config.json files
(tests/data/hf_configs): gpt-oss, Gemma 3, Mistral Small 3, Phi-4, OLMo 2. Counts are exact against the
published parameter figures (HF safetensors metadata / model cards)."""

from __future__ import annotations

import pytest

from catalog.hf_config import model_from_hf_config
from catalog.params import count_params
from errors import InvalidInput
from tests.hf_configs import CONFIGS, hf_config

# config -> (published total, published active without the input embedding). Gemma 3 4B-27B publish the
# multimodal checkpoint; gpuplan plans its text decoder, so the published figure less the SigLIP vision
# tower and projector (VISION below) is what the count must equal.
PUBLISHED = {
    "gpt-oss-20b": (20_914_757_184, 3_608_307_264),  # model card: 20.91B total, 3.61B active
    "gpt-oss-120b": (116_829_156_672, 5_132_849_472),  # model card: 116.83B total, 5.13B active
    "gemma-3-1b": (999_885_952, None),
    "gemma-3-4b": (4_300_079_472, None),
    "gemma-3-12b": (12_187_325_040, None),
    "gemma-3-27b": (27_432_406_640, None),
    "mistral-small-24b": (23_572_403_200, None),
    "phi-4": (14_659_507_200, None),
    "olmo-2-7b": (7_298_617_344, None),
}
# SigLIP so400m (27 layers, 1152 wide, 896px / 14 patches) + Gemma 3's projector (1152 x hidden + norm)
SIGLIP = 416_866_032


def _vision(name: str) -> int:
    hidden = {"gemma-3-4b": 2560, "gemma-3-12b": 3840, "gemma-3-27b": 5376}.get(name)
    return 0 if hidden is None else SIGLIP + 1152 * hidden + 1152


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_counts_equal_the_published_figures(name: str) -> None:
    total, active = PUBLISHED[name]
    pc = count_params(model_from_hf_config(CONFIGS / f"{name}.json"))
    assert pc.total + _vision(name) == total
    if active is not None:
        assert pc.active - pc.embedding == active


def test_gpt_oss_layers_sinks_eager_and_expert_loop() -> None:
    m = model_from_hf_config(hf_config("gpt-oss-20b"))
    assert m.attention is not None and m.moe is not None
    assert (m.attention.sliding_window, m.attention.sliding_layers) == (128, 12)
    assert m.attention.sinks and m.attention.eager and m.moe.expert_loop
    assert (m.num_experts, m.experts_per_token, m.head_size) == (32, 4, 64)
    assert m.assumptions == []


def test_gemma3_pattern_qk_norm_and_four_norms() -> None:
    one = model_from_hf_config(hf_config("gemma-3-1b"))
    assert one.attention is not None
    assert (one.attention.sliding_window, one.attention.sliding_layers) == (512, 22)  # 5 of every 6 of 26
    assert (one.attention.qk_norm, one.attention.norms_per_layer) == ("head", 4)
    assert one.tie_word_embeddings and one.assumptions == []


def test_multimodal_gemma3_plans_the_text_decoder_and_says_so() -> None:
    m = model_from_hf_config(hf_config("gemma-3-27b"))
    assert m.family == "gemma3_text" and m.hf_config["model_type"] == "gemma3_text"
    assert (m.num_layers, m.head_size, m.num_kv_heads, m.vocab_size) == (62, 128, 16, 262208)  # defaults filled
    (note,) = m.assumptions
    assert "text decoder only" in note and "vision tower" in note


def test_olmo2_full_qk_norm_and_phi4_mistral_small_plain() -> None:
    olmo = model_from_hf_config(hf_config("olmo-2-7b"))
    assert olmo.attention is not None and olmo.attention.qk_norm == "full"
    for name in ("phi-4", "mistral-small-24b"):
        m = model_from_hf_config(hf_config(name))
        assert m.attention is None and m.assumptions == [], name  # sliding_window null: full attention


def test_window_rules_of_each_family() -> None:
    mistral = {"model_type": "mistral", "hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
               "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 32768}
    every = model_from_hf_config({**mistral, "sliding_window": 4096})
    assert every.attention is not None and every.attention.sliding_layers == 8
    qwen = {**mistral, "model_type": "qwen2", "sliding_window": 4096, "max_window_layers": 6}
    assert model_from_hf_config(qwen).attention is None  # use_sliding_window defaults to false
    gated = model_from_hf_config({**qwen, "use_sliding_window": True})
    assert gated.attention is not None and gated.attention.sliding_layers == 2
    # a window as long as the longest sequence is full attention
    assert model_from_hf_config({**mistral, "sliding_window": 32768}).attention is None


def test_bad_layer_types_are_named() -> None:
    with pytest.raises(InvalidInput, match="layer_types"):
        model_from_hf_config({**hf_config("gpt-oss-20b"), "layer_types": ["full_attention"]})


def test_unknown_layer_types_are_named_in_a_warning() -> None:
    cfg = hf_config("gpt-oss-20b")
    types = cfg["layer_types"]
    assert isinstance(types, list)
    cfg["layer_types"] = ["chunked_attention", *types[1:]]
    (note,) = model_from_hf_config(cfg).assumptions
    assert "chunked_attention" in note


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma-3-1b", "gemma-3-27b", "phi-4", "olmo-2-7b"])
def test_count_equals_a_real_transformers_model(name: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    m = model_from_hf_config(hf_config(name))
    cfg = {k: v for k, v in m.hf_config.items() if k != "quantization_config"}
    with torch.device("meta"):
        config = AutoConfig.for_model(**cfg)  # type: ignore[arg-type]  # model_type is in the dict
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    assert count_params(m).total == sum(p.numel() for p in model.parameters())
