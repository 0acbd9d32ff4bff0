"""The checkpoint store, local and S3 (a real moto S3 server on 127.0.0.1 reached through boto3)."""

from __future__ import annotations

import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from errors import CheckpointError, InvalidInput
from tests.moto_server import moto_s3, moto_server, use_moto
from tests.processes import kill_9_when_ready
from workers.checkpoint.local import CheckpointStore, LocalStore, open_store, step_dirname
from workers.checkpoint.s3 import S3Store


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    moto_s3(s3_endpoint).create_bucket(Bucket=name)
    return name


StoreFactory = Callable[..., CheckpointStore]


@pytest.fixture(params=["local", "s3"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "local":
        return lambda **kw: open_store(str(tmp_path / "ckpts"), **kw)
    endpoint = request.getfixturevalue("s3_endpoint")
    name = request.getfixturevalue("bucket")
    client = moto_s3(endpoint)
    return lambda **kw: open_store(f"s3://{name}/jobs/job-1", s3_client=client, **kw)


def _write_ckpt(directory: Path, step: int, size: int = 1000) -> Path:
    """A fake checkpoint directory whose bytes depend on the step (so restores are checkable)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.bin").write_bytes(bytes([step % 256]) * size)
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "optim.bin").write_bytes(f"optimizer state at step {step}".encode())
    return directory


def _assert_restores_step(store: CheckpointStore, step: int, dest: Path) -> None:
    info = store.latest()
    assert info is not None and info.step == step
    meta = store.restore(info, dest)
    assert meta["step"] == step
    assert (dest / "model.bin").read_bytes()[:1] == bytes([step % 256])
    assert (dest / "sub" / "optim.bin").read_text() == f"optimizer state at step {step}"


def test_save_restore_roundtrip(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    src = _write_ckpt(tmp_path / "src", 12)
    info = store.save(12, src, metadata={"step": 12, "loss": 1.5, "data": {"offset": 4096}})
    assert info.step == 12 and info.uri.endswith(step_dirname(12))
    assert set(info.sha256) == {"model.bin", "sub/optim.bin"}
    assert info.size_bytes == 1000 + len(b"optimizer state at step 12")
    assert store.list() == [info]
    assert store.latest() == info
    dest = tmp_path / "dest"
    meta = store.restore(info, dest)
    assert meta == {"step": 12, "loss": 1.5, "data": {"offset": 4096}}
    assert (dest / "model.bin").read_bytes() == (src / "model.bin").read_bytes()
    assert (dest / "sub" / "optim.bin").read_bytes() == (src / "sub" / "optim.bin").read_bytes()


def test_empty_store_has_no_latest(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    assert store.latest() is None
    assert store.list() == []
    assert store.restore_latest(tmp_path / "d") is None


def test_keeps_last_k(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(keep=2)
    for step in range(1, 6):
        store.save(step, _write_ckpt(tmp_path / f"s{step}", step), metadata={"step": step})
    assert [c.step for c in store.list()] == [4, 5]
    _assert_restores_step(store, 5, tmp_path / "dest")


def test_saving_an_older_step_never_prunes_newer(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store(keep=1)
    store.save(10, _write_ckpt(tmp_path / "a", 10), metadata={"step": 10})
    store.save(7, _write_ckpt(tmp_path / "b", 7), metadata={"step": 7})
    assert [c.step for c in store.list()] == [7, 10]
    _assert_restores_step(store, 10, tmp_path / "dest")


def test_resaving_a_step_replaces_it(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    store.save(3, _write_ckpt(tmp_path / "a", 3, size=10), metadata={"step": 3})
    src = _write_ckpt(tmp_path / "b", 3, size=20)
    (src / "extra.txt").write_text("new")
    info = store.save(3, src, metadata={"step": 3, "again": True})
    assert [c.step for c in store.list()] == [3]
    assert info.size_bytes == 20 + len(b"optimizer state at step 3") + 3
    dest = tmp_path / "dest"
    assert store.restore(info, dest) == {"step": 3, "again": True}
    assert (dest / "extra.txt").read_text() == "new"


def test_corrupted_file_is_skipped_with_warning(
    make_store: StoreFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture, s3_endpoint: str
) -> None:
    store = make_store(keep=3)
    store.save(1, _write_ckpt(tmp_path / "a", 1), metadata={"step": 1})
    store.save(2, _write_ckpt(tmp_path / "b", 2), metadata={"step": 2})
    newest = store.latest()
    assert newest is not None and newest.step == 2
    # Same size, different bytes: only a hash can tell.
    if isinstance(store, LocalStore):
        path = store.root / step_dirname(2) / "model.bin"
        path.write_bytes(b"\xff" + path.read_bytes()[1:])
    else:
        assert isinstance(store, S3Store)
        key = f"{store.prefix}/{step_dirname(2)}/model.bin"
        moto_s3(s3_endpoint).put_object(Bucket=store.bucket, Key=key, Body=b"\xff" * 1000)
    with caplog.at_level(logging.WARNING):
        info = store.latest()
    assert info is not None and info.step == 1
    assert any("step-000000002" in r.getMessage() or "step 2" in r.getMessage() for r in caplog.records)
    with pytest.raises(CheckpointError, match="corrupted"):
        store.restore(newest, tmp_path / "bad")
    restored = store.restore_latest(tmp_path / "good")
    assert restored is not None and restored[0].step == 1 and restored[1] == {"step": 1}
    assert (tmp_path / "good" / "model.bin").read_bytes()[:1] == b"\x01"


def test_s3_deep_check_catches_content_swapped_under_same_metadata(
    s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    client = moto_s3(s3_endpoint)
    store = open_store(f"s3://{bucket}/p", s3_client=client)
    assert isinstance(store, S3Store)
    store.save(1, _write_ckpt(tmp_path / "a", 1), metadata={"step": 1})
    info2 = store.save(2, _write_ckpt(tmp_path / "b", 2), metadata={"step": 2})
    key = f"p/{step_dirname(2)}/model.bin"
    meta = client.head_object(Bucket=bucket, Key=key)["Metadata"]
    client.put_object(Bucket=bucket, Key=key, Body=b"\x00" * 1000, Metadata=meta)
    assert store.latest() == info2  # quick check trusts recorded hashes...
    deep = store.latest(deep=True)  # ...the deep one reads every byte
    assert deep is not None and deep.step == 1
    with pytest.raises(CheckpointError, match="corrupted"):
        store.restore(info2, tmp_path / "x")


def test_marker_without_files_is_torn(make_store: StoreFactory, tmp_path: Path, s3_endpoint: str) -> None:
    store = make_store()
    store.save(1, _write_ckpt(tmp_path / "a", 1), metadata={"step": 1})
    store.save(2, _write_ckpt(tmp_path / "b", 2), metadata={"step": 2})
    if isinstance(store, LocalStore):
        (store.root / step_dirname(2) / "sub" / "optim.bin").unlink()
    else:
        assert isinstance(store, S3Store)
        moto_s3(s3_endpoint).delete_object(Bucket=store.bucket, Key=f"{store.prefix}/{step_dirname(2)}/sub/optim.bin")
    assert [c.step for c in store.list()] == [1]
    _assert_restores_step(store, 1, tmp_path / "dest")


def test_move_adopts_the_directory_without_copying(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpts"))
    src = _write_ckpt(tmp_path / "src", 4)
    inode = (src / "model.bin").stat().st_ino
    info = store.save(4, src, metadata={"step": 4}, move=True)
    assert not src.exists(), "the directory was handed over"
    assert isinstance(store, LocalStore)
    assert (store.root / step_dirname(4) / "model.bin").stat().st_ino == inode, "renamed, not copied"
    assert store.latest() == info
    _assert_restores_step(store, 4, tmp_path / "dest")


def test_failed_move_gives_the_directory_back(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ckpts"))
    src = _write_ckpt(tmp_path / "src", 4)
    with pytest.raises(InvalidInput, match="JSON"):
        store.save(4, src, metadata={"bad": object()}, move=True)
    assert (src / "model.bin").read_bytes()[:1] == b"\x04" and (src / "sub" / "optim.bin").exists()
    assert not (src / "COMMIT").exists()
    assert store.list() == []


def test_move_to_s3_deletes_the_local_copy_after_commit(s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    store = open_store(f"s3://{bucket}/m", s3_client=moto_s3(s3_endpoint))
    src = _write_ckpt(tmp_path / "src", 6)
    store.save(6, src, metadata={"step": 6}, move=True)
    assert not src.exists()
    _assert_restores_step(store, 6, tmp_path / "dest")


def test_source_modified_during_save_is_refused(tmp_path: Path) -> None:
    src = _write_ckpt(tmp_path / "src", 1)

    def trainer_still_writing(rel: str) -> None:
        (src / rel).write_bytes(b"newer bytes")

    store = open_store(str(tmp_path / "ckpts"), on_file=trainer_still_writing)
    with pytest.raises(CheckpointError, match="changed while it was being saved"):
        store.save(1, src)
    assert store.list() == [] and store.latest() is None


def test_s3_resave_of_identical_step_never_uncommits_it(s3_endpoint: str, bucket: str, tmp_path: Path) -> None:
    client = moto_s3(s3_endpoint)
    seen: list[int | None] = []
    watcher = open_store(f"s3://{bucket}/r", s3_client=client)

    def during_save(rel: str) -> None:
        info = watcher.latest()
        seen.append(info.step if info else None)

    store = open_store(f"s3://{bucket}/r", s3_client=client, on_file=during_save)
    store.save(2, _write_ckpt(tmp_path / "a", 2), metadata={"step": 2})
    store.save(3, _write_ckpt(tmp_path / "b", 3), metadata={"step": 3})
    seen.clear()
    info = store.save(3, _write_ckpt(tmp_path / "c", 3), metadata={"step": 3, "again": True})
    assert seen == [3, 3], "the committed step 3 stayed committed while it was saved again"
    assert store.restore(info, tmp_path / "d") == {"step": 3, "again": True}
    seen.clear()
    changed = _write_ckpt(tmp_path / "e", 3, size=5)
    store.save(3, changed, metadata={"step": 3})
    assert seen and all(s == 2 for s in seen), "different bytes: un-committed first, the older one serves"
    _assert_restores_step(store, 3, tmp_path / "f")


def test_many_files_in_parallel(make_store: StoreFactory, tmp_path: Path) -> None:
    src = tmp_path / "many"
    for i in range(20):
        (src / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 3}" / f"f{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    store = make_store()
    info = store.save(1, src)
    assert len(info.sha256) == 20
    dest = tmp_path / "dest"
    store.restore(info, dest)
    for i in range(20):
        assert (dest / f"d{i % 3}" / f"f{i}.bin").read_bytes() == bytes([i]) * (1000 + i)


# -- killed while writing ------------------------------------------------------------------------


def _child_save(uri: str, endpoint: str | None, src: str, move: bool, started: Any) -> None:
    """Runs in a spawned process: saves step 2 and stalls after its first file until killed."""

    def stall(rel: str) -> None:
        started.set()
        time.sleep(120)

    client = moto_s3(endpoint) if endpoint else None
    store = open_store(uri, s3_client=client, on_file=stall)
    store.save(2, Path(src), metadata={"step": 2}, move=move)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "move"), [("local", False), ("local", True), ("s3", False)])
def test_killed_mid_save_previous_checkpoint_loads(
    backend: str, move: bool, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    if backend == "local":
        uri, endpoint, client = str(tmp_path / "ckpts"), None, None
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        uri, client = f"s3://{request.getfixturevalue('bucket')}/job", moto_s3(endpoint)
    store = open_store(uri, s3_client=client)
    store.save(1, _write_ckpt(tmp_path / "one", 1), metadata={"step": 1})

    kill_9_when_ready(_child_save, uri, endpoint, str(_write_ckpt(tmp_path / "two", 2)), move, timeout_s=60,
                      waiting_for="reached the middle of its save")

    reopened = open_store(uri, s3_client=client)
    with caplog.at_level(logging.WARNING):
        _assert_restores_step(reopened, 1, tmp_path / "dest")
    if backend == "local":
        assert isinstance(reopened, LocalStore)
        assert not list(reopened.root.glob(".tmp-*")), "a dead writer's temp dir is cleaned up on open"
        assert not (reopened.root / step_dirname(2)).exists()
    else:
        assert any("step 2" in r.getMessage() for r in caplog.records), "torn S3 save is reported"
    # The job resumes and saves step 2 again: it must become the latest.
    reopened.save(2, _write_ckpt(tmp_path / "two-again", 2), metadata={"step": 2})
    _assert_restores_step(reopened, 2, tmp_path / "dest2")


def test_interrupted_replace_is_recovered_on_open(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    store = open_store(str(root))
    store.save(5, _write_ckpt(tmp_path / "a", 5), metadata={"step": 5})
    # A crash between the two renames of a same-step replace leaves only the set-aside copy.
    os.rename(root / step_dirname(5), root / f".old-{step_dirname(5)}-deadbeef")
    assert open_store(str(root)).latest() is not None
    _assert_restores_step(open_store(str(root)), 5, tmp_path / "dest")


# -- bad input -------------------------------------------------------------------------------------


def test_missing_bucket_fails_at_open(s3_endpoint: str) -> None:
    with pytest.raises(CheckpointError) as err:
        open_store("s3://no-such-bucket-here/ckpts", s3_client=moto_s3(s3_endpoint))
    assert "no-such-bucket-here" in str(err.value) and "create it" in str(err.value)


def test_missing_bucket_via_environment_endpoint(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    use_moto(monkeypatch, s3_endpoint)
    with pytest.raises(CheckpointError, match="does not exist"):
        open_store("s3://not-created-bucket/x")
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    moto_s3(s3_endpoint).create_bucket(Bucket=name)
    assert open_store(f"s3://{name}/x").uri == f"s3://{name}/x"


def test_unwritable_local_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError, match="not writable"):
        open_store(str(blocker / "ckpts"))


def test_bad_uris_and_arguments(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unsupported"):
        open_store("gs://bucket/x")
    with pytest.raises(InvalidInput, match="empty"):
        open_store(" ")
    with pytest.raises(InvalidInput, match="keep"):
        open_store(str(tmp_path), keep=0)
    store = open_store(f"file://{tmp_path}/c")
    with pytest.raises(InvalidInput, match="JSON"):
        store.save(1, _write_ckpt(tmp_path / "a", 1), metadata={"x": object()})
    with pytest.raises(InvalidInput, match="non-negative"):
        store.save(-1, tmp_path / "a")
    with pytest.raises(CheckpointError, match="does not exist"):
        store.save(1, tmp_path / "missing")
    assert store.list() == [], "failed saves leave nothing behind"
    assert not [p for p in Path(store.uri).iterdir() if not p.name.startswith(".probe")]


# -- property: any interleaving of saves and torn saves -----------------------------------------

_OPS = st.lists(
    st.tuples(st.sampled_from(["save", "killed", "nomarker", "corrupt"]), st.integers(0, 6)),
    min_size=1,
    max_size=12,
)


def _apply(store: LocalStore, root: Path, op: str, step: int, state: dict[int, str], scratch: Path) -> None:
    keep = store.keep
    src = _write_ckpt(scratch / f"{op}-{step}-{uuid.uuid4().hex[:6]}", step, size=64)
    if op == "save":
        store.save(step, src, metadata={"step": step})
        state[step] = "good"
        # Model of pruning: only steps older than the saved one, beyond the newest `keep` with a marker.
        older = sorted((s for s, v in state.items() if s < step and v in ("good", "corrupt")), reverse=True)
        for s in older[keep - 1 :]:
            del state[s]
        for s in [s for s, v in state.items() if s < step and v == "torn"]:
            del state[s]
    elif op == "killed":  # a writer that died mid-copy leaves a temp dir of a dead pid
        tmp = root / f".tmp-{step_dirname(step)}-otherhost-1-0000"
        tmp.mkdir(exist_ok=True)
        (tmp / "model.bin").write_bytes(b"partial")
    elif op == "nomarker" and step not in state:  # files copied in by hand, never committed
        (root / step_dirname(step)).mkdir()
        (root / step_dirname(step) / "model.bin").write_bytes(b"x" * 64)
        state[step] = "torn"
    elif op == "corrupt" and state.get(step) == "good":
        path = root / step_dirname(step) / "model.bin"
        path.write_bytes(bytes([(path.read_bytes()[0] + 1) % 256]) + path.read_bytes()[1:])
        state[step] = "corrupt"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS, keep=st.integers(1, 3))
def test_latest_is_newest_complete_under_any_interleaving(ops: list[tuple[str, int]], keep: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root, scratch = Path(tmp) / "ckpts", Path(tmp) / "scratch"
        store = open_store(str(root), keep=keep)
        assert isinstance(store, LocalStore)
        state: dict[int, str] = {}
        for op, step in ops:
            _apply(store, root, op, step, state, scratch)
            good = [s for s, v in state.items() if v == "good"]
            info = store.latest()
            assert (info.step if info else None) == (max(good) if good else None)
        if good:
            restored = store.restore_latest(Path(tmp) / "out")
            assert restored is not None and restored[1] == {"step": max(good)}
