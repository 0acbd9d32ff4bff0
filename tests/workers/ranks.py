"""Training ranks as spawned processes over gloo on CPU, the way Ray's TorchTrainer runs them."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.net import free_port
from workers.train.hooks import TrainHooks


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


def _rank_entry(target: Callable[..., None], rank: int, port: int, queue: Any, done: Any, *args: Any) -> None:
    """A rank's process: ``target``, then "done" on its own queue once everything it put is flushed, then
    exit at once. The exit skips interpreter teardown on purpose: there, torch's C++ destructors of gloo
    process groups can abort the process ("terminate called without an active exception", seen once in
    ~20 suites on this machine, after both ranks had finished and reported), which says nothing about the
    training under test. A rank that raises exits 1 with its traceback, as before."""
    target(rank, port, queue, *args)
    queue.close()
    queue.join_thread()
    done.put(rank)
    done.close()
    done.join_thread()
    os._exit(0)


def run_ranks(target: Callable[..., None], *args: Any, world: int = 2, results: int = 0) -> list[Any]:
    """Run ``target(rank, port, queue, *args)`` in ``world`` spawned processes; every one must finish it and
    exit 0. Returns the ``results`` items the ranks put on ``queue``, in the order they arrived."""
    ctx = multiprocessing.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_entry, args=(target, rank, port, queue, done, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=600)
    finished = sorted(done.get(timeout=5) for _ in range(sum(p.exitcode == 0 for p in procs)))
    codes = {rank: p.exitcode for rank, p in enumerate(procs)}
    assert finished == list(range(world)) and set(codes.values()) == {0}, \
        f"ranks that finished: {finished}; exit codes by rank: {codes} (the ranks' output is above)"
    return [queue.get(timeout=5) for _ in range(results)]
