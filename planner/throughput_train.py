"""How fast a training placement runs (planner.throughput has the roofline both tasks share, and inference).

FLOPs per token (6N for the matmuls, causal attention, one extra forward when checkpointing; MoE counts active
parameters) over (peak TFLOPS of the precision x efficiency), where efficiency saturates with hidden size and
tokens per micro-batch; plus the memory-bound kernels' traffic, eager per-layer overhead, the optimizer step
(memory-bandwidth bound) and the exposed part of the gradient / parameter communication (NVLink vs PCIe vs
network), as the sharding kind moves it (planner.strategies).
"""

from __future__ import annotations

import math

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig
from planner.activations import layer_activation_bytes_per_token, merged_expert_bytes, routed_mlp_width
from planner.calibration import ThroughputCalibration
from planner.knobs import KnobsLike
from planner.memory import sparse_layer_count
from planner.numerics import SR_BYTES_PER_PARAM, SR_FUSED_STEP_BYTES_PER_PARAM, stochastic_rounding, storage_precision
from planner.strategies import ShardingKind, finetune_kind, precision_kind, sharding_kind
from planner.throughput import (
    attention_flops_per_token,
    expert_loop_s,
    layer_kernel_weight,
    matmul_params,
    peak_tflops,
)
from planner.types import ThroughputEstimate, construct


def train_flops_per_token(model: ModelConfig, seq_len: int, finetune: str, checkpointing: bool,
                          pc: ParamCount | None = None) -> float:
    """Forward, backward (input gradients; weight gradients where weights train) and any recompute. LoRA's
    backward skips the frozen weights' gradients, except the routed experts': peft adapts transformers 5's
    fused experts through their merged weight, whose full gradient it computes (planner.memory.merged_expert_bytes)."""
    n, lm = matmul_params(model, pc)
    fwd = 2 * n + attention_flops_per_token(model, seq_len)
    adapters = finetune_kind(finetune).adapters
    backward = fwd + attention_flops_per_token(model, seq_len) if adapters else 2 * fwd
    if adapters:
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
    if sharding_kind(strategy.sharding).shards_parameters:
        act_precision = precision_kind(act_precision).sharded_activations
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
    c = precision_kind(strategy.precision).bytes.compute
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
    if strategy.data_parallel <= 1:
        return 0
    return layers * sharding_kind(strategy.sharding).collectives_per_layer(strategy.activation_checkpointing)


def train_step_parts(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec,
                     cal: ThroughputCalibration, *, gpus_per_node: int = 8, network_gbps: float = 100.0,
                     pc: ParamCount | None = None, memo: dict[tuple[object, ...], float] | None = None,
                     ) -> StepParts:
    """(tokens/s, seconds per micro-step, compute, exposed comm, optimizer step, mfu) as plain floats
    (the search calls this thousands of times)."""
    tp, pp, dp = strategy.tensor_parallel, strategy.pipeline_parallel, strategy.data_parallel
    accum = strategy.grad_accum
    tokens_micro = strategy.micro_batch * seq_len
    pc = pc or count_params(model)
    memo = {} if memo is None else memo
    peak = peak_tflops(gpu, strategy.precision) * 1e12
    layers_here = math.ceil(model.num_layers / pp)
    compute = _compute_s(model, strategy, seq_len, gpu, cal, pc, memo, peak)
    local = pc.total / (tp * pp)
    trainable = local * 0.01 if finetune_kind(strategy.finetune).adapters else local
    link = link_gbytes_per_s(gpu, strategy.gpu_count, gpus_per_node, network_gbps) * 1e9
    exposed = _exposed_comm_s(model, strategy, link, local, trainable, compute, layers_here, tokens_micro, cal)
    opt = _optimizer_s(strategy, trainable, gpu, cal)
    per_micro = compute + exposed + (opt + cal.step_overhead_s) / accum
    bubble = (pp - 1) / (accum + pp - 1) if pp > 1 else 0.0
    per_micro = per_micro / (1 - bubble)
    tokens_per_s = tokens_micro * dp / per_micro
    achieved = memo[("flops", strategy.finetune, False)] * tokens_per_s
    mfu = achieved / (peak * strategy.gpu_count)
    return tokens_per_s, per_micro, compute, exposed, opt, mfu


