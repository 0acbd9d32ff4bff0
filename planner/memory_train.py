"""Bytes per GPU (most loaded rank) that a training run allocates: four candidate peak moments, the
largest of which is the peak (planner.memory explains the model; this is its training side).

The moments: the start of backward (all saved activations + the fp32 loss tensors), the lm_head
weight-grad moment, the end of backward (all gradients), and the optimizer step (params + grads +
states + the foreach temporaries). Optimizer states exist in every forward after the first step, and
the measured peak spans several steps, so states count at every moment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig
from planner.activations import (
    eager_attention_backward_bytes_per_token,
    layer_activation_bytes_per_token,
    merged_expert_bytes,
)
from planner.calibration import MemoryCalibration
from planner.knobs import Knobs, KnobsLike
from planner.memory import (
    BLOCK,
    Moment,
    finish_estimate,
    hidden_dims,
    limit_bytes,
    linear_params_per_layer,
    sparse_layer_count,
    torchao_linear_params,
)
from planner.strategies import ShardingKind, finetune_kind, precision_kind, sharding_kind
from planner.types import MemoryEstimate

QLORA_NF4_BYTES = 0.5 + 0.5 / 64 * 1.03  # nf4 + double-quantised absmax (8-bit per 64, fp32 per 256 blocks)


def lora_params_per_layer(model: ModelConfig, rank: int) -> int:
    """Adapter parameters r*(in+out) on q,k,v,o,gate,up,down of one layer (every expert's MLP)."""
    h, hq, kvd, inter = hidden_dims(model)
    if model.family == "gpt2":
        return rank * ((h + 3 * h) + (h + h) + (h + inter) + (inter + h))
    attn = rank * ((h + hq) + 2 * (h + kvd) + (hq + h))
    moe = model.moe
    if moe is None:
        return attn + _lora_mlp(h, inter, rank) * model.num_experts
    # fine-grained MoE: the mean layer over dense layers and sparse ones (narrow experts + shared experts)
    sparse = _lora_mlp(h, moe.expert_intermediate_size, rank) * model.num_experts
    if moe.shared_intermediate_size:
        sparse += _lora_mlp(h, moe.shared_intermediate_size, rank)
    dense = _lora_mlp(h, inter, rank)
    layers = model.num_layers
    return attn + (moe.dense_layers * dense + (layers - moe.dense_layers) * sparse) // layers


def _lora_mlp(h: int, width: int, rank: int) -> int:
    return rank * (2 * (h + width) + (width + h))  # gate, up, down


def _optimizer_bytes(optimizer: str, trainable: float, state_bytes: int,
                     largest_param: float = 0.0) -> tuple[float, float]:
    """(persistent state bytes, temporaries during step) for ``trainable`` params."""
    if optimizer == "adamw":
        return 2 * trainable * state_bytes, trainable * state_bytes  # exp_avg, exp_avg_sq; sqrt(exp_avg_sq)
    if optimizer == "adamw-8bit":
        return trainable * (2 + 8 / 256), 0.0  # uint8 x2 + blockwise fp32 absmax; fused kernel
    if optimizer == "sgd":
        return trainable * state_bytes, 0.0  # momentum buffer; in-place foreach
    if optimizer == "adafactor":
        # row/col factors only; measured H200 runs show no full-size foreach temporaries, only the
        # per-parameter estimate and update of the largest tensor (the embedding)
        return trainable * 4 * 0.002, 2 * largest_param * state_bytes
    raise ValueError(f"unknown optimizer {optimizer!r}")


def train_memory(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec,
                 cal: MemoryCalibration, pc: ParamCount | None = None, headroom: float | None = None) -> MemoryEstimate:
    """Peak memory per GPU for one training configuration."""
    moments, mode = train_moments(model, strategy, seq_len, cal, pc)
    return finish_estimate(moments, mode, gpu, strategy.gpu_count, cal, headroom=headroom)


def train_moments(model: ModelConfig, strategy: KnobsLike, seq_len: int, cal: MemoryCalibration,
                  pc: ParamCount | None = None, memo: dict[tuple[object, ...], float] | None = None,
                  ) -> tuple[list[Moment], str]:
    """The candidate peak moments (component -> bytes) and the allocator mode. ``memo``: a dict the caller
    keeps for one model and ``seq_len`` (per-token activation bytes)."""
    pc = pc or count_params(model)
    layers_here = math.ceil(model.num_layers / strategy.pipeline_parallel)
    held = _parameter_bytes(model, strategy, pc, layers_here)
    sharding = sharding_kind(strategy.sharding)
    act_precision = _shard_data_parallel(held, model, strategy, sharding, pc, layers_here)
    tokens = strategy.micro_batch * seq_len
    saved, backward_end_acts = _activation_bytes(model, strategy, act_precision, tokens, layers_here, seq_len, cal,
                                                 memo)
    merged_start, merged_end = _merged_expert_weights(model, strategy, layers_here)
    # logits: lm_head output (compute dtype) -> .float() copy -> log_softmax (saved) -> grads
    lb = precision_kind(act_precision).bytes.compute
    bsv = tokens * model.vocab_size / strategy.tensor_parallel * cal.logits_scale
    logits_peak = max(bsv * (lb + (4 if lb != 4 else 0) + 4), bsv * 12)
    accum_grads = held.grads if strategy.grad_accum > 1 else 0.0
    base = {"weights": held.weights, "optimizer_states": held.states, **held.extra}
    copies_start, copies_end = _autocast_copies(held, model, strategy, pc)
    moments = [
        Moment("backward start", {**base, "autocast_weight_copies": copies_start, "gradients": accum_grads,
                                  "activations": saved, "merged_expert_weights": merged_start,
                                  "logits_loss": logits_peak}),
        Moment("lm_head grad", {**base, "autocast_weight_copies": copies_start,
                                "gradients": max(accum_grads, held.lm_grad * (2 if held.autocast else 1)),
                                "activations": saved, "merged_expert_weights": merged_start,
                                "logits_loss": bsv * (lb + 4)}),
        Moment("backward end", {**base, "autocast_weight_copies": copies_end, "gradients": held.grads,
                                "activations": backward_end_acts, "merged_expert_weights": merged_end}),
        Moment("optimizer step", {"weights": held.weights, "gradients": held.grads,
                                  "optimizer_states": held.states, "optimizer_temporaries": held.temp,
                                  **{k: val for k, val in held.extra.items() if k == "ddp_buckets"}}),
    ]
    return moments, _allocator_mode(strategy, sharding)


@dataclass
class _Held:
    """Bytes one rank holds for the parameters, whatever the micro-batch."""

    weights: float
    grads: float
    states: float
    temp: float  # the optimizer step's temporaries
    autocast_copies: float  # autocast's low-precision copies of every linear weight (0 without autocast)
    lm_grad: float  # lm_head's weight gradient (full fine-tuning)
    autocast: bool
    extra: dict[str, float] = field(default_factory=dict)  # DDP buckets, FSDP's gathered units and buffers


def _parameter_bytes(model: ModelConfig, strategy: KnobsLike, pc: ParamCount, layers_here: int) -> _Held:
    """Weights, gradients and optimizer states of this rank's parameters, before data-parallel sharding."""
    pb = precision_kind(strategy.precision).bytes
    tp, pp, h = strategy.tensor_parallel, strategy.pipeline_parallel, model.hidden_size
    emb = pc.embedding if pp == 1 else max(pc.embedding, pc.lm_head or pc.embedding)
    head = pc.lm_head if pp == 1 else 0
    local_params = (layers_here * pc.per_layer + emb + head + h) / tp
    linear_params = (layers_here * linear_params_per_layer(model, pc) + (pc.lm_head or pc.embedding)) / tp
    autocast_copies = linear_params * 2 if pb.autocast else 0.0
    ft = finetune_kind(strategy.finetune)
    if not ft.adapters:
        states, temp = _optimizer_bytes(strategy.optimizer, local_params, pb.state,
                                        max(pc.embedding, pc.lm_head) / tp)
        return _Held(weights=local_params * pb.param, grads=local_params * pb.grad, states=states, temp=temp,
                     autocast_copies=autocast_copies, lm_grad=(pc.lm_head or pc.embedding) / tp * pb.grad,
                     autocast=pb.autocast)
    trainable = lora_params_per_layer(model, strategy.lora_rank) * layers_here / tp
    t_bytes = 4  # peft upcasts bf16 adapters to fp32 (autocast_adapter_dtype=True)
    if ft.quantized_base:
        frozen_linear = layers_here * _nf4_linear_per_layer(model, pc) / tp
        weights = frozen_linear * QLORA_NF4_BYTES + (local_params - frozen_linear) * 2
    else:
        weights = local_params * pb.param
    weights += trainable * t_bytes
    states, temp = _optimizer_bytes(strategy.optimizer, trainable, t_bytes, 2 * h * model.intermediate_size / tp)
    return _Held(weights=weights, grads=trainable * t_bytes, states=states, temp=temp,
                 autocast_copies=autocast_copies, lm_grad=0.0, autocast=pb.autocast)


def _shard_data_parallel(held: _Held, model: ModelConfig, strategy: KnobsLike, sharding: ShardingKind,
                         pc: ParamCount, layers_here: int) -> str:
    """Apply data-parallel sharding (DDP's buckets, ZeRO's optimizer states, FSDP2) to ``held``; the precision
    activations run at."""
    dp = strategy.data_parallel
    if dp <= 1:
        return strategy.precision
    if sharding.gradient_buckets:
        held.extra["ddp_buckets"] = held.grads  # gradient_as_bucket_view=False: a flat copy of every grad
    if sharding.shards_optimizer_state:
        held.states, held.temp = held.states / dp, held.temp / dp
    if sharding.shards_gradients:
        held.grads, held.lm_grad = held.grads / dp, held.lm_grad / dp
    if not sharding.shards_parameters:
        return strategy.precision
    kind = precision_kind(strategy.precision)
    tp = strategy.tensor_parallel
    unsharded_b = kind.bytes.compute  # FSDP2 gathers the weights in the dtype the matmuls run in
    reduce_b = kind.bytes.grad  # and reduces the gradients in theirs (fp32 under mixed precision)
    held.weights = held.weights / dp
    held.autocast_copies = 0.0  # FSDP2's MixedPrecisionPolicy casts instead of autocast
    unit = pc.per_layer / tp * unsharded_b
    held.extra["fsdp_root_unsharded"] = (pc.embedding + pc.lm_head + model.hidden_size) / tp * unsharded_b
    # a kind that keeps the weights gathered from forward to backward (fsdp-grad-op) holds every unit at once
    held.extra["fsdp_gathered_units"] = 2 * unit if sharding.reshards_after_forward else layers_here * unit
    held.extra["fsdp_grad_buffers"] = 0.0 if finetune_kind(strategy.finetune).adapters \
        else pc.per_layer / tp * (unsharded_b + reduce_b)
    return kind.sharded_activations


def _activation_bytes(model: ModelConfig, strategy: KnobsLike, act_precision: str, tokens: int, layers_here: int,
                      seq_len: int, cal: MemoryCalibration, memo: dict[tuple[object, ...], float] | None = None,
                      ) -> tuple[float, float]:
    """(activations saved at the start of backward, activations alive at its end): at the end one layer's
    activations (recomputed when checkpointing) and its backward temporaries remain."""
    h = model.hidden_size
    key = ("layer_activations", act_precision, strategy.finetune, strategy.lora_rank, strategy.tensor_parallel)
    per_tok_layer = memo.get(key) if memo is not None else None
    if per_tok_layer is None:
        per_tok_layer = layer_activation_bytes_per_token(model, act_precision, strategy.finetune, strategy.lora_rank,
                                                         strategy.tensor_parallel, seq_len)
        if memo is not None:
            memo[key] = per_tok_layer
    per_tok_layer *= cal.activation_scale
    act_bp = precision_kind(act_precision).bytes
    final_norm = (4 * h if act_bp.residual == 2 else 0) + 2 * act_bp.residual * h
    embed_out = act_bp.residual * h if model.family == "gpt2" else 0.0
    # one layer's backward: its activations (recomputed when checkpointing) and working copies, or, for an
    # eager attention, the moment its seq x seq score gradients are alive, whichever is larger
    eager = eager_attention_backward_bytes_per_token(model, act_precision, strategy.finetune, seq_len, per_tok_layer,
                                                     cal.eager_score_grad_buffers, strategy.tensor_parallel)
    layer_backward = tokens * max(per_tok_layer * (1 + cal.backward_working_layers), eager)
    if strategy.activation_checkpointing:
        saved = tokens * (layers_here * act_bp.residual * h + final_norm + embed_out)
        return saved, layer_backward + saved
    saved = tokens * (layers_here * per_tok_layer + final_norm + embed_out)
    return saved, layer_backward


def _merged_expert_weights(model: ModelConfig, strategy: KnobsLike, layers_here: int) -> tuple[float, float]:
    """LoRA's merged expert weights (planner.memory.merged_expert_bytes) at the start and at the end of backward:
    every sparse layer's until its backward (none kept when checkpointing: the recomputed layer makes its own),
    and in a layer's backward that weight and its gradient."""
    merged = merged_expert_bytes(model, strategy.finetune, strategy.tensor_parallel, strategy.precision)
    if not merged:
        return 0.0, 0.0
    sparse_here = layers_here * sparse_layer_count(model) / model.num_layers
    return (0.0 if strategy.activation_checkpointing else sparse_here * merged), 2 * merged


def _autocast_copies(held: _Held, model: ModelConfig, strategy: KnobsLike, pc: ParamCount) -> tuple[float, float]:
    """autocast's bf16 weight copies at the start and at the end of backward: they live as long as autograd
    saves them, every layer's until its backward (only lm_head's when checkpointing: recomputation
    re-casts one layer at a time)."""
    if not held.autocast_copies:
        return 0.0, 0.0
    tp = strategy.tensor_parallel
    head_copy = (pc.lm_head or pc.embedding) / tp * 2
    layer_copy = linear_params_per_layer(model, pc) / tp * 2
    if strategy.activation_checkpointing:
        return head_copy + layer_copy, layer_copy
    return head_copy + (held.autocast_copies - head_copy), layer_copy


def _allocator_mode(strategy: KnobsLike, sharding: ShardingKind) -> str:
    """Which of the calibration's reserved-overhead rows this run's allocator behaves like."""
    if strategy.data_parallel > 1:
        return sharding.allocator_row
    mode = "single"
    if strategy.activation_checkpointing:
        mode = "single-ckpt"  # recomputation churns the allocator's blocks: more cached, unused memory
    return mode


MemoryLines = list[tuple[float, float]]


def memory_lines(model: ModelConfig, knobs: Knobs, seq_len: int, cal: MemoryCalibration,
                 pc: ParamCount | None = None, memo: dict[tuple[object, ...], float] | None = None) -> MemoryLines:
    """Every peak moment as (bytes at micro_batch 1, bytes per extra sequence): memory is linear in
    the micro-batch, so the search needs only these two numbers per moment, for any GPU."""
    one, _ = train_moments(model, knobs.with_micro_batch(1), seq_len, cal, pc, memo)
    two, _ = train_moments(model, knobs.with_micro_batch(2), seq_len, cal, pc, memo)
    return [(a.total, b.total - a.total) for a, b in zip(one, two, strict=True)]


def max_micro_batch(lines: MemoryLines, gpu_count: int, gpu: GpuSpec, cal: MemoryCalibration,
                    candidates: list[int], headroom: float) -> int | None:
    """Largest micro-batch in ``candidates`` that fits within the usable memory less ``headroom``
    (the same verdict as ``train_memory(...).fits``), without building estimates; None if none does."""
    outside = cal.cuda_context_bytes + (cal.nccl_bytes if gpu_count > 1 else 0)
    limit = limit_bytes(gpu, headroom)

    def cap(limit: float) -> float:
        """Largest (real-valued) micro-batch whose peak stays within ``limit`` (same rounding as finish_estimate)."""
        budget = (limit - outside) / (1 + cal.pressure_slack) - cal.workspace_bytes - BLOCK
        best = math.inf
        for t1, slope in lines:
            if t1 > budget:
                return 0.0
            if slope > 0:
                best = min(best, 1 + (budget - t1) / slope)
        return best

    roomy = cap(limit)
    fitting = [mb for mb in candidates if mb <= roomy]
    return fitting[-1] if fitting else None


def _nf4_linear_per_layer(model: ModelConfig, pc: ParamCount) -> float:
    """What QLoRA stores in NF4 per layer, on average over the layers: the torchao-quantizable linear layers
    (a mixture of experts' fused 3-D expert weights stay bf16)."""
    return torchao_linear_params(model, pc) / model.num_layers
