"""Sharded training-state checkpoints: real tensors, real files, a real moto S3 server."""

from __future__ import annotations

import copy
import itertools
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import CheckpointError, InvalidInput
from tests.moto_server import moto_s3, moto_server
from workers.checkpoint import s3 as checkpoint_s3
from workers.checkpoint.local import LocalStore, open_store, step_dirname
from workers.train.state_load import load_state, read_checkpoint_state, read_sharded
from workers.train.state_save import (
    ALIGN,
    META_FILE,
    STATE_FILE,
    CheckpointWriter,
    plan_layout,
    rng_state,
    save_state,
    shape_signature,
)


class Net(torch.nn.Module):
    def __init__(self, width: int = 24, layers: int = 5) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(layers))
        self.head = torch.nn.Linear(width, 3, bias=False)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        out: torch.Tensor = self.head(x) * self.scale
        return out


def _parts(seed: int = 0, frozen: bool = False, width: int = 24) -> tuple[Net, Any, Any]:
    torch.manual_seed(seed)
    model = Net(width)
    if frozen:  # stands for LoRA: the base is frozen, only the head trains
        for p in model.blocks.parameters():
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return model, optimizer, scheduler


def _train(model: Net, optimizer: Any, scheduler: Any, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(4, model.head.in_features)
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def _save(writer: CheckpointWriter, step: int, model: Net, optimizer: Any, scheduler: Any,
          blocking: bool = True) -> None:
    save_state(writer, step=step, data_position=step * 4, tokens=step * 100, loss=0.5, model=model,
               optimizer=optimizer, scheduler=scheduler, sharded=False, extra_metadata={"job_id": "t"},
               blocking=blocking, on_cpu=True)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_sharded_save_resumes_exactly_and_continues_bit_for_bit(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    _train(model, optimizer, scheduler, 3)
    writer = CheckpointWriter(store)
    _save(writer, 3, model, optimizer, scheduler)
    rng_after_save = rng_state()["torch"]
    info = store.latest()
    assert info is not None
    shards = [rel for rel in info.sha256 if rel.startswith("shard-")]
    assert META_FILE in info.sha256 and len(shards) == 16
    _train(model, optimizer, scheduler, 2)  # the reference goes on from the saved point

    fresh, fresh_opt, fresh_sched = _parts(seed=99)
    loaded = load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False)
    assert loaded is not None and (loaded.step, loaded.data_position, loaded.tokens) == (3, 12, 300)
    assert torch.equal(rng_state()["torch"], rng_after_save)
    _train(fresh, fresh_opt, fresh_sched, 2)
    _same(model.state_dict(), fresh.state_dict())
    assert fresh_sched.last_epoch == scheduler.last_epoch


def test_host_buffer_is_reused_and_the_next_snapshot_waits_for_the_write(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    _train(model, optimizer, scheduler, 1)
    writer = CheckpointWriter(store)
    _save(writer, 1, model, optimizer, scheduler, blocking=False)
    buffers = [b.data_ptr() for b in writer.buffer.buffers]
    _train(model, optimizer, scheduler, 1)
    _save(writer, 2, model, optimizer, scheduler, blocking=False)  # waits for step 1's write first
    assert [b.data_ptr() for b in writer.buffer.buffers] == buffers
    writer.wait()
    assert [i.step for i in store.list()] == [1, 2]
    found = read_checkpoint_state(store)
    assert found is not None and found[0] == 2
    _same(found[1], model.state_dict())


def test_a_corrupt_shard_is_never_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    writer = CheckpointWriter(store)
    _train(model, optimizer, scheduler, 1)
    _save(writer, 1, model, optimizer, scheduler)
    at_1 = copy.deepcopy(model.state_dict())
    _train(model, optimizer, scheduler, 1)
    _save(writer, 2, model, optimizer, scheduler)
    shard = tmp_path / "ck" / step_dirname(2) / "shard-00-of-16.bin"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one flipped byte: only the hash can tell
    shard.write_bytes(bytes(raw))

    fresh, fresh_opt, fresh_sched = _parts(seed=5)
    loaded = load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False)
    assert loaded is not None and loaded.step == 1
    _same(fresh.state_dict(), at_1)
    assert "skipping checkpoint step 2" in caplog.text and "corrupted" in caplog.text


def test_a_torn_sharded_save_is_skipped(tmp_path: Path) -> None:
    class Die(Exception):
        pass

    seen: list[str] = []

    def hook(rel: str) -> None:
        seen.append(rel)
        if len(seen) == 20:  # 17 files per save: a few shards of the second one have landed
            raise Die

    store = LocalStore(tmp_path / "ck", on_file=hook)
    model, optimizer, scheduler = _parts()
    writer = CheckpointWriter(store)
    _save(writer, 1, model, optimizer, scheduler)
    with pytest.raises(CheckpointError, match="step 2") as raised:
        _save(writer, 2, model, optimizer, scheduler)
    assert isinstance(raised.value.__cause__, Die)
    assert [i.step for i in LocalStore(tmp_path / "ck").list()] == [1]
    assert not (tmp_path / "ck" / step_dirname(2)).exists()


def test_lora_checkpoint_holds_only_the_trainable_part(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts(frozen=True, width=64)
    _train(model, optimizer, scheduler, 2)
    writer = CheckpointWriter(store)
    _save(writer, 2, model, optimizer, scheduler)
    info = store.latest()
    assert info is not None
    head_bytes = model.head.weight.numel() * 4
    shard_bytes = sum(size for rel, size in info.sizes.items() if rel.startswith("shard-"))
    assert shard_bytes < 4 * head_bytes  # weights + two moments (+ alignment), none of the frozen blocks
    found = read_checkpoint_state(store)
    assert found is not None and set(found[1]) == {"head.weight"}

    base, base_opt, base_sched = _parts(seed=0, frozen=True, width=64)  # the frozen base from its source
    loaded = load_state(store, model=base, optimizer=base_opt, scheduler=base_sched, sharded=False)
    assert loaded is not None
    _same(base.state_dict(), model.state_dict())


def test_a_different_model_is_refused_by_name(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    _save(CheckpointWriter(store), 1, model, optimizer, scheduler)
    other, other_opt, other_sched = _parts(width=16)
    with pytest.raises(InvalidInput, match=r"blocks\.0\.weight is"):
        load_state(store, model=other, optimizer=other_opt, scheduler=other_sched, sharded=False)


def _legacy_save(store: LocalStore, step: int, model: Net, optimizer: Any, scheduler: Any) -> None:
    """Exactly what the single-file writer of earlier versions put in the store."""
    state = {"step": step, "data_position": step * 4, "tokens": step * 100, "loss": 0.25,
             "model": {k: v.clone() for k, v in model.state_dict().items()},
             "optimizer": copy.deepcopy(optimizer.state_dict()), "scheduler": scheduler.state_dict(),
             "rng": [rng_state()], "shapes": shape_signature(model)}
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(state, Path(tmp) / STATE_FILE)
        store.save(step, Path(tmp), metadata={"step": step})


def test_single_file_checkpoints_of_earlier_versions_still_load(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts()
    _train(model, optimizer, scheduler, 2)
    _legacy_save(store, 2, model, optimizer, scheduler)
    _train(model, optimizer, scheduler, 1)
    fresh, fresh_opt, fresh_sched = _parts(seed=3)
    loaded = load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False)
    assert loaded is not None and (loaded.step, loaded.tokens, loaded.loss) == (2, 200, 0.25)
    _train(fresh, fresh_opt, fresh_sched, 1)
    _same(fresh.state_dict(), model.state_dict())  # the same RNG stream drew the same third batch
    found = read_checkpoint_state(store)
    assert found is not None and found[0] == 2


def test_an_unknown_layout_is_refused_not_guessed(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "weights.safetensors").write_bytes(b"\0" * 16)
    store.save(4, tmp_path / "src")
    model, optimizer, scheduler = _parts()
    with pytest.raises(InvalidInput, match="layout this version of gpuplan cannot read"):
        load_state(store, model=model, optimizer=optimizer, scheduler=scheduler, sharded=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.float32, torch.bfloat16, torch.uint8, torch.int64]),
                          st.integers(0, 300)), min_size=1, max_size=40),
       st.integers(1, 16))
