"""How a training run carries on after trouble: the micro-batch split a resumed run starts at, the
back-off after a CUDA OOM (half the micro-batch, twice the accumulation: the same global batch), and
the wait after a just-in-time checkpoint while a spot node is taken away."""

from __future__ import annotations

import gc
import time

import torch

from errors import GpuplanError
from planner.types import Strategy


def resume_split(strategy: Strategy, saved: tuple[int, int] | None) -> tuple[int, int]:
    """The (micro_batch, grad_accum) a run starts at: the plan's, or the smaller one its checkpoint
    was saved at after an OOM back-off, when that split keeps the plan's global batch."""
    planned = (strategy.micro_batch, strategy.grad_accum)
    if saved is None or saved == planned:
        return planned
    micro, accum = saved
    if 1 <= micro < planned[0] and micro * accum == planned[0] * planned[1]:
        return micro, accum
    return planned  # another plan (a pinned micro-batch changed): the new plan's split


def back_off(step: int, micro: int, accum: int, world: int, why: str) -> tuple[int, int]:
    """The next (micro_batch, grad_accum) after an OOM: half the micro-batch, twice the accumulation,
    so every optimizer step still sees the same sequences with the same loss scaling."""
    if world > 1:
        raise GpuplanError(
            f"CUDA ran out of memory at step {step + 1} on a {world}-GPU run ({why}); the micro-batch is halved "
            "automatically only on one GPU, where no other rank waits in a collective",
            hint="lower train.micro_batch or raise resources.memory_headroom and resubmit")
    if micro <= 1:
        raise GpuplanError(
            f"CUDA ran out of memory at step {step + 1} at micro-batch 1 ({why}): the job does not fit this GPU "
            "even at the smallest micro-batch",
            hint="use activation_checkpointing, lora, a smaller seq_len, or a bigger GPU (see gpuplan plan)")
    # the largest divisor of the micro-batch up to its half, so accumulation keeps the global batch exactly
    half = max(d for d in range(1, micro // 2 + 1) if micro % d == 0)
    return half, accum * (micro // half)


def free_memory(device: torch.device) -> None:
    """Give the failed step's blocks back so the retry starts from the weights and optimizer state alone."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def wait_for_teardown(deadline: float) -> None:
    """After a just-in-time checkpoint, idle until the node goes: steps taken now would be lost anyway.

    If the node is still here well after the deadline (the drain was cancelled), carry on training.
    """
    give_up = max(deadline, time.time()) + 30.0
    while time.time() < give_up:
        time.sleep(0.2)
