"""Bytes autograd saves for backward, per token of one decoder layer (and the mixture-of-experts terms beside
them), tensor by tensor as PyTorch and Hugging Face transformers save them: a Llama block with SDPA flash/efficient
attention (no seq^2), a GPT-2 block, latent attention, eager attention, LoRA's frozen base, for each precision.
planner.memory_train counts them into the training peak; planner.throughput_train prices their memory traffic.
"""

from __future__ import annotations

from catalog.schema import ModelConfig
from planner.memory import expert_weight_params, expert_width, hidden_dims, sparse_layer_count
from planner.strategies import PrecisionBytes, PrecisionKind, finetune_kind, precision_kind


def layer_activation_bytes_per_token(model: ModelConfig, precision: str, finetune: str, rank: int, tp: int = 1,
                                     seq_len: int = 0) -> float:
    """Bytes autograd saves per token for one decoder layer (flash/efficient SDPA, no dropout masks
    unless the model has dropout). ``tp`` splits the attention/MLP inner tensors (Megatron TP)."""
    kind = precision_kind(precision)
    if model.family == "gpt2":
        return _gpt2_saved_per_token(model, kind.bytes, tp)
    adapters = finetune_kind(finetune).adapters
    c = kind.bytes.compute
    if adapters:
        saved = _adapted_layer_saved_per_token(model, c, rank, tp, seq_len)
    else:
        saved = _trained_layer_saved_per_token(model, kind, tp, seq_len)
    return (saved + _qk_norm_saved_per_token(model, c, adapters, tp) + _extra_norms_saved_per_token(model, kind.bytes)
            + _window_mask_per_token(model, c, seq_len))


def _qk_norm_saved_per_token(model: ModelConfig, c: int, adapters: bool, tp: int) -> float:
    """RMSNorm on q and k (before RoPE; Qwen3 and Gemma 3 per head, OLMo 2 over the whole projection): pow()
    saves an fp32 copy of each projection's output, and the weight mul saves its input, cast back to the
    compute dtype (Qwen3) or still fp32 (Gemma, OLMo: the weight multiplies in fp32); nothing more when the
    norm weight is frozen. Measured on one H200, Qwen3-0.6B amp-bf16 mb=16 s=2048: 15.9 GiB over the model
    without it; this term gives 15.75 GiB. The Gemma/OLMo bytes follow the autograd graph (CPU probe)."""
    if model.attn.qk_norm == "none":
        return 0.0
    _, hq_i, kvd_i, _ = hidden_dims(model)
    fp32_weight_norm = model.family in FP32_WEIGHT_NORM_FAMILIES
    return (4 + (0 if adapters else (4 if fp32_weight_norm else c))) * (hq_i / tp + kvd_i / tp)


def _extra_norms_saved_per_token(model: ModelConfig, pb: PrecisionBytes) -> float:
    """Beyond two pre-norms: Gemma's post-attention and post-feedforward norms each save an fp32 copy of
    their input and the fp32 normed tensor; norms that multiply their weight in fp32 (Gemma, gpt-oss, OLMo)
    save the fp32 normed tensor instead of a compute-dtype one; OLMo 2 normalises after each block, so the
    projections save the residual stream itself besides the norm's tensors."""
    h = model.hidden_size
    extra_norms = (model.attn.norms_per_layer - 2) * 8 * h
    if model.family == "olmo2":
        extra_norms += 2 * pb.compute * h
    elif model.family in FP32_WEIGHT_NORM_FAMILIES and not pb.autocast and pb.residual == 2:
        extra_norms += 2 * 2 * h  # the two pre-norms' fp32 normed tensors (the post-norms' are counted above)
    return extra_norms


def _window_mask_per_token(model: ModelConfig, c: int, seq_len: int) -> float:
    """A sliding-window layer longer than its window gets an explicit mask, which SDPA converts to a
    compute-dtype bias of seq x seq per sequence and saves for backward (mean over the layers)."""
    shape = model.attn
    if shape.sliding_window is not None and not shape.eager and seq_len >= shape.sliding_window:
        return c * seq_len * shape.sliding_layers / model.num_layers
    return 0.0


