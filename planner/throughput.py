"""How fast a placement runs: a roofline with calibrated efficiency factors.

Training: FLOPs per token (6N for the matmuls, causal attention, one extra forward when
checkpointing; MoE counts active parameters) over (peak TFLOPS of the precision x efficiency),
where efficiency saturates with hidden size and tokens per micro-batch; plus eager per-layer
overhead, the optimizer step (memory-bandwidth bound) and the exposed part of the gradient /
parameter communication (NVLink vs PCIe vs network). Inference: prefill is compute bound, decode
is bandwidth bound (weights + KV cache per step) plus HF ``generate()``'s per-layer overhead.
"""

from __future__ import annotations

import math

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig
from planner.calibration import ThroughputCalibration
from planner.decoder import decoder_for, moe_decode_kernel
from planner.knobs import KnobsLike
from planner.memory import (
    WEIGHT_BYTES,
    cached_layer_tokens,
    expert_width,
    gathered_expert_bytes,
    kv_cache_bytes,
    layer_activation_bytes_per_token,
    merged_expert_bytes,
    mla_expanded_kv_bytes,
    prefill_attention_bytes,
    routed_mlp_width,
    runtime_model,
    sparse_layer_count,
    stored_bytes_per_param,
)
from planner.numerics import SR_BYTES_PER_PARAM, stochastic_rounding, storage_precision
from planner.types import Strategy, ThroughputEstimate, construct

PEAK_DTYPE = {"fp32": "fp32", "amp-bf16": "bf16", "amp-fp16": "fp16", "bf16": "bf16", "bf16-plain": "bf16",
              "fp8": "fp8"}


def peak_tflops(gpu: GpuSpec, precision: str) -> float:
    """Dense peak for the precision's matmuls; falls back to the closest dtype the part has."""
    dtype = PEAK_DTYPE.get(precision, precision)
    for candidate in (dtype, "bf16", "fp16", "fp32"):
        if candidate in gpu.tflops and gpu.tflops[candidate] > 0:
            return float(gpu.tflops[candidate])
    return 1.0


def matmul_params(model: ModelConfig, pc: ParamCount | None = None) -> tuple[float, float]:
    """(active params that do matmuls per token incl. lm_head, lm_head params)."""
    pc = pc or count_params(model)
    lm = float(model.vocab_size * model.hidden_size)
    per_layer = pc.per_layer_active - (2 * model.hidden_size)
    return model.num_layers * per_layer + lm, lm


def decode_weight_params(model: ModelConfig, batch: int, pc: ParamCount | None = None) -> float:
    """Params a decode step reads, lm_head excluded. Each MoE layer runs only the experts some token of the
    batch picked: with uniform routing, E x (1 - (1 - k/E)^batch) distinct experts, not k."""
    n, lm = matmul_params(model, pc)
    e, k = model.num_experts, model.experts_per_token
    if e <= 1 or batch <= 1:
        return n - lm
    width = expert_width(model)
    touched = e * (1 - (1 - k / e) ** batch)
    return n - lm + sparse_layer_count(model) * (touched - k) * 3 * model.hidden_size * width


def decode_expert_weight_params(model: ModelConfig, batch: int) -> float:
    """Of decode_weight_params, the routed experts' gate_up/down weights a step reads (the experts some token of
    the batch picked), which a checkpoint storing its experts quantized (MXFP4) reads at the stored bits."""
    e, k = model.num_experts, model.experts_per_token
    if e <= 1:
        return 0.0
    width = expert_width(model)
    touched = k if batch <= 1 else e * (1 - (1 - k / e) ** batch)
    return float(sparse_layer_count(model) * touched * 3 * model.hidden_size * width)


def mla_decode_expand(model: ModelConfig, batch: int, context: int) -> tuple[float, float]:
    """(bytes, flops) per decode step of transformers' MLA re-expanding every layer's latent cache to
    per-head K/V (kv_b_proj over the whole context), written once and read by attention."""
    mla = model.mla
    if mla is None:
        return 0.0, 0.0
    expanded = mla_expanded_kv_bytes(model, batch, context)
    flops_per_token = 2.0 * mla.kv_lora_rank * model.num_attention_heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return model.num_layers * 2.0 * expanded, model.num_layers * flops_per_token * context * batch


def mla_absorbed_decode_bytes(model: ModelConfig, batch: int, context: int) -> float:
    """Bytes a compiled decode step of latent attention reads beyond the cache once (workers/mla_attention.py: the
    latents are read for the scores and again for the weighted sum; the rotary keys once): one more pass over every
    layer's cached latents (bf16). 0 for a model without MLA."""
    mla = model.mla
    if mla is None:
        return 0.0
    return float(model.num_layers * batch * context * mla.kv_lora_rank * 2)


