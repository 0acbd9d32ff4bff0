"""What a training run measured: its result (next to the planner's prediction), and the peak memory
of the most loaded rank."""

from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist


@dataclass
class TrainResult:
    status: Literal["succeeded", "preempted", "cancelled", "stopped", "failed"]
    steps: int
    total_steps: int
    tokens: int
    final_loss: float | None
    checkpoints_written: int
    resumed_from_step: int | None
    tokens_per_s: float | None  # whole placement, wall time of this attempt incl. checkpoints
    steady_tokens_per_s: float | None  # whole placement, training steps only, first step excluded
    loop_tokens_per_s: float | None  # after the first step, wall clock: checkpoints and hooks included
    wall_s: float
    checkpoint_save_s: float  # writing checkpoints (in the background, except the last and just-in-time ones)
    checkpoint_blocking_s: float  # what checkpoints cost the training loop: snapshots and waits
    checkpoint_interval_steps: int  # the interval used last (pinned by the spec, or Young/Daly)
    checkpoint_interval_s: float | None  # Young/Daly's tau behind it; None when the spec pinned the steps
    checkpoint_stall_s: float | None  # loop stall of the last periodic checkpoint (snapshot into host memory)
    checkpoint_durable_s: float | None  # snapshot handed over -> committed, of the last checkpoint
    peak_allocated_bytes: int | None  # torch.cuda.max_memory_allocated on the most loaded rank
    peak_reserved_bytes: int | None
    peak_rss_bytes: int | None  # CPU runs: the process's peak resident set
    predicted: dict[str, float]
    device: str
    world_size: int
    micro_batch: int = 0  # what the loop ran at the end (the plan's, unless an OOM halved it)
    grad_accum: int = 0
    oom_backoffs: list[dict[str, int]] = field(default_factory=list)  # step, from/to micro_batch and grad_accum
    cuda_alloc_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF the run had
    error: str | None = None  # set on the measurements of a run that failed
    # the step of the newest checkpoint this attempt saved or resumed from (a stopped run: the step it stopped at)
    checkpoint_step: int | None = None
    # the network NCCL chose (workers.cluster.nccl_net: "efa", "socket", "ib"; None: no multi-node NCCL) and the link
    # speed the node has on it, of the slowest rank
    nccl_network: str | None = None
    nccl_link_gbps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_memory(device: torch.device, world: int, error: str | None) -> tuple[int | None, int | None, int | None]:
    """(allocated, reserved, None): the peaks on the most loaded GPU rank; (None, None, rss) on a CPU, the
    process's peak resident set. ``error``: the run failed, so no collective (other ranks may be gone)."""
    if device.type != "cuda":
        return None, None, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    peak_alloc = torch.cuda.max_memory_allocated(device)
    peak_reserved = torch.cuda.max_memory_reserved(device)
    if world > 1 and error is None:  # a failing rank cannot count on the others joining a collective
        peaks = torch.tensor([peak_alloc, peak_reserved], device=device)
        dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
        peak_alloc, peak_reserved = int(peaks[0]), int(peaks[1])
    return peak_alloc, peak_reserved, None
