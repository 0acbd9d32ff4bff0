"""Parameter counts of a ModelConfig, exactly as transformers builds the model (no weights needed).

The planner sizes weights, gradients and optimizer state from these counts, so they are tested
against the published sizes of every preset (tests/catalog/test_integrity.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from catalog.schema import ModelConfig


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts. ``active`` counts only the routed experts a token uses (MoE)."""

    total: int
    active: int
    embedding: int  # input embedding (+ learned positions); the lm_head when untied is in lm_head
    lm_head: int  # 0 when tied to the input embedding
    per_layer: int  # one decoder layer, all experts
    per_layer_active: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.lm_head


def _has_qkv_bias(model: ModelConfig) -> bool:
    explicit = model.hf_config.get("attention_bias")
    if isinstance(explicit, bool):
        return explicit
    return model.family in ("qwen2", "qwen2_moe")  # Qwen2 puts biases on q/k/v only


def count_params(model: ModelConfig) -> ParamCount:
    h = model.hidden_size
    v = model.vocab_size
    if model.family == "gpt2":
        inner = model.intermediate_size
        attn = h * 3 * h + 3 * h + h * h + h  # c_attn (fused qkv) + c_proj, with biases
        mlp = h * inner + inner + inner * h + h
        norms = 2 * (2 * h)  # ln_1, ln_2 with bias
        per_layer = attn + mlp + norms
        embedding = v * h + model.max_position_embeddings * h
        lm_head = 0  # GPT-2 always ties lm_head to wte
        total = embedding + model.num_layers * per_layer + 2 * h  # ln_f
        return ParamCount(total, total, embedding, lm_head, per_layer, per_layer)

    hd = model.head_size
    q = h * model.num_attention_heads * hd
    kv = 2 * h * model.num_kv_heads * hd
    o = model.num_attention_heads * hd * h
    attn = q + kv + o
    if _has_qkv_bias(model):
        attn += model.num_attention_heads * hd + 2 * model.num_kv_heads * hd
    expert = 3 * h * model.intermediate_size  # gate, up, down (SwiGLU)
    router = h * model.num_experts if model.num_experts > 1 else 0
    norms = 2 * h  # RMSNorm weights, no bias
    per_layer = attn + model.num_experts * expert + router + norms
    per_layer_active = attn + model.experts_per_token * expert + router + norms
    embedding = v * h
    lm_head = 0 if model.tie_word_embeddings else v * h
    rest = embedding + lm_head + h  # final norm
    total = rest + model.num_layers * per_layer
    active = rest + model.num_layers * per_layer_active
    return ParamCount(total, active, embedding, lm_head, per_layer, per_layer_active)
