"""Save everything a training run needs to continue exactly: weights, optimizer, LR schedule, every
rank's RNG states and the data position, through the checkpoint store (loading it back:
workers.train.state_load).

A checkpoint is ``state-meta.pt`` (the structure of the state, its small values, and where each
tensor lies) plus ~16 shard files of raw tensor bytes, balanced by size. A periodic checkpoint stops
the loop only for the snapshot: the tensors are copied into host buffers that are allocated once and
reused (pinned on CUDA, so the copy runs at the device's speed), and a background thread writes the
shards from a pool of threads, each file hashed as it is written, then commits the step. The next
snapshot waits only if that write has not finished. Final and just-in-time checkpoints take the same
path and wait for it.

What is saved: with frozen parameters (LoRA, QLoRA) only the trainable ones and their optimizer
state; the frozen base is rebuilt from its source (preset or config and seed, or the weights
directory), as at the first start. Under FSDP2 every rank writes its own local shards
(``rank-NNNN/``), nothing is gathered, and rank 0 commits once every rank's files are durable.
Under DDP rank 0 writes the (replicated) state and every rank's RNG.
"""

from __future__ import annotations

import copy as copy_module
import heapq
import io
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from errors import CheckpointError
from workers.checkpoint.format import CHUNK, Shard, Sink, new_token
from workers.checkpoint.read import host_bytes
from workers.model.isolation import rng_lock

logger = logging.getLogger(__name__)

STATE_FILE = "train_state.pt"  # the earlier single-file layout: loaded, no longer written
META_FILE = "state-meta.pt"
FORMAT = 2
SHARDS = 16  # files per rank: enough to keep SHARD_THREADS writers busy, few enough to list cheaply
ALIGN = 64  # byte alignment of each tensor in a shard (any dtype can be viewed in place)
REF = "__gpuplan_tensor__"


def shape_signature(model: torch.nn.Module) -> dict[str, list[int]]:
    """Parameter name -> full shape: what a checkpoint must match to be loadable into ``model``."""
    # A DTensor's .shape is its global shape, so this needs no collective under FSDP.
    return {_clean(name): list(param.shape) for name, param in model.named_parameters()}


def _clean(name: str) -> str:
    # DDP and activation checkpointing add wrapper prefixes that are not part of the model's shape.
    for prefix in ("module.", "_orig_mod.", "_checkpoint_wrapped_module."):
        name = name.replace(prefix, "")
    return name


def rng_state() -> dict[str, Any]:
    with rng_lock():  # not in the middle of another in-process job's seeded build
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    with rng_lock():  # a resume must not reseed another in-process job's build halfway
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def has_frozen(model: torch.nn.Module) -> bool:
    return any(not p.requires_grad for p in model.parameters())


