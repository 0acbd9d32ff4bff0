"""Architectures transformers has no SDPA path for (gpt-oss) build with eager attention, as the planner
prices them; the rest keep SDPA."""

from __future__ import annotations

from typing import Any

import torch

from catalog.hf_config import model_from_hf_config
from workers.model.build import ModelSource, attn_implementation, build_model

TINY_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
            "num_experts_per_tok": 2, "vocab_size": 128, "max_position_embeddings": 256, "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"]}


def test_gpt_oss_builds_with_eager_attention_and_trains_a_step() -> None:
    config = model_from_hf_config(TINY_OSS, model_id="tiny-oss")
    assert attn_implementation(config) == "eager"
    model: Any = build_model(ModelSource(config=config, weights_dir=None), seed=0, weights_dtype=torch.float32)
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(0, 128, (2, 32))
    model(input_ids=ids, labels=ids).loss.backward()


# the same shape as a dense Llama (no experts, no sliding window)
TINY_LLAMA = {**{k: v for k, v in TINY_OSS.items() if k not in ("layer_types", "num_local_experts",
                                                                "num_experts_per_tok", "sliding_window")},
              "model_type": "llama"}


def test_llama_keeps_sdpa() -> None:
    assert attn_implementation(model_from_hf_config(TINY_LLAMA)) == "sdpa"
