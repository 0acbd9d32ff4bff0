"""Bytes per GPU (most loaded rank) that a training or inference run really allocates.

The model follows what PyTorch and Hugging Face transformers do, tensor by tensor:

* Training peaks at one of four moments; we compute each and report the largest:
  the start of backward (all saved activations + the fp32 loss tensors), the lm_head weight-grad
  moment, the end of backward (all gradients), and the optimizer step (params + grads + states +
  the foreach temporaries). Optimizer states exist in every forward after the first step, and the
  measured peak spans several steps, so states count at every moment.
* Saved activations are counted per token per layer from the autograd graph of a Llama block
  with SDPA flash/efficient attention (no seq^2), or of a GPT-2 block, for each precision.
* HF computes the loss as ``cross_entropy(logits.float())``: the fp32 copy, the saved
  log-softmax and its gradient are B*S*V*4 bytes each.
* Reserved = allocated plus what the caching allocator keeps cached. Workers run it with
  expandable segments (``cal.allocator``), which keeps that small; PyTorch's stock allocator
  fragments far more (an H200 run held 14.6 GiB reserved but unusable and OOMed a plan whose
  allocated bytes were right within 0.2%). total = reserved + CUDA context (+ NCCL buffers).
* ``fits`` is judged under pressure: the allocator frees cached blocks before raising OOM, so a
  run needs allocated (+ a small slack) plus context, and the plan must leave ``headroom`` of the
  usable memory free so it is never on the edge (one rule for the verdict and the micro-batch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig
from planner.calibration import GIB, MIB, MemoryCalibration
from planner.decoder import decoder_for
from planner.knobs import Knobs, KnobsLike
from planner.types import MemoryEstimate, Strategy

BLOCK = 2 * MIB


@dataclass(frozen=True)
class PrecisionBytes:
    param: int  # stored parameters
    grad: int
    state: int  # optimizer state element (AdamW/SGD follow the param dtype)
    compute: int  # matmul outputs
    residual: int  # residual stream / norm inputs
    autocast: bool  # autocast keeps a low-precision copy of every linear weight


PRECISION_BYTES: dict[str, PrecisionBytes] = {
    "fp32": PrecisionBytes(4, 4, 4, 4, 4, False),
    "amp-bf16": PrecisionBytes(4, 4, 4, 2, 4, True),
    "amp-fp16": PrecisionBytes(4, 4, 4, 2, 4, True),
    "bf16": PrecisionBytes(2, 2, 2, 2, 2, False),
    "fp8": PrecisionBytes(2, 2, 2, 2, 2, False),
}

# Bytes per weight for inference weights, scale overhead included (torchao layouts):
# int8 weight-only: per-output-channel bf16 scale; fp8: per-row fp32 scale; int4: group 128, bf16 scale+zero.
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 4 / 128}
QLORA_NF4_BYTES = 0.5 + 0.5 / 64 * 1.03  # nf4 + double-quantised absmax (8-bit per 64, fp32 per 256 blocks)


APPLE_WORKING_SET = 0.75  # MPS's recommendedMaxWorkingSetSize is about 3/4 of unified memory


def usable_bytes(gpu: GpuSpec) -> int:
    """What a job can allocate: the device memory torch sees where it was measured (a little less than
    nvidia-smi's total), else the driver's total; on Apple's unified memory only the Metal working set
    (the OS and other apps share the rest)."""
    total = (gpu.torch_total_gib or gpu.memory_gib) * GIB
    return int(total * APPLE_WORKING_SET if gpu.vendor == "apple" else total)


def round_block(n: float) -> int:
    return int(math.ceil(n / BLOCK) * BLOCK)


def lora_params_per_layer(model: ModelConfig, rank: int) -> int:
    """Adapter parameters r*(in+out) on q,k,v,o,gate,up,down of one layer (every expert's MLP)."""
    h, hq, kvd, inter = _dims(model)
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


def _dims(model: ModelConfig) -> tuple[int, int, int, int]:
    hd = model.head_size
    return model.hidden_size, model.num_attention_heads * hd, model.num_kv_heads * hd, model.intermediate_size


def layer_activation_bytes_per_token(model: ModelConfig, precision: str, finetune: str, rank: int, tp: int = 1,
                                     seq_len: int = 0) -> float:
    """Bytes autograd saves per token for one decoder layer (flash/efficient SDPA, no dropout masks
    unless the model has dropout). ``tp`` splits the attention/MLP inner tensors (Megatron TP)."""
    pb = PRECISION_BYTES[precision]
    h, hq_i, kvd_i, inter_i = _dims(model)
    hq, kvd, inter = hq_i / tp, kvd_i / tp, inter_i / tp
    c, r = pb.compute, pb.residual
    heads = model.num_attention_heads / tp
    shape = model.attn
    lse = 4 * heads
    adapters = finetune in ("lora", "qlora")
    fp32_weight_norm = model.family in FP32_WEIGHT_NORM_FAMILIES
    # RMSNorm on q and k (before RoPE; Qwen3 and Gemma 3 per head, OLMo 2 over the whole projection): pow()
    # saves an fp32 copy of each projection's output, and the weight mul saves its input, cast back to the
    # compute dtype (Qwen3) or still fp32 (Gemma, OLMo: the weight multiplies in fp32); nothing more when the
    # norm weight is frozen. Measured on one H200, Qwen3-0.6B amp-bf16 mb=16 s=2048: 15.9 GiB over the model
    # without it; this term gives 15.75 GiB. The Gemma/OLMo bytes follow the autograd graph (CPU probe).
    qk_norm = 0.0
    if shape.qk_norm != "none":
        qk_norm = (4 + (0 if adapters else (4 if fp32_weight_norm else c))) * (hq + kvd)
    # Beyond two pre-norms: Gemma's post-attention and post-feedforward norms each save an fp32 copy of
    # their input and the fp32 normed tensor; norms that multiply their weight in fp32 (Gemma, gpt-oss, OLMo)
    # save the fp32 normed tensor instead of a compute-dtype one; OLMo 2 normalises after each block, so the
    # projections save the residual stream itself besides the norm's tensors.
    extra_norms = (shape.norms_per_layer - 2) * 8 * h
    if model.family == "olmo2":
        extra_norms += 2 * c * h
    elif fp32_weight_norm and not pb.autocast and r == 2:
        extra_norms += 2 * 2 * h  # the two pre-norms' fp32 normed tensors (the post-norms' are counted above)
    # attention: SDPA saves q, k, v, out and the logsumexp; eager attention (gpt-oss) saves q, the
    # repeated k and v, out, and the softmax probabilities (one extra column for the sinks) per token;
    # a sliding-window layer longer than its window gets an explicit mask, which SDPA converts to a
    # compute-dtype bias of seq x seq per sequence and saves for backward (mean over the layers)
    window_mask = 0.0
    if shape.sliding_window is not None and not shape.eager and seq_len >= shape.sliding_window:
        window_mask = c * seq_len * shape.sliding_layers / model.num_layers
    mlp_width = moe_mlp_width(model) / tp
    if model.family == "gpt2":
        ln_out = 2 * h if pb.autocast else c * h
        # python gelu_new saves its input (pow), tanh out, 0.5*x, 1+tanh, and its output (c_proj);
        # under autocast pow runs in fp32, so the input cast, tanh and 1+tanh are fp32 and the
        # bf16 c_fc output is not saved at all
        gelu = (4 + 4 + 2 + 4 + 2) * inter if pb.autocast else 5 * c * inter
        # ln inputs, ln outputs (casts), fused qkv buffer, attn out, residual-dropout masks and output
        return 2 * r * h + 2 * ln_out + 3 * c * h + c * h + 2 * h + c * h / 2 + gelu + lse
    if adapters:
        # frozen base: weights' grads not needed, so norm outputs and linear inputs are saved only
        # through peft's fp32 casts of each adapter input (autocast_adapter_dtype=True).
        norm = 4 * h  # the fp32 copy saved by pow()
        attn_in = 3 * 4 * h
        mlp_in = 2 * 4 * h
        attn = c * hq + 2 * c * kvd + c * hq + 4 * hq
        if shape.eager:
            attn = 4 * c * hq + 4 * hq + heads * (seq_len + shape.sinks) * c
            lse = 8 * heads if shape.sinks else 0.0
        mlp = 3 * c * mlp_width + 4 * mlp_width + moe_dispatch_bytes(model, c) / tp
        small = 7 * 4 * rank
        return 2 * norm + attn_in + mlp_in + attn + mlp + small + lse + qk_norm + extra_norms + window_mask
    if pb.autocast:
        # residual fp32 (saved by pow), fp32 normed (saved by weight mul), one bf16 cast per consumer linear
        norm1 = 4 * h + 4 * h + 3 * 2 * h
        norm2 = 4 * h + 4 * h + 2 * 2 * h
    else:
        # x.to(fp32) copy (bf16 only), the normed input of the weight mul, its output (saved by linears)
        fp32_copy = 4 * h if r == 2 else 0
        norm1 = norm2 = (fp32_copy + r * h + c * h) if r == 2 else (r * h + r * h + c * h)
    attn = 2 * c * hq + 2 * c * kvd  # q, k (after RoPE), v, out (flash output is already BSHD)
    if shape.eager:
        # q, repeated k and v, out; the probabilities (+ the sink column); max()'s int64 indices (sinks)
        attn = 4 * c * hq + heads * (seq_len + shape.sinks) * c
        lse = 8 * heads if shape.sinks else 0.0
    elif precision == "fp32" and model.num_kv_heads != model.num_attention_heads:
        # fp32 + GQA: flash lacks fp32, efficient lacks GQA -> SDPA math: scaled q/k, repeated k/v,
        # the softmax probabilities (seq^2) and a contiguous copy of the output
        attn = 4 * c * hq + c * hq + 4 * heads * seq_len
    # gate out, silu out, up out, product (of every routed expert a token visits), plus an MoE's dispatch
    mlp = _mlp_act_factor(model) * c * mlp_width + moe_dispatch_bytes(model, c) / tp
    return norm1 + norm2 + attn + mlp + lse + qk_norm + extra_norms + window_mask


# Families whose RMSNorm multiplies its weight in fp32 and casts after (transformers' Gemma, gpt-oss, OLMo 2)
FP32_WEIGHT_NORM_FAMILIES = frozenset({"gemma2", "gemma3_text", "gpt_oss", "olmo2"})


def moe_mlp_width(model: ModelConfig) -> float:
    """MLP intermediate elements one token produces in the mean layer: intermediate_size in a dense layer;
    in a sparse layer the experts it visits (top-k x expert width) plus the shared experts."""
    if model.num_experts <= 1:
        return float(model.intermediate_size)
    moe = model.moe
    expert = moe.expert_intermediate_size if moe else model.intermediate_size
    sparse = model.experts_per_token * expert + (moe.shared_intermediate_size if moe else 0)
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


@dataclass(frozen=True)
class _Moment:
    name: str
    parts: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def reserved_overhead(cal: MemoryCalibration, mode: str) -> float:
    """Cached-but-unallocated bytes per allocated byte at the peak, for the allocator the workers run."""
    table = cal.expandable_overhead if cal.allocator == "expandable-segments" else cal.reserved_overhead
    return table.get(mode, table.get("single", 0.06))


def limit_bytes(gpu: GpuSpec, headroom: float) -> int:
    """What a plan may need on ``gpu``: its usable memory less the headroom."""
    return int(usable_bytes(gpu) * (1 - headroom))


def _finish(moments: list[_Moment], mode: str, gpu: GpuSpec, gpu_count: int, cal: MemoryCalibration,
            extra_cached: float = 0.0, headroom: float | None = None) -> MemoryEstimate:
    """``extra_cached``: bytes the allocator keeps cached beyond the proportional overhead (e.g. the
    blocks a growing KV cache leaves behind). ``headroom``: None is the calibration's default."""
    peak = max(moments, key=lambda m: m.total)
    allocated = round_block(peak.total + cal.workspace_bytes)
    reserved = round_block(allocated * (1 + reserved_overhead(cal, mode)) + extra_cached)
    outside = cal.cuda_context_bytes + (cal.nccl_bytes if gpu_count > 1 else 0)
    total = reserved + outside
    usable = usable_bytes(gpu)
    required = int(allocated * (1 + cal.pressure_slack)) + outside
    room = cal.plan_headroom if headroom is None else headroom
    breakdown = {k: int(v) for k, v in peak.parts.items() if v > 0}
    breakdown["cublas_workspaces"] = cal.workspace_bytes
    breakdown["cuda_context"] = cal.cuda_context_bytes
    if gpu_count > 1:
        breakdown["nccl"] = cal.nccl_bytes
    breakdown["allocator_cache"] = reserved - allocated
    # model_construct: every field is computed here from validated inputs, and validating thousands of
    # these per plan() was a third of the planner's time
    return MemoryEstimate.model_construct(
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        total_bytes=total,
        usable_bytes=usable,
        required_bytes=required,
        fits=required <= limit_bytes(gpu, room),
        headroom=room,
        limit_bytes=limit_bytes(gpu, room),
        peak_moment=peak.name,
        breakdown=breakdown,
    )


def train_memory(model: ModelConfig, strategy: KnobsLike, seq_len: int, gpu: GpuSpec,
                 cal: MemoryCalibration, pc: ParamCount | None = None, headroom: float | None = None) -> MemoryEstimate:
    """Peak memory per GPU for one training configuration."""
    moments, mode = train_moments(model, strategy, seq_len, cal, pc)
    return _finish(moments, mode, gpu, strategy.gpu_count, cal, headroom=headroom)


def train_moments(model: ModelConfig, strategy: KnobsLike, seq_len: int, cal: MemoryCalibration,
                  pc: ParamCount | None = None) -> tuple[list[_Moment], str]:
    """The candidate peak moments (component -> bytes) and the allocator mode."""
    pc = pc or count_params(model)
    pb = PRECISION_BYTES[strategy.precision]
    tp, pp, dp = strategy.tensor_parallel, strategy.pipeline_parallel, strategy.data_parallel
    mb = strategy.micro_batch
    tokens = mb * seq_len
    layers_here = math.ceil(model.num_layers / pp)
    h, v = model.hidden_size, model.vocab_size

    # parameters held by this rank before data-parallel sharding
    emb = pc.embedding if pp == 1 else max(pc.embedding, pc.lm_head or pc.embedding)
    head = pc.lm_head if pp == 1 else 0
    layer_params = layers_here * pc.per_layer
    local_params = (layer_params + emb + head + h) / tp
    linear_params = (layers_here * _linear_per_layer(model, pc) + (pc.lm_head or pc.embedding)) / tp

    ft = strategy.finetune
    sharding = strategy.sharding
    if ft in ("lora", "qlora"):
        trainable = lora_params_per_layer(model, strategy.lora_rank) * layers_here / tp
        t_bytes = 4  # peft upcasts bf16 adapters to fp32 (autocast_adapter_dtype=True)
        if ft == "qlora":
            frozen_linear = layers_here * _nf4_linear_per_layer(model, pc) / tp
            weights = frozen_linear * QLORA_NF4_BYTES + (local_params - frozen_linear) * 2
        else:
            weights = local_params * pb.param
        weights += trainable * t_bytes
        grads = trainable * t_bytes
        states, temp = _optimizer_bytes(strategy.optimizer, trainable, t_bytes,
                                        2 * h * model.intermediate_size / tp)
        autocast_copies = linear_params * 2 if pb.autocast else 0.0
        lm_grad = 0.0
    else:
        trainable = local_params
        weights = local_params * pb.param
        grads = local_params * pb.grad
        states, temp = _optimizer_bytes(strategy.optimizer, trainable, pb.state, max(pc.embedding, pc.lm_head) / tp)
        autocast_copies = linear_params * 2 if pb.autocast else 0.0
        lm_grad = (pc.lm_head or pc.embedding) / tp * pb.grad

    # data-parallel sharding (ZeRO stages / FSDP2)
    extra: dict[str, float] = {}
    fsdp_like = sharding in ("fsdp", "fsdp-grad-op") and dp > 1
    if sharding == "ddp" and dp > 1:
        extra["ddp_buckets"] = grads  # gradient_as_bucket_view=False: a flat copy of every grad
    if sharding == "zero1" and dp > 1:
        states, temp = states / dp, temp / dp
        extra["ddp_buckets"] = grads
    if fsdp_like:
        unsharded_b = 2 if strategy.precision in ("amp-bf16", "amp-fp16", "bf16", "fp8") else pb.param
        reduce_b = 4 if strategy.precision in ("amp-bf16", "amp-fp16", "fp32") else pb.grad
        weights, grads, states, temp = weights / dp, grads / dp, states / dp, temp / dp
        lm_grad = lm_grad / dp
        autocast_copies = 0.0  # FSDP2's MixedPrecisionPolicy casts instead of autocast
        unit = pc.per_layer / tp * unsharded_b
        root = (pc.embedding + pc.lm_head + h) / tp * unsharded_b
        extra["fsdp_root_unsharded"] = root
        if sharding == "fsdp":
            extra["fsdp_gathered_units"] = 2 * unit
        else:
            extra["fsdp_gathered_units"] = layers_here * unit  # kept unsharded from forward to backward
        extra["fsdp_grad_buffers"] = pc.per_layer / tp * (unsharded_b + reduce_b) if ft == "full" else 0.0
        act_precision = "bf16" if strategy.precision in ("amp-bf16", "amp-fp16") else strategy.precision
    else:
        act_precision = strategy.precision

    per_tok_layer = layer_activation_bytes_per_token(model, act_precision, ft, strategy.lora_rank, tp, seq_len)
    per_tok_layer *= cal.activation_scale
    act_bp = PRECISION_BYTES[act_precision]
    final_norm = (4 * h if act_bp.residual == 2 else 0) + 2 * act_bp.residual * h
    embed_out = act_bp.residual * h if model.family == "gpt2" else 0.0
    if strategy.activation_checkpointing:
        saved = tokens * (layers_here * act_bp.residual * h + final_norm + embed_out)
        recompute = tokens * per_tok_layer * (1 + cal.backward_working_layers)
    else:
        saved = tokens * (layers_here * per_tok_layer + final_norm + embed_out)
        recompute = tokens * per_tok_layer * cal.backward_working_layers
    # logits: lm_head output (compute dtype) -> .float() copy -> log_softmax (saved) -> grads
    lb = act_bp.compute
    bsv = tokens * v / tp * cal.logits_scale
    logits_fwd = bsv * (lb + (4 if lb != 4 else 0) + 4)
    logits_bwd = bsv * 12
    logits_peak = max(logits_fwd, logits_bwd)
    accum_grads = grads if strategy.grad_accum > 1 else 0.0
    # at the end of backward every gradient exists; one layer's activations (recomputed when
    # checkpointing) and its backward temporaries remain
    backward_end_acts = recompute + (saved if strategy.activation_checkpointing else tokens * per_tok_layer)

    base = {"weights": weights, "optimizer_states": states, **extra}
    # autocast's bf16 weight copies live as long as autograd saves them: every layer's until its
    # backward (only lm_head's when checkpointing: recomputation re-casts one layer at a time)
    copies_start, copies_end = 0.0, 0.0
    if autocast_copies:
        head_copy = (pc.lm_head or pc.embedding) / tp * 2
        layer_copy = _linear_per_layer(model, pc) / tp * 2
        copies_start = head_copy + (layer_copy if strategy.activation_checkpointing else autocast_copies - head_copy)
        copies_end = layer_copy
    moments = [
        _Moment("backward start", {**base, "autocast_weight_copies": copies_start, "gradients": accum_grads,
                                   "activations": saved, "logits_loss": logits_peak}),
        _Moment("lm_head grad", {**base, "autocast_weight_copies": copies_start,
                                 "gradients": max(accum_grads, lm_grad * (2 if pb.autocast else 1)),
                                 "activations": saved, "logits_loss": bsv * (lb + 4)}),
        _Moment("backward end", {**base, "autocast_weight_copies": copies_end, "gradients": grads,
                                 "activations": backward_end_acts}),
        _Moment("optimizer step", {"weights": weights, "gradients": grads, "optimizer_states": states,
                                   "optimizer_temporaries": temp,
                                   **{k: val for k, val in extra.items() if k == "ddp_buckets"}}),
    ]
    mode = sharding if fsdp_like else ("ddp" if dp > 1 else "single")
    if strategy.activation_checkpointing and mode == "single":
        mode = "single-ckpt"  # recomputation churns the allocator's blocks: more cached, unused memory
    return moments, mode


MemoryLines = list[tuple[float, float]]


def memory_lines(model: ModelConfig, knobs: Knobs, seq_len: int, cal: MemoryCalibration,
                 pc: ParamCount | None = None) -> MemoryLines:
    """Every peak moment as (bytes at micro_batch 1, bytes per extra sequence): memory is linear in
    the micro-batch, so the search needs only these two numbers per moment, for any GPU."""
    one, _ = train_moments(model, knobs.with_micro_batch(1), seq_len, cal, pc)
    two, _ = train_moments(model, knobs.with_micro_batch(2), seq_len, cal, pc)
    return [(a.total, b.total - a.total) for a, b in zip(one, two, strict=True)]


def max_micro_batch(lines: MemoryLines, gpu_count: int, gpu: GpuSpec, cal: MemoryCalibration,
                    candidates: list[int], headroom: float) -> int | None:
    """Largest micro-batch in ``candidates`` that fits within the usable memory less ``headroom``
    (the same verdict as ``train_memory(...).fits``), without building estimates; None if none does."""
    outside = cal.cuda_context_bytes + (cal.nccl_bytes if gpu_count > 1 else 0)
    limit = limit_bytes(gpu, headroom)

    def cap(limit: float) -> float:
        """Largest (real-valued) micro-batch whose peak stays within ``limit`` (same rounding as _finish)."""
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
    """What QLoRA stores in NF4 per layer: the linear layers. A mixture of experts keeps its experts
    in fused 3-D weights (transformers 5), which the workers' NF4 pass leaves in bf16."""
    linear = _linear_per_layer(model, pc)
    if model.num_experts > 1:
        linear -= 3 * model.hidden_size * model.intermediate_size * model.num_experts
    return max(0.0, linear)


def _linear_per_layer(model: ModelConfig, pc: ParamCount) -> float:
    h = model.hidden_size
    if model.family == "gpt2":
        return 4 * h * h + 2 * h * model.intermediate_size
    return pc.per_layer - 2 * h


def cached_layer_tokens(model: ModelConfig, context: int) -> int:
    """Tokens the cache holds summed over layers: a sliding-window layer keeps only its last window - 1
    (transformers' DynamicSlidingWindowLayer), the others the whole context."""
    shape = model.attn
    if shape.sliding_window is None:
        return model.num_layers * context
    kept = min(context, shape.sliding_window - 1)
    return (model.num_layers - shape.sliding_layers) * context + shape.sliding_layers * kept


def kv_cache_bytes(model: ModelConfig, batch: int, context: int, bytes_per: int = 2) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x context x batch x bytes (sliding-window layers: the
    window, not the context). MLA caches the compressed latent and the shared RoPE key instead:
    (kv_lora_rank + qk_rope_head_dim) per layer."""
    tokens = cached_layer_tokens(model, context)
    if model.mla is not None:
        return (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) * tokens * batch * bytes_per
    return 2 * model.num_kv_heads * model.head_size * tokens * batch * bytes_per


def mla_expanded_kv_bytes(model: ModelConfig, batch: int, context: int, bytes_per: int = 2) -> int:
    """Per-head keys and values of one layer that transformers' MLA expands from its latent cache on every
    forward (heads x (qk_nope + qk_rope + v_head_dim) per token); 0 for other attention."""
    if model.mla is None:
        return 0
    mla = model.mla
    width = model.num_attention_heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim)
    return width * context * batch * bytes_per


def prefill_attention_bytes(model: ModelConfig, batch: int, prompt: int, c: int = 2) -> float:
    """Transient seq^2 tensors of one prefill forward. Eager attention (gpt-oss): the masked scores, the
    scores with the sink column and their softmax are alive at once, beside the float masks transformers
    builds (one per attention type). SDPA with a sliding window the prompt reaches: the boolean mask and
    the compute-dtype bias SDPA converts it to. Plain causal SDPA (flash): none."""
    shape = model.attn
    square = batch * prompt * prompt
    if shape.eager:
        masks = 2 if shape.sliding_window is not None else 1
        return 3 * model.num_attention_heads * batch * prompt * (prompt + 1) * c + masks * square * c
    if shape.sliding_window is not None and prompt >= shape.sliding_window:
        return square * (1 + c)
    return 0.0


def infer_memory(model: ModelConfig, strategy: Strategy, prompt_tokens: int, output_tokens: int, gpu: GpuSpec,
                 cal: MemoryCalibration, pc: ParamCount | None = None, headroom: float | None = None, *,
                 decoder: str | None = None) -> MemoryEstimate:
    """Peak memory per GPU of the workers' decoder (``decoder``: "graph" or "generate"; None: the workers'
    rule): ``generate()`` with the default DynamicCache, or workers/decode.py's preallocated static cache."""
    graph = decoder_for(model, gpu.vendor, strategy.weights, decoder) == "graph"
    pc = pc or count_params(model)
    tp = strategy.tensor_parallel
    b = strategy.batch
    h, _, _, inter = _dims(model)
    wb = WEIGHT_BYTES[strategy.weights]
    linear = model.num_layers * _linear_per_layer(model, pc)
    other = pc.total - linear
    weights = (linear * wb + other * 2) / tp
    ctx = prompt_tokens + output_tokens
    kv_full = kv_cache_bytes(model, b, ctx) / tp
    kv_prompt = kv_cache_bytes(model, b, prompt_tokens) / tp
    # one layer's torch.cat copy of the cache, and (MLA) the per-head K/V expanded for the layer being run
    kv_layer = kv_full / model.num_layers + mla_expanded_kv_bytes(model, b, ctx) / tp
    if graph:  # the static cache is allocated whole before the prefill
        kv_prompt = kv_full
    elif model.attn.sliding_window is not None and model.mla is None:
        # DynamicSlidingWindowLayer keeps a view of the prefill's torch.cat: every sliding layer holds the
        # whole prompt's storage until its first decode step (gemma-3-4b b8 p4096: +2.6 GiB over the window)
        kv_prompt = 2 * model.num_kv_heads * model.head_size * model.num_layers * prompt_tokens * b * 2 / tp
    kv_prefill = kv_prompt + mla_expanded_kv_bytes(model, b, prompt_tokens) / tp
    t = b * prompt_tokens
    # prefill transients of one layer: MLP (act, up, product) or the norm's fp32 temporaries, plus
    # the hidden states alive meanwhile (the caller's layer input, the residual, the norm output)
    # bytes per MLP-intermediate element alive at once: 6 in bf16 (act, up, product); fp8's dynamic
    # activation quantization adds fp32 copies of down_proj's input (x.float() / scale, clamp)
    mlp_bytes = cal.prefill_mlp_bytes.get(strategy.weights, 6.0)
    if model.family == "gpt2":
        mlp_bytes += 2.0  # python gelu_new keeps c_fc's output, 0.5*x and two chain temporaries alive
    mlp_work = mlp_bytes * inter / tp
    if model.num_experts > 1:
        # routed experts: each routed copy of the hidden state, the experts' gate_up / act / product, the
        # weighted output (grouped GEMMs hold them for all routed copies at once; a per-expert loop holds one
        # expert's share, and its one_hot mask of int64 over (experts x top-k) per token)
        moe = model.moe
        width = moe.expert_intermediate_size if moe else model.intermediate_size
        k = model.experts_per_token
        if moe is not None and moe.expert_loop:
            mlp_work = k * model.num_experts * 8 + 2 * h + 2 * k * (2 * h + 4 * width) / model.num_experts
        else:
            mlp_work = k * 2 * (2 * h + 3 * width) / tp
        if moe is not None and moe.shared_intermediate_size:
            mlp_work += mlp_bytes * moe.shared_intermediate_size / tp
    prefill_work = t * max(mlp_work, 14 * h) + t * 2 * h * 3 + prefill_attention_bytes(model, b, prompt_tokens) / tp
    logits = b * model.vocab_size * (2 + 4 + 4)
    moments = [
        _Moment("prefill", {"weights": weights, "kv_cache": kv_prefill, "prefill_activations": prefill_work,
                            "logits": logits}),
        _Moment("decode end", {"weights": weights, "kv_cache": kv_full + kv_layer, "logits": logits}),
    ]
    # DynamicCache grows by torch.cat, so every step frees blocks one token too small to reuse
    fragmentation = 0.0 if graph else cal.kv_fragmentation * kv_full
    return _finish(moments, "infer", gpu, strategy.gpu_count, cal, extra_cached=fragmentation, headroom=headroom)