def _flops_per_token(model: ModelConfig, strategy: KnobsLike, seq_len: int, pc: ParamCount,
                     memo: dict[tuple[object, ...], float]) -> float:
    """train_flops_per_token of ``strategy``, kept in ``memo`` with the count without recompute (its MFU's)."""
    ft, ckpt = strategy.finetune, strategy.activation_checkpointing
    fkey = ("flops", ft, ckpt)
    if fkey not in memo:
        memo[fkey] = train_flops_per_token(model, seq_len, ft, ckpt, pc)
        memo[("flops", ft, False)] = train_flops_per_token(model, seq_len, ft, False, pc)
    return memo[fkey]


def _matmul_efficiency(model: ModelConfig, strategy: KnobsLike, tokens_micro: int, cal: ThroughputCalibration,
                       memo: dict[tuple[object, ...], float], flops_per_token: float) -> float:
    """The share of peak the step's matmuls reach. The adapters' kernels (and QLoRA's dequantisation) slow the
    adapted nn.Linear layers; the routed experts, adapted through their merged weight, run plain grouped GEMMs at
    full fine-tuning's efficiency (one H200: Mixtral-8x7B QLoRA's grouped GEMMs at ~730 TFLOP/s,
    bench/accuracy/moe_train_layers.py), and so does the frozen LM head."""
    eff = efficiency(model, strategy.precision, tokens_micro, cal)
    ft = finetune_kind(strategy.finetune)
    if ft.adapters:
        xkey = ("adapter_free_share", strategy.activation_checkpointing)
        if xkey not in memo:
            memo[xkey] = adapter_free_flops_per_token(model, strategy.activation_checkpointing) / flops_per_token
        speed = cal.qlora_speed if ft.quantized_base else cal.lora_speed
        eff /= memo[xkey] + (1.0 - memo[xkey]) / speed
    return eff


def _compute_s(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec, cal: ThroughputCalibration,
               pc: ParamCount, memo: dict[tuple[object, ...], float], peak: float) -> float:
    """Seconds of one micro-step's compute on one GPU: matmuls, memory-bound kernels and per-layer overheads, or
    the host's kernel launches where a small step waits on them."""
    tp, pp, ckpt = strategy.tensor_parallel, strategy.pipeline_parallel, strategy.activation_checkpointing
    tokens_micro = strategy.micro_batch * seq_len
    per_token = _flops_per_token(model, strategy, seq_len, pc, memo)
    flops = per_token * tokens_micro / (tp * pp)
    eff = _matmul_efficiency(model, strategy, tokens_micro, cal, memo, per_token)
    layers_here = math.ceil(model.num_layers / pp)
    recompute_factor = 4 / 3 if ckpt else 1.0
    tkey = ("traffic", strategy.precision, strategy.sharding, strategy.finetune, tp, pp, ckpt)
    if tkey not in memo:
        memo[tkey] = step_traffic_bytes_per_token(model, strategy, seq_len, cal)
    traffic = memo[tkey] * tokens_micro
    loop_passes = 2.0 + (1.0 if ckpt else 0.0)
    kernel_layers = layers_here * recompute_factor * layer_kernel_weight(model)
    scores = cal.eager_score_passes * eager_score_bytes(model, strategy, seq_len, layers_here) * recompute_factor
    merged = merged_expert_traffic_bytes(model, strategy.finetune, tp, layers_here, ckpt, cal)
    dispatch = moe_dispatch_bytes(model, tokens_micro, layers_here, ckpt, cal)
    gpu_time = ((flops / (peak * eff)) + (traffic + scores + merged + dispatch)
                / (gpu.memory_bandwidth_gbps * 1e9)
                + cal.layer_overhead_s * kernel_layers)
    # the GPU runs behind the host's kernel launches: a small step waits on the host instead
    return (max(gpu_time, cal.host_layer_s * kernel_layers)
            + expert_loop_s(model, tokens_micro, loop_passes, cal) / pp)


