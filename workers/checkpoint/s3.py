"""The S3 backend of the checkpoint store (the format and its guarantees: workers.checkpoint.format).

S3 has no rename, so a save uploads every object (each carrying its sha256 as object metadata and,
on real S3, a server-verified ``ChecksumSHA256``), checks each one with HEAD, and only then puts
the ``COMMIT`` marker. A save killed before the marker leaves objects without one: torn, skipped.
Deleting (pruning or replacing a step) removes the marker first, so a half-deleted checkpoint is
never mistaken for a complete one.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from errors import CheckpointError, InvalidInput
from workers.checkpoint.format import (
    MARKER,
    CheckpointInfo,
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

logger = logging.getLogger(__name__)

SINGLE_PUT_MAX = 256 * 1024 * 1024  # above this, multipart upload (per-part checksums)
PART_BYTES = 64 * 1024 * 1024  # multipart part size of sharded saves: parts of one shard upload in parallel
PART_THREADS = 4  # parts of one shard in flight at once (times SHARD_THREADS shards)


def parse_s3_uri(uri: str) -> tuple[str, str]:
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise InvalidInput(f"checkpoint uri {uri!r} names no bucket", hint="use s3://bucket/prefix")
    return bucket, prefix.strip("/")


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _explain(exc: Exception, bucket: str) -> CheckpointError:
    """Turn a boto3/botocore failure into an actionable CheckpointError."""
    from botocore.exceptions import EndpointConnectionError, NoCredentialsError

    code = _error_code(exc)
    if code in ("404", "NoSuchBucket"):
        return CheckpointError(
            f"S3 bucket {bucket!r} does not exist",
            hint=f"create it (aws s3 mb s3://{bucket}) or fix the bucket name in checkpoint_uri; if it exists,"
            " check AWS_REGION / the endpoint",
        )
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
        return CheckpointError(
            f"access to S3 bucket {bucket!r} was denied ({code})",
            hint="check the AWS credentials and that they allow s3:ListBucket on the bucket (no s3:prefix condition:"
            " HeadBucket is authorized as ListBucket) and GetObject, PutObject, DeleteObject, AbortMultipartUpload"
            " under the prefix (the policy in `gpuplan cluster config`'s header; `gpuplan cluster check` compares)",
        )
    if code in ("301", "PermanentRedirect", "AuthorizationHeaderMalformed"):
        return CheckpointError(
            f"S3 bucket {bucket!r} is in another region ({code})",
            hint="set AWS_REGION (or the client's region) to the bucket's region",
        )
    if isinstance(exc, NoCredentialsError):
        return CheckpointError(
            f"no AWS credentials to reach S3 bucket {bucket!r}",
            hint="set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance role",
        )
    if isinstance(exc, EndpointConnectionError):
        return CheckpointError(
            f"cannot reach the S3 endpoint for bucket {bucket!r}: {exc}",
            hint="check the network and AWS_ENDPOINT_URL",
        )
    return CheckpointError(f"S3 request on bucket {bucket!r} failed: {exc}")


class S3Store:
    """Checkpoints under ``s3://bucket/prefix``."""

    def __init__(self, uri: str, *, keep: int = 3, client: Any | None = None, on_file: FileHook | None = None) -> None:
        check_keep(keep)
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.keep = keep
        self._on_file = on_file
        if client is None:
            import boto3

            client = boto3.client("s3")
        self.client: Any = client
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc

    # -- keys -------------------------------------------------------------------------------
    def _base(self, step: int) -> str:
        name = step_dirname(step)
        return f"{self.prefix}/{name}" if self.prefix else name

    def _listing(self) -> dict[int, dict[str, int]]:
        """step -> {relative path: size} for every object under the prefix (the marker included)."""
        root = f"{self.prefix}/" if self.prefix else ""
        out: dict[int, dict[str, int]] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=root)
            for page in pages:
                for obj in page.get("Contents", []):
                    dirname, _, rel = obj["Key"][len(root) :].partition("/")
                    step = parse_step_dirname(dirname)
                    if step is not None and rel:
                        out.setdefault(step, {})[rel] = int(obj["Size"])
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc
        return out

    def _delete_step(self, step: int, rels: Iterable[str]) -> None:
        base = self._base(step)
        rels = [r for r in rels if r != MARKER]
        self.client.delete_object(Bucket=self.bucket, Key=f"{base}/{MARKER}")  # marker first
        for i in range(0, len(rels), 1000):
            batch = [{"Key": f"{base}/{rel}"} for rel in rels[i : i + 1000]]
            if batch:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})

    # -- save -------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        source_dir: Path,
        *,
        metadata: Mapping[str, object] | None = None,
        move: bool = False,
    ) -> CheckpointInfo:
        """Upload ``source_dir`` as step ``step`` (files in parallel, marker last); ``move`` deletes the
        local directory once the checkpoint is committed."""
        check_step(step)
        source_dir = Path(source_dir)
        files = source_files(source_dir)
        base = self._base(step)
        hook = self._on_file
        try:
            local = parallel_map(lambda item: (sha256_file(item[1]), item[1].stat().st_size), files)
            written = {rel: result for (rel, _), result in zip(files, local, strict=True)}
            existing = self._listing().get(step, {})
            if self._committed_with(step, existing, written):
                # The same step with the same bytes (a step repeated after resume): only the marker is
                # rewritten, in one PUT, so the committed checkpoint is never un-committed.
                if hook is not None:
                    for rel, _ in files:
                        hook(rel)
            else:
                self._upload_step(step, files, written, existing)
            manifest = build_manifest(step, written, metadata, time.time())
            self.client.put_object(
                Bucket=self.bucket,
                Key=f"{base}/{MARKER}",
                Body=manifest,
                ChecksumSHA256=base64.b64encode(hashlib.sha256(manifest).digest()).decode(),
            )
        except CheckpointError:
            raise
        except OSError as exc:
            raise CheckpointError(f"could not read checkpoint files from {source_dir}: {exc}") from exc
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc
        if move:
            shutil.rmtree(source_dir, ignore_errors=True)
        info = parse_manifest(manifest, step).info(f"s3://{self.bucket}/{base}")
        self._prune(step)
        return info

    def _upload_step(self, step: int, files: Sequence[tuple[str, Path]], written: Mapping[str, tuple[str, int]],
                     existing: Mapping[str, int]) -> None:
        """Upload ``files`` (rel -> (sha256, size) in ``written``) as step ``step``, in parallel, and check that
        the objects and the local files still hold what was hashed; ``existing``: the step's objects now."""
        base, hook = self._base(step), self._on_file
        if existing:  # a different save of this step, or leftovers of a killed one: un-commit first
            self._delete_step(step, [r for r in existing if r not in written])

        def upload(index: int) -> None:
            rel, src = files[index]
            sha, size = written[rel]
            self._upload(src, f"{base}/{rel}", sha, size)

        on_done = None if hook is None else (lambda i: hook(files[i][0]))
        parallel_map(upload, list(range(len(files))), on_done)

        def check(item: tuple[str, tuple[str, int]]) -> None:
            rel, (sha, size) = item
            head = self.client.head_object(Bucket=self.bucket, Key=f"{base}/{rel}")
            if int(head["ContentLength"]) != size or head.get("Metadata", {}).get("sha256") != sha:
                raise CheckpointError(
                    f"checkpoint step {step}: s3://{self.bucket}/{base}/{rel} does not match what was"
                    " uploaded (changed while it was being saved, or another writer shares this prefix)",
                    hint="do not modify the source during save; give each job its own checkpoint_uri",
                )

        parallel_map(check, list(written.items()))
        again = parallel_map(lambda item: sha256_file(item[1]), files)
        for (rel, (sha, _)), got in zip(written.items(), again, strict=True):
            if got != sha:
                raise CheckpointError(
                    f"checkpoint step {step}: {rel} changed while it was being saved",
                    hint="do not modify the source directory during save",
                )

    def _committed_with(self, step: int, rels: Mapping[str, int], files: Mapping[str, tuple[str, int]]) -> bool:
        """Whether ``step`` is already committed with exactly these files (by sha256 and size)."""
        if MARKER not in rels:
            return False
        try:
            return self._verify(step, rels, deep=False).files == dict(files)
        except (ValueError, KeyError):
            return False

    def _upload(self, src: Path, key: str, sha: str, size: int) -> None:
        if size <= SINGLE_PUT_MAX:
            with src.open("rb") as body:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    Metadata={"sha256": sha},
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(sha)).decode(),
                )
        else:
            self.client.upload_file(
                str(src), self.bucket, key, ExtraArgs={"Metadata": {"sha256": sha}, "ChecksumAlgorithm": "SHA256"}
            )

    def _prune(self, saved_step: int) -> None:
        try:
            listing = self._listing()
            for step in prune_targets({s: MARKER in rels for s, rels in listing.items()}, saved_step, self.keep):
                self._delete_step(step, listing[step])
        except Exception as exc:  # the save itself succeeded; pruning is retried after the next one
            logger.warning("could not prune old checkpoints under %s: %s", self.uri, exc)

    # -- read -------------------------------------------------------------------------------
    def _manifest(self, step: int, rels: Mapping[str, int]) -> Manifest:
        """The manifest if the marker and every file (by size) are present; raises ValueError if not."""
        if MARKER not in rels:
            raise ValueError("no COMMIT marker (the save did not finish)")
        body = self.client.get_object(Bucket=self.bucket, Key=f"{self._base(step)}/{MARKER}")["Body"].read()
        return check_present(parse_manifest(body, step), rels.get)

    def list(self) -> list[CheckpointInfo]:
        out = []
        for step, rels in sorted(self._listing().items()):
            try:
                out.append(self._manifest(step, rels).info(f"s3://{self.bucket}/{self._base(step)}"))
            except (ValueError, KeyError) as exc:
                logger.debug("checkpoint step %d under %s is incomplete: %s", step, self.uri, exc)
            except Exception as exc:
                raise _explain(exc, self.bucket) from exc
        return out

    def _verify(self, step: int, rels: Mapping[str, int], *, deep: bool) -> Manifest:
        manifest = self._manifest(step, rels)
        base = self._base(step)
        if deep:
            return verify_content(self, manifest, f"s3://{self.bucket}/{base}")

        def recorded_sha(rel: str) -> str:
            head = self.client.head_object(Bucket=self.bucket, Key=f"{base}/{rel}")
            return str(head.get("Metadata", {}).get("sha256", "<none>"))

        names = list(manifest.files)
        for rel, recorded in zip(names, parallel_map(recorded_sha, names), strict=True):
            if recorded != manifest.files[rel][0]:
                raise ValueError(f"{rel}: sha256 does not match the manifest (overwritten or corrupted)")
        return manifest

    def latest(self, *, deep: bool = False) -> CheckpointInfo | None:
        """Newest complete checkpoint. ``deep`` re-reads every byte to hash it (a full download);
        otherwise sizes and each object's recorded sha256 are checked, and restore() hashes content."""
        for step, rels in sorted(self._listing().items(), reverse=True):
            try:
                return self._verify(step, rels, deep=deep).info(f"s3://{self.bucket}/{self._base(step)}")
            except (ValueError, KeyError) as exc:
                logger.warning("skipping torn checkpoint step %d under %s: %s", step, self.uri, exc)
            except Exception as exc:
                if _error_code(exc) in ("404", "NoSuchKey"):  # deleted under us: treat as torn
                    logger.warning("skipping checkpoint step %d under %s: object vanished", step, self.uri)
                    continue
                raise _explain(exc, self.bucket) from exc
        return None

    def restore(self, info: CheckpointInfo, dest_dir: Path) -> dict[str, object]:
        base = self._base(info.step)
        try:
            manifest = self._manifest(info.step, self._listing().get(info.step, {}))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(
                f"checkpoint step {info.step} at s3://{self.bucket}/{base} is not complete: {exc}",
                hint="use latest() or restore_latest() to pick the newest complete checkpoint",
            ) from exc
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc
        return restore_files(self, info, manifest, dest_dir)

    def restore_latest(self, dest_dir: Path) -> tuple[CheckpointInfo, dict[str, object]] | None:
        return restore_newest_valid(self, dest_dir)

    # -- sharded saves ----------------------------------------------------------------------
    def stage(self, step: int, token: str, *, primary: bool = True) -> StagedSave:
        check_step(step)
        if primary:
            # Re-saving a step (repeated after a resume): un-commit it before new bytes land under it.
            try:
                self.client.delete_object(Bucket=self.bucket, Key=f"{self._base(step)}/{MARKER}")
            except Exception as exc:
                raise _explain(exc, self.bucket) from exc
        return _S3Staged(self, step)

    def open_file(self, info: CheckpointInfo, rel: str) -> _BodyReader:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=f"{self._base(info.step)}/{rel}")["Body"]
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc
        return _BodyReader(body, self.bucket)

    def read_into(self, info: CheckpointInfo, rel: str, out: memoryview) -> None:
        read_into(self, info, rel, out)

    def metadata(self, info: CheckpointInfo) -> dict[str, object]:
        try:
            return dict(self._manifest(info.step, self._listing().get(info.step, {})).metadata)
        except (ValueError, KeyError) as exc:
            raise CheckpointError(f"checkpoint step {info.step} under {self.uri} is not complete: {exc}") from exc
        except Exception as exc:
            raise _explain(exc, self.bucket) from exc