def model_and_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                               sharded: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The live state (tensors alias the parameters): trainable parameters only when some are frozen."""
    frozen = has_frozen(model)
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=False, ignore_frozen_params=frozen)
        return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer,
                                                                                      options=options)
    target = unwrap(model)
    state = target.state_dict(keep_vars=True)
    if frozen:
        state = {k: v for k, v in state.items() if isinstance(v, torch.nn.Parameter) and v.requires_grad}
    return {k: v.detach() for k, v in state.items()}, optimizer.state_dict()


def state_shapes(model_state: dict[str, Any]) -> dict[str, list[int]]:
    return {name: list(value.shape) for name, value in model_state.items() if isinstance(value, torch.Tensor)}


# -- flattening: a nested state with its plain tensors pulled out (to shards) ----------------------
def flatten(value: Any, out: list[torch.Tensor], seen: dict[tuple[Any, ...], int] | None = None) -> Any:
    """``value`` with plain tensors replaced by references into ``out``; a tensor reached twice (tied
    embeddings) is stored once."""
    from torch.distributed.tensor import DTensor

    seen = {} if seen is None else seen

    if isinstance(value, DTensor):
        out.append(value.to_local().detach())
        return {REF: len(out) - 1, "placements": tuple(value.placements), "shape": tuple(value.shape),
                "stride": tuple(value.stride())}
    if isinstance(value, torch.Tensor):
        if type(value) in (torch.Tensor, torch.nn.Parameter) and value.layout == torch.strided:
            key = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
            if key not in seen:
                out.append(value.detach())
                seen[key] = len(out) - 1
            return {REF: seen[key]}
        return value.detach().to("cpu", copy=True)  # a tensor subclass (8-bit optimizer state): pickled as is
    if isinstance(value, dict):
        return {k: flatten(v, out, seen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(flatten(v, out, seen) for v in value)
    return copy_module.deepcopy(value)


# -- layout: which shard and offset each tensor goes to --------------------------------------------
@dataclass(frozen=True)
class Slot:
    shard: int
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    slots: tuple[Slot, ...]
    shard_bytes: tuple[int, ...]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_layout(tensors: Sequence[torch.Tensor], shards: int = SHARDS) -> Layout:
    """Tensors into at most ``shards`` files, balanced by bytes (largest first into the lightest)."""
    count = max(1, min(shards, len(tensors)))
    heap = [(0, i) for i in range(count)]
    placed: dict[int, tuple[int, int]] = {}
    for index in sorted(range(len(tensors)), key=lambda i: -_nbytes(tensors[i])):
        used, shard = heapq.heappop(heap)
        offset = -(-used // ALIGN) * ALIGN
        placed[index] = (shard, offset)
        heapq.heappush(heap, (offset + _nbytes(tensors[index]), shard))
    sizes = [0] * count
    for used, shard in heap:
        sizes[shard] = used
    slots = tuple(Slot(shard=placed[i][0], offset=placed[i][1], nbytes=_nbytes(t), dtype=t.dtype,
                       shape=tuple(t.shape)) for i, t in enumerate(tensors))
    return Layout(slots=slots, shard_bytes=tuple(sizes))


def _view(buffer: torch.Tensor, slot: Slot) -> torch.Tensor:
    return buffer[slot.offset : slot.offset + slot.nbytes].view(slot.dtype).view(slot.shape)


class HostBuffer:
    """Host memory for the shards of one state layout, allocated once and reused while the layout
    stays the same (pinned when the state is on a GPU: fresh pageable memory is ~30x slower).

    Pinning ~15 GB takes seconds; ``prepare`` does it in a background thread, one shard's buffer at
    a time, as soon as the state exists (after the first optimizer step), so the first checkpoint's
    snapshot costs what the later ones do. ``fill`` waits for a preparation still running and
    allocates itself only when nothing was prepared for this layout."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self.layout: Layout | None = None
        self.buffers: list[torch.Tensor] = []
        self._preparing: threading.Thread | None = None
        self._prepare_error: BaseException | None = None
        self.prepare_s: float | None = None  # how long the last background allocation took

    @staticmethod
    def _key_of(tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
        return (any(t.is_cuda for t in tensors), *((t.dtype, tuple(t.shape)) for t in tensors))

    def prepare(self, tensors: Sequence[torch.Tensor]) -> None:
        """Start allocating the buffers for ``tensors``' layout in the background (no-op if they exist)."""
        self.wait_prepared()
        key = self._key_of(tensors)
        if key == self._key:
            return
        layout = plan_layout(tensors)
        pinned = bool(key[0])
        device = next((t.device for t in tensors if t.is_cuda), None)
        self.buffers, self.layout, self._key = [], None, None  # release the old buffers before taking new ones

        def allocate() -> None:
            began = time.perf_counter()
            try:
                if device is not None:
                    torch.cuda.set_device(device)  # the thread's CUDA context is the run's device's
                buffers = [torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=pinned)
                           for size in layout.shard_bytes]
            except BaseException as exc:  # fill() allocates itself and reports a real failure
                self._prepare_error = exc
                return
            self.buffers, self.layout, self._key = buffers, layout, key
            self.prepare_s = time.perf_counter() - began

        self._preparing = threading.Thread(target=allocate, daemon=True, name="gpuplan-checkpoint-buffer")
        self._preparing.start()

    def wait_prepared(self) -> None:
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None
        if self._prepare_error is not None:
            logger.warning("allocating the checkpoint buffer in the background failed (%s); the first"
                           " checkpoint allocates it", self._prepare_error)
            self._prepare_error = None

    @property
    def ready(self) -> bool:
        """Whether a background allocation has finished (or none is running)."""
        return self._preparing is None or not self._preparing.is_alive()

    def fill(self, tensors: Sequence[torch.Tensor]) -> Layout:
        self.wait_prepared()
        key = self._key_of(tensors)
        pinned = bool(key[0])
        if key != self._key or self.layout is None:
            self.buffers = []  # release the old buffers before taking new ones
            self.layout = plan_layout(tensors)
            self.buffers = [torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=pinned)
                            for size in self.layout.shard_bytes]
            self._key = key
        for tensor, slot in zip(tensors, self.layout.slots, strict=True):
            _view(self.buffers[slot.shard], slot).copy_(tensor, non_blocking=pinned)
        if pinned:
            torch.cuda.synchronize()
        return self.layout


