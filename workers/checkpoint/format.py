"""The checkpoint format, shared by every backend (workers.checkpoint.local: local; workers.checkpoint.s3: S3).

Layout::

    <uri>/step-000000012/<files of the checkpoint...>
    <uri>/step-000000012/COMMIT      # JSON manifest: sha256 + size per file, metadata; written LAST

A checkpoint is *complete* only when its ``COMMIT`` marker exists, parses, and every file it lists
is present with the listed size and content hash. Anything else (a save killed mid-way, a file
corrupted later) is *torn*: ``latest()`` skips it with a warning and it is never loaded.

This module holds what does not depend on where the bytes live: naming, the manifest, hashing,
pruning, and the one verification path. A backend only lists steps, reads a marker, opens a file
for reading (``open_file``) and writes; every read of checkpoint content goes through
``stream_verified``, which hashes the bytes as they go by and raises CheckpointError at the end if
they are not the committed ones, so nothing unverified is ever handed to a caller as final.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from errors import CheckpointError, InvalidInput
from workers.checkpoint.threads import parallel_map

logger = logging.getLogger(__name__)

MARKER = "COMMIT"
MANIFEST_FORMAT = 1
CHUNK = 8 * 1024 * 1024
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


class Reader(Protocol):
    """One open checkpoint file, read sequentially (a local file, an S3 object's body)."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...

    def close(self) -> None: ...


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

    def open_file(self, info: CheckpointInfo, rel: str) -> Reader:
        """Open one file of ``info`` for a sequential read (unverified: read it through
        ``stream_verified``)."""

    def read_into(self, info: CheckpointInfo, rel: str, out: memoryview) -> None:
        """Read one file of ``info`` into ``out`` (exactly its size), verifying its sha256 as it reads;
        CheckpointError if the bytes are not the committed ones."""

    def metadata(self, info: CheckpointInfo) -> dict[str, object]:
        """The metadata committed with ``info``."""


# -- naming ------------------------------------------------------------------------------------
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


def check_keep(keep: int) -> None:
    if keep < 1:
        raise InvalidInput(f"keep must be at least 1 (got {keep}): the newest checkpoint is always kept")


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


# -- hashing -----------------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# -- the manifest ------------------------------------------------------------------------------
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


def check_present(manifest: Manifest, size_of: Callable[[str], int | None]) -> Manifest:
    """``manifest`` if every file it lists is present (``size_of`` -> None when not) with its size;
    ValueError if not (the checkpoint is torn)."""
    for rel, (_, size) in manifest.files.items():
        actual = size_of(rel)
        if actual is None:
            raise ValueError(f"{rel} is missing")
        if actual != size:
            raise ValueError(f"{rel} has {actual} bytes, manifest says {size}")
    return manifest


# -- pruning -----------------------------------------------------------------------------------
def plan_prune(steps_with_marker: list[int], saved_step: int, keep: int) -> list[int]:
    """Steps to delete after saving ``saved_step``: only ones older than it, beyond the newest ``keep``.

    Steps newer than the one just saved are never touched (the newest complete checkpoint may be
    among them), and the one just saved is always kept.
    """
    candidates = sorted({*(s for s in steps_with_marker if s <= saved_step), saved_step}, reverse=True)
    return sorted(candidates[max(keep, 1) :])


def prune_targets(steps: Mapping[int, bool], saved_step: int, keep: int) -> list[int]:
    """What a save of ``saved_step`` removes: ``steps`` maps every step present to whether its marker
    exists; complete ones beyond ``keep`` (plan_prune) and torn ones older than the one just saved."""
    with_marker = [s for s, committed in steps.items() if committed]
    torn_older = [s for s, committed in steps.items() if not committed and s < saved_step]
    return [*plan_prune(with_marker, saved_step, keep), *torn_older]


# -- verification: the one read path -----------------------------------------------------------
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


def _fill(reader: Reader, view: memoryview) -> int:
    done = 0
    while done < len(view):
        got = reader.readinto(view[done:])
        if not got:
            break
        done += got
    return done


def stream_verified(store: CheckpointStore, info: CheckpointInfo, rel: str,
                    target: Callable[[int], memoryview]) -> Iterator[tuple[int, memoryview]]:
    """Read one file of ``info`` in pieces: ``target(offset)`` gives the memory the bytes from
    ``offset`` on go to (any length); yields ``(offset, filled view)`` per piece, hashed before it is
    yielded. After the last piece the file's size and sha256 are checked: CheckpointError if they are
    not the manifest's, so a consumer must treat what it got as unverified until the loop ends."""
    if rel not in info.sha256:
        raise CheckpointError(f"checkpoint step {info.step} has no file {rel}")
    size = info.sizes.get(rel, 0)
    digest = hashlib.sha256()
    done = 0
    try:
        reader = store.open_file(info, rel)
        try:
            while done < size:
                view = target(done)[: size - done]
                got = _fill(reader, view)
                if not got:
                    break
                digest.update(view[:got])
                yield done, view[:got]
                done += got
            extra = _fill(reader, memoryview(bytearray(1)))
        finally:
            reader.close()
    except OSError as exc:
        raise CheckpointError(f"checkpoint step {info.step}: cannot read {rel}: {exc}",
                              hint="restore an older checkpoint (a resume falls back to one automatically)") from exc
    check_read(info, rel, digest.hexdigest(), done == size and not extra)


def read_into(store: CheckpointStore, info: CheckpointInfo, rel: str, out: memoryview) -> None:
    """Read one file of ``info`` straight into ``out`` (exactly its size), verified."""
    for _ in stream_verified(store, info, rel, lambda offset: out[offset : offset + CHUNK]):
        pass


def copy_verified(store: CheckpointStore, info: CheckpointInfo, rel: str, dst: Path) -> None:
    """One file of ``info`` to ``dst`` through a .part file; renamed into place only once verified."""
    part = dst.with_name(f".{dst.name}.{uuid.uuid4().hex[:8]}.part")
    scratch = memoryview(bytearray(CHUNK))
    try:
        with part.open("wb") as fh:
            for _, view in stream_verified(store, info, rel, lambda _offset: scratch):
                fh.write(view)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, dst)