def test_layout_is_balanced_aligned_and_non_overlapping(specs: list[tuple[torch.dtype, int]], shards: int) -> None:
    tensors = [torch.empty(n, dtype=dtype) for dtype, n in specs]
    layout = plan_layout(tensors, shards)
    assert len(layout.shard_bytes) == min(shards, len(tensors))
    by_shard: dict[int, list[tuple[int, int]]] = {}
    for slot, t in zip(layout.slots, tensors, strict=True):
        assert slot.offset % ALIGN == 0 and slot.nbytes == t.numel() * t.element_size()
        assert slot.offset + slot.nbytes <= layout.shard_bytes[slot.shard]
        by_shard.setdefault(slot.shard, []).append((slot.offset, slot.offset + slot.nbytes))
    for spans in by_shard.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    total = sum(t.numel() * t.element_size() for t in tensors)
    largest = max(t.numel() * t.element_size() for t in tensors)
    assert max(layout.shard_bytes) <= total / len(layout.shard_bytes) + largest + ALIGN * len(tensors)


# -- S3 -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_client() -> Iterator[Any]:
    with moto_server() as url:
        yield moto_s3(url)


def test_s3_sharded_save_with_multipart_shards_resumes_exactly(s3_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_s3, "PART_BYTES", 5 * 1024 * 1024)  # S3's smallest part: shards go multipart
    bucket = f"ck-{uuid.uuid4().hex[:10]}"
    s3_client.create_bucket(Bucket=bucket)
    store = open_store(f"s3://{bucket}/job", s3_client=s3_client)
    model, optimizer, scheduler = _parts(width=1200)  # 5.8 MB per weight or moment: shards > 5 MiB
    _train(model, optimizer, scheduler, 1)
    writer = CheckpointWriter(store)
    _save(writer, 1, model, optimizer, scheduler)
    info = store.latest()
    assert info is not None and max(info.sizes.values()) > 5 * 1024 * 1024
    fresh, fresh_opt, fresh_sched = _parts(seed=4, width=1200)
    loaded = load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False)
    assert loaded is not None and loaded.step == 1
    _same(fresh.state_dict(), model.state_dict())

    key = f"job/{step_dirname(1)}/shard-03-of-16.bin"
    body = bytearray(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[0] ^= 0xFF
    s3_client.put_object(Bucket=bucket, Key=key, Body=bytes(body),
                         Metadata=s3_client.head_object(Bucket=bucket, Key=key)["Metadata"])
    with pytest.raises(CheckpointError, match="corrupted"):
        store.read_into(info, "shard-03-of-16.bin", memoryview(bytearray(info.sizes["shard-03-of-16.bin"])))
    assert load_state(store, model=fresh, optimizer=fresh_opt, scheduler=fresh_sched, sharded=False) is None


def test_an_unreadable_rank_meta_is_skipped_not_loaded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from workers.checkpoint.local import Shard, new_token

    store = LocalStore(tmp_path / "ck")
    staged = store.stage(3, new_token())
    files = staged.write([Shard(f"rank-{r:04d}/{META_FILE}", lambda sink: None) for r in range(2)])
    staged.commit(files, {"step": 3})
    model, optimizer, scheduler = _parts()
    assert load_state(store, model=model, optimizer=optimizer, scheduler=scheduler, sharded=False) is None
    assert "cannot be read" in caplog.text


def test_tied_weights_are_stored_once_and_stay_tied(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "ck")
    model, optimizer, scheduler = _parts(width=48)
    model.extra = torch.nn.Linear(48, 3, bias=False)
    model.extra.weight = model.head.weight  # tied, as llama-3.2-1b ties embeddings and lm_head
    _train(model, optimizer, scheduler, 1)
    _save(CheckpointWriter(store), 1, model, optimizer, scheduler)
    info = store.latest()
    assert info is not None
    meta, tensors = read_sharded(store, info)
    refs = meta["state"]["model"]
    assert refs["extra.weight"] == refs["head.weight"]  # one copy in the shards, two names
    assert len(tensors) == len(model.state_dict()) - 1 + 2 * len(list(model.parameters())) + len(
        list(model.parameters()))  # unique weights and buffers; AdamW's two moments and step per parameter
    found = read_checkpoint_state(store)
    assert found is not None and torch.equal(found[1]["extra.weight"], found[1]["head.weight"])