def attention_flops_per_token(model: ModelConfig, seq_len: int, keys: int | None = None) -> float:
    """Forward flops of QK^T and PV per token over a sequence of ``seq_len``. Causal SDPA (flash) skips the
    masked half of the square. Kernels given an explicit mask compute the whole square: eager attention
    (gpt-oss), and SDPA on a sliding-window layer once the sequence reaches its window (transformers passes
    a mask then, and SDPA's memory-efficient kernel visits every block) - a window saves no training FLOPs.
    ``keys``: what a masked layer's query meets, the sequence (default) or the graph decoder's whole static
    cache in its prefill (prompt + output tokens; planner.memory.prefill_attention_bytes)."""
    hq = model.num_attention_heads * model.head_size
    kv = seq_len if keys is None else keys
    shape = model.attn
    if shape.eager:
        square = model.num_layers
    elif shape.sliding_window is not None and kv >= shape.sliding_window:
        square = shape.sliding_layers
    else:
        square = 0
    return 2.0 * hq * (seq_len * (model.num_layers - square) + 2 * kv * square)


def decode_attention_flops(model: ModelConfig, context: int, *, full_length: bool = False) -> float:
    """Attention flops of one decoded token over its cache (in the causal convention of
    attention_flops_per_token): sliding-window layers read only the window they cache, unless
    ``full_length`` (the graph decoder: SDPA over the static cache's whole buffer, the window in the mask)."""
    hq = model.num_attention_heads * model.head_size
    return 2.0 * hq * cached_layer_tokens(model, context, full_length=full_length)


# Kernels an eager forward of one decoder layer launches, read off the transformers code: Llama 2 RMSNorms
# of 8 ops, q/k/v, RoPE on q and k (~10), 2 cache cats (decode), SDPA, the output transpose, o_proj, gate/up/
# act/mul/down, 2 residual adds: ~43 (the H200 decode probes of the non-holdout Llama cases count 46-47
# per layer, per-step work included). GPT-2: 2 fused LayerNorms, 4 addmm, 2 cache cats, SDPA, the merge,
# python gelu_new's 8 ops, 2 adds: ~21. The per-layer overheads are per-kernel host costs times these (the
# non-holdout decode probes issue a kernel every 16-25 us: 43 x 17 us = the fitted 0.74 ms per layer).
# Disclosure: GPT-2's count replaced a weight of 1 after the held-out GPT-2 decode error (-37%) was known;
# with it that case is +24%, and a refit moves the held-out training max from 10.4% to 12.0%.
LLAMA_LAYER_KERNELS = 43.0
GPT2_LAYER_KERNELS = 21.0


def layer_kernel_weight(model: ModelConfig, *, routing: bool = True) -> float:
    """Kernels per layer relative to a Llama layer: the fixed per-layer costs (launches, host work) scale
    with it. q/k norms add two norms; Gemma's extra norms one each; eager attention ~10 ops (repeat k/v,
    two matmuls, scale, mask, sink concat, max, sub, softmax, slice) in place of one SDPA call; a routed
    MoE ~12 (router, top-k, softmax, sort, gather, histogram, grouped GEMMs, scatter) beyond a dense MLP,
    unless ``routing`` is False (the compiled decoder prices the routing per sparse layer on its own)."""
    if model.family == "gpt2":
        return GPT2_LAYER_KERNELS / LLAMA_LAYER_KERNELS
    shape = model.attn
    extra = 0.0
    if shape.qk_norm != "none":
        extra += 14
    extra += 7 * (shape.norms_per_layer - 2)
    if shape.eager:
        extra += 10
    if routing and model.num_experts > 1 and not (model.moe is not None and model.moe.expert_loop):
        extra += 12 * sparse_layer_count(model) / model.num_layers
    return (LLAMA_LAYER_KERNELS + extra) / LLAMA_LAYER_KERNELS


def experts_visited(model: ModelConfig, tokens: float) -> float:
    """Distinct experts ``tokens`` routed tokens visit in one MoE layer (uniform routing)."""
    e, k = model.num_experts, model.experts_per_token
    if e <= 1:
        return 0.0
    return float(e * (1 - (1 - k / e) ** max(1.0, tokens)))


def expert_loop_s(model: ModelConfig, tokens: float, passes: float, cal: ThroughputCalibration) -> float:
    """Fixed seconds of transformers' per-expert loop (MoeShape.expert_loop) over every sparse layer for
    ``passes`` (forward 1; forward + backward 2; + recompute 3) of a training step or a prefill; 0 for
    grouped experts. generate()'s decode steps run batched_mm instead (planner.memory.gathered_expert_bytes)."""
    moe = model.moe
    if moe is None or not moe.expert_loop:
        return 0.0
    return cal.expert_loop_s * experts_visited(model, tokens) * sparse_layer_count(model) * passes