def _gpt2_saved_per_token(model: ModelConfig, pb: PrecisionBytes, tp: int) -> float:
    """A GPT-2 block: ln inputs, ln outputs (casts), fused qkv buffer, attn out, residual-dropout masks and output,
    the MLP's gelu, and SDPA's logsumexp."""
    h, c, r = model.hidden_size, pb.compute, pb.residual
    inter = model.intermediate_size / tp
    lse = 4 * (model.num_attention_heads / tp)
    ln_out = 2 * h if pb.autocast else c * h
    # python gelu_new saves its input (pow), tanh out, 0.5*x, 1+tanh, and its output (c_proj);
    # under autocast pow runs in fp32, so the input cast, tanh and 1+tanh are fp32 and the
    # bf16 c_fc output is not saved at all
    gelu = (4 + 4 + 2 + 4 + 2) * inter if pb.autocast else 5 * c * inter
    return 2 * r * h + 2 * ln_out + 3 * c * h + c * h + 2 * h + c * h / 2 + gelu + lse


def _adapted_layer_saved_per_token(model: ModelConfig, c: int, rank: int, tp: int, seq_len: int) -> float:
    """A layer under LoRA, besides its q/k norms, extra norms and window mask. Frozen base: weights' grads are not
    needed, so norm outputs and linear inputs are saved only through peft's fp32 casts of each adapter input
    (autocast_adapter_dtype=True)."""
    h, hq_i, kvd_i, _ = hidden_dims(model)
    hq, kvd = hq_i / tp, kvd_i / tp
    heads = model.num_attention_heads / tp
    shape = model.attn
    lse = 4 * heads
    norm = 4 * h  # the fp32 copy saved by pow()
    attn_in: float = 3 * 4 * h
    # peft 0.21 maps a fused-expert MoE's v4 MLP names onto its routed experts, leaving the nn.Linear MLPs
    # (dense layers, shared experts) unadapted: no casts of their inputs (H200 probe, DeepSeek-V2-Lite)
    mlp_in = 2 * 4 * h if model.num_experts <= 1 else 0.0
    attn = c * hq + 2 * c * kvd + c * hq + 4 * hq
    if model.mla is not None:
        attn_in, attn = _mla_lora_saved_per_token(model, c, tp)
    if shape.eager:
        attn = 4 * c * hq + 4 * hq + heads * (seq_len + shape.sinks) * c
        lse = 8 * heads if shape.sinks else 0.0
    mlp = _mlp_saved_per_token(model, c, True, tp) + _fp32_router_bytes(model, True)
    small = 7 * 4 * rank
    return 2 * norm + attn_in + mlp_in + attn + mlp + small + lse


def _trained_layer_saved_per_token(model: ModelConfig, kind: PrecisionKind, tp: int, seq_len: int) -> float:
    """A layer whose weights train, besides its q/k norms, extra norms and window mask: the two norms, attention
    (SDPA saves q, k, v, out and the logsumexp; eager attention, as gpt-oss runs it, saves q, the repeated k and
    v, out, and the softmax probabilities, one extra column for the sinks, per token) and the MLP."""
    pb = kind.bytes
    h, hq_i, kvd_i, _ = hidden_dims(model)
    hq, kvd = hq_i / tp, kvd_i / tp
    c, r = pb.compute, pb.residual
    heads = model.num_attention_heads / tp
    shape = model.attn
    lse = 4 * heads
    if pb.autocast:
        # residual fp32 (saved by pow), fp32 normed (saved by weight mul), one bf16 cast per consumer linear
        norm1 = 4 * h + 4 * h + 3 * 2 * h
        norm2 = 4 * h + 4 * h + 2 * 2 * h
    else:
        # x.to(fp32) copy (bf16 only), the normed input of the weight mul, its output (saved by linears)
        fp32_copy = 4 * h if r == 2 else 0
        norm1 = norm2 = (fp32_copy + r * h + c * h) if r == 2 else (r * h + r * h + c * h)
    attn = 2 * c * hq + 2 * c * kvd  # q, k (after RoPE), v, out (flash output is already BSHD)
    if model.mla is not None:
        attn = _mla_saved_per_token(model, c, tp)
    if shape.eager:
        # q, repeated k and v, out; the probabilities (+ the sink column); max()'s int64 indices (sinks)
        attn = 4 * c * hq + heads * (seq_len + shape.sinks) * c
        lse = 8 * heads if shape.sinks else 0.0
    elif kind.compute_dtype == "fp32" and model.num_kv_heads != model.num_attention_heads:
        # fp32 + GQA: flash lacks fp32, efficient lacks GQA -> SDPA math: scaled q/k, repeated k/v,
        # the softmax probabilities (seq^2) and a contiguous copy of the output
        attn = 4 * c * hq + c * hq + 4 * heads * seq_len
    # gate out, silu out, up out, product (of every routed expert a token visits), plus an MoE's dispatch
    mlp = _mlp_saved_per_token(model, c, False, tp) + _fp32_router_bytes(model, False)
    return norm1 + norm2 + attn + mlp + lse


