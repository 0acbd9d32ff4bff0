"""Bytes per GPU (most loaded rank) that a training or inference run really allocates.

The model follows what PyTorch and Hugging Face transformers do, tensor by tensor:

* Training peaks at one of four moments (planner.memory_train computes each; the largest is the peak).
  Inference peaks at prefill or at the end of decoding (:func:`infer_memory`, here).
* Saved activations are counted per token per layer from the autograd graph of a Llama block
  with SDPA flash/efficient attention (no seq^2), or of a GPT-2 block, for each precision
  (planner.activations). The bytes of each precision's tensors are planner.strategies'.
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
from planner.decoder import decoder_for, moe_decode_kernel
from planner.types import MemoryEstimate, Strategy, construct

BLOCK = 2 * MIB


# Bytes per weight for inference weights, scale overhead included (torchao layouts):
# int8 weight-only: per-output-channel bf16 scale; fp8: per-row fp32 scale; int4: group 128, bf16 scale+zero.
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 4 / 128}


def sparse_layer_count(model: ModelConfig) -> int:
    """Layers whose MLP is a mixture of experts (every layer of a MoE model but its dense ones)."""
    return model.num_layers - (model.moe.dense_layers if model.moe else 0)


def expert_width(model: ModelConfig) -> int:
    """One routed expert's intermediate width (a model without MoE shapes: its intermediate_size)."""
    return model.expert_width


def expert_weight_params(model: ModelConfig) -> int:
    """The routed experts' gate_up and down projection weights over every sparse layer (not their biases):
    what a checkpoint with StoredQuantization.weights == 'experts' (gpt-oss's MXFP4) stores quantized."""
    if model.num_experts <= 1:
        return 0
    return sparse_layer_count(model) * model.num_experts * 3 * model.hidden_size * expert_width(model)


def stored_bytes_per_param(model: ModelConfig, weights: str) -> float:
    """Bytes per quantized weight of the checkpoint's own format (``weights`` 'mxfp4'), block scales included."""
    q = model.quantization
    if q is None or q.method != weights:
        raise ValueError(f"{model.id} is not stored as {weights}")
    return q.bits_per_param / 8


def resident_weight_bytes(model: ModelConfig, pc: ParamCount, weights: str) -> float:
    """Bytes the model's weights occupy on the GPUs (all tensor-parallel ranks together). 'mxfp4': the
    checkpoint as published, its experts at the stored bits and everything else bf16; otherwise the decoder's
    linear layers at ``weights`` (torchao) and the rest (embeddings, norms, biases) bf16, or fp32 with fp32 weights."""
    if weights == "mxfp4":
        experts = expert_weight_params(model)
        return experts * stored_bytes_per_param(model, weights) + (pc.total - experts) * 2
    linear = torchao_linear_params(model, pc)
    other = pc.total - linear
    return linear * WEIGHT_BYTES[weights] + other * (4 if weights == "fp32" else 2)  # fp32 (a CPU): all of it


def torchao_linear_params(model: ModelConfig, pc: ParamCount) -> float:
    """The weights the workers' torchao passes quantize (int8/fp8 inference, QLoRA's NF4): the decoder's
    ``nn.Linear`` layers. transformers 5 keeps a mixture of experts' routed experts in fused 3-D parameters
    (Qwen3MoeExperts, MixtralExperts, GptOssExperts, DeepseekV3Experts), not ``nn.Linear``, so they stay bf16."""
    return max(0.0, model.num_layers * linear_params_per_layer(model, pc) - expert_weight_params(model))


