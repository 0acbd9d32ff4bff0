"""How fast a placement runs: a roofline with calibrated efficiency factors.

Here: what both tasks share (peak rates, matmul parameters, attention FLOPs, per-layer kernel weights) and
inference, where prefill is compute bound and decode is bandwidth bound (weights + KV cache per step) plus
the decoder's per-layer overhead. Training's step is planner.throughput_train's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig
from planner.calibration import ThroughputCalibration
from planner.decoder import decoder_for, moe_decode_kernel
from planner.memory import (
    WEIGHT_BYTES,
    cached_layer_tokens,
    expert_width,
    gathered_expert_bytes,
    kv_cache_bytes,
    mla_expanded_kv_bytes,
    prefill_attention_bytes,
    runtime_model,
    sparse_layer_count,
    stored_bytes_per_param,
)
from planner.strategies import PRECISIONS
from planner.types import Strategy, ThroughputEstimate, construct


def peak_tflops(gpu: GpuSpec, precision: str) -> float:
    """Dense peak for a training precision's matmuls (its compute dtype), or a dtype's ('bf16', 'fp8'); falls back
    to the closest dtype the part has."""
    kind = PRECISIONS.get(precision)
    dtype = kind.compute_dtype if kind is not None else precision
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
    """Bytes a compiled decode step of latent attention reads beyond the cache once (workers/infer/mla_attention.py: the
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


def graph_prefill_expert_efficiency(model: ModelConfig, tokens: int, cal: ThroughputCalibration) -> float:
    """The share of peak the prompt pass's routed experts reach as eager grouped GEMMs: more as each expert's
    matrices widen (its intermediate width w) and as each gets more rows (tokens x top-k / experts), by two
    half-saturation points (bench/probes/prefill_probe.py --fit: gpt-oss-20b, Qwen1.5-MoE, Mixtral; Qwen3-30B-A3B
    held out)."""
    width = expert_width(model)
    rows = tokens * model.experts_per_token / max(1, model.num_experts)
    return (cal.graph_prefill_expert_mfu * width / (width + cal.graph_prefill_expert_width_half)
            * rows / (rows + cal.graph_prefill_expert_rows_half))


def graph_prefill_s(model: ModelConfig, batch: int, prompt_tokens: int, keys: int, tp: int, peak: float,
                    cal: ThroughputCalibration, n: float, lm: float) -> float:
    """The compiled decoder's prompt pass (workers/infer/decode.py: eager, a static cache of ``keys`` positions), before
    the attention extras every prefill pays (eager scores, sliding masks). Its own fit, not generate()'s curve
    (bench/probes/prefill_probe.py, timed by the decoder's CUDA events): the lm head runs on each row's last position
    only (``logits_to_keep=1``), the matmuls reach more of the peak as the hidden size grows, a mixture's routed experts
    run as eager grouped GEMMs at their own efficiency, and eager PyTorch launches set a floor per layer."""
    h = model.hidden_size
    experts = decode_expert_weight_params(model, 1)  # the k routed experts' matmul params per token, every layer
    dense = batch * prompt_tokens * (2 * (n - lm - experts) + attention_flops_per_token(model, prompt_tokens, keys))
    flops_time = ((dense + 2 * batch * lm) / (cal.graph_prefill_mfu * h / (h + cal.graph_prefill_hidden_half))
                  + 2 * batch * prompt_tokens * experts / graph_prefill_expert_efficiency(model, batch * prompt_tokens,
                                                                                         cal)) / (tp * peak)
    return max(flops_time, model.num_layers * cal.graph_prefill_layer_s)


def graph_decode_keys(model: ModelConfig, rows: int, ctx: int) -> float:
    """Cached positions the compiled decode step's packed grouped-query attention walks (workers/infer/gqa_attention.py:
    each KV head's query heads are its query rows), summed over its blocks (rows x KV heads) and layers, each
    walking the whole static cache. Its cost per key beyond the bytes (ThroughputCalibration.graph_decode_key_s) is
    cuDNN's flash kernel's: at head_dim 64 it reads the cache at ~1.4 TB/s, not the weights' 3.4
    (bench/workers/decode_step_profile.py, on packed models only). The other forms run as other kernels' shapes, not
    measured this way: 0 for one query head per KV head, a single KV head, latent (MLA) and eager attention."""
    kv, heads = model.num_kv_heads, model.num_attention_heads
    if model.mla is not None or model.attn.eager or not 1 < kv < heads:
        return 0.0
    return float(rows * kv * ctx * model.num_layers)


@dataclass(frozen=True)
class _Decode:
    """One inference placement's batch as the workers' decoder runs it on one replica."""

    model: ModelConfig  # as transformers runs it with the weights (planner.memory.runtime_model)
    gpu: GpuSpec
    cal: ThroughputCalibration
    pc: ParamCount | None
    weights: str
    batch: int
    tp: int
    prompt_tokens: int
    output_tokens: int
    graph: bool  # the compiled decoder (workers/infer/decode.py), else generate()
    kernel: str | None  # a mixture of experts' decode kernel
    n: float  # matmul params per token, lm_head included
    lm: float  # lm_head's params
    peak: float  # FLOP/s of the weights' matmuls

    @property
    def ctx(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def raw_bw(self) -> float:
        return self.gpu.memory_bandwidth_gbps * 1e9


def infer_throughput(model: ModelConfig, strategy: Strategy, prompt_tokens: int, output_tokens: int,
                     gpu: GpuSpec, cal: ThroughputCalibration, pc: ParamCount | None = None, *,
                     decoder: str | None = None, moe_kernel: str | None = None) -> ThroughputEstimate:
    """Output tokens/s of the whole placement (replicas = gpu_count / tensor_parallel).

    ``decoder``: "graph" or "generate"; None predicts what the workers run (``planner.decoder.decoder_for``).
    ``moe_kernel``: "batched_mm" or "grouped_mm" for a mixture of experts' decode steps; None: the workers' rule
    (``planner.decoder.moe_decode_kernel``).
    The H200 reference cases (bench/accuracy/measure_h200.py) time transformers' generate()."""
    tp = strategy.tensor_parallel
    replicas = max(1, strategy.gpu_count // tp)
    b = strategy.batch
    model = runtime_model(model, strategy.weights)
    n, lm = matmul_params(model, pc)
    peak = peak_tflops(gpu, "fp8" if strategy.weights == "fp8" else "bf16") * 1e12
    graph = decoder_for(model, gpu.vendor, strategy.weights, decoder, gpu.compute_capability) == "graph"
    kernel = moe_decode_kernel(model, gpu.vendor, strategy.weights, b, graph=graph, given=moe_kernel)
    d = _Decode(model, gpu, cal, pc, strategy.weights, b, tp, prompt_tokens, output_tokens, graph, kernel, n, lm,
                peak)
    prefill = _prefill_s(d)
    decode_step = _decode_step_s(d)
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


def _prefill_s(d: _Decode) -> float:
    """The prompt pass of one batch. The graph decoder's static cache: every layer holds and reads the whole
    context (workers/infer/decode.py), so a sliding layer's prefill mask spans it."""
    model, cal, b, tp, prompt_tokens = d.model, d.cal, d.batch, d.tp, d.prompt_tokens
    keys = d.ctx if d.graph else None
    h = model.hidden_size
    if d.graph:
        prefill = graph_prefill_s(model, b, prompt_tokens, d.ctx, tp, d.peak, cal, d.n, d.lm)
    else:
        work = b * prompt_tokens
        prefill_flops = b * prompt_tokens * (2 * d.n + attention_flops_per_token(model, prompt_tokens, keys)) / tp
        prefill_eff = cal.prefill_mfu * h / (h + cal.hidden_half) * work / (work + cal.tokens_half)
        prefill = prefill_flops / (d.peak * prefill_eff) + expert_loop_s(model, work, 1.0, cal)
    if model.attn.eager:
        # eager attention's prompt x (prompt + sinks) scores: scale, mask, sink concat, max, fp32 softmax, cast,
        # slice, each a separate kernel over every layer's scores (passes fitted on the gpt-oss prefills)
        scores = b * model.num_attention_heads / tp * prompt_tokens * (prompt_tokens + model.attn.sinks) * 2
        prefill += cal.prefill_score_passes * scores * model.num_layers / d.raw_bw
    else:
        # a sliding window's mask and bias (prompt x keys): written and read once per sliding layer
        square_bytes = prefill_attention_bytes(model, b, prompt_tokens, keys=keys) / tp
        prefill += (2 * square_bytes * model.attn.sliding_layers
                    / (d.raw_bw * cal.decode_bw_efficiency))
    return prefill


def _decode_weight_bytes(d: _Decode) -> tuple[float, float, float]:
    """(weight bytes a decode step reads at the decode bandwidth, routed-expert bytes the compiled step's grouped
    GEMMs read at their own, seconds of generate()'s batched_mm gathers). generate()'s batched_mm experts
    (planner.memory.gathered_expert_bytes): each (token, expert) pair's weights are gathered (read and written)
    and read again by its bmm, instead of each expert read once."""
    model, cal, b, tp, pc, lm = d.model, d.cal, d.batch, d.tp, d.pc, d.lm
    gathered = gathered_expert_bytes(model, b, d.weights, batched_mm=d.kernel == "batched_mm")
    grouped_bytes = 0.0
    gather_time = 3 * gathered * sparse_layer_count(model) / tp / (d.raw_bw * cal.decode_gather_bw_efficiency)
    if d.weights == "mxfp4":  # the checkpoint's MXFP4 experts, everything else bf16
        experts = decode_expert_weight_params(model, b)
        read = decode_weight_params(model, b, pc)
        weight_bytes = ((read - experts) * 2 + experts * stored_bytes_per_param(model, "mxfp4") + lm * 2) / tp
    else:
        wb = WEIGHT_BYTES[d.weights]
        weight_bytes = (decode_weight_params(model, b, pc) * wb + lm * (4 if d.weights == "fp32" else 2)) / tp
        if gathered:  # the routed experts are the gathers' bytes, not read once each
            weight_bytes -= decode_expert_weight_params(model, b) * wb / tp
        elif d.graph and d.kernel == "grouped_mm":
            # the compiled step's grouped GEMMs read the routed experts at their own share of the bandwidth
            grouped_bytes = decode_expert_weight_params(model, b) * wb / tp
            weight_bytes -= grouped_bytes
    return weight_bytes, grouped_bytes, gather_time


def _decode_cache_traffic(d: _Decode) -> tuple[float, float, float]:
    """(KV cache bytes a decode step moves, MLA's latent expansion bytes and flops) at the mean context."""
    model, cal, b, tp = d.model, d.cal, d.batch, d.tp
    avg_ctx = d.prompt_tokens + d.output_tokens / 2
    kv = kv_cache_bytes(model, b, int(avg_ctx)) / tp
    if d.graph:
        # the compiled step attends over the cached latents, kv_b_proj folded into the query and the output
        # (workers/infer/mla_attention.py): no expansion, the latents read once more (scores, then the weighted sum)
        expand_bytes, expand_flops = mla_absorbed_decode_bytes(model, b, d.ctx), 0.0
    else:
        expand_bytes, expand_flops = mla_decode_expand(model, b, int(avg_ctx))
    # HF's DynamicCache grows by torch.cat: every step re-reads and re-writes the cache besides
    # attention reading it, hence kv_traffic_factor passes; the static cache is written in place and
    # its attention reads the whole preallocated length, in every layer (sliding ones too)
    kv_time = (kv_cache_bytes(model, b, d.ctx, full_length=True) / tp if d.graph else kv * cal.kv_traffic_factor)
    if d.graph and model.attn.eager:
        # eager attention (gpt-oss) repeats each KV head for its query heads before its matmuls: the whole
        # static cache expanded heads / kv_heads times, written and read every step (bench/workers/graph_decode.py MoE
        # cases: the extra step time grows with the batch at this rate). SDPA models copy nothing: the workers
        # pack each KV head's query heads as its query rows (workers/infer/gqa_attention.py) since 2026-12-03
        kv_time += 2 * kv_time * (model.num_attention_heads // model.num_kv_heads)
    return kv_time, expand_bytes, expand_flops


def _decode_step_s(d: _Decode) -> float:
    """One decode step of the batch: the larger of its bytes and its flops, the decoder's fixed overhead and
    tensor parallelism's all-reduces."""
    model, cal, b, tp = d.model, d.cal, d.batch, d.tp
    weight_bytes, grouped_bytes, gather_time = _decode_weight_bytes(d)
    kv_time, expand_bytes, expand_flops = _decode_cache_traffic(d)
    bw = d.raw_bw * cal.decode_bw_efficiency
    speed = cal.quant_decode_speed.get(d.weights, 1.0)
    mem_time = ((weight_bytes / speed + kv_time + expand_bytes / tp) / bw + gather_time
                + grouped_bytes / (d.raw_bw * cal.graph_moe_expert_bw_efficiency))
    avg_ctx = d.prompt_tokens + d.output_tokens / 2
    attention = decode_attention_flops(model, int(avg_ctx), full_length=d.graph)
    compute_time = (b * (2 * d.n + attention) + expand_flops) / tp / (d.peak * cal.prefill_mfu)
    decode_step = max(mem_time, compute_time) + _decode_overhead_s(d)
    if tp > 1:
        link = d.gpu.interconnect.gbps_per_gpu / 2 * 1e9 * cal.comm_efficiency
        decode_step += 2 * model.num_layers * (b * model.hidden_size * 2 / link + 2e-5)
    return decode_step


def _decode_overhead_s(d: _Decode) -> float:
    """A decode step's fixed seconds beyond its bytes and flops."""
    model, cal, b, tp = d.model, d.cal, d.batch, d.tp
    if d.graph:
        # a replayed CUDA graph: no host work per kernel; what stays is the GPU's own cost beyond the bytes
        # read, per layer (gaps between small kernels, so by the layer's kernels: Gemma's extra norms and Qwen3's
        # q/k norms cost more; the routing's own are graph_moe_layer_s's). Fitted on the decoder's own step times
        # (bench/workers/graph_decode.py --fit, docs/lab-notes/2026-12-03-prompt-pass-and-step-apart.md);
        # a term in rows x the layers' matmul weights priced the K/V copy while the decoder made one and stays 0
        per_layer = cal.graph_decode_layer_s * layer_kernel_weight(model, routing=False)
        overhead = (model.num_layers * (per_layer + cal.graph_decode_row_layer_s * b / tp)
                    + cal.graph_decode_row_param_s * b * (d.n - d.lm) / tp + cal.graph_decode_step_s
                    + cal.graph_decode_key_s * graph_decode_keys(model, b, d.ctx) / tp)
        if d.kernel == "grouped_mm":
            # the routing's small kernels (sort, histogram, offsets, gathers, the weighted sum) and two grouped
            # GEMMs' launches per sparse layer, replayed, beyond the routed experts' bytes (read at
            # graph_moe_expert_bw_efficiency; fitted on gpt-oss-20b, Qwen1.5-MoE, Mixtral, Qwen3-30B-A3B held out)
            overhead += ((cal.graph_moe_layer_s + cal.graph_moe_pair_s * b * model.experts_per_token)
                         * sparse_layer_count(model))
        return overhead
    overhead = ((cal.decode_layer_overhead_s * model.num_layers * layer_kernel_weight(model)
                 + cal.decode_step_overhead_s) * cal.quant_layer_overhead.get(d.weights, 1.0))
    if d.kernel == "grouped_mm" and d.gpu.vendor != "cpu":
        # grouped_mm's sort, histogram, offsets, masks and two grouped GEMMs per sparse layer: host work that
        # batched_mm's gather + bmm does not issue (a CPU's fitted decode overhead already holds it)
        overhead += cal.decode_grouped_layer_s * sparse_layer_count(model)
    return overhead


def inference_split(throughput: Mapping[str, Any], strategy: Mapping[str, Any]) -> dict[str, float | None]:
    """A plan's prompt pass and decode step of one batch on one replica (what one worker times), from its
    ``throughput`` and ``strategy`` (JSON or model dumps); None for training plans."""
    breakdown = throughput.get("breakdown_s") or {}
    decode_rate = throughput.get("decode_tokens_per_s")
    prefill = breakdown.get("prefill")
    if not isinstance(decode_rate, int | float) or decode_rate <= 0 or not isinstance(prefill, int | float):
        return {"prefill_s": None, "decode_step_s": None}
    replicas = max(1, int(strategy.get("gpu_count") or 1) // int(strategy.get("tensor_parallel") or 1))
    return {"prefill_s": float(prefill),
            "decode_step_s": int(strategy.get("batch") or 1) * replicas / float(decode_rate)}