class _BodyReader:
    """An object's body as a Reader (``readinto``), its failures explained."""

    def __init__(self, body: Any, bucket: str) -> None:
        self._body, self._bucket = body, bucket

    def readinto(self, buffer: memoryview, /) -> int:
        try:
            data = self._body.read(len(buffer))
        except Exception as exc:
            raise _explain(exc, self._bucket) from exc
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._body.close()


class _S3Staged:
    """Each shard is spooled to a local temp file while it is hashed, then uploaded (multipart, parts in
    parallel, for big shards) and checked with HEAD; the marker goes last in ``commit``."""

    def __init__(self, store: S3Store, step: int) -> None:
        self._store, self._step = store, step

    def write(self, shards: Sequence[Shard]) -> FileDigests:
        hook = self._store._on_file
        on_done = None if hook is None else (lambda i: hook(shards[i].rel))
        with tempfile.TemporaryDirectory(prefix="gpuplan-s3-spool-") as spool:
            written = parallel_map(lambda shard: self._put(Path(spool), shard), shards, on_done,
                                   threads=SHARD_THREADS)
        return {shard.rel: digest for shard, digest in zip(shards, written, strict=True)}

    def _put(self, spool: Path, shard: Shard) -> tuple[str, int]:
        from boto3.s3.transfer import TransferConfig

        store = self._store
        path = spool / uuid.uuid4().hex
        with path.open("wb") as fh:
            sink = HashingSink(fh)
            shard.write(sink)
        sha, size = sink.hexdigest(), sink.size
        key = f"{store._base(self._step)}/{shard.rel}"
        try:
            if size <= PART_BYTES:
                store._upload(path, key, sha, size)
            else:
                config = TransferConfig(multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES,
                                        max_concurrency=PART_THREADS)
                store.client.upload_file(str(path), store.bucket, key, Config=config,
                                         ExtraArgs={"Metadata": {"sha256": sha}, "ChecksumAlgorithm": "SHA256"})
            head = store.client.head_object(Bucket=store.bucket, Key=key)
        except CheckpointError:
            raise
        except Exception as exc:
            raise _explain(exc, store.bucket) from exc
        finally:
            path.unlink(missing_ok=True)
        if int(head["ContentLength"]) != size or head.get("Metadata", {}).get("sha256") != sha:
            raise CheckpointError(
                f"checkpoint step {self._step}: s3://{store.bucket}/{key} does not match what was uploaded",
                hint="give each job its own checkpoint_uri",
            )
        return sha, size

    def commit(self, files: FileDigests, metadata: Mapping[str, object] | None) -> CheckpointInfo:
        store = self._store
        base = store._base(self._step)
        manifest = build_manifest(self._step, files, metadata, time.time())
        try:
            store.client.put_object(Bucket=store.bucket, Key=f"{base}/{MARKER}", Body=manifest,
                                    ChecksumSHA256=base64.b64encode(hashlib.sha256(manifest).digest()).decode())
        except Exception as exc:
            raise _explain(exc, store.bucket) from exc
        info = parse_manifest(manifest, self._step).info(f"s3://{store.bucket}/{base}")
        store._prune(self._step)
        return info

    def abort(self) -> None:
        """Uploaded objects without a marker are torn; the next save's prune removes them."""
