"""The planner's tunable constants, as one typed value.

The defaults below are first-principles values (vendor behaviour, PyTorch allocator rules); the
fitted values live in ``planner/calibration.json`` (written by ``bench/accuracy/accuracy.py`` from the
NON-holdout measured cases only, with where they came from). Pure functions take a
:class:`Calibration` argument; only edges (CLI, scheduler, bench) call :func:`load_calibration`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from errors import CatalogError

MIB = 1 << 20
GIB = 1 << 30

DEFAULT_CALIBRATION_PATH = Path(__file__).resolve().parent / "calibration.json"
CPU_CALIBRATION_NAME = "calibration_cpu.json"  # beside the calibration file it completes


class _Cal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryCalibration(_Cal):
    cuda_context_bytes: int = Field(
        default=560 * MIB, description="CUDA context + cuBLAS workspace, outside the allocator"
    )
    nccl_bytes: int = Field(default=400 * MIB, description="NCCL communicator buffers per rank when gpu_count > 1")
    allocator: Literal["expandable-segments", "default"] = Field(
        default="expandable-segments",
        description="the CUDA caching allocator the workers run with: they set PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True unless the user set it; 'default' predicts PyTorch's stock allocator")
    # default allocator: reserved = allocated * (1 + overhead) + 2 MiB-block rounding; by execution mode
    # (fitted on H200 runs with the stock allocator, see docs/ACCURACY.md)
    reserved_overhead: dict[str, float] = Field(
        default_factory=lambda: {"single": 0.06, "single-ckpt": 0.1, "ddp": 0.08, "fsdp": 0.35, "fsdp-grad-op": 0.25,
                                 "infer": 0.12}
    )
    # expandable segments: one segment per stream grows by mapping pages, a large block needs no
    # contiguous free cached block, and free pages are unmapped before an OOM is raised (so the fit
    # verdict rests on allocated + pressure_slack; reserved is reported, not judged). Freed pages stay
    # mapped until then, so reserved is allocated plus the pages cached at the peak.
    # MEASURED for "single" on one H200 with the stock workers (bench/accuracy/gpu_acceptance.py, 2026-12-01,
    # bench/results/acceptance/2026-12-01_run2.json and _run3.json; reserved / allocated - 1):
    # llama-3.2-1b full amp-bf16 mb=16 +6.4%, llama-3-8b LoRA bf16 mb=4 +2.6%, Qwen3-0.6B (config
    # path) bf16 mb=16 +7.9%. 0.053 keeps the worst of the three within 2.7%. ASSUMED (unmeasured):
    # single-ckpt and ddp as single (one compute stream); FSDP 4 points more (its all-gather stream
    # keeps its own segment, as first assumed); inference 1% (generate() frees little at its peak).
    expandable_overhead: dict[str, float] = Field(
        default_factory=lambda: {"single": 0.053, "single-ckpt": 0.053, "ddp": 0.053, "fsdp": 0.093,
                                 "fsdp-grad-op": 0.093, "infer": 0.01},
        description="reserved / allocated - 1 under expandable segments, by execution mode (single measured, "
        "the rest assumed; see comment)")
    # under memory pressure the allocator frees cached blocks and retries: a run needs at least
    # allocated * (1 + pressure_slack) + context to survive
    pressure_slack: float = 0.02
    workspace_bytes: int = Field(
        default=64 * MIB, description="cuBLAS + cuBLASLt workspaces (allocated through the caching allocator)"
    )
    kv_fragmentation: float = Field(default=0.3, description="inference: cached bytes per byte of final KV cache")
    plan_headroom: float = Field(
        default=0.05, ge=0.0, le=0.5,
        description="fraction of usable memory every plan leaves free (its fit verdict and the micro-batch "
        "choice); resources.memory_headroom overrides it per job. 0.05 = the worst under-prediction of "
        "peak allocated on the H200 cases (3.0%) + 2% for allocator pages and transient buffers")
    activation_scale: float = Field(default=1.0, description="multiplier on the counted saved activations")
    logits_scale: float = Field(default=1.0, description="multiplier on the counted logits/loss tensors")
    prefill_mlp_bytes: dict[str, float] = Field(
        default_factory=lambda: {"bf16": 6.0, "fp16": 6.0, "int8": 6.0, "int4": 6.0, "fp8": 10.0},
        description="bytes per MLP-intermediate element live during prefill, by weight dtype",
    )
    backward_working_layers: float = Field(
        default=1.0, description="extra per-layer activation copies live while a layer's backward runs"
    )
    eager_score_grad_buffers: float = Field(
        default=3.0, ge=0.0,
        description="seq x seq gradient buffers alive beside the saved probabilities while an eager "
        "attention's backward runs (softmax/slice/scale grads); counted from the allocator trace at the "
        "peak of a gpt-oss step on the H200 (bench/probes/memory_peak_probe.py: 3), 2 on the CPU (MemTracker)")


class ThroughputCalibration(_Cal):
    # step compute time = max(GPU time, host time), the GPU running behind the host's launches:
    #   GPU time  = FLOPs / (peak * mfu_max[precision] * h/(h+hidden_half) * T/(T+tokens_half))
    #               + layer_overhead_s * layers (small kernels' GPU-side cost) + activation traffic
    #   host time = host_layer_s * layers (eager PyTorch issuing a layer's kernels, forward + backward)
    mfu_max: dict[str, float] = Field(
        default_factory=lambda: {"fp32": 0.7, "amp-bf16": 0.5, "amp-fp16": 0.5, "bf16": 0.55, "fp8": 0.45}
    )
    hidden_half: float = 0.0
    tokens_half: float = 1024.0
    layer_overhead_s: float = 4e-4
    host_layer_s: float = Field(
        default=0.0, ge=0.0,
        description="host seconds to issue one decoder layer's forward and backward kernels in eager "
        "PyTorch; a micro-step is never faster than layers x this (launch-bound: batch 1, short sequences, "
        "~100M-parameter models)")
    traffic_factor: float = Field(default=3.0, description="memory-bound passes over the decoder layers' "
                                  "saved-activation bytes")
    # bench/accuracy/moe_train_layers.py: a step's time less its layers' (two depths), one H200, shapes of five models
    # (vocabularies 32k-152k, 4k-33k tokens a micro-step); fitted on DeepSeek-V2-Lite, Qwen1.5-MoE and Llama-3-8B,
    # Qwen3-30B-A3B and Mixtral-8x7B held out (docs/lab-notes/2026-12-04-sparse-layer-training-cost.md)
    loss_bytes_per_logit: float = Field(
        default=71.5, ge=0.0,
        description="training: memory-traffic bytes per logit (tokens x vocabulary) of the LM head's output, its "
        "log-softmax and cross-entropy, forward and backward; never recomputed")
    step_overhead_s: float = 5e-3
    lora_speed: float = Field(default=0.85, description="LoRA's adapter kernels relative to the adapted layers' "
                              "FLOPs (not the routed experts' or the frozen LM head's: adapter_free_flops_per_token)")
    lora_merged_expert_bytes: float = Field(
        default=53.3, ge=0.0,
        description="LoRA of a mixture of experts (peft's ParamWrapper on transformers 5's fused experts): "
        "memory-traffic bytes per routed-expert weight element per micro-step at the GPU's bandwidth, half in "
        "forward (the merge W + B @ A and its copies; again when recomputed), half in backward (the merged "
        "weight's gradient, cast and reduced into the adapters'). Fitted with moe_dispatch_bytes on a sparse "
        "layer's measured time (bench/accuracy/moe_train_layers.py; DeepSeek-V2-Lite and Qwen1.5-MoE, LoRA with and "
        "without checkpointing); the first estimate, 60, came from a DeepSeek-V2-Lite kernel profile alone")
    qlora_speed: float = Field(default=0.55, description="nf4 dequantisation overhead on the frozen matmuls")
    # bench/accuracy/moe_train_layers.py on one H200 (bench/results/workers/moe_train_layers_2026-12-04/): a sparse
    # layer's time from two depths of the published shape; fitted on DeepSeek-V2-Lite and Qwen1.5-MoE-A2.7B (full,
    # LoRA, LoRA + checkpointing), Qwen3-30B-A3B and Mixtral-8x7B held out
    # (docs/lab-notes/2026-12-04-sparse-layer-training-cost.md)
    moe_dispatch_bytes: float = Field(
        default=38.2, ge=0.0,
        description="training a mixture of experts: memory-traffic bytes per element of each routed copy of a "
        "token's hidden state, per pass (forward, two in backward, one more when recomputed): the permute, "
        "gather, scatter and weighted sum of top-k copies, beyond the saved-activation traffic")
    optimizer_bw_efficiency: float = 0.6
    comm_efficiency: float = 0.7
    comm_overlap: float = 0.6
    fsdp_collective_s: float = Field(
        default=0.0, ge=0.0,
        description="fixed cost of one FSDP collective (a layer's all-gather or reduce-scatter): launch and "
        "sync that prefetching does not hide, on top of the bytes over the link")
    ddp_comm_efficiency: float = Field(default=0.7, description="DDP all-reduce bandwidth / link bandwidth")
    ddp_overlap: float = Field(default=0.6, description="fraction of DDP's all-reduce hidden behind backward")
    kv_traffic_factor: float = Field(default=3.0, description="passes over the KV cache per decode step")
    prefill_mfu: float = 0.5
    decode_bw_efficiency: float = 0.7
    decode_layer_overhead_s: float = Field(default=2.5e-4, description="HF eager generate(): per layer per token")
    decode_step_overhead_s: float = 4e-3
    # the graph_decode_* defaults: bench/workers/graph_decode.py --fit on the decoder's own step times (CUDA events) of
    # the 5 dense cases of bench/results/workers/graph_decode_split2_2026-12-03.json (the GPU acceptance's two inference
    # shapes, llama-3.2-1b and gemma-3-1b at 32x512x128, and the 8B models held out); the graph_moe_* terms on the
    # mixtures of graph_decode_moefit_{a,b}_2026-12-04.json (gpt-oss-20b, Qwen1.5-MoE-A2.7B, Mixtral-8x7B; every
    # Qwen3-30B-A3B case held out), chosen by leave-one-model-out; the per-layer term is per Llama layer's kernels
    # (layer_kernel_weight). The rows x matmul-params term priced the K/V copy the decoder no longer makes
    # (docs/lab-notes/2026-12-03-packed-gqa.md; "The compiled decoder's prompt pass and step, apart").
    # Refitted 2026-12-04 (same records, same holdouts) with graph_decode_key_s held, measured first on its own from
    # the attention kernels' profile (docs/lab-notes/2026-12-04-decode-step-profile.md)
    graph_decode_layer_s: float = Field(
        default=4.96e-5, ge=0.0,
        description="compiled static-cache decode (workers/infer/decode.py): GPU seconds per layer per token "
        "beyond the bytes read (gaps between its small kernels), for a Llama layer's kernels")
    graph_decode_row_layer_s: float = Field(
        default=0.0, ge=0.0,
        description="compiled decode: GPU seconds per layer per token per batch row beyond the bytes read")
    graph_decode_row_param_s: float = Field(
        default=0.0, ge=0.0,
        description="compiled decode: GPU seconds per token per batch row per matmul parameter of the decoder "
        "layers, beyond the bytes read (it priced the K/V copy; 0 since the decoder packs grouped-query attention)")
    graph_decode_key_s: float = Field(
        default=1.02e-10, ge=0.0,
        description="compiled decode: GPU seconds per cached position per SDPA block (row x packed KV head) per "
        "layer beyond the cache's bytes (planner.throughput.graph_decode_keys; cuDNN's flash kernel's per-key cost, "
        "from the kernel profile bench/workers/decode_step_profile.py --fit-keys)")
    graph_decode_step_s: float = Field(
        default=0.0, ge=0.0, description="compiled decode: fixed seconds per token (graph replay, argmax)")
    graph_compile_layer_s: float = Field(
        default=2.15, ge=0.0,
        description="compiled decode: one-time seconds per layer to capture the step in a fresh process "
        "(torch.compile: dynamo, inductor, the CUDA graph); bench/workers/graph_decode.py --fit, the median over its "
        "first-in-process cases (1.8-3.3 s; a process that compiled before takes 1.1-1.5)")
    graph_moe_layer_s: float = Field(
        default=5.35e-5, ge=0.0,
        description="compiled decode of a mixture of experts: GPU seconds per sparse layer per token beyond the "
        "routed experts' bytes (the routing's kernels, the grouped GEMMs' launches)")
    graph_moe_expert_bw_efficiency: float = Field(
        default=0.5659, gt=0.0, le=1.0,
        description="compiled decode of a mixture of experts: the share of the memory bandwidth at which the "
        "grouped GEMMs read the routed experts a step touches (the other weights: decode_bw_efficiency; a kernel "
        "profile of gpt-oss-20b and Qwen3-30B-A3B measured 0.50-0.58)")
    graph_moe_pair_s: float = Field(
        default=0.0, ge=0.0,
        description="compiled decode of a mixture of experts: GPU seconds per sparse layer per (token, expert) "
        "pair routed, beyond the experts' bytes (a candidate term of the fit, not chosen: 0)")
    # the graph_prefill_* defaults: bench/probes/prefill_probe.py --fit on
    # bench/results/workers/prefill_probe_2026-12-03.json and prefill_probe_moefit_2026-12-04.json (Qwen1.5-MoE,
    # Mixtral) (the compiled decoder's own prompt pass timed by its CUDA events on one H200; fitted on the 1-4B models,
    # the 8B models, gemma-3-12b and Qwen3-30B-A3B held out; docs/lab-notes/2026-12-03-prompt-pass-and-step-apart.md)
    graph_prefill_mfu: float = Field(
        default=0.63, gt=0.0, le=1.0,
        description="the compiled decoder's eager prompt pass (workers/infer/decode.py): the share of peak bf16 "
                    "FLOP/s its "
        "dense matmuls reach at an infinite hidden size; times h / (h + graph_prefill_hidden_half)")
    graph_prefill_hidden_half: float = Field(
        default=1500.0, ge=0.0,
        description="the hidden size at which the prompt pass's matmuls reach half of graph_prefill_mfu")
    graph_prefill_layer_s: float = Field(
        default=1.4e-3, ge=0.0,
        description="the prompt pass is never faster than layers x this: eager PyTorch issuing a layer's kernels "
        "(one row of a short prompt)")
    graph_prefill_expert_mfu: float = Field(
        default=0.46, gt=0.0, le=1.0,
        description="the prompt pass of a mixture of experts: the share of peak bf16 FLOP/s the routed experts' "
        "grouped GEMMs reach, eager, at wide experts and many rows each (graph_prefill_expert_efficiency; fitted "
        "on gpt-oss-20b, Qwen1.5-MoE-A2.7B, Mixtral-8x7B, Qwen3-30B-A3B held out)")
    graph_prefill_expert_width_half: float = Field(
        default=1500.0, ge=0.0,
        description="the expert intermediate width at which the prompt pass's grouped GEMMs reach half of "
        "graph_prefill_expert_mfu")
    graph_prefill_expert_rows_half: float = Field(
        default=128.0, ge=0.0,
        description="the rows per expert (prompt tokens x top-k / experts) at which the prompt pass's grouped GEMMs "
        "reach half of graph_prefill_expert_mfu")
    # ASSUMED (not yet measured; bench/accuracy/cases_models.yaml measures it): transformers' per-expert Python loop
    # (gpt-oss) syncs the host on every expert it visits (`for expert_idx in expert_hit`) and launches about
    # a dozen small kernels for it: ~12 x 10 us + a 30 us sync
    expert_loop_s: float = Field(
        default=1.5e-4, ge=0.0,
        description="seconds per expert visited, per MoE layer, per forward pass, when transformers loops over "
        "the experts in Python (MoeShape.expert_loop); backward replays the kernels without the syncs")
    prefill_score_passes: float = Field(
        default=6.0, ge=0.0,
        description="inference prefill: memory passes over every eager-attention layer's prompt x prompt scores "
        "(their separate elementwise kernels); fitted on the non-holdout gpt-oss prefills")
    decode_gather_bw_efficiency: float = Field(
        default=1.0, gt=0.0,
        description="generate()'s decode of a mixture of experts on a GPU (transformers' batched_mm): the share "
        "of the memory bandwidth its gathers of each (token, expert) pair's weights and their bmm reach; large "
        "streams, some reads served from L2 (fitted on the non-holdout MoE inference cases)")
    # default: bench/accuracy/moe_decode_fit.py on 14 gpt-oss-20b timings
    # (bench/results/workers/moe_decode_impl_oss_2026-12-03b.json and the workers' runs of
    # bench/results/acceptance/2026-12-03_run13_{a,c}.json; Qwen3-30B-A3B held out): host-bound, it moved 0.34-1.46 ms
    # between calls as the host's speed did
    decode_grouped_layer_s: float = Field(
        default=6.84e-4, ge=0.0,
        description="generate()'s decode of a mixture of experts on a GPU with grouped_mm kept (workers/"
        "moe_decode.py): host seconds per sparse layer per token beyond the dense decode overhead (its sort, "
        "histogram, offsets, masks and grouped GEMMs)")
    eager_score_passes: float = Field(
        default=0.0, ge=0.0,
        description="training: memory passes over every eager-attention layer's seq x seq scores beyond the "
        "saved-activation traffic (scale, mask, sink concat, max, softmax and their backward run as separate "
        "kernels, several below full bandwidth); fitted on the non-holdout eager cases")
    optimizer_passes: dict[str, float] = Field(
        default_factory=lambda: {"adamw": 10.0, "adamw-8bit": 6.0, "sgd": 5.0, "adafactor": 8.0},
        description="memory passes over (trainable params x state bytes) per optimizer step",
    )
    quant_layer_overhead: dict[str, float] = Field(
        default_factory=lambda: {"int8": 1.5, "fp8": 2.5, "int4": 2.0},
        description="decode fixed-overhead multiplier of quantized weights (extra quant/dequant kernels)",
    )
    quant_decode_speed: dict[str, float] = Field(
        default_factory=lambda: {"int8": 0.8, "fp8": 0.9, "int4": 0.7}, description="dequant kernel slowdown"
    )


class CostCalibration(_Cal):
    spot_hazard_per_h: dict[str, float] = Field(
        default_factory=lambda: {"aws": 0.08, "gcp": 0.1, "azure": 0.08, "default": 0.1},
        description="expected spot preemptions per instance-hour, by cloud",
    )
    # AWS: the two-minute spot interruption notice; GCP: 30 s before a spot/preemptible VM is stopped; Azure:
    # Scheduled Events announce a spot eviction at least 30 s ahead. A notice that covers the checkpoint's stall
    # and write gets the workers' just-in-time checkpoint (planner.cost.just_in_time_reserve_s)
    spot_notice_s: dict[str, float] = Field(
        default_factory=lambda: {"aws": 120.0, "gcp": 30.0, "azure": 30.0, "default": 0.0},
        description="seconds of warning before a spot preemption, by cloud (0: none)",
    )
    restart_h: float = Field(default=0.15, description="new node + Ray + load checkpoint")
    # A job's one-time seconds beyond its steady work, in its hours: medians of bench/accuracy/start_fit.py over the GPU
    # acceptance records of runs 13-25 (2026-12-03/04, `gpuplan run` end to end on an H200; runs 26 on are
    # held out). Training: the process and the plan, the model's build, the optimizer, the first step's warm-up
    # (47 case runs of 7 cases, 18.9-57.0 s: wall less the steady steps, less the two checkpoint terms below,
    # which scale with the state: the buffer's pinning at the start, the last checkpoint's write at the end).
    # Inference: the process and the plan, and the model's load (48 case runs of 9 cases, 15.3-32.6 s); the
    # compiled decoder's capture is the estimate's warmup_s. Weights read from a folder add their read time.
    train_start_s: float = Field(default=26.5, ge=0.0, description="training: fixed seconds of a job's start")
    infer_start_s: float = Field(default=23.4, ge=0.0, description="inference: fixed seconds of a job's start")
    # 14.8 GB of pinned host buffers allocated in 7.15 s on the H200 host (bench/workers/checkpoint_io.py: 2.07 GB/s)
    checkpoint_pin_gbps: float = Field(default=2.07, gt=0.0,
                                       description="GB/s: the checkpoint buffer pinned once at the start")
    # Measured on one H200 host (bench/workers/checkpoint_io.py, issue 11): 14.8 GB of state made durable on
    # tmpfs in 3.26 s and 3.15 s (4.55 and 4.71 GB/s) as 16 shards hashed while written; the loop
    # stops only for the device-to-host snapshot into reused pinned buffers, 0.29 s (50 GB/s).
    checkpoint_write_gbps: float = Field(default=4.7, description="GB/s: snapshot -> durable in the checkpoint store")
    checkpoint_snapshot_gbps: float = Field(default=50.0, description="GB/s: what the loop stops for (snapshot)")
    min_checkpoint_h: float = Field(default=1 / 3600, description="fixed loop cost of any checkpoint (sync, metadata)")
    deadline_confidence: float = Field(default=0.9, ge=0, le=1, description="spot must meet the deadline this surely")


def _cpu_memory() -> MemoryCalibration:
    # No CUDA context, cuBLAS workspace or caching allocator: malloc returns what it frees, so
    # reserved is allocated; "outside" is the interpreter with torch and transformers imported.
    return MemoryCalibration(cuda_context_bytes=450 * MIB, nccl_bytes=0, workspace_bytes=0,
                             reserved_overhead={"single": 0.0, "single-ckpt": 0.0, "infer": 0.0})


def _cpu_throughput() -> ThroughputCalibration:
    # The CPU's "peak" is its measured fp32 matmul rate (catalog.local_cpu), so mfu_max["fp32"] is
    # the fraction of it a training step's matmuls reach; eager PyTorch on CPU pays more per op.
    # the loss: 12 bytes a logit at traffic_factor's 3 passes, as before the loss had its own constant
    return ThroughputCalibration(mfu_max={"fp32": 0.6}, tokens_half=64.0, layer_overhead_s=2e-3,
                                 traffic_factor=3.0, loss_bytes_per_logit=36.0, step_overhead_s=5e-3,
                                 optimizer_bw_efficiency=0.5)


class CpuCalibration(_Cal):
    """The constants of a CPU placement (vendor ``cpu``): fitted on measured CPU runs by
    ``bench/accuracy/cpu_accuracy.py --fit`` into ``planner/calibration_cpu.json``."""

    source: str = "uncalibrated first-principles CPU defaults (planner/calibration.py)"
    fitted_on: list[str] = Field(default_factory=list, description="case ids used for fitting")
    memory: MemoryCalibration = Field(default_factory=_cpu_memory)
    throughput: ThroughputCalibration = Field(default_factory=_cpu_throughput)


class Calibration(_Cal):
    source: str = "uncalibrated first-principles defaults (planner/calibration.py)"
    fitted_on: list[str] = Field(default_factory=list, description="case ids used for fitting")
    memory: MemoryCalibration = Field(default_factory=MemoryCalibration)
    throughput: ThroughputCalibration = Field(default_factory=ThroughputCalibration)
    cost: CostCalibration = Field(default_factory=CostCalibration)
    cpu: CpuCalibration = Field(default_factory=CpuCalibration)

    def for_vendor(self, vendor: str) -> Calibration:
        """The constants for a part of ``vendor``: a CPU's memory and throughput differ in kind."""
        if vendor != "cpu":
            return self
        return self.model_copy(update={"memory": self.cpu.memory, "throughput": self.cpu.throughput})


