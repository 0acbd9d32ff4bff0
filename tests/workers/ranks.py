"""Training ranks as spawned processes over gloo on CPU, the way Ray's TorchTrainer runs them."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.net import free_port
from workers.hooks import TrainHooks


class KillAt(TrainHooks):
    """A rank that dies (RuntimeError "killed") at ``where`` of ``step``: the backward of step 5 unless told."""

    def __init__(self, step: int = 5, where: str = "backward") -> None:
        self.at = (step, where)

    def fault(self, step: int, where: str) -> None:
        if (step, where) == self.at:
            raise RuntimeError("killed")


@contextmanager
def gloo(rank: int, port: int, world: int = 2) -> Iterator[None]:
    """This process as ``rank`` of a gloo process group on 127.0.0.1:``port``, for the block."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_ranks(target: Callable[..., None], *args: Any, world: int = 2, results: int = 0) -> list[Any]:
    """Run ``target(rank, port, queue, *args)`` in ``world`` spawned processes; every one must exit 0.
    Returns the ``results`` items the ranks put on ``queue``, in the order they arrived."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, port, queue, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    assert [p.exitcode for p in procs] == [0] * world
    return [queue.get(timeout=5) for _ in range(results)]