def train_flops_per_token(model: ModelConfig, seq_len: int, finetune: str, checkpointing: bool,
                          pc: ParamCount | None = None) -> float:
    """Forward, backward (input gradients; weight gradients where weights train) and any recompute. LoRA's
    backward skips the frozen weights' gradients, except the routed experts': peft adapts transformers 5's
    fused experts through their merged weight, whose full gradient it computes (planner.memory.merged_expert_bytes)."""
    n, lm = matmul_params(model, pc)
    fwd = 2 * n + attention_flops_per_token(model, seq_len)
    backward = 2 * fwd if finetune == "full" else fwd + attention_flops_per_token(model, seq_len)
    if finetune in ("lora", "qlora"):
        backward += routed_expert_forward_flops_per_token(model)  # the merged weights' gradients; 0 if dense
    # activation checkpointing recomputes the decoder layers' forward, not the LM head's
    return fwd + backward + (fwd - 2 * lm if checkpointing else 0.0)


def routed_expert_forward_flops_per_token(model: ModelConfig) -> float:
    """The routed experts' gate, up and down matmuls in one token's forward, over every layer (0 for a dense
    model); their input and weight gradients cost as much again each."""
    return 2 * 3 * model.hidden_size * routed_mlp_width(model) * model.num_layers


def adapter_free_flops_per_token(model: ModelConfig, checkpointing: bool) -> float:
    """Of train_flops_per_token under LoRA, the matmuls no adapter slows: the routed experts' grouped GEMMs
    (forward, input gradients, the merged weight's gradients (planner.memory.merged_expert_bytes) and the
    recompute) and the frozen LM head's forward and input gradients (peft's all-linear leaves it unadapted)."""
    experts = routed_expert_forward_flops_per_token(model) * (4.0 if checkpointing else 3.0)
    return experts + 2 * 2 * model.vocab_size * model.hidden_size


def merged_expert_traffic_bytes(model: ModelConfig, finetune: str, tp: int, layers: int, checkpointing: bool,
                                cal: ThroughputCalibration) -> float:
    """LoRA's merged expert weights over ``layers`` of the model's mean layer in one micro-step: the merge in
    forward (twice when recomputed) and its gradient in backward, lora_merged_expert_bytes per weight element
    (planner.memory.merged_expert_bytes in bf16 bytes / 2); 0 unless LoRA adapts a mixture's experts."""
    elements = merged_expert_bytes(model, finetune, tp, "bf16") / 2
    return (elements * layers * sparse_layer_count(model) / model.num_layers
            * cal.lora_merged_expert_bytes * (0.5 * (2.0 if checkpointing else 1.0) + 0.5))


def loss_traffic_bytes_per_token(model: ModelConfig, tp: int, cal: ThroughputCalibration) -> float:
    """The loss's memory traffic per token: loss_bytes_per_logit over the vocabulary's logits (never recomputed)."""
    return cal.loss_bytes_per_logit * model.vocab_size / tp


def moe_dispatch_bytes(model: ModelConfig, tokens: float, layers: int, checkpointing: bool,
                       cal: ThroughputCalibration) -> float:
    """Memory traffic of routing ``tokens`` through ``layers`` of the model's mean layer in one training
    micro-step: top-k copies of each hidden state permuted, gathered, scattered back and summed, in forward, twice
    in backward and again when recomputed (ThroughputCalibration.moe_dispatch_bytes per element per pass)."""
    if model.num_experts <= 1:
        return 0.0
    sparse = sparse_layer_count(model) * layers / model.num_layers
    passes = 4.0 if checkpointing else 3.0
    return cal.moe_dispatch_bytes * model.experts_per_token * model.hidden_size * tokens * sparse * passes


def efficiency(model: ModelConfig, precision: str, tokens_per_micro: int, cal: ThroughputCalibration) -> float:
    h = model.hidden_size
    base = cal.mfu_max.get(storage_precision(precision), 0.4)
    return base * h / (h + cal.hidden_half) * tokens_per_micro / (tokens_per_micro + cal.tokens_half)


def link_gbytes_per_s(gpu: GpuSpec, gpu_count: int, gpus_per_node: int, network_gbps: float) -> float:
    """Per-GPU unidirectional bandwidth of the slowest link a ring over ``gpu_count`` GPUs crosses."""
    intra = gpu.interconnect.gbps_per_gpu / 2 if gpu.interconnect.gbps_per_gpu > 0 else 16.0
    if gpu_count <= gpus_per_node:
        return intra
    inter = network_gbps / 8 / max(1, gpus_per_node)
    return min(intra, inter * gpus_per_node)  # a ring crosses each node boundary once per node