def load_calibration(path: Path | None = None, *, overlay: Path | None = None) -> Calibration:
    """Read a calibration file (an edge helper: the CLI, scheduler and bench call it, not the planner).

    A missing default file yields the first-principles defaults. ``overlay``: a user's refit
    (``gpuplan calibrate`` writes ``~/.gpuplan/calibration.json``, see :func:`user_calibration_path`)
    whose ``overrides`` replace single constants of the shipped file; a missing overlay is no overlay.
    """
    target = path or DEFAULT_CALIBRATION_PATH
    if not target.is_file():
        if path is not None:
            raise CatalogError(f"calibration file {target} does not exist", hint="run bench/accuracy/accuracy.py --fit")
        cal = Calibration(cpu=_load_cpu(target.with_name(CPU_CALIBRATION_NAME)))
    else:
        try:
            cal = Calibration.model_validate(json.loads(target.read_text()))
        except (ValueError, OSError) as exc:
            raise CatalogError(
                f"calibration file {target} is invalid: {exc}",
                hint="regenerate it with bench/accuracy/accuracy.py --fit",
            ) from exc
        cpu_path = target.with_name(CPU_CALIBRATION_NAME)
        if cpu_path.is_file():
            cal = cal.model_copy(update={"cpu": _load_cpu(cpu_path)})
    if overlay is None or not overlay.is_file():
        return cal
    try:
        doc = json.loads(overlay.read_text())
        overrides = doc["overrides"] if isinstance(doc, dict) else None
        if not isinstance(overrides, dict):
            raise ValueError("it has no 'overrides' mapping")
        return apply_overrides(cal, overrides, source=f"{doc.get('source', 'a user refit')} ({overlay})")
    except (ValueError, OSError, KeyError) as exc:
        raise CatalogError(f"your calibration file {overlay} is invalid: {exc}",
                           hint="refit it with `gpuplan calibrate`, or delete it (`gpuplan calibrate --reset`) to "
                           "plan with the shipped calibration") from exc


