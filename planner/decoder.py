"""Which decoder the inference workers run, one rule for the plan's time and memory and the workers."""

from __future__ import annotations

from typing import Literal

from catalog.schema import ModelConfig

Decoder = Literal["graph", "generate"]
MoeKernel = Literal["batched_mm", "grouped_mm"]


def grouped_gemm_gpu(vendor: str, capability: str | None) -> bool:
    """Whether torch's grouped GEMM runs on the GPU (NVIDIA compute capability 8.0 and later); an unknown
    capability counts as yes (the workers read the real one from the driver)."""
    if vendor != "nvidia":
        return False
    if capability is None:
        return True
    try:
        return int(capability.split(".")[0]) >= 8
    except ValueError:
        return False


def graph_decode(model: ModelConfig, vendor: str, weights: str, capability: str | None = None) -> bool:
    """Whether the workers decode with the compiled static-cache step (workers/infer/decode.py) rather than
    transformers' eager generate(), on an NVIDIA GPU of compute ``capability`` ("9.0"; None: unknown):

    - dense models in bf16/fp16, where it was measured first. Sliding-window layers (Gemma 3, Mistral) too, since
      2026-12-02: their static cache is built as if every layer were full attention, so the step compiles once.
      Before, transformers' sliding static layer recompiled the step every token on the H200 (680 tok/s against
      5,969 planned and a 375 s first batch, bench/results/workers/graph_decode_gemma_2026-12-02.txt). The plan
      prices what that costs: a full-length KV cache in every layer, read whole each step.
    - a mixture of experts in bf16 on a GPU with grouped GEMMs (sm80+), since 2026-12-03: transformers' grouped_mm
      experts route on the GPU (a sort, a histogram, offsets: no host sync), so the whole step is one CUDA graph
      (no graph break, no recompile). On one H200 it decodes gpt-oss-20b 1.7-2.4x and Qwen3-30B-A3B 2.6x as fast
      as generate() with grouped_mm kept (bench/results/workers/graph_decode_moe_2026-12-03.json). Not fp16
      (inductor lowers grouped_mm for bf16 only; other dtypes take a fallback that syncs the host per expert),
      not an MXFP4 checkpoint (its triton kernels were not measured captured), not int8/fp8 (torchao's kernels,
      likewise).
    """
    if vendor != "nvidia":
        return False
    if model.num_experts > 1:
        return weights == "bf16" and grouped_gemm_gpu(vendor, capability)
    return weights in ("bf16", "fp16")


def decoder_for(model: ModelConfig, vendor: str, weights: str, given: str | None = None,
                capability: str | None = None) -> Decoder:
    """``given`` ("graph" or "generate") wins; None is the workers' rule."""
    if given is not None:
        return "graph" if given == "graph" else "generate"
    return "graph" if graph_decode(model, vendor, weights, capability) else "generate"


# generate()'s batched_mm copies each (token, expert) pair's weights three passes over; grouped_mm reads each routed
# expert once but issues more kernels (a host cost per sparse layer). From two visits per expert per step on,
# grouped wins on an H200 (bench/results/workers/moe_decode_impl_*_2026-12-03b.json: gpt-oss-20b level at batch 16,
# 1.7x faster at 32 and 4x at 64; Qwen3-30B-A3B slower at 16, 1.3x faster at 32, 1.5x at 64)
GROUPED_FROM_VISITS = 2


def moe_decode_kernel(model: ModelConfig, vendor: str, weights: str, batch: int, *, graph: bool = False,
                      given: str | None = None) -> MoeKernel | None:
    """The kernel a mixture of experts' decode steps run, one rule for the plan's time and memory and the workers
    (workers/infer/moe_decode.py): None for a dense model and an MXFP4 checkpoint (its triton kernels read the experts
    in place); "grouped_mm" in the compiled decoder (``graph``: the model's own kernel, captured), on a CPU
    (generate() keeps it there) and, on a GPU under generate(), once batch x top-k reaches
    ``GROUPED_FROM_VISITS`` x the experts (the workers keep grouped_mm then); otherwise "batched_mm",
    generate()'s own switch. ``given`` wins over the rule for generate() (bench/accuracy/measure_h200.py times stock
    generate(): "batched_mm" on a GPU)."""
    if model.num_experts <= 1 or weights == "mxfp4":
        return None
    if graph:
        return "grouped_mm"
    if given is not None:
        return "grouped_mm" if given == "grouped_mm" else "batched_mm"
    if vendor == "cpu" or batch * model.experts_per_token >= GROUPED_FROM_VISITS * model.num_experts:
        return "grouped_mm"
    return "batched_mm"


def moe_decode_phrase(decoder: str | None, kernel: str | None) -> str:
    """The words a plan and a run put after their numbers about a MoE's decode ("" for a dense model): the kernel
    moves its speed several-fold (docs/lab-notes/2026-12-03-moe-keeps-grouped-mm.md)."""
    if kernel is None:
        return ""
    return f", experts decoded with {kernel}" + (" in a CUDA graph" if decoder == "graph" else "")
