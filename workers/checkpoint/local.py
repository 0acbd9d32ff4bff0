"""The local backend of the checkpoint store, and ``open_store`` (a directory or ``s3://bucket/prefix``).

The format (step directories, the ``COMMIT`` manifest, verification, pruning) is in
workers.checkpoint.format; the S3 backend is workers.checkpoint.s3. Both give the same guarantees.

Local saves are written into a hidden temp directory next to the final one, fsynced, and renamed
into place, so a crash leaves either the old state or the new one. Sharded saves (``stage``) have
each file produced straight into the store by a writer callback and hashed as its bytes go by (no
second read); several processes may write into one staged step (FSDP ranks), and one commits it
after all of them are durable. Pruning keeps the newest ``keep`` complete checkpoints and only ever
removes checkpoints *older* than the one just saved, so the newest complete checkpoint is never deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from errors import CheckpointError, InvalidInput
from workers.checkpoint.format import (
    CHUNK,
    MARKER,
    CheckpointInfo,
    CheckpointStore,
    FileDigests,
    FileHook,
    HashingSink,
    Manifest,
    Shard,
    StagedSave,
    build_manifest,
    check_keep,
    check_present,
    check_step,
    new_token,
    parse_manifest,
    parse_step_dirname,
    prune_targets,
    read_into,
    restore_files,
    restore_newest_valid,
    sha256_file,
    source_files,
    step_dirname,
    verify_content,
)
from workers.checkpoint.threads import SHARD_THREADS, parallel_map

__all__ = ["CheckpointInfo", "CheckpointStore", "LocalStore", "Shard", "StagedSave", "new_token", "open_store",
           "step_dirname"]

logger = logging.getLogger(__name__)


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
        check_keep(keep)
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
        steps = {step: (path / MARKER).is_file() for step, path in self._step_dirs()}
        for step in prune_targets(steps, saved_step, self.keep):
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

        def size_of(rel: str) -> int | None:
            try:
                return (path / rel).stat().st_size
            except FileNotFoundError:
                return None

        return check_present(parse_manifest(raw, step), size_of)

    def list(self) -> list[CheckpointInfo]:
        out = []
        for step, path in self._step_dirs():
            try:
                out.append(self._read_manifest(step, path).info(str(path)))
            except (ValueError, KeyError, OSError) as exc:
                logger.debug("checkpoint %s is incomplete: %s", path, exc)
        return out

    def latest(self) -> CheckpointInfo | None:
        for step, path in reversed(self._step_dirs()):
            try:
                return verify_content(self, self._read_manifest(step, path), str(path)).info(str(path))
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
        return restore_files(self, info, manifest, dest_dir)

    def restore_latest(self, dest_dir: Path) -> tuple[CheckpointInfo, dict[str, object]] | None:
        return restore_newest_valid(self, dest_dir)

    # -- sharded saves ----------------------------------------------------------------------
    def stage(self, step: int, token: str, *, primary: bool = True) -> StagedSave:
        check_step(step)
        tmp = self.root / f".tmp-{step_dirname(step)}-{token}"
        tmp.mkdir(exist_ok=True)
        return _LocalStaged(self, step, tmp)

    def open_file(self, info: CheckpointInfo, rel: str) -> io.FileIO:
        return io.FileIO(self.root / step_dirname(info.step) / rel, "rb")

    def read_into(self, info: CheckpointInfo, rel: str, out: memoryview) -> None:
        read_into(self, info, rel, out)

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
        from workers.checkpoint.s3 import S3Store

        return S3Store(uri, keep=keep, client=s3_client, on_file=on_file)
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif "://" in uri:
        raise InvalidInput(
            f"unsupported checkpoint uri {uri!r}",
            hint="use a local directory path, file:///path, or s3://bucket/prefix",
        )
    return LocalStore(Path(uri), keep=keep, on_file=on_file)