USER_CALIBRATION_NAME = "calibration.json"


def user_calibration_path(home: Path) -> Path:
    """Where ``gpuplan calibrate`` keeps a user's refit: ``<gpuplan home>/calibration.json``."""
    return home / USER_CALIBRATION_NAME


def load_user_calibration(home: Path) -> Calibration:
    """The planner's constants for a user: the shipped calibration with their refit (``gpuplan calibrate``,
    kept in ``<home>/calibration.json``) over it, if there is one. The one loader the edges call (the CLI,
    the server, ``gpuplan run``); the workers take what it returned as a value."""
    return load_calibration(overlay=user_calibration_path(home))


def apply_overrides(cal: Calibration, overrides: Mapping[str, Any], *, source: str | None = None) -> Calibration:
    """``cal`` with the constants named in ``overrides`` replaced (a nested mapping in the file's
    layout: ``{"throughput": {"mfu_max": {"bf16": 0.7}}, "cpu": {"throughput": {...}}}``; a
    dict-valued constant is merged key by key). Unknown names are refused (ValueError), as in the file."""
    merged = _merge(cal.model_dump(mode="json"), overrides)
    if source is not None:
        merged["source"] = f"{cal.source}; overlaid by {source}"
    return Calibration.model_validate(merged)


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_cpu(path: Path) -> CpuCalibration:
    """The CPU constants kept beside the GPU file (fitted apart, on another machine than the GPUs)."""
    if not path.is_file():
        return CpuCalibration()
    try:
        return CpuCalibration.model_validate(json.loads(path.read_text()))
    except (ValueError, OSError) as exc:
        raise CatalogError(f"CPU calibration file {path} is invalid: {exc}",
                           hint="regenerate it with bench/accuracy/cpu_accuracy.py --fit") from exc