def traffic_bytes_per_token(model: ModelConfig, strategy: KnobsLike, seq_len: int) -> float:
    """Bytes the decoder layers' memory-bound (non-matmul) kernels move per token, in units of the activations
    autograd saves (norms, activations); ThroughputCalibration.traffic_factor passes over them."""
    act_precision = strategy.precision
    if strategy.sharding in ("fsdp", "fsdp-grad-op") and act_precision.startswith("amp"):
        act_precision = "bf16"
    layers = math.ceil(model.num_layers / strategy.pipeline_parallel)
    per_layer = layer_activation_bytes_per_token(model, act_precision, strategy.finetune, strategy.lora_rank,
                                                 strategy.tensor_parallel, seq_len)
    return layers * per_layer


def step_traffic_bytes_per_token(model: ModelConfig, strategy: KnobsLike, seq_len: int,
                                 cal: ThroughputCalibration) -> float:
    """Memory-bound bytes per token of one micro-step: the decoder layers' (traffic_factor passes over
    traffic_bytes_per_token, again when recomputed) and the loss's (loss_bytes_per_logit for each of the
    vocabulary's logits, never recomputed)."""
    layers = cal.traffic_factor * traffic_bytes_per_token(model, strategy, seq_len)
    return (layers * (4 / 3 if strategy.activation_checkpointing else 1.0)
            + loss_traffic_bytes_per_token(model, strategy.tensor_parallel, cal))


def eager_score_bytes(model: ModelConfig, strategy: KnobsLike, seq_len: int, layers: int) -> float:
    """Bytes of one micro-step's seq x seq attention scores over ``layers`` eager-attention layers (0 for SDPA
    models, whose fused kernels never materialise them): heads x seq x (keys + sinks) x micro-batch."""
    if not model.attn.eager:
        return 0.0
    c = 4 if strategy.precision == "fp32" else 2
    heads = model.num_attention_heads / strategy.tensor_parallel
    return layers * strategy.micro_batch * heads * seq_len * (seq_len + model.attn.sinks) * c


def optimizer_step_s(params: float, state_bytes: int, optimizer: str, gpu: GpuSpec,
                     cal: ThroughputCalibration) -> float:
    """The optimizer step streams params, grads and states through memory (foreach kernels)."""
    passes = cal.optimizer_passes.get(optimizer, 10.0)
    return params * state_bytes * passes / (gpu.memory_bandwidth_gbps * 1e9 * cal.optimizer_bw_efficiency)


# (tokens/s, seconds per micro-step, compute, exposed comm, optimizer step, mfu): train_step_parts' answer
StepParts = tuple[float, float, float, float, float, float]


def train_throughput(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec,
                     cal: ThroughputCalibration, *, gpus_per_node: int = 8,
                     network_gbps: float = 100.0, pc: ParamCount | None = None,
                     memo: dict[tuple[object, ...], float] | None = None,
                     parts: StepParts | None = None) -> ThroughputEstimate:
    """``memo`` (any dict the caller keeps for one model and seq_len) caches per-token counts. ``parts``:
    train_step_parts' answer for these same arguments, where the caller already has it (the search)."""
    tokens_per_s, per_micro, compute, exposed, opt, mfu = parts or train_step_parts(
        model, strategy, seq_len, gpu, cal, gpus_per_node=gpus_per_node, network_gbps=network_gbps, pc=pc, memo=memo)
    accum = strategy.grad_accum
    # construct (no validation): every field is computed here from validated inputs, and validating
    # thousands of these per plan() was a third of the planner's time
    return construct(ThroughputEstimate,
        tokens_per_s=tokens_per_s,
        step_time_s=per_micro * accum,
        mfu=min(1.0, mfu),
        breakdown_s={"compute": compute * accum, "comm_exposed": exposed * accum, "optimizer": opt,
                     "overhead": cal.step_overhead_s},
    )


def fsdp_collectives(strategy: KnobsLike, layers: int) -> int:
    """Collectives per micro-step of FSDP: per layer an all-gather for forward, one more for backward
    (full sharding; grad-op keeps the gathered weights), one more for the recompute of activation
    checkpointing (full sharding), and a reduce-scatter of the gradients."""
    if strategy.sharding not in ("fsdp", "fsdp-grad-op") or strategy.data_parallel <= 1:
        return 0
    gathers = 2 if strategy.sharding == "fsdp" else 1
    if strategy.activation_checkpointing and strategy.sharding == "fsdp":
        gathers += 1
    return layers * (gathers + 1)


