"""Reading a checkpoint to its devices (workers.checkpoint.read) and the background-pinned host buffer."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import CheckpointError
from tests.workers.train.test_train_state import _parts, _same, _save, _train
from workers.checkpoint import read as checkpoint_read
from workers.checkpoint.local import LocalStore
from workers.checkpoint.read import spans, target_devices
from workers.train.state_load import load_state, read_sharded
from workers.train.state_save import CheckpointWriter, prepare_state


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=12), gaps=st.lists(st.integers(0, 7), min_size=12,
       max_size=12), piece=st.integers(1, 50))
def test_pieces_of_a_file_land_in_exactly_the_bytes_of_their_tensors(sizes: list[int], gaps: list[int],
                                                                     piece: int) -> None:
    slots, at = [], 0
    for size, gap in zip(sizes, gaps, strict=False):
        at += gap  # alignment padding between tensors is read but lands nowhere
        slots.append((at, size))
        at += size
    data = bytes(i % 251 for i in range(at))
    out = [bytearray(size) for _, size in slots]
    first = 0
    for offset in range(0, at, piece):
        chunk = data[offset : offset + piece]
        runs, first = spans(offset, len(chunk), slots, first)
        for index, dest_at, source_at, count in runs:
            assert count > 0 and dest_at + count <= slots[index][1]
            out[index][dest_at : dest_at + count] = chunk[source_at : source_at + count]
    assert [bytes(o) for o in out] == [data[start : start + size] for start, size in slots]


def test_tensors_go_to_the_run_device_only_if_they_were_on_an_accelerator() -> None:
    cuda, cpu = torch.device("cuda", 1), torch.device("cpu")
    assert target_devices(["cuda", "cpu", "cuda"], 3, cuda) == [cuda, cpu, cuda]
    assert target_devices(["cuda", "cpu"], 2, None) == [cpu, cpu]  # tools read to the host
    assert target_devices(None, 2, cuda) == [cpu, cpu]  # checkpoints that did not record devices


def test_a_prepared_buffer_is_the_one_the_first_snapshot_uses(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    _train(model, optimizer, scheduler, 1)
    writer = CheckpointWriter(store)
    prepare_state(writer, model=model, optimizer=optimizer, sharded=False)
    writer.buffer.wait_prepared()
    assert writer.buffer.prepare_s is not None
    prepared = [b.data_ptr() for b in writer.buffer.buffers]
    assert prepared
    _save(writer, 1, model, optimizer, scheduler)
    assert [b.data_ptr() for b in writer.buffer.buffers] == prepared  # no allocation in the stall
    prepare_state(writer, model=model, optimizer=optimizer, sharded=False)  # same layout: nothing to do
    assert [b.data_ptr() for b in writer.buffer.buffers] == prepared

    info = store.latest()
    assert info is not None
    meta, _ = read_sharded(store, info)
    assert set(meta["devices"]) == {"cpu"}
    fresh, fresh_opt, fresh_sched = _parts(seed=5)
    assert load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False) is not None
    _same(fresh.state_dict(), model.state_dict())


class _Stream:
    """CUDA stream stand-in: on the CPU every copy is done when it returns."""

    device = torch.device("cpu")

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Event:
    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass


@pytest.fixture
def cpu_as_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Run the device read path (pinned staging pieces, streams, events) with CPU stand-ins, and
    pieces of 1 KiB so that tensors straddle many pieces."""
    monkeypatch.setattr(checkpoint_read, "CHUNK", 1024)
    monkeypatch.setattr(checkpoint_read, "_pinned", lambda n: torch.empty(n, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    yield


def _entries(meta: dict[str, Any]) -> list[checkpoint_read.Entry]:
    return [(rel, offset, nbytes, dtype, tuple(shape)) for rel, offset, nbytes, dtype, shape in meta["tensors"]]


def test_the_device_path_puts_every_byte_where_the_host_path_does(tmp_path: Path, cpu_as_device: None) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts(width=40)
    _train(model, optimizer, scheduler, 2)
    _save(CheckpointWriter(store), 2, model, optimizer, scheduler)
    info = store.latest()
    assert info is not None
    meta, host = read_sharded(store, info)
    cpu = torch.device("cpu")
    entries = _entries(meta)
    staged = checkpoint_read._to_device(store, info, entries, [cpu] * len(entries), cpu)
    assert len(staged) == len(host)
    for a, b in zip(staged, host, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)

    shard = tmp_path / "ck" / "step-000000002" / "shard-00-of-16.bin"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="corrupted"):
        checkpoint_read._to_device(store, info, entries, [cpu] * len(entries), cpu)
