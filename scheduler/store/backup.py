"""The head's SQLite database kept on S3, so teams, jobs and spend outlive the head (``ray down``, a lost node).

A cluster whose server has no PostgreSQL URL keeps its database in a SQLite file on the head's root disk,
which ``ray down`` deletes. ``backup`` copies it with SQLite's online backup API (a consistent snapshot while
the server keeps writing: WAL mode, no lock held for long) and uploads the copy as one object; S3 replaces an
object atomically, so a reader finds the previous backup or the new one, never half of one. ``restore`` runs
when a head starts, before its server: it downloads that object only where no database file is there yet, so
a restarted head keeps its own newer file and a new head starts from the last backup.

    python -m scheduler.store.backup restore --db ~/.gpuplan/gpuplan.db --to s3://bucket/prefix/_server/gpuplan.db
    python -m scheduler.store.backup loop --db ~/.gpuplan/gpuplan.db --to s3://... --every 300

The loop uploads only after a database file exists, and the head's start runs ``restore`` first: an empty
new head can never overwrite the backup it should have restored. boto3 honours ``AWS_ENDPOINT_URL`` (tests).
"""

from __future__ import annotations

import argparse
import logging
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from errors import InvalidInput
from workers.cluster.config import SERVER_DB_BACKUP

logger = logging.getLogger(__name__)
BACKUP_NAME = SERVER_DB_BACKUP  # under the cluster's checkpoint root (workers.cluster.config.backup_uri)


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise InvalidInput(f"backup location {uri!r} is not on S3", path="backup",
                           hint="give s3://bucket/prefix/gpuplan.db (the cluster's checkpoint root)")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket or not key or key.endswith("/"):
        raise InvalidInput(f"backup location {uri!r} names no object", path="backup",
                           hint="give s3://bucket/prefix/gpuplan.db")
    return bucket, key


def _s3(s3: Any | None) -> Any:
    if s3 is not None:
        return s3
    import boto3

    return boto3.client("s3")


def snapshot(db: Path, into: Path) -> None:
    """A consistent copy of the live SQLite database ``db`` at ``into`` (SQLite's online backup)."""
    source = sqlite3.connect(db)
    try:
        target = sqlite3.connect(into)
        try:
            source.backup(target)
        finally:
            target.close()
    finally:
        source.close()


def backup(db: Path, uri: str, s3: Any | None = None) -> bool:
    """Upload a snapshot of ``db`` to ``uri``; False (nothing uploaded) while ``db`` does not exist yet."""
    bucket, key = _split(uri)
    if not db.is_file():
        return False
    with tempfile.TemporaryDirectory(prefix="gpuplan-backup-") as tmp:
        copy = Path(tmp) / "gpuplan.db"
        snapshot(db, copy)
        _s3(s3).upload_file(str(copy), bucket, key)
    return True


def restore(db: Path, uri: str, s3: Any | None = None) -> bool:
    """Download the backup at ``uri`` to ``db`` when ``db`` does not exist; True when one was restored.
    No backup there (a new cluster) restores nothing; any other error is raised (the head must not start
    an empty server over a backup it could not read)."""
    bucket, key = _split(uri)
    if db.exists():
        return False
    client = _s3(s3)
    try:
        client.head_object(Bucket=bucket, Key=key)
    except Exception as exc:
        code = str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    db.parent.mkdir(parents=True, exist_ok=True)
    part = db.with_name(db.name + ".restoring")
    client.download_file(bucket, key, str(part))
    with sqlite3.connect(part) as check:  # a torn or foreign file fails here, not in the server
        if check.execute("PRAGMA integrity_check").fetchone() != ("ok",):
            raise InvalidInput(f"the backup {uri} is damaged", path="backup",
                               hint="restore an older version of the object (S3 versioning) or remove it")
    part.replace(db)
    return True


def backup_loop(db: Path, uri: str, every_s: float, stop: threading.Event, s3: Any | None = None) -> None:
    """``backup`` every ``every_s`` seconds until ``stop`` is set; a failed upload is logged and retried."""
    while not stop.wait(every_s):
        try:
            backup(db, uri, s3)
        except Exception:
            logger.exception("backup of %s to %s failed; retrying in %.0f s", db, uri, every_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.store.backup")
    parser.add_argument("action", choices=("restore", "backup", "loop"))
    parser.add_argument("--db", required=True, type=Path, help="the server's SQLite file")
    parser.add_argument("--to", required=True, help="s3://bucket/prefix/gpuplan.db")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between backups (loop)")
    args = parser.parse_args(argv)
    db = args.db.expanduser()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.action == "restore":
        print(f"restored {db} from {args.to}" if restore(db, args.to) else f"nothing to restore into {db}")
    elif args.action == "backup":
        print(f"backed up {db} to {args.to}" if backup(db, args.to) else f"no {db} yet")
    else:
        backup_loop(db, args.to, args.every, threading.Event())
    return 0


if __name__ == "__main__":
    sys.exit(main())