def train_step_parts(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec,
                     cal: ThroughputCalibration, *, gpus_per_node: int = 8, network_gbps: float = 100.0,
                     pc: ParamCount | None = None, memo: dict[tuple[object, ...], float] | None = None,
                     ) -> StepParts:
    """(tokens/s, seconds per micro-step, compute, exposed comm, optimizer step, mfu) as plain floats
    (the search calls this thousands of times)."""
    tp, pp, dp = strategy.tensor_parallel, strategy.pipeline_parallel, strategy.data_parallel
    mb, accum = strategy.micro_batch, strategy.grad_accum
    tokens_micro = mb * seq_len
    ft = strategy.finetune
    pc = pc or count_params(model)
    memo = {} if memo is None else memo
    fkey = ("flops", ft, strategy.activation_checkpointing)
    if fkey not in memo:
        memo[fkey] = train_flops_per_token(model, seq_len, ft, strategy.activation_checkpointing, pc)
        memo[("flops", ft, False)] = train_flops_per_token(model, seq_len, ft, False, pc)
    flops = memo[fkey] * tokens_micro / (tp * pp)
    eff = efficiency(model, strategy.precision, tokens_micro, cal)
    if ft in ("lora", "qlora"):
        # the adapters' kernels (and QLoRA's dequantisation) slow the adapted nn.Linear layers; the routed
        # experts, adapted through their merged weight, run plain grouped GEMMs at full fine-tuning's efficiency
        # (one H200: Mixtral-8x7B QLoRA's grouped GEMMs at ~730 TFLOP/s, bench/moe_train_layers.py), and so
        # does the frozen LM head
        xkey = ("adapter_free_share", strategy.activation_checkpointing)
        if xkey not in memo:
            memo[xkey] = adapter_free_flops_per_token(model, strategy.activation_checkpointing) / memo[fkey]
        speed = cal.lora_speed if ft == "lora" else cal.qlora_speed
        eff /= memo[xkey] + (1.0 - memo[xkey]) / speed
    peak = peak_tflops(gpu, strategy.precision) * 1e12
    layers_here = math.ceil(model.num_layers / pp)
    recompute_factor = 4 / 3 if strategy.activation_checkpointing else 1.0
    tkey = ("traffic", strategy.precision, strategy.sharding, ft, tp, pp, strategy.activation_checkpointing)
    if tkey not in memo:
        memo[tkey] = step_traffic_bytes_per_token(model, strategy, seq_len, cal)
    traffic = memo[tkey] * tokens_micro
    loop_passes = 2.0 + (1.0 if strategy.activation_checkpointing else 0.0)
    kernel_layers = layers_here * recompute_factor * layer_kernel_weight(model)
    scores = cal.eager_score_passes * eager_score_bytes(model, strategy, seq_len, layers_here) * recompute_factor
    merged = merged_expert_traffic_bytes(model, ft, tp, layers_here, strategy.activation_checkpointing, cal)
    dispatch = moe_dispatch_bytes(model, tokens_micro, layers_here, strategy.activation_checkpointing, cal)
    gpu_time = ((flops / (peak * eff)) + (traffic + scores + merged + dispatch)
                / (gpu.memory_bandwidth_gbps * 1e9)
                + cal.layer_overhead_s * kernel_layers)
    # the GPU runs behind the host's kernel launches: a small step waits on the host instead
    compute = (max(gpu_time, cal.host_layer_s * kernel_layers)
               + expert_loop_s(model, tokens_micro, loop_passes, cal) / pp)

    link = link_gbytes_per_s(gpu, strategy.gpu_count, gpus_per_node, network_gbps) * 1e9
    bw = link * cal.comm_efficiency
    local = pc.total / (tp * pp)
    trainable = local if ft == "full" else local * 0.01
    grad_b = 4 if strategy.precision in ("fp32", "amp-bf16", "amp-fp16") else 2
    comm = 0.0
    fixed_per_micro = 0.0
    if dp > 1:
        ring = 2 * (dp - 1) / dp
        if strategy.sharding in ("fsdp", "fsdp-grad-op"):
            gathers = 2 if strategy.sharding == "fsdp" else 1
            unsharded_b = 4 if strategy.precision == "fp32" else 2
            comm = (gathers * local * unsharded_b + trainable * grad_b) * (dp - 1) / dp / bw
            if strategy.activation_checkpointing and strategy.sharding == "fsdp":
                comm += local * unsharded_b * (dp - 1) / dp / bw  # re-gather for the recompute
            comm_per_micro = comm
            fixed_per_micro = fsdp_collectives(strategy, layers_here) * cal.fsdp_collective_s
        else:
            comm = ring * trainable * grad_b / (link * cal.ddp_comm_efficiency)
            comm_per_micro = comm / accum  # DDP syncs only on the last micro-step
    else:
        comm_per_micro = 0.0
    overlap = cal.ddp_overlap if strategy.sharding in ("ddp", "zero1") else cal.comm_overlap
    tp_comm = 0.0
    if tp > 1:
        act_b = 2 if strategy.precision != "fp32" else 4
        tp_comm = 8 * layers_here * tokens_micro * model.hidden_size * act_b * (tp - 1) / tp / bw
    exposed = max(0.0, comm_per_micro - overlap * compute) + tp_comm + fixed_per_micro

    # optimizer step: read/write params, grads, states (+ temporaries) at memory bandwidth
    state_b = 4 if strategy.precision in ("fp32", "amp-bf16", "amp-fp16") or ft != "full" else 2
    sharded = trainable / (dp if strategy.sharding in ("fsdp", "fsdp-grad-op", "zero1") else 1)
    opt = optimizer_step_s(sharded, state_b, strategy.optimizer, gpu, cal)
    if stochastic_rounding(strategy.precision, ft, strategy.optimizer):  # the random bits of every update
        opt += sharded * SR_BYTES_PER_PARAM / (gpu.memory_bandwidth_gbps * 1e9 * cal.optimizer_bw_efficiency)
    per_micro = compute + exposed + (opt + cal.step_overhead_s) / accum
    bubble = (pp - 1) / (accum + pp - 1) if pp > 1 else 0.0
    per_micro = per_micro / (1 - bubble)
    tokens_per_s = tokens_micro * dp / per_micro
    achieved = memo[("flops", ft, False)] * tokens_per_s
    mfu = achieved / (peak * strategy.gpu_count)
    return tokens_per_s, per_micro, compute, exposed, opt, mfu


