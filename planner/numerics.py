"""What each training precision does to the weights' updates, and what that costs beyond its bytes.

``bf16`` keeps weights, gradients and AdamW states in bf16 with no fp32 master copy; its optimizer step
rounds each update into the weights stochastically (workers/train/sr_adamw.py), so updates below bf16's half-ulp
still move the weights in expectation. ``bf16-plain`` is the same memory with round-to-nearest: most
fine-tuning updates round to nothing (docs/NUMERICS.md measures both against amp-bf16's fp32 master).
"""

from __future__ import annotations

from planner.strategies import finetune_kind, precision_kind

# torchao's 8-bit AdamW with stochastic rounding: its foreach step plus 16 random bits a parameter, written by the
# generator and read by the update (no persistent state: the bits' seed is a function of the step).
SR_BYTES_PER_PARAM = 4.0
# AdamW with stochastic rounding is one fused kernel a tensor (workers/train/sr_adamw.py): it reads the bf16 weight,
# gradient and both moments once and writes weight and moments once, 14 bytes a parameter, its random bits hashed
# in registers. Measured on an H100 (bench/workers/sr_step.py, llama-3.2-1b): 7.9 ms a step where this prices 8.6 ms
# and torch's foreach AdamW on the same bf16 parameters takes 22.1 ms
# (docs/lab-notes/2026-12-05-bf16-numerics.md).
SR_FUSED_STEP_BYTES_PER_PARAM = 14.0


def storage_precision(precision: str) -> str:
    """The precision ``precision`` prices its memory and compute as (``bf16-plain`` is ``bf16``)."""
    return precision_kind(precision).storage


def numerics(precision: str, finetune: str = "full") -> str:
    """What ``precision``'s updates go through; LoRA trains its adapters in fp32 whatever the base is."""
    if finetune_kind(finetune).adapters:
        return "fp32 adapters"
    return precision_kind(precision).numerics


def stochastic_rounding(precision: str, finetune: str, optimizer: str) -> bool:
    """Whether the optimizer step rounds stochastically into bf16 weights (AdamW: the fused step,
    SR_FUSED_STEP_BYTES_PER_PARAM; the 8-bit AdamW: its own step and SR_BYTES_PER_PARAM)."""
    return (precision_kind(precision).stochastic_rounding and not finetune_kind(finetune).adapters
            and optimizer in ("adamw", "adamw-8bit"))