def _mla_saved_per_token(model: ModelConfig, c: int, tp: int) -> float:
    """Latent attention (DeepSeek V2/V3) under full fine-tuning, per token: q and k at the q/k head width, the
    kv_b projection's output (the no-RoPE keys and the values, of which v is a view), the SDPA output and
    o_proj's contiguous copy of it, and each low-rank branch's RMSNorm (an fp32 copy and the normed tensor) and
    the up-projection's input. H200, DeepSeek-V2-Lite bf16 (bench/probes/moe_lora_probe.py, saved_in_first_layer):
    32,832 bytes per token besides the input norm, this sum exactly."""
    mla = model.mla
    assert mla is not None
    heads = model.num_attention_heads / tp
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    per_head = 2 * qk + (mla.qk_nope_head_dim + mla.v_head_dim) + 2 * mla.v_head_dim
    low_rank = (4 + 2 * c) * (mla.kv_lora_rank + (mla.q_lora_rank or 0))
    return c * heads * per_head + low_rank


def _mla_lora_saved_per_token(model: ModelConfig, c: int, tp: int) -> tuple[float, float]:
    """Latent attention under LoRA, per token: (the adapters' fp32 input casts, the rest). Casts: q_proj's (or
    q_a_proj's and q_b_proj's) and kv_a_proj's of the hidden state, kv_b_proj's of the latent, o_proj's of the
    output; the rest as full fine-tuning keeps it (q, k, the kv_b output, the SDPA output) and the low-rank norms'
    fp32 copies. H200, DeepSeek-V2-Lite bf16 LoRA (bench/probes/moe_lora_probe.py): 53,248 bytes besides the norms."""
    mla = model.mla
    assert mla is not None
    h, heads = model.hidden_size, model.num_attention_heads / tp
    q_rank = mla.q_lora_rank or 0
    casts = 4 * (2 * h + q_rank + mla.kv_lora_rank + heads * mla.v_head_dim)
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    rest = c * heads * (2 * qk + mla.qk_nope_head_dim + 2 * mla.v_head_dim) + 4 * (mla.kv_lora_rank + q_rank)
    return casts, rest


# MoE routers that compute their logits in fp32 (transformers' DeepseekV2/V3 TopkRouter casts the hidden states,
# and autograd keeps that copy)
FP32_ROUTER_FAMILIES = frozenset({"deepseek_v2", "deepseek_v3"})


def _fp32_router_bytes(model: ModelConfig, adapters: bool) -> float:
    """Bytes per token (mean layer) of a router's fp32 input copy, 4 x hidden in each sparse layer: an fp32 router
    keeps it, and so does one LoRA adapts (peft maps the v4 router name onto its weight; the adapter's fp32 cast),
    the same tensor when both."""
    if model.num_experts <= 1 or not (adapters or model.family in FP32_ROUTER_FAMILIES):
        return 0.0
    return 4.0 * model.hidden_size * sparse_layer_count(model) / model.num_layers


def eager_attention_backward_bytes_per_token(model: ModelConfig, precision: str, finetune: str, seq_len: int,
                                             layer_bytes_per_token: float, grad_buffers: float, tp: int = 1) -> float:
    """Bytes per token alive while one layer's eager attention runs its backward (0 for SDPA models): the
    layer's saved tensors less its MLP's, whose backward ran first and freed them, plus ``grad_buffers``
    seq x seq gradients of the scores beside the saved probabilities. On the H200 this moment is a gpt-oss
    step's peak at long sequences (bench/probes/memory_peak_probe.py: probabilities + 3 buffers of 4.0 GiB each at
    seq 4096, micro-batch 2, with activation checkpointing)."""
    if not model.attn.eager:
        return 0.0
    c = precision_kind(precision).bytes.compute
    scores = model.num_attention_heads / tp * (seq_len + model.attn.sinks) * c
    mlp = _mlp_saved_per_token(model, c, finetune_kind(finetune).adapters, tp)
    return max(0.0, layer_bytes_per_token - mlp) + grad_buffers * scores


