"""What each training precision does to the weights' updates, and what that costs beyond its bytes.

``bf16`` keeps weights, gradients and AdamW states in bf16 with no fp32 master copy; its optimizer step
rounds each update into the weights stochastically (workers/train/sr_adamw.py), so updates below bf16's half-ulp
still move the weights in expectation. ``bf16-plain`` is the same memory with round-to-nearest: most
fine-tuning updates round to nothing (docs/NUMERICS.md measures both against amp-bf16's fp32 master).
"""

from __future__ import annotations

from planner.strategies import finetune_kind, precision_kind

# The stochastic-rounding step's extra traffic: 16 random bits a parameter, written by the generator and read
# by the fused update (no persistent state: the bits' seed is a function of the step).
SR_BYTES_PER_PARAM = 4.0


def storage_precision(precision: str) -> str:
    """The precision ``precision`` prices its memory and compute as (``bf16-plain`` is ``bf16``)."""
    return precision_kind(precision).storage


def numerics(precision: str, finetune: str = "full") -> str:
    """What ``precision``'s updates go through; LoRA trains its adapters in fp32 whatever the base is."""
    if finetune_kind(finetune).adapters:
        return "fp32 adapters"
    return precision_kind(precision).numerics


def stochastic_rounding(precision: str, finetune: str, optimizer: str) -> bool:
    """Whether the optimizer step rounds stochastically into bf16 weights (and pays SR_BYTES_PER_PARAM)."""
    return (precision_kind(precision).stochastic_rounding and not finetune_kind(finetune).adapters
            and optimizer in ("adamw", "adamw-8bit"))