def gathered_expert_bytes(model: ModelConfig, batch: int, weights: str, *, batched_mm: bool) -> float:
    """Bytes of routed-expert weights that a decode step of ``generate()`` copies in one sparse layer.

    On a GPU, generate() switches transformers 5's fused experts (every MoE family with
    ``@use_experts_implementation``) from grouped GEMMs to ``batched_mm`` for the decode steps, which gathers
    each (token, expert) pair's gate_up and down weights (``gate_up_proj[expert_ids]``) before its bmm:
    batch x top-k experts' weights, in the compute dtype (torchao leaves the fused experts bf16). The gathered
    gate_up is still referenced while the down weights are gathered, so both are alive at once. 0 for dense
    models, MXFP4 checkpoints (their triton kernels read the experts in place) and unless ``batched_mm``
    (planner.decoder.moe_decode_kernel: generate() on a GPU below two visits per expert per step).
    H200, gpt-oss-20b b32 (bench/results/h200_moe_infer.json): 6.4 GB above the weights and the cache."""
    if model.num_experts <= 1 or not batched_mm or weights == "mxfp4":
        return 0.0
    moe = model.moe
    width = expert_width(model)
    per_pair = 3 * model.hidden_size * width + (2 * width + model.hidden_size if moe and moe.expert_bias else 0)
    return float(batch * model.experts_per_token * per_pair * 2)


def runtime_model(model: ModelConfig, weights: str) -> ModelConfig:
    """The model as transformers runs it with ``weights``: its MXFP4 path (Mxfp4GptOssExperts) routes the
    experts through grouped triton matmuls (matmul_ogs), so gpt-oss's per-expert Python loop is gone."""
    moe = model.moe
    if weights == "mxfp4" and moe is not None and moe.expert_loop:
        return model.model_copy(update={"moe": moe.model_copy(update={"expert_loop": False})})
    return model


APPLE_WORKING_SET = 0.75  # MPS's recommendedMaxWorkingSetSize is about 3/4 of unified memory


def usable_bytes(gpu: GpuSpec) -> int:
    """What a job can allocate: the device memory torch sees where it was measured (a little less than
    nvidia-smi's total), else the driver's total; on Apple's unified memory only the Metal working set
    (the OS and other apps share the rest)."""
    total = (gpu.torch_total_gib or gpu.memory_gib) * GIB
    return int(total * APPLE_WORKING_SET if gpu.vendor == "apple" else total)


def round_block(n: float) -> int:
    return int(math.ceil(n / BLOCK) * BLOCK)


def hidden_dims(model: ModelConfig) -> tuple[int, int, int, int]:
    hd = model.head_size
    return model.hidden_size, model.num_attention_heads * hd, model.num_kv_heads * hd, model.intermediate_size


@dataclass(frozen=True)
class Moment:
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