def _mlp_saved_per_token(model: ModelConfig, c: int, adapters: bool, tp: int) -> float:
    """Bytes the MLP of the mean layer saves per token: gate out, act out, up out, product of every routed
    expert a token visits (compute dtype; with frozen adapters' fp32 input casts instead of the gate's), plus an
    MoE's dispatch. With adapters the routed experts still save what full fine-tuning saves: peft adapts
    transformers 5's fused experts through their merged weight, whose gradient needs every input
    (:func:`merged_expert_bytes`); only the nn.Linear MLPs (dense layers, shared experts) save the adapter casts."""
    full = _mlp_act_factor(model) * c
    if not adapters:
        return full * moe_mlp_width(model) / tp + moe_dispatch_bytes(model, c) / tp
    routed = routed_mlp_width(model)
    # a dense model's adapted MLP: gate, up and act outputs and down's fp32 adapter cast; a fused-expert MoE's
    # dense and shared MLPs stay unadapted under peft (gate, up and act outputs only)
    linear = 3 * c + (4 if model.num_experts <= 1 else 0)
    return (linear * (moe_mlp_width(model) - routed) + full * routed) / tp + moe_dispatch_bytes(model, c) / tp


def routed_mlp_width(model: ModelConfig) -> float:
    """The routed experts' share of :func:`moe_mlp_width`: top-k x expert width over the sparse layers (mean layer)."""
    if model.num_experts <= 1:
        return 0.0
    return model.experts_per_token * expert_width(model) * sparse_layer_count(model) / model.num_layers


def merged_expert_bytes(model: ModelConfig, finetune: str, tp: int = 1, precision: str = "bf16") -> float:
    """Bytes one sparse layer saves for backward, whatever the tokens, when LoRA adapts its routed experts.

    transformers 5 keeps the experts in fused 3-D parameters (gate_up_proj, down_proj), and peft's LoRA
    (``target_modules="all-linear"``, as the workers ask; peft 0.21 maps the v4 expert names onto them) wraps each
    in a ParamWrapper that adds B @ A to the whole weight every forward: autograd keeps each merged weight, in
    the frozen weights' dtype (``precision``'s parameters: bf16, or fp32 under fp32 and autocast; QLoRA leaves the
    fused experts bf16), until the layer's backward computes its gradient. One H200, peft 0.21.0, transformers
    5.17, bf16 (bench/probes/moe_lora_probe.py, bench/results/workers/moe_lora_probe_2026-12-04/): 1.03 GiB per
    DeepSeek-V2-Lite layer, 1.13 GiB per Qwen3-30B-A3B layer, exactly these weights."""
    kind = finetune_kind(finetune)
    if not kind.adapters or model.num_experts <= 1:
        return 0.0
    element = 2 if kind.quantized_base else precision_kind(precision).bytes.param
    return expert_weight_params(model) / sparse_layer_count(model) * element / tp


# Families whose RMSNorm multiplies its weight in fp32 and casts after (transformers' Gemma, gpt-oss, OLMo 2)
FP32_WEIGHT_NORM_FAMILIES = frozenset({"gemma2", "gemma3_text", "gpt_oss", "olmo2"})


def moe_mlp_width(model: ModelConfig) -> float:
    """MLP intermediate elements one token produces in the mean layer: intermediate_size in a dense layer;
    in a sparse layer the experts it visits (top-k x expert width) plus the shared experts."""
    if model.num_experts <= 1:
        return float(model.intermediate_size)
    moe = model.moe
    sparse = model.experts_per_token * expert_width(model) + (moe.shared_intermediate_size if moe else 0)
    dense_layers = moe.dense_layers if moe else 0
    return (dense_layers * model.intermediate_size + (model.num_layers - dense_layers) * sparse) / model.num_layers


def moe_dispatch_bytes(model: ModelConfig, c: int) -> float:
    """Bytes per token (mean layer) an MoE saves besides the expert MLPs: each routed copy of the token's
    hidden state and its weighted output, and the router's logits and probabilities (CPU probe of
    transformers' grouped and looped experts: 2 x compute bytes x hidden per routed copy)."""
    if model.num_experts <= 1:
        return 0.0
    dense_layers = model.moe.dense_layers if model.moe else 0
    per_sparse = model.experts_per_token * 2 * c * model.hidden_size + 2 * c * model.num_experts
    return per_sparse * (model.num_layers - dense_layers) / model.num_layers


def _mlp_act_factor(model: ModelConfig) -> float:
    """Compute-dtype tensors saved per MLP-intermediate element: 4 for SwiGLU (gate, act, up, product);
    7 for gpt-oss's clamped SwiGLU (gate_up, both clamps, sigmoid, glu, up + 1, product), per a CPU probe."""
    return 7.0 if model.family == "gpt_oss" else 4.0