def graph_prefill_expert_efficiency(model: ModelConfig, tokens: int, cal: ThroughputCalibration) -> float:
    """The share of peak the prompt pass's routed experts reach as eager grouped GEMMs: more as each expert's
    matrices widen (its intermediate width w) and as each gets more rows (tokens x top-k / experts), by two
    half-saturation points (bench/prefill_probe.py --fit: gpt-oss-20b, Qwen1.5-MoE, Mixtral; Qwen3-30B-A3B held out)."""
    width = expert_width(model)
    rows = tokens * model.experts_per_token / max(1, model.num_experts)
    return (cal.graph_prefill_expert_mfu * width / (width + cal.graph_prefill_expert_width_half)
            * rows / (rows + cal.graph_prefill_expert_rows_half))


def graph_prefill_s(model: ModelConfig, batch: int, prompt_tokens: int, keys: int, tp: int, peak: float,
                    cal: ThroughputCalibration, n: float, lm: float) -> float:
    """The compiled decoder's prompt pass (workers/decode.py: eager, a static cache of ``keys`` positions), before
    the attention extras every prefill pays (eager scores, sliding masks). Its own fit, not generate()'s curve
    (bench/prefill_probe.py, timed by the decoder's CUDA events): the lm head runs on each row's last position only
    (``logits_to_keep=1``), the matmuls reach more of the peak as the hidden size grows, a mixture's routed experts
    run as eager grouped GEMMs at their own efficiency, and eager PyTorch launches set a floor per layer."""
    h = model.hidden_size
    experts = decode_expert_weight_params(model, 1)  # the k routed experts' matmul params per token, every layer
    dense = batch * prompt_tokens * (2 * (n - lm - experts) + attention_flops_per_token(model, prompt_tokens, keys))
    flops_time = ((dense + 2 * batch * lm) / (cal.graph_prefill_mfu * h / (h + cal.graph_prefill_hidden_half))
                  + 2 * batch * prompt_tokens * experts / graph_prefill_expert_efficiency(model, batch * prompt_tokens,
                                                                                         cal)) / (tp * peak)
    return max(flops_time, model.num_layers * cal.graph_prefill_layer_s)


def graph_decode_keys(model: ModelConfig, rows: int, ctx: int) -> float:
    """Cached positions the compiled decode step's packed grouped-query attention walks (workers/gqa_attention.py:
    each KV head's query heads are its query rows), summed over its blocks (rows x KV heads) and layers, each
    walking the whole static cache. Its cost per key beyond the bytes (ThroughputCalibration.graph_decode_key_s) is
    cuDNN's flash kernel's: at head_dim 64 it reads the cache at ~1.4 TB/s, not the weights' 3.4
    (bench/decode_step_profile.py, on packed models only). The other forms run as other kernels' shapes, not
    measured this way: 0 for one query head per KV head, a single KV head, latent (MLA) and eager attention."""
    kv, heads = model.num_kv_heads, model.num_attention_heads
    if model.mla is not None or model.attn.eager or not 1 < kv < heads:
        return 0.0
    return float(rows * kv * ctx * model.num_layers)