def finish_estimate(moments: list[Moment], mode: str, gpu: GpuSpec, gpu_count: int, cal: MemoryCalibration,
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
    # construct (no validation): every field is computed here from validated inputs, and validating
    # thousands of these per plan() was a third of the planner's time
    return construct(MemoryEstimate,
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


def linear_params_per_layer(model: ModelConfig, pc: ParamCount) -> float:
    h = model.hidden_size
    if model.family == "gpt2":
        return 4 * h * h + 2 * h * model.intermediate_size
    return pc.per_layer - 2 * h


def cached_layer_tokens(model: ModelConfig, context: int, *, full_length: bool = False) -> int:
    """Tokens the cache holds summed over layers: a sliding-window layer keeps only its last window - 1
    (transformers' DynamicSlidingWindowLayer), the others the whole context. ``full_length``: every layer
    the whole context, as the graph decoder's static cache holds it (workers/infer/decode.py: sliding layers get a
    full-length buffer, the window is only in the mask)."""
    shape = model.attn
    if shape.sliding_window is None or full_length:
        return model.num_layers * context
    kept = min(context, shape.sliding_window - 1)
    return (model.num_layers - shape.sliding_layers) * context + shape.sliding_layers * kept


def kv_cache_bytes(model: ModelConfig, batch: int, context: int, bytes_per: int = 2, *,
                   full_length: bool = False) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x context x batch x bytes (sliding-window layers: the
    window, not the context, unless ``full_length``: the graph decoder's static cache). MLA caches the
    compressed latent and the shared RoPE key instead: (kv_lora_rank + qk_rope_head_dim) per layer."""
    tokens = cached_layer_tokens(model, context, full_length=full_length)
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


def prefill_attention_bytes(model: ModelConfig, batch: int, prompt: int, c: int = 2, *,
                            keys: int | None = None) -> float:
    """Transient prompt x keys tensors of one prefill forward. Eager attention (gpt-oss): the masked scores,
    the scores with the sink column and their softmax are alive at once, beside the float masks transformers
    builds (one per attention type). SDPA with a sliding window the keys reach: the boolean mask and the
    compute-dtype bias SDPA converts it to. Plain causal SDPA (flash): none. ``keys``: the key length, the
    prompt's (generate()'s growing cache, the default) or the graph decoder's whole static cache (prompt +
    output tokens), which the sliding layers' mask spans; its full-attention layers still run causal SDPA
    without a mask (transformers skips it when the cache starts empty and no row is padded)."""
    shape = model.attn
    kv = prompt if keys is None else keys
    square = batch * prompt * kv
    if shape.eager:
        masks = 2 if shape.sliding_window is not None else 1
        return 3 * model.num_attention_heads * batch * prompt * (kv + 1) * c + masks * square * c
    if shape.sliding_window is not None and kv >= shape.sliding_window:
        return square * (1 + c)
    return 0.0


def infer_memory(model: ModelConfig, strategy: Strategy, prompt_tokens: int, output_tokens: int, gpu: GpuSpec,
                 cal: MemoryCalibration, pc: ParamCount | None = None, headroom: float | None = None, *,
                 decoder: str | None = None, moe_kernel: str | None = None) -> MemoryEstimate:
    """Peak memory per GPU of the workers' decoder (``decoder``: "graph" or "generate"; None: the workers'
    rule): ``generate()`` with the default DynamicCache, or workers/infer/decode.py's preallocated static cache.
    ``moe_kernel``: a mixture of experts' decode kernel ("batched_mm" or "grouped_mm"); None: the workers' rule
    (planner.decoder.moe_decode_kernel)."""
    graph = decoder_for(model, gpu.vendor, strategy.weights, decoder, gpu.compute_capability) == "graph"
    pc = pc or count_params(model)
    model = runtime_model(model, strategy.weights)
    tp = strategy.tensor_parallel
    b = strategy.batch
    h, _, _, inter = hidden_dims(model)
    weights = resident_weight_bytes(model, pc, strategy.weights) / tp
    ctx = prompt_tokens + output_tokens
    # the graph decoder's static cache holds every layer's whole context, sliding layers too
    kv_full = kv_cache_bytes(model, b, ctx, full_length=graph) / tp
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
        width = expert_width(model)
        k = model.experts_per_token
        if moe is not None and moe.expert_loop:
            mlp_work = k * model.num_experts * 8 + 2 * h + 2 * k * (2 * h + 4 * width) / model.num_experts
        else:
            mlp_work = k * 2 * (2 * h + 3 * width) / tp
        if moe is not None and moe.shared_intermediate_size:
            mlp_work += mlp_bytes * moe.shared_intermediate_size / tp
    # (the graph decoder's masks of a decode step, rows x cache length per attention type, are kilobytes)
    square = prefill_attention_bytes(model, b, prompt_tokens, keys=ctx if graph else None) / tp
    prefill_work = t * max(mlp_work, 14 * h) + t * 2 * h * 3 + square
    logits = b * model.vocab_size * (2 + 4 + 4)
    kernel = moe_decode_kernel(model, gpu.vendor, strategy.weights, b, graph=graph, given=moe_kernel)
    moments = [
        Moment("prefill", {"weights": weights, "kv_cache": kv_prefill, "prefill_activations": prefill_work,
                            "logits": logits}),
        Moment("decode end", {"weights": weights, "kv_cache": kv_full + kv_layer, "logits": logits,
                              "gathered_experts": gathered_expert_bytes(model, b, strategy.weights,
                                                                        batched_mm=kernel == "batched_mm") / tp}),
    ]
    # DynamicCache grows by torch.cat, so every step frees blocks one token too small to reuse
    fragmentation = 0.0 if graph else cal.kv_fragmentation * kv_full
    return finish_estimate(moments, "infer", gpu, strategy.gpu_count, cal, extra_cached=fragmentation,
                           headroom=headroom)