def _exposed_comm_s(model: ModelConfig, strategy: KnobsLike, link: float, local: float, trainable: float,
                    compute: float, layers_here: int, tokens_micro: int, cal: ThroughputCalibration) -> float:
    """Seconds of one micro-step's communication that compute does not hide: the data-parallel traffic beyond
    its overlap with compute, tensor parallelism's activations and FSDP's fixed cost per collective."""
    tp = strategy.tensor_parallel
    bw = link * cal.comm_efficiency
    sharding = sharding_kind(strategy.sharding)
    comm_per_micro, fixed_per_micro = _data_parallel_comm_s(strategy, sharding, link, local, trainable,
                                                            layers_here, cal)
    overlap = cal.ddp_overlap if sharding.gradient_buckets else cal.comm_overlap
    tp_comm = 0.0
    if tp > 1:
        act_b = precision_kind(strategy.precision).bytes.compute
        tp_comm = 8 * layers_here * tokens_micro * model.hidden_size * act_b * (tp - 1) / tp / bw
    return max(0.0, comm_per_micro - overlap * compute) + tp_comm + fixed_per_micro


def _data_parallel_comm_s(strategy: KnobsLike, sharding: ShardingKind, link: float, local: float,
                          trainable: float, layers_here: int, cal: ThroughputCalibration) -> tuple[float, float]:
    """(seconds of data-parallel traffic per micro-step, fixed seconds of its collectives). A kind that shards
    the parameters gathers them (again for backward and the recompute where it frees them after forward) and
    reduce-scatters the gradients every micro-step; the others all-reduce the gradients on the last one."""
    dp = strategy.data_parallel
    if dp <= 1:
        return 0.0, 0.0
    kind = precision_kind(strategy.precision)
    grad_b = kind.bytes.grad  # gradients travel in their own dtype (fp32 under mixed precision)
    if not sharding.shards_parameters:
        ring = 2 * (dp - 1) / dp
        comm = ring * trainable * grad_b / (link * cal.ddp_comm_efficiency)
        return comm / strategy.grad_accum, 0.0  # DDP syncs only on the last micro-step
    bw = link * cal.comm_efficiency
    unsharded_b = kind.bytes.compute  # the weights are gathered in the dtype the matmuls run in
    comm = (sharding.gathers_per_step() * local * unsharded_b + trainable * grad_b) * (dp - 1) / dp / bw
    if sharding.regathers_for_recompute(strategy.activation_checkpointing):
        comm += local * unsharded_b * (dp - 1) / dp / bw  # re-gather for the recompute
    return comm, fsdp_collectives(strategy, layers_here) * cal.fsdp_collective_s


def _optimizer_s(strategy: KnobsLike, trainable: float, gpu: GpuSpec, cal: ThroughputCalibration) -> float:
    """The optimizer step: read/write params, grads, states (+ temporaries) at memory bandwidth, over this rank's
    share of the states, and stochastic rounding's random bits of every update."""
    dp = strategy.data_parallel
    adapters = finetune_kind(strategy.finetune).adapters
    state_b = 4 if adapters else precision_kind(strategy.precision).bytes.state  # peft's adapters train in fp32
    sharded = trainable / (dp if sharding_kind(strategy.sharding).shards_optimizer_state else 1)
    bandwidth = gpu.memory_bandwidth_gbps * 1e9 * cal.optimizer_bw_efficiency
    if not stochastic_rounding(strategy.precision, strategy.finetune, strategy.optimizer):
        return optimizer_step_s(sharded, state_b, strategy.optimizer, gpu, cal)
    if strategy.optimizer == "adamw":  # one fused kernel a tensor: each byte once
        return sharded * SR_FUSED_STEP_BYTES_PER_PARAM / bandwidth
    return optimizer_step_s(sharded, state_b, strategy.optimizer, gpu, cal) + sharded * SR_BYTES_PER_PARAM / bandwidth
