"""Which decoder the inference workers run, one rule for the plan's time and memory and the workers."""

from __future__ import annotations

from typing import Literal

from catalog.schema import ModelConfig

Decoder = Literal["graph", "generate"]
MoeKernel = Literal["batched_mm", "grouped_mm"]


def graph_decode(model: ModelConfig, vendor: str, weights: str) -> bool:
    """Whether the workers decode with the compiled static-cache step (workers/decode.py) rather than
    transformers' eager generate(): dense models in bf16/fp16 on NVIDIA GPUs, where it was measured.
    MoE layers route tokens on the host and quantized kernels (torchao int8/fp8, a checkpoint's MXFP4 experts
    through transformers' triton kernels) were not measured captured: gpt-oss, MXFP4 or not, runs generate().
    Sliding-window layers (Gemma 3, Mistral) take the graph too, since 2026-12-02: their static cache is
    built as if every layer were full attention, so the step compiles once. Before, transformers' sliding
    static layer recompiled the step every token on the H200 (680 tok/s against 5,969 planned and a 375 s
    first batch, bench/results/workers/graph_decode_gemma_2026-12-02.txt). The plan prices what that costs:
    a full-length KV cache in every layer, read whole each step (planner/memory.py, planner/throughput.py).
    Not yet measured on a GPU with the fix (docs/PERFORMANCE.md)."""
    return vendor == "nvidia" and model.num_experts == 1 and weights in ("bf16", "fp16")


def decoder_for(model: ModelConfig, vendor: str, weights: str, given: str | None = None) -> Decoder:
    """``given`` ("graph" or "generate") wins; None is the workers' rule."""
    if given is not None:
        return "graph" if given == "graph" else "generate"
    return "graph" if graph_decode(model, vendor, weights) else "generate"


# generate()'s batched_mm copies each (token, expert) pair's weights three passes over; grouped_mm reads each routed
# expert once but issues more kernels (a host cost per sparse layer). From two visits per expert per step on,
# grouped wins on an H200 (bench/results/workers/moe_decode_impl_*_2026-12-03b.json: gpt-oss-20b level at batch 16,
# 1.7x faster at 32 and 4x at 64; Qwen3-30B-A3B slower at 16, 1.3x faster at 32, 1.5x at 64)
GROUPED_FROM_VISITS = 2


def moe_decode_kernel(model: ModelConfig, vendor: str, weights: str, batch: int, *, graph: bool = False,
                      given: str | None = None) -> MoeKernel | None:
    """The kernel a mixture of experts' decode steps run under generate(), one rule for the plan's time and memory
    and the workers (workers/moe_decode.py): None for a dense model, the compiled decoder (dense only) and an
    MXFP4 checkpoint (its triton kernels read the experts in place); "grouped_mm" on a CPU (generate() keeps it
    there) and, on a GPU, once batch x top-k reaches ``GROUPED_FROM_VISITS`` x the experts (the workers keep
    grouped_mm then); otherwise "batched_mm", generate()'s own switch. ``given`` wins over the rule (bench/
    measure_h200.py times stock generate(): "batched_mm" on a GPU)."""
    if model.num_experts <= 1 or graph or weights == "mxfp4":
        return None
    if given is not None:
        return "grouped_mm" if given == "grouped_mm" else "batched_mm"
    if vendor == "cpu" or batch * model.experts_per_token >= GROUPED_FROM_VISITS * model.num_experts:
        return "grouped_mm"
    return "batched_mm"
