"""Keep transformers' grouped GEMM experts for generate()'s decode steps, where the plan says so.

On a GPU, generate() switches every fused-experts MoE (gpt-oss, Qwen3-MoE, Mixtral, DeepSeek-V3) from
``grouped_mm`` to ``batched_mm`` for its decode steps (``GenerationMixin._optimize_model_for_decode``).
batched_mm copies every (token, expert) pair's weights before its bmm, so a step's traffic grows with batch x
top-k; grouped_mm reads each routed expert once. From a few visits per expert on, grouped_mm is the faster
(gpt-oss-20b on an H200, batch 32: 37-62 ms a step against 107; docs/lab-notes/2026-12-03-moe-keeps-grouped-mm.md). The
switch happens only for an implementation named "grouped_mm", so the same forward registered under another name
(transformers' public ``ExpertsInterface.register``) is kept for every step. Which one a plan runs is
``planner.decoder.moe_decode_kernel``'s rule, shared with the planner's time and memory.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

KEPT_GROUPED_MM = "gpuplan_grouped_mm"


def keep_grouped_mm(model: Any) -> bool:
    """Give ``model``'s grouped_mm experts the same forward under a name generate() leaves alone.

    True when the model now decodes with grouped GEMMs; False (and the model unchanged) for a dense model, experts
    that do not run grouped_mm (an MXFP4 checkpoint's triton kernels, eager experts) or a transformers without the
    experts interface."""
    try:
        from transformers.integrations.moe import ExpertsInterface, grouped_mm_experts_forward
    except ImportError:
        return False
    get = getattr(model, "get_experts_implementation", None)
    if get is None:
        return False
    current: dict[str, str | None] = get()
    if "grouped_mm" not in current.values():
        return False
    ExpertsInterface.register(KEPT_GROUPED_MM, grouped_mm_experts_forward)
    model.set_experts_implementation({k: KEPT_GROUPED_MM if v == "grouped_mm" else v for k, v in current.items()})
    logger.info("decoding the experts with grouped GEMMs (transformers' switch to batched_mm kept off)")
    return True