def check_same(info: CheckpointInfo, manifest: Manifest) -> None:
    if {rel: sha for rel, (sha, _) in manifest.files.items()} != info.sha256:
        raise CheckpointError(
            f"checkpoint step {info.step} was replaced after it was listed",
            hint="call latest() again and restore what it returns",
        )


def restore_files(store: CheckpointStore, info: CheckpointInfo, manifest: Manifest,
                  dest_dir: Path) -> dict[str, object]:
    """Copy every file of a complete checkpoint into ``dest_dir``, each verified; its metadata."""
    check_same(info, manifest)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    rels = list(manifest.files)
    for rel in rels:
        (dest_dir / rel).parent.mkdir(parents=True, exist_ok=True)
    parallel_map(lambda rel: copy_verified(store, info, rel, dest_dir / rel), rels)
    return dict(manifest.metadata)


def verify_content(store: CheckpointStore, manifest: Manifest, uri: str) -> Manifest:
    """``manifest`` if every file's bytes hash to it (a full read); ValueError naming the first that does not."""
    info = manifest.info(uri)
    scratch = threading.local()  # one chunk per thread, reused across its files

    def check(rel: str) -> None:
        if not hasattr(scratch, "buffer"):
            scratch.buffer = memoryview(bytearray(CHUNK))
        buffer: memoryview = scratch.buffer
        for _ in stream_verified(store, info, rel, lambda _offset: buffer):
            pass

    try:
        parallel_map(check, list(manifest.files))
    except CheckpointError as exc:
        raise ValueError(str(exc)) from exc
    return manifest


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