def _shard_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}shard-{index:02d}-of-{count:02d}.bin"


def _bytes_writer(buffer: torch.Tensor, size: int) -> Callable[[Sink], None]:
    def write(sink: Sink) -> None:
        view = host_bytes(buffer)[:size]
        for start in range(0, size, CHUNK):
            sink.write(view[start : start + CHUNK])

    return write


def _shards(buffer: HostBuffer, layout: Layout, meta: dict[str, Any], prefix: str,
            devices: list[str]) -> list[Shard]:
    count = len(layout.shard_bytes)
    meta = {**meta, "format": FORMAT, "devices": devices,
            "tensors": [(_shard_name(prefix, s.shard, count), s.offset, s.nbytes, str(s.dtype).removeprefix("torch."),
                         s.shape) for s in layout.slots]}
    raw = io.BytesIO()
    torch.save(meta, raw)
    encoded = raw.getvalue()

    def write_meta(sink: Sink) -> None:
        sink.write(encoded)

    shards = [Shard(_shard_name(prefix, i, count), _bytes_writer(buffer.buffers[i], size))
              for i, size in enumerate(layout.shard_bytes)]
    return [Shard(prefix + META_FILE, write_meta), *shards]


class CheckpointWriter:
    """Writes this rank's checkpoints in a background thread, one at a time, so training only stops
    for the snapshot into host memory. ``wait`` makes every submitted checkpoint durable (and
    raises the write's error, if any). Under FSDP the ranks' writer threads agree on the commit
    over a process group of their own, so they never interleave with the training collectives."""

    def __init__(self, store: Any, on_saved: Callable[[int, float], None] | None = None) -> None:
        self._store = store
        self._on_saved = on_saved
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.buffer = HostBuffer()
        self.write_s = 0.0
        self.last_write_s: float | None = None  # snapshot handed over -> durable, of the newest save
        self._group = dist.new_group(backend="gloo") if distributed() else None

    def submit(self, step: int, shards: list[Shard], metadata: dict[str, Any], *, collective: bool,
               blocking: bool) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._write, args=(step, shards, metadata, collective),
                                        daemon=True, name=f"gpuplan-checkpoint-{step}")
        self._thread.start()
        if blocking:
            self.wait()

    def _write(self, step: int, shards: list[Shard], metadata: dict[str, Any], collective: bool) -> None:
        began = time.perf_counter()
        try:
            self._write_and_commit(step, shards, metadata, collective)
        except BaseException as exc:
            self._error = exc
            return
        took = time.perf_counter() - began
        self.write_s += took
        self.last_write_s = took
        if self._on_saved is not None and (not collective or dist.get_rank() == 0):
            self._on_saved(step, took)

    def _write_and_commit(self, step: int, shards: list[Shard], metadata: dict[str, Any], collective: bool) -> None:
        rank = dist.get_rank() if collective else 0
        token: list[Any] = [new_token() if rank == 0 else None]
        if collective:
            dist.broadcast_object_list(token, src=0, group=self._group)
        staged = self._store.stage(step, token[0], primary=rank == 0)
        files: dict[str, tuple[str, int]] | None = None
        error: BaseException | None = None
        try:
            files = staged.write(shards)
        except BaseException as exc:
            error = exc
        everyone: list[Any] = [files]
        if collective:
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, files, group=self._group)
        if rank == 0:
            if any(part is None for part in everyone):
                staged.abort()
            else:
                merged = {rel: digest for part in everyone for rel, digest in part.items()}
                try:
                    staged.commit(merged, metadata)
                except CheckpointError:
                    raise
                except Exception as exc:  # a store failure must name the checkpoint, not leak a boto3 trace
                    raise CheckpointError(f"could not save the checkpoint of step {step}: {exc}") from exc
        if error is not None:
            if isinstance(error, CheckpointError | KeyboardInterrupt | SystemExit):
                raise error
            raise CheckpointError(f"could not save the checkpoint of step {step}: {error}") from error
        if collective and rank == 0 and any(part is None for part in everyone):
            raise CheckpointError(f"the checkpoint of step {step} was not committed: another rank failed to write"
                                  " its shards (its error is in that rank's log)")

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def save_state(writer: CheckpointWriter, *, step: int, data_position: int, tokens: int, loss: float | None,
               model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
               sharded: bool, extra_metadata: dict[str, Any], blocking: bool, on_cpu: bool) -> int | None:
    """Collective: every rank calls it. Snapshots the state into the writer's host buffer (after the
    previous write has finished with it) and hands the write to the background thread."""
    rank = dist.get_rank() if distributed() else 0
    writes = sharded or rank == 0
    rngs: list[Any] = [rng_state()]
    if distributed() and not sharded:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, rngs[0])
        rngs = gathered
    if not writes:
        return None
    model_state, optim_state = model_and_optimizer_state(model, optimizer, sharded)
    writer.wait()  # the host buffer is the previous checkpoint's until its write is done
    tensors: list[torch.Tensor] = []
    seen: dict[tuple[Any, ...], int] = {}
    skeleton = {"model": flatten(model_state, tensors, seen), "optimizer": flatten(optim_state, tensors, seen)}
    layout = writer.buffer.fill(tensors)
    trainable_only = has_frozen(model)
    meta = {"step": step, "data_position": data_position, "tokens": tokens, "loss": loss, "state": skeleton,
            "scheduler": copy_module.deepcopy(scheduler.state_dict()), "rng": rngs,
            "shapes": state_shapes(model_state), "trainable_only": trainable_only,
            "world_size": dist.get_world_size() if distributed() else 1, "fsdp": sharded,
            "run_split": extra_metadata.get("run_split")}  # what a resume reads back (LoadedState.split)
    prefix = f"rank-{rank:04d}/" if sharded else ""
    shards = _shards(writer.buffer, layout, meta, prefix, [t.device.type for t in tensors])
    metadata = {"step": step, "data_position": data_position, "tokens": tokens, "loss": loss,
                "layout": "sharded-v2", "fsdp_ranks": dist.get_world_size() if sharded else 0,
                "trainable_only": trainable_only, **extra_metadata}
    writer.submit(step, shards, metadata, collective=sharded, blocking=blocking)
    return step if rank == 0 else None


def prepare_state(writer: CheckpointWriter, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  sharded: bool) -> None:
    """Start allocating the host buffer of this rank's checkpoints in the background. Call it once the
    optimizer state exists (after the first step), on every rank that writes."""
    if not sharded and distributed() and dist.get_rank() != 0:
        return
    model_state, optim_state = model_and_optimizer_state(model, optimizer, sharded)
    tensors: list[torch.Tensor] = []
    seen: dict[tuple[Any, ...], int] = {}
    flatten({"model": model_state, "optimizer": optim_state}, tensors, seen)
    writer.buffer.prepare(tensors)


