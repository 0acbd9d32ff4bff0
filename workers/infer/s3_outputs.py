"""Inference outputs under an S3 checkpoint root (``gpuplan server --checkpoint-root s3://...``).

The outputs file is appended and fsynced batch by batch, which S3 cannot do, so an attempt whose
``checkpoint_uri`` is ``s3://bucket/prefix`` works on a copy on its node's disk:

- at start the copy is replaced by ``s3://bucket/prefix/outputs.jsonl`` when there is one (what an
  earlier attempt, on any node, finished), so the requests in it are skipped;
- after a batch, the whole copy is put back when ``every_s`` seconds have passed since the last put
  (a PUT replaces the object at once: readers see whole files of whole lines);
- when the attempt ends, finished or failed, it is put once more.

A node lost between two puts costs at most ``every_s`` seconds of requests, which the next attempt
redoes; none is written twice, because each attempt starts from the object.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

UPLOAD_EVERY_S = 30.0


def _code(exc: Exception) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def staging_folder(uri: str) -> Path:
    """This node's working copy of an S3 attempt folder: one per URI, under the temp directory."""
    return Path(tempfile.gettempdir()) / "gpuplan-outputs" / hashlib.sha256(uri.encode()).hexdigest()[:16]


class S3Outputs:
    """``<uri>/<local.name>``, staged at ``local``."""

    def __init__(self, uri: str, local: Path, *, client: Any | None = None, every_s: float = UPLOAD_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from workers.checkpoint.s3 import S3Store

        store = S3Store(uri, client=client)  # a missing bucket or no credentials fail here, with a fix
        self.client, self.bucket = store.client, store.bucket
        self.key = f"{store.prefix}/{local.name}" if store.prefix else local.name
        self.uri = f"s3://{self.bucket}/{self.key}"
        self.local, self.every_s, self.clock = local, every_s, clock
        self._last = clock()

    def download(self) -> int:
        """Replace the local copy with the object (none: an empty start); the bytes it holds."""
        self.local.parent.mkdir(parents=True, exist_ok=True)
        self.local.unlink(missing_ok=True)
        try:
            self.client.download_file(self.bucket, self.key, str(self.local))
        except Exception as exc:
            if _code(exc) not in ("404", "NoSuchKey"):
                raise
            return 0
        return self.local.stat().st_size

    def upload(self) -> None:
        if self.local.exists():
            self.client.upload_file(str(self.local), self.bucket, self.key)
        self._last = self.clock()

    def upload_if_due(self) -> None:
        if self.clock() - self._last >= self.every_s:
            self.upload()

    def upload_after_failure(self) -> None:
        """The last put of a failed attempt: an error here is logged, not raised over the attempt's own."""
        try:
            self.upload()
        except Exception:
            logger.exception("could not put the outputs to %s", self.uri)
