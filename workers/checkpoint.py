"""Atomic checkpoint store: a local directory or ``s3://bucket/prefix``.

Layout (both backends)::

    <uri>/step-000000012/<files of the saved directory...>
    <uri>/step-000000012/COMMIT      # JSON manifest: sha256 + size per file, metadata; written LAST

A checkpoint is *complete* only when its ``COMMIT`` marker exists, parses, and every file it lists
is present with the listed size and content hash. Anything else (a save killed mid-way, a file
corrupted later) is *torn*: ``latest()`` skips it with a warning and it is never loaded.

Local saves are written into a hidden temp directory next to the final one, fsynced, and renamed
into place, so a crash leaves either the old state or the new one. Sharded saves (``stage``) have
each file produced straight into the store by a writer callback and hashed as its bytes go by (no
second read); several processes may write into one staged step (FSDP ranks), and one commits it
after all of them are durable. ``read_into`` reads one file into memory, hashing as it reads.
S3 saves upload every object, check each one, and put the marker last (S3 has no rename).
Pruning keeps the newest ``keep`` complete checkpoints and only ever removes checkpoints *older*
than the one just saved, so the newest complete checkpoint is never deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar, runtime_checkable

from catalog.errors import CheckpointError, InvalidInput

logger = logging.getLogger(__name__)

MARKER = "COMMIT"
MANIFEST_FORMAT = 1
CHUNK = 8 * 1024 * 1024
IO_THREADS = 8  # files copied/hashed at once: one sha256 stream is ~1 GB/s, a disk or S3 takes more
# Shards written/read at once: each thread hashes its own file as it goes, so more threads = more hashing.
SHARD_THREADS = max(IO_THREADS, min(16, os.cpu_count() or 1))
_STEP_RE = re.compile(r"^step-(\d{9,})$")

FileHook = Callable[[str], None]
"""Called with a file's relative path after each file of a save is written (progress; tests use it
to kill a save at a known point)."""


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    uri: str  # where this one checkpoint lives: <store uri>/step-000000012
    created_at: float  # unix seconds, when the marker was written
    size_bytes: int  # total of the files (marker excluded)
    sha256: dict[str, str]  # relative path ('/'-separated) -> hex digest
    sizes: dict[str, int] = field(default_factory=dict)  # relative path -> bytes


class Sink(Protocol):
    def write(self, data: bytes | memoryview, /) -> int: ...


@dataclass(frozen=True)
class Shard:
    """One file of a sharded save: ``write`` produces its bytes into the sink it is given."""

    rel: str
    write: Callable[[Sink], None]


FileDigests = dict[str, tuple[str, int]]
"""relative path -> (sha256 hex, size) of files written by a staged save."""


class HashingSink:
    """Writes through to a file while hashing the same bytes: the file is verified as it is written."""

    def __init__(self, fh: BinaryIO) -> None:
        self._fh = fh
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes | memoryview, /) -> int:
        self._digest.update(data)
        self.size += len(data)
        self._fh.write(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


@runtime_checkable
class StagedSave(Protocol):
    def write(self, shards: Sequence[Shard]) -> FileDigests:
        """Write, hash and make durable these files of the step (any process of the save may call it)."""

    def commit(self, files: FileDigests, metadata: Mapping[str, object] | None) -> CheckpointInfo:
        """Commit the step with exactly ``files`` (every writer's, once all are durable), then prune."""

    def abort(self) -> None:
        """Drop what was written (never touches committed checkpoints)."""


@runtime_checkable
class CheckpointStore(Protocol):
    uri: str

    def save(
        self,
        step: int,
        source_dir: Path,
        *,
        metadata: Mapping[str, object] | None = None,
        move: bool = False,
    ) -> CheckpointInfo:
        """Copy every file of ``source_dir`` to ``<uri>/step-<step>/``, verify, commit, prune.

        ``move=True``: the store may take ``source_dir`` over (rename instead of copy) and it is
        gone afterwards; on failure it is left in place."""

    def latest(self) -> CheckpointInfo | None:
        """The newest complete checkpoint; torn ones are skipped with a logged warning."""

    def restore(self, info: CheckpointInfo, dest_dir: Path) -> dict[str, object]:
        """Download/copy ``info`` into ``dest_dir``, verify every hash; returns the saved metadata."""

    def list(self) -> list[CheckpointInfo]:
        """Checkpoints whose marker and files are present, oldest first (hashes not re-read)."""

    def restore_latest(self, dest_dir: Path) -> tuple[CheckpointInfo, dict[str, object]] | None:
        """Restore the newest checkpoint that verifies, falling back to older ones; None if none."""

    def stage(self, step: int, token: str, *, primary: bool = True) -> StagedSave:
        """Begin a sharded save of ``step``. Every process writing into it passes the same ``token``
        (from ``new_token()``, made once and shared); the ``primary`` one commits."""

    def read_into(self, info: CheckpointInfo, rel: str, out: memoryview) -> None:
        """Read one file of ``info`` into ``out`` (exactly its size), verifying its sha256 as it reads;
        CheckpointError if the bytes are not the committed ones."""

    def metadata(self, info: CheckpointInfo) -> dict[str, object]:
        """The metadata committed with ``info``."""


def new_token() -> str:
    """Names one staged save: host, pid and a random part (a dead writer's leftovers are recognised)."""
    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def step_dirname(step: int) -> str:
    return f"step-{step:09d}"


def parse_step_dirname(name: str) -> int | None:
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None


def check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InvalidInput(f"checkpoint step must be a non-negative integer, got {step!r}")


def source_files(source_dir: Path) -> list[tuple[str, Path]]:
    """(relative '/'-path, absolute path) of every regular file under ``source_dir``, sorted."""
    if not source_dir.is_dir():
        raise CheckpointError(
            f"cannot save checkpoint: source directory {source_dir} does not exist or is not a directory",
            hint="write the checkpoint files into a directory first, then save that directory",
        )
    files: list[tuple[str, Path]] = []
    for root, dirs, names in os.walk(source_dir):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            if not path.is_file():
                continue
            rel = path.relative_to(source_dir).as_posix()
            if rel == MARKER:
                raise InvalidInput(
                    f"{path}: a file named {MARKER!r} at the top of a checkpoint is reserved for the commit marker",
                    hint="rename that file",
                )
            files.append((rel, path))
    return files


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build_manifest(
    step: int, files: Mapping[str, tuple[str, int]], metadata: Mapping[str, object] | None, created_at: float
) -> bytes:
    body = {
        "format": MANIFEST_FORMAT,
        "step": step,
        "created_at": created_at,
        "files": {rel: {"sha256": sha, "size": size} for rel, (sha, size) in sorted(files.items())},
        "metadata": dict(metadata or {}),
    }
    try:
        return json.dumps(body, sort_keys=True, indent=1, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(
            f"checkpoint metadata must be JSON-serialisable (str, int, float, bool, None, lists, dicts): {exc}",
            hint="convert tensors/arrays to lists or save them as files in the checkpoint directory",
        ) from exc


@dataclass(frozen=True)
class Manifest:
    step: int
    created_at: float
    files: dict[str, tuple[str, int]]  # rel -> (sha256, size)
    metadata: dict[str, object]

    def info(self, uri: str) -> CheckpointInfo:
        return CheckpointInfo(
            step=self.step,
            uri=uri,
            created_at=self.created_at,
            size_bytes=sum(size for _, size in self.files.values()),
            sha256={rel: sha for rel, (sha, _) in self.files.items()},
            sizes={rel: size for rel, (_, size) in self.files.items()},
        )


def parse_manifest(raw: bytes, expected_step: int) -> Manifest:
    """Parse a marker; raises ValueError on anything malformed (the caller treats it as torn)."""
    body = json.loads(raw)
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        raise ValueError("unknown manifest format")
    if body.get("step") != expected_step:
        raise ValueError(f"marker says step {body.get('step')!r}, directory says {expected_step}")
    files_raw = body["files"]
    metadata = body.get("metadata", {})
    if not isinstance(files_raw, dict) or not isinstance(metadata, dict):
        raise ValueError("malformed manifest")
    files: dict[str, tuple[str, int]] = {}
    for rel, entry in files_raw.items():
        sha, size = entry["sha256"], entry["size"]
        if not isinstance(sha, str) or not isinstance(size, int) or ".." in rel.split("/"):
            raise ValueError(f"malformed manifest entry {rel!r}")
        files[rel] = (sha, size)
    return Manifest(step=expected_step, created_at=float(body["created_at"]), files=files, metadata=metadata)


def plan_prune(steps_with_marker: list[int], saved_step: int, keep: int) -> list[int]:
    """Steps to delete after saving ``saved_step``: only ones older than it, beyond the newest ``keep``.

    Steps newer than the one just saved are never touched (the newest complete checkpoint may be
    among them), and the one just saved is always kept.
    """
    candidates = sorted({*(s for s in steps_with_marker if s <= saved_step), saved_step}, reverse=True)
    return sorted(candidates[max(keep, 1) :])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LocalStore:
    """Checkpoints in a local (or network-mounted) directory."""

    def __init__(self, root: Path, *, keep: int = 3, on_file: FileHook | None = None) -> None:
        if keep < 1:
            raise InvalidInput(f"keep must be at least 1 (got {keep}): the newest checkpoint is always kept")
        self.root = root.expanduser().resolve()
        self.uri = str(self.root)
        self.keep = keep
        self._on_file = on_file
        self._host = socket.gethostname().replace("-", "_")
        self._check_writable()
        self._recover()

    # -- open-time checks -------------------------------------------------------------------
    def _check_writable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(
                f"checkpoint directory {self.root} is not writable: {exc.strerror or exc}",
                hint="choose a directory you can write to (checkpoint_uri), or fix its permissions",
            ) from exc

    def _recover(self) -> None:
        """Undo a replace (same-step re-save) that was interrupted between its two renames."""
        for old in self.root.glob(".old-step-*"):
            name = old.name[len(".old-") :].rsplit("-", 1)[0]
            final = self.root / name
            if parse_step_dirname(name) is None:
                continue
            if final.exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.rename(old, final)
        self._remove_dead_temps()

    def _remove_dead_temps(self) -> None:
        """Temp dirs of saves whose process died (same host) are garbage; live ones may be saving."""
        for tmp in self.root.glob(".tmp-step-*"):
            parts = tmp.name.split("-")  # .tmp-step-<step>-<host>-<pid>-<uuid>
            if len(parts) < 6 or parts[3] != self._host:
                continue
            try:
                pid = int(parts[4])
            except ValueError:
                continue
            if pid != os.getpid() and not _pid_alive(pid):
                shutil.rmtree(tmp, ignore_errors=True)

    # -- save -------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        source_dir: Path,
        *,
        metadata: Mapping[str, object] | None = None,
        move: bool = False,
    ) -> CheckpointInfo:
        """Save ``source_dir`` as step ``step``. ``move=True`` hands the directory over: on the same
        filesystem it is renamed into the store and hashed in place (no copy; the fast path for a
        just-in-time checkpoint), elsewhere copied and then deleted."""
        check_step(step)
        source_dir = Path(source_dir)
        files = source_files(source_dir)
        final = self.root / step_dirname(step)
        tmp = self.root / f".tmp-{step_dirname(step)}-{self._host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        adopted = move and self._adopt(source_dir, tmp)
        try:
            if adopted:
                hashed = parallel_map(lambda item: _hash_and_fsync(tmp / item[0]), files, self._hook(files))
                written = {rel: result for (rel, _), result in zip(files, hashed, strict=True)}
            else:
                tmp.mkdir()
                for rel, _ in files:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                copied = parallel_map(lambda item: _copy_hashing(item[1], tmp / item[0]), files, self._hook(files))
                written = {rel: result for (rel, _), result in zip(files, copied, strict=True)}
                # The copy and its hash come from the same reads; re-hash the source to catch a writer
                # still changing it (a torn copy that would otherwise verify).
                landed = parallel_map(lambda item: sha256_file(item[1]), files)
                for (rel, (sha, _)), got in zip(written.items(), landed, strict=True):
                    if got != sha:
                        raise CheckpointError(
                            f"checkpoint step {step}: {rel} changed while it was being saved",
                            hint="do not modify the source directory during save",
                        )
            manifest = build_manifest(step, written, metadata, time.time())
            with (tmp / MARKER).open("wb") as fh:
                fh.write(manifest)
                fh.flush()
                os.fsync(fh.fileno())
            for dirpath, _, _ in os.walk(tmp):
                _fsync_dir(Path(dirpath))
            self._publish(tmp, final)
        except BaseException as exc:
            if adopted:  # give the caller's directory back rather than delete its only copy
                (tmp / MARKER).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    os.rename(tmp, source_dir)
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise CheckpointError(
                    f"could not write checkpoint step {step} to {self.root}: {exc}",
                    hint="check free disk space and permissions; the previous checkpoint is untouched",
                ) from exc
            raise
        if move and not adopted:
            shutil.rmtree(source_dir, ignore_errors=True)
        info = parse_manifest(manifest, step).info(str(final))
        self._prune(step)
        return info

    def _adopt(self, source_dir: Path, tmp: Path) -> bool:
        """Rename ``source_dir`` to ``tmp`` if both are on one filesystem; False to fall back to copying."""
        try:
            if os.stat(source_dir).st_dev != os.stat(self.root).st_dev:
                return False
            os.rename(source_dir, tmp)
        except OSError:
            return False
        return True

    def _hook(self, files: Sequence[tuple[str, Path]]) -> Callable[[int], None] | None:
        hook = self._on_file
        if hook is None:
            return None
        return lambda index: hook(files[index][0])

    def _publish(self, tmp: Path, final: Path) -> None:
        if final.exists():
            # Same step saved again (a repeated step after resume): swap, never leave neither.
            old = self.root / f".old-{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            _fsync_dir(self.root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(self.root)

    def _prune(self, saved_step: int) -> None:
        with_marker: list[int] = []
        torn_older: list[int] = []
        for step, path in self._step_dirs():
            if (path / MARKER).is_file():
                with_marker.append(step)
            elif step < saved_step:
                torn_older.append(step)
        for step in [*plan_prune(with_marker, saved_step, self.keep), *torn_older]:
            shutil.rmtree(self.root / step_dirname(step), ignore_errors=True)
        self._remove_dead_temps()

    # -- read -------------------------------------------------------------------------------
    def _step_dirs(self) -> list[tuple[int, Path]]:
        out: list[tuple[int, Path]] = []
        with contextlib.suppress(FileNotFoundError):
            for entry in self.root.iterdir():
                step = parse_step_dirname(entry.name)
                if step is not None and entry.is_dir():
                    out.append((step, entry))
        return sorted(out)

    def _read_manifest(self, step: int, path: Path) -> Manifest:
        """The manifest if the marker and every file (by size) are present; raises ValueError if not."""
        try:
            raw = (path / MARKER).read_bytes()
        except FileNotFoundError:
            raise ValueError("no COMMIT marker (the save did not finish)") from None
        manifest = parse_manifest(raw, step)
        for rel, (_, size) in manifest.files.items():
            try:
                actual = (path / rel).stat().st_size
            except FileNotFoundError:
                raise ValueError(f"{rel} is missing") from None
            if actual != size:
                raise ValueError(f"{rel} has {actual} bytes, manifest says {size}")
        return manifest

    def list(self) -> list[CheckpointInfo]:
        out = []
        for step, path in self._step_dirs():
            try:
                out.append(self._read_manifest(step, path).info(str(path)))
            except (ValueError, KeyError, OSError) as exc:
                logger.debug("checkpoint %s is incomplete: %s", path, exc)
        return out

    def _verify(self, step: int, path: Path) -> Manifest:
        manifest = self._read_manifest(step, path)
        rels = list(manifest.files)
        for rel, got in zip(rels, parallel_map(lambda r: sha256_file(path / r), rels), strict=True):
            if got != manifest.files[rel][0]:
                raise ValueError(f"{rel}: sha256 does not match the manifest (corrupted)")
        return manifest

    def latest(self) -> CheckpointInfo | None:
        for step, path in reversed(self._step_dirs()):
            try:
                return self._verify(step, path).info(str(path))
            except (ValueError, KeyError, OSError) as exc:
                logger.warning("skipping torn checkpoint %s: %s", path, exc)
        return None

    def restore(self, info: CheckpointInfo, dest_dir: Path) -> dict[str, object]:
        path = self.root / step_dirname(info.step)
        try:
            manifest = self._read_manifest(info.step, path)
        except (ValueError, KeyError, OSError) as exc:
            raise CheckpointError(
                f"checkpoint step {info.step} at {path} is not complete: {exc}",
                hint="use latest() or restore_latest() to pick the newest complete checkpoint",
            ) from exc
        _check_same(info, manifest)
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        rels = list(manifest.files)
        for rel in rels:
            (dest_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        copied = parallel_map(lambda r: _copy_hashing(path / r, dest_dir / r, fsync=False), rels)
        for rel, (got, _) in zip(rels, copied, strict=True):
            sha = manifest.files[rel][0]
            if got != sha:
                (dest_dir / rel).unlink(missing_ok=True)
                raise CheckpointError(
                    f"checkpoint step {info.step}: {rel} is corrupted (sha256 {got[:12]}..., manifest {sha[:12]}...)",
                    hint="restore an older checkpoint (restore_latest() does this automatically)",
                )
        return dict(manifest.metadata)

    def restore_latest(self, dest_dir: Path) -> tuple[CheckpointInfo, dict[str, object]] | None:
        return restore_newest_valid(self, dest_dir)

    # -- sharded saves ----------------------------------------------------------------------
    def stage(self, step: int, token: str, *, primary: bool = True) -> StagedSave:
        check_step(step)
        tmp = self.root / f".tmp-{step_dirname(step)}-{token}"
        tmp.mkdir(exist_ok=True)
        return _LocalStaged(self, step, tmp)

    def read_into(self, info: CheckpointInfo, rel: str, out: memoryview) -> None:
        path = self.root / step_dirname(info.step) / rel
        digest = hashlib.sha256()
        try:
            with path.open("rb", buffering=0) as fh:
                done = 0
                while done < len(out):
                    got = fh.readinto(out[done : done + CHUNK])
                    if not got:
                        break
                    digest.update(out[done : done + got])
                    done += got
                extra = fh.read(1)
        except OSError as exc:
            raise CheckpointError(f"checkpoint step {info.step}: cannot read {rel}: {exc}",
                                  hint="restore an older checkpoint") from exc
        check_read(info, rel, digest.hexdigest(), done == len(out) and not extra)

    def metadata(self, info: CheckpointInfo) -> dict[str, object]:
        path = self.root / step_dirname(info.step)
        try:
            return dict(self._read_manifest(info.step, path).metadata)
        except (ValueError, KeyError, OSError) as exc:
            raise CheckpointError(f"checkpoint step {info.step} at {path} is not complete: {exc}") from exc


class _LocalStaged:
    def __init__(self, store: LocalStore, step: int, tmp: Path) -> None:
        self._store, self._step, self._tmp = store, step, tmp

    def write(self, shards: Sequence[Shard]) -> FileDigests:
        for shard in shards:
            (self._tmp / shard.rel).parent.mkdir(parents=True, exist_ok=True)
        hook = self._store._on_file
        on_done = None if hook is None else (lambda i: hook(shards[i].rel))
        try:
            written = parallel_map(lambda shard: _write_shard(self._tmp / shard.rel, shard), shards, on_done,
                                   threads=SHARD_THREADS)
        except OSError as exc:
            raise CheckpointError(
                f"could not write checkpoint step {self._step} to {self._store.root}: {exc}",
                hint="check free disk space and permissions; the previous checkpoint is untouched",
            ) from exc
        return {shard.rel: digest for shard, digest in zip(shards, written, strict=True)}

    def commit(self, files: FileDigests, metadata: Mapping[str, object] | None) -> CheckpointInfo:
        final = self._store.root / step_dirname(self._step)
        try:
            for rel, (_, size) in files.items():
                if (self._tmp / rel).stat().st_size != size:
                    raise CheckpointError(f"checkpoint step {self._step}: {rel} is not the file that was written",
                                          hint="give each job its own checkpoint_uri")
            manifest = build_manifest(self._step, files, metadata, time.time())
            with (self._tmp / MARKER).open("wb") as fh:
                fh.write(manifest)
                fh.flush()
                os.fsync(fh.fileno())
            for dirpath, _, _ in os.walk(self._tmp):
                _fsync_dir(Path(dirpath))
            self._store._publish(self._tmp, final)
        except BaseException as exc:
            self.abort()
            if isinstance(exc, OSError):
                raise CheckpointError(
                    f"could not write checkpoint step {self._step} to {self._store.root}: {exc}",
                    hint="check free disk space and permissions; the previous checkpoint is untouched",
                ) from exc
            raise
        info = parse_manifest(manifest, self._step).info(str(final))
        self._store._prune(self._step)
        return info

    def abort(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def _write_shard(path: Path, shard: Shard) -> tuple[str, int]:
    with path.open("wb", buffering=0) as fh:
        sink = HashingSink(fh)
        shard.write(sink)
        os.fsync(fh.fileno())
    return sink.hexdigest(), sink.size


def check_read(info: CheckpointInfo, rel: str, got: str, complete: bool) -> None:
    want = info.sha256.get(rel)
    if want is None:
        raise CheckpointError(f"checkpoint step {info.step} has no file {rel}")
    if not complete or got != want:
        raise CheckpointError(
            f"checkpoint step {info.step}: {rel} is corrupted (sha256 {got[:12]}..., manifest {want[:12]}...)"
            if complete else f"checkpoint step {info.step}: {rel} does not have the size its manifest records",
            hint="restore an older checkpoint (a resume falls back to one automatically)",
        )


def _check_same(info: CheckpointInfo, manifest: Manifest) -> None:
    if {rel: sha for rel, (sha, _) in manifest.files.items()} != info.sha256:
        raise CheckpointError(
            f"checkpoint step {info.step} was replaced after it was listed",
            hint="call latest() again and restore what it returns",
        )


T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], on_done: Callable[[int], None] | None = None,
                 threads: int = IO_THREADS) -> list[R]:
    """``[fn(i) for i in items]`` on up to ``threads`` threads (hashlib and file I/O release the GIL).

    ``on_done(index)`` runs in the calling thread as each item finishes. The first error is raised
    after the items not yet started are cancelled.
    """
    if len(items) <= 1:
        out = []
        for index, item in enumerate(items):
            out.append(fn(item))
            if on_done is not None:
                on_done(index)
        return out
    results: dict[int, R] = {}
    with ThreadPoolExecutor(max_workers=min(threads, len(items))) as pool:
        futures = {pool.submit(fn, item): index for index, item in enumerate(items)}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                if on_done is not None:
                    on_done(futures[future])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return [results[i] for i in range(len(items))]


def _hash_and_fsync(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb+") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
        os.fsync(fh.fileno())
    return digest.hexdigest(), size


def _copy_hashing(src: Path, dst: Path, *, fsync: bool = True) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with src.open("rb") as fin, dst.open("wb") as fout:
        for chunk in iter(lambda: fin.read(CHUNK), b""):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        if fsync:
            fout.flush()
            os.fsync(fout.fileno())
    return digest.hexdigest(), size


def restore_newest_valid(store: CheckpointStore, dest_dir: Path) -> tuple[CheckpointInfo, dict[str, object]] | None:
    """Restore newest-first; a checkpoint that fails verification is skipped with a warning."""
    for info in reversed(store.list()):
        written = dest_dir / f".restore-{uuid.uuid4().hex[:8]}"
        try:
            metadata = store.restore(info, written)
        except CheckpointError as exc:
            logger.warning("skipping checkpoint step %d: %s", info.step, exc)
            shutil.rmtree(written, ignore_errors=True)
            continue
        for rel in info.sha256:
            target = dest_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(written / rel, target)
        shutil.rmtree(written, ignore_errors=True)
        return info, metadata
    return None


def open_store(
    uri: str, *, keep: int = 3, s3_client: Any | None = None, on_file: FileHook | None = None
) -> CheckpointStore:
    """Open a checkpoint store. ``uri``: a directory path, ``file:///path``, or ``s3://bucket/prefix``.

    S3 uses ``s3_client`` if given, else ``boto3.client("s3")`` (which honours ``AWS_ENDPOINT_URL``,
    ``AWS_REGION`` and the usual credential chain). The bucket is checked now so a job fails fast.
    """
    if not uri or not uri.strip():
        raise InvalidInput("checkpoint uri is empty", hint="give a directory path or s3://bucket/prefix")
    if uri.startswith("s3://"):
        from workers.checkpoint_s3 import S3Store

        return S3Store(uri, keep=keep, client=s3_client, on_file=on_file)
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif "://" in uri:
        raise InvalidInput(
            f"unsupported checkpoint uri {uri!r}",
            hint="use a local directory path, file:///path, or s3://bucket/prefix",
        )
    return LocalStore(Path(uri), keep=keep, on_file=on_file)
