"""Read a sharded checkpoint's tensors straight to the device they train on, verified.

A plain parallel read into fresh pageable memory, then ``load_state_dict`` copying that to the GPU,
costs the read plus a pageable host-to-device copy (a few GB/s) plus first-touch page faults: 2.4x a
plain read on the H200 (docs/lab-notes/2026-12-01-checkpoints-of-a-training-state.md). Here every file is read by its
own thread in CHUNK pieces into a small pinned staging pair that thread owns (allocated once per load: threads x 2 x
CHUNK), hashed, and copied from there to the destination tensors on a CUDA stream of that thread, so
reading, hashing and the copy to the device overlap and nothing big is allocated on the host.

Tensors that were on the CPU when saved (AdamW's ``step`` counters) and every tensor when the run
has no CUDA device go to host memory, read in place. A file that does not verify raises
CheckpointError after its last piece; the caller drops what it read (the live model is never
written before every file has verified).
"""

from __future__ import annotations

import queue
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from workers.checkpoint.format import (
    CHUNK,
    CheckpointInfo,
    CheckpointStore,
    stream_verified,
)
from workers.checkpoint.threads import SHARD_THREADS, parallel_map

Entry = tuple[str, int, int, str, tuple[int, ...]]
"""One tensor of a checkpoint: (file, byte offset, bytes, dtype name, shape)."""


def host_bytes(buffer: torch.Tensor) -> memoryview:
    """A uint8 CPU tensor's bytes, shared (no copy)."""
    array: Any = buffer.numpy()
    return memoryview(array).cast("B")


def target_devices(saved: Sequence[str] | None, count: int, device: torch.device | None) -> list[torch.device]:
    """Where each of ``count`` tensors goes: to ``device`` (the run's accelerator) if it was on one
    when saved, else to the CPU. Checkpoints that did not record devices load on the CPU."""
    cpu = torch.device("cpu")
    if saved is None or device is None or device.type == "cpu":
        return [cpu] * count
    return [device if kind != "cpu" else cpu for kind in saved]


def read_tensors(store: CheckpointStore, info: CheckpointInfo, entries: Sequence[Entry],
                 devices: Sequence[torch.device]) -> list[torch.Tensor]:
    """The tensors of ``entries``, each on its device, every file read in parallel and verified."""
    accelerator = next((d for d in devices if d.type == "cuda"), None)
    if accelerator is not None:
        try:
            return _to_device(store, info, entries, devices, accelerator)
        except torch.OutOfMemoryError:  # the device is too full for a second copy: stage on the host
            torch.cuda.empty_cache()
    return _to_host(store, info, entries)


def _to_host(store: CheckpointStore, info: CheckpointInfo, entries: Sequence[Entry]) -> list[torch.Tensor]:
    files = sorted({entry[0] for entry in entries})
    buffers = {rel: torch.empty(max(info.sizes.get(rel, 0), 1), dtype=torch.uint8) for rel in files}
    parallel_map(lambda rel: store.read_into(info, rel, host_bytes(buffers[rel])[: info.sizes[rel]]),
                 files, threads=SHARD_THREADS)
    return [buffers[rel][offset : offset + nbytes].view(getattr(torch, dtype)).view(shape)
            for rel, offset, nbytes, dtype, shape in entries]


@dataclass
class _Staging:
    """One reader thread's pinned double buffer and CUDA stream."""

    pieces: tuple[torch.Tensor, torch.Tensor]
    events: tuple[Any, Any]
    stream: Any


def _pinned(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _staging(device: torch.device, count: int) -> queue.Queue[_Staging]:
    # Made in the caller's thread: it has the run's device current (a worker thread would open a
    # context on GPU 0).
    pool: queue.Queue[_Staging] = queue.Queue()
    for _ in range(count):
        pieces = (_pinned(CHUNK), _pinned(CHUNK))
        events = (torch.cuda.Event(), torch.cuda.Event())  # type: ignore[no-untyped-call]
        pool.put(_Staging(pieces, events, torch.cuda.Stream(device)))  # type: ignore[no-untyped-call]
    return pool


def _to_device(store: CheckpointStore, info: CheckpointInfo, entries: Sequence[Entry],
               devices: Sequence[torch.device], device: torch.device) -> list[torch.Tensor]:
    out = [torch.empty(shape, dtype=getattr(torch, dtype), device=dev)
           for (_, _, _, dtype, shape), dev in zip(entries, devices, strict=True)]
    by_file: dict[str, list[int]] = defaultdict(list)  # file -> its entries, by offset
    for index in sorted(range(len(entries)), key=lambda i: entries[i][1]):
        by_file[entries[index][0]].append(index)
    files = sorted(by_file)
    pool = _staging(device, min(SHARD_THREADS, len(files)))
    allocated = torch.cuda.current_stream(device)

    def read(rel: str) -> None:
        staging = pool.get()
        try:
            _read_file(store, info, rel, [(entries[i][1], out[i]) for i in by_file[rel]], staging, allocated)
        finally:
            staging.stream.synchronize()  # after a failure too: no copy still reads the buffers handed back
            pool.put(staging)

    parallel_map(read, files, threads=SHARD_THREADS)
    return out


Run = tuple[int, int, int, int]
"""(slot, byte in the slot, byte in the piece, count)."""


def spans(offset: int, length: int, slots: Sequence[tuple[int, int]], first: int) -> tuple[list[Run], int]:
    """Where the file's bytes ``[offset, offset + length)`` go. ``slots`` are ``(offset, nbytes)`` sorted
    by offset; ``first`` is the first slot that may still overlap (returned advanced for the next piece)."""
    end = offset + length
    while first < len(slots) and slots[first][0] + slots[first][1] <= offset:
        first += 1
    out: list[Run] = []
    for index in range(first, len(slots)):
        start, nbytes = slots[index]
        if start >= end:
            break
        lo, hi = max(offset, start), min(end, start + nbytes)
        if hi > lo:
            out.append((index, lo - start, lo - offset, hi - lo))
    return out, first


def _read_file(store: CheckpointStore, info: CheckpointInfo, rel: str, slots: list[tuple[int, torch.Tensor]],
               staging: _Staging, allocated: Any) -> None:
    """Stream one file through ``staging`` into the ``(offset, tensor)`` slots it holds (sorted by offset).
    ``allocated``: the stream the destinations were allocated on."""
    flat = [tensor.view(-1).view(torch.uint8) for _, tensor in slots]
    ranges = [(offset, dest.numel()) for (offset, _), dest in zip(slots, flat, strict=True)]
    first = 0
    with torch.cuda.device(allocated.device), torch.cuda.stream(staging.stream):
        staging.stream.wait_stream(allocated)  # the copies wait until the destinations' memory is theirs
        pieces = stream_verified(store, info, rel, lambda offset: host_bytes(staging.pieces[(offset // CHUNK) % 2]))
        for offset, view in pieces:
            which = (offset // CHUNK) % 2
            source = staging.pieces[which]
            runs, first = spans(offset, len(view), ranges, first)
            for index, dest_at, source_at, count in runs:
                flat[index][dest_at : dest_at + count].copy_(source[source_at : source_at + count], non_blocking=True)
            staging.events[which].record(staging.stream)
            # The next piece is read into the other buffer: its copies (two pieces ago) must be done.
            staging.events[1 - which].synchronize()