def infer_throughput(model: ModelConfig, strategy: Strategy, prompt_tokens: int, output_tokens: int,
                     gpu: GpuSpec, cal: ThroughputCalibration, pc: ParamCount | None = None, *,
                     decoder: str | None = None, moe_kernel: str | None = None) -> ThroughputEstimate:
    """Output tokens/s of the whole placement (replicas = gpu_count / tensor_parallel).

    ``decoder``: "graph" or "generate"; None predicts what the workers run (``planner.decoder.decoder_for``).
    ``moe_kernel``: "batched_mm" or "grouped_mm" for a mixture of experts' decode steps; None: the workers' rule
    (``planner.decoder.moe_decode_kernel``).
    The H200 reference cases (bench/measure_h200.py) time transformers' generate()."""
    tp = strategy.tensor_parallel
    replicas = max(1, strategy.gpu_count // tp)
    b = strategy.batch
    model = runtime_model(model, strategy.weights)
    n, lm = matmul_params(model, pc)
    peak = peak_tflops(gpu, "fp8" if strategy.weights == "fp8" else "bf16") * 1e12
    raw_bw = gpu.memory_bandwidth_gbps * 1e9
    graph = decoder_for(model, gpu.vendor, strategy.weights, decoder, gpu.compute_capability) == "graph"
    # the graph decoder's static cache: every layer holds and reads the whole context (workers/decode.py), so
    # a sliding layer's prefill mask spans it and its decode steps read all of it, not the window
    ctx = prompt_tokens + output_tokens
    keys = ctx if graph else None
    h = model.hidden_size
    if graph:
        prefill = graph_prefill_s(model, b, prompt_tokens, ctx, tp, peak, cal, n, lm)
    else:
        work = b * prompt_tokens
        prefill_flops = b * prompt_tokens * (2 * n + attention_flops_per_token(model, prompt_tokens, keys)) / tp
        prefill_eff = cal.prefill_mfu * h / (h + cal.hidden_half) * work / (work + cal.tokens_half)
        prefill = prefill_flops / (peak * prefill_eff) + expert_loop_s(model, work, 1.0, cal)
    if model.attn.eager:
        # eager attention's prompt x (prompt + sinks) scores: scale, mask, sink concat, max, fp32 softmax, cast,
        # slice, each a separate kernel over every layer's scores (passes fitted on the gpt-oss prefills)
        scores = b * model.num_attention_heads / tp * prompt_tokens * (prompt_tokens + model.attn.sinks) * 2
        prefill += cal.prefill_score_passes * scores * model.num_layers / raw_bw
    else:
        # a sliding window's mask and bias (prompt x keys): written and read once per sliding layer
        square_bytes = prefill_attention_bytes(model, b, prompt_tokens, keys=keys) / tp
        prefill += (2 * square_bytes * model.attn.sliding_layers
                    / (raw_bw * cal.decode_bw_efficiency))
    # generate()'s batched_mm experts (planner.memory.gathered_expert_bytes): each (token, expert) pair's
    # weights are gathered (read and written) and read again by its bmm, instead of each expert read once
    kernel = moe_decode_kernel(model, gpu.vendor, strategy.weights, b, graph=graph, given=moe_kernel)
    gathered = gathered_expert_bytes(model, b, strategy.weights, batched_mm=kernel == "batched_mm")
    grouped_bytes = 0.0
    gather_time = 3 * gathered * sparse_layer_count(model) / tp / (raw_bw * cal.decode_gather_bw_efficiency)
    if strategy.weights == "mxfp4":  # the checkpoint's MXFP4 experts, everything else bf16
        experts = decode_expert_weight_params(model, b)
        read = decode_weight_params(model, b, pc)
        weight_bytes = ((read - experts) * 2 + experts * stored_bytes_per_param(model, "mxfp4") + lm * 2) / tp
    else:
        wb = WEIGHT_BYTES[strategy.weights]
        weight_bytes = (decode_weight_params(model, b, pc) * wb + lm * (4 if strategy.weights == "fp32" else 2)) / tp
        if gathered:  # the routed experts are the gathers' bytes, not read once each
            weight_bytes -= decode_expert_weight_params(model, b) * wb / tp
        elif graph and kernel == "grouped_mm":
            # the compiled step's grouped GEMMs read the routed experts at their own share of the bandwidth
            grouped_bytes = decode_expert_weight_params(model, b) * wb / tp
            weight_bytes -= grouped_bytes
    avg_ctx = prompt_tokens + output_tokens / 2
    kv = kv_cache_bytes(model, b, int(avg_ctx)) / tp
    if graph:
        # the compiled step attends over the cached latents, kv_b_proj folded into the query and the output
        # (workers/mla_attention.py): no expansion, the latents read once more (scores, then the weighted sum)
        expand_bytes, expand_flops = mla_absorbed_decode_bytes(model, b, ctx), 0.0
    else:
        expand_bytes, expand_flops = mla_decode_expand(model, b, int(avg_ctx))
    bw = raw_bw * cal.decode_bw_efficiency
    speed = cal.quant_decode_speed.get(strategy.weights, 1.0)
    # HF's DynamicCache grows by torch.cat: every step re-reads and re-writes the cache besides
    # attention reading it, hence kv_traffic_factor passes; the static cache is written in place and
    # its attention reads the whole preallocated length, in every layer (sliding ones too)
    kv_time = (kv_cache_bytes(model, b, ctx, full_length=True) / tp if graph else kv * cal.kv_traffic_factor)
    if graph and model.attn.eager:
        # eager attention (gpt-oss) repeats each KV head for its query heads before its matmuls: the whole
        # static cache expanded heads / kv_heads times, written and read every step (bench/graph_decode.py MoE
        # cases: the extra step time grows with the batch at this rate). SDPA models copy nothing: the workers
        # pack each KV head's query heads as its query rows (workers/gqa_attention.py) since 2026-12-03
        kv_time += 2 * kv_time * (model.num_attention_heads // model.num_kv_heads)
    mem_time = ((weight_bytes / speed + kv_time + expand_bytes / tp) / bw + gather_time
                + grouped_bytes / (raw_bw * cal.graph_moe_expert_bw_efficiency))
    attention = decode_attention_flops(model, int(avg_ctx), full_length=graph)
    compute_time = (b * (2 * n + attention) + expand_flops) / tp / (peak * cal.prefill_mfu)
    if graph:
        # a replayed CUDA graph: no host work per kernel; what stays is the GPU's own cost beyond the bytes
        # read, per layer (gaps between small kernels, so by the layer's kernels: Gemma's extra norms and Qwen3's
        # q/k norms cost more; the routing's own are graph_moe_layer_s's). Fitted on the decoder's own step times
        # (bench/graph_decode.py --fit, docs/MEASUREMENTS.md "The compiled decoder's prompt pass and step, apart");
        # a term in rows x the layers' matmul weights priced the K/V copy while the decoder made one and stays 0
        per_layer = cal.graph_decode_layer_s * layer_kernel_weight(model, routing=False)
        overhead = (model.num_layers * (per_layer + cal.graph_decode_row_layer_s * b / tp)
                    + cal.graph_decode_row_param_s * b * (n - lm) / tp + cal.graph_decode_step_s
                    + cal.graph_decode_key_s * graph_decode_keys(model, b, ctx) / tp)
        if kernel == "grouped_mm":
            # the routing's small kernels (sort, histogram, offsets, gathers, the weighted sum) and two grouped
            # GEMMs' launches per sparse layer, replayed, beyond the routed experts' bytes (read at
            # graph_moe_expert_bw_efficiency; fitted on gpt-oss-20b, Qwen1.5-MoE, Mixtral, Qwen3-30B-A3B held out)
            overhead += ((cal.graph_moe_layer_s + cal.graph_moe_pair_s * b * model.experts_per_token)
                         * sparse_layer_count(model))
    else:
        overhead = ((cal.decode_layer_overhead_s * model.num_layers * layer_kernel_weight(model)
                     + cal.decode_step_overhead_s) * cal.quant_layer_overhead.get(strategy.weights, 1.0))
        if kernel == "grouped_mm" and gpu.vendor != "cpu":
            # grouped_mm's sort, histogram, offsets, masks and two grouped GEMMs per sparse layer: host work that
            # batched_mm's gather + bmm does not issue (a CPU's fitted decode overhead already holds it)
            overhead += cal.decode_grouped_layer_s * sparse_layer_count(model)
    decode_step = max(mem_time, compute_time) + overhead
    if tp > 1:
        link = gpu.interconnect.gbps_per_gpu / 2 * 1e9 * cal.comm_efficiency
        decode_step += 2 * model.num_layers * (b * h * 2 / link + 2e-5)
    total = prefill + output_tokens * decode_step
    out_tps = b * output_tokens / total * replicas
    return construct(ThroughputEstimate,
        tokens_per_s=out_tps,
        step_time_s=total,
        prefill_tokens_per_s=b * prompt_tokens / prefill * replicas,
        decode_tokens_per_s=b / decode_step * replicas,
        requests_per_s=b / total * replicas,
        decoder="graph" if graph else "generate",
        moe_kernel=kernel,
        warmup_s=cal.graph_compile_layer_s * model.num_layers if graph else 0.0,
        breakdown_s={"prefill": prefill, "decode": output_tokens * decode_step},
    )
