"""Which decoder the inference workers run, one rule for the plan's time and memory and the workers."""

from __future__ import annotations

from typing import Literal

from catalog.schema import ModelConfig

Decoder = Literal["graph", "generate"]


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


def batched_mm_decode(vendor: str, graph: bool) -> bool:
    """Whether a mixture of experts' decode steps run transformers' batched_mm (planner.memory.
    gathered_expert_bytes): generate() switches to it on any accelerator, not on a CPU (grouped_mm stays)."""
    return not graph and vendor != "cpu"
