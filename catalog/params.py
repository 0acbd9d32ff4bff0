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
    per_layer: int  # the mean decoder layer, all experts
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

    attn = _attention_params(model)
    norms = model.attn.norms_per_layer * h  # RMSNorm weights, no bias (Gemma: pre and post each block)
    dense_layer = attn + _mlp(h, model.intermediate_size) + norms
    sparse_total, sparse_active = _moe_mlp_params(model)
    dense_layers = model.moe.dense_layers if model.moe else (0 if model.num_experts > 1 else model.num_layers)
    sparse_layers = model.num_layers - dense_layers
    layers_total = dense_layers * dense_layer + sparse_layers * (attn + sparse_total + norms)
    layers_active = dense_layers * dense_layer + sparse_layers * (attn + sparse_active + norms)
    embedding = v * h
    lm_head = 0 if model.tie_word_embeddings else v * h
    rest = embedding + lm_head + h  # final norm
    # per-layer figures are the mean layer: DeepSeek's and Qwen-MoE's dense layers differ from sparse ones
    per_layer = layers_total // model.num_layers
    per_layer_active = layers_active // model.num_layers
    return ParamCount(rest + layers_total, rest + layers_active, embedding, lm_head, per_layer, per_layer_active)


def _mlp(h: int, width: int) -> int:
    return 3 * h * width  # gate, up, down (SwiGLU)


def _attention_params(model: ModelConfig) -> int:
    h = model.hidden_size
    heads = model.num_attention_heads
    bias = model.hf_config.get("attention_bias") is True
    mla = model.mla
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            q = h * heads * qk
        else:  # q_a_proj, q_a_layernorm, q_b_proj
            q = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * qk + (mla.q_lora_rank if bias else 0)
        # kv_a_proj_with_mqa (latent + the shared RoPE key), kv_a_layernorm, kv_b_proj (per-head k_nope and v)
        kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
        kv += mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        kv += (mla.kv_lora_rank + mla.qk_rope_head_dim) if bias else 0
        return q + kv + heads * mla.v_head_dim * h + (h if bias else 0)
    hd = model.head_size
    kvd = model.num_kv_heads * hd
    attn = h * heads * hd + 2 * h * kvd + heads * hd * h
    if _has_qkv_bias(model):
        attn += heads * hd + 2 * kvd
    if bias and model.family not in ("qwen2", "qwen2_moe"):
        attn += h  # an explicit attention_bias puts a bias on o_proj too (Llama, Qwen3, gpt-oss)
    shape = model.attn
    if shape.qk_norm == "head":
        attn += 2 * hd  # q_norm and k_norm over each head (Qwen3, Gemma 3)
    elif shape.qk_norm == "full":
        attn += heads * hd + kvd  # over the whole projection (OLMo 2)
    if shape.sinks:
        attn += heads  # gpt-oss: one sink logit per head
    return attn


def _moe_mlp_params(model: ModelConfig) -> tuple[int, int]:
    """(all, per token) parameters of one sparse layer's MLP: routed experts, shared experts, router."""
    h = model.hidden_size
    if model.num_experts <= 1:
        return 0, 0
    moe = model.moe
    width = model.expert_width
    expert = _mlp(h, width) + (2 * width + h if moe and moe.expert_bias else 0)  # gate_up and down biases
    always = h * model.num_experts + (model.num_experts if moe and moe.router_bias else 0)  # the router
    if moe is not None and moe.shared_intermediate_size:
        always += _mlp(h, moe.shared_intermediate_size) + (h if moe.shared_expert_gate else 0)
    return model.num_experts * expert + always, model.experts_per_token * expert + always
