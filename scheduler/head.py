"""The gpuplan server on a cluster's head, as its systemd unit starts it:

    python -m scheduler.head [--admin-token-secret REF] [--database-url-secret REF] [--backup s3://...] \
        [--db PATH] -- /home/ubuntu/gpuplan-venv/bin/gpuplan server --executor ray ...

- the admin token: read from the named secret (``workers.cluster.secrets``: Secrets Manager, or ``ssm:NAME``
  for a SecureString), else made once on the head and kept in ``~/.gpuplan/admin-token`` (mode 0600), so
  the server always starts with admin enabled;
- the database: the URL in the named secret (PostgreSQL outlives the head); without one, the SQLite file
  ``--db``, restored from ``--backup`` before the server starts when the head is new, backed up every
  ``--every`` seconds while it runs and once more when the unit stops (``scheduler.store.backup``);
- both values reach the server through its environment only (``GPUPLAN_ADMIN_TOKEN``,
  ``GPUPLAN_DATABASE_URL``): never on a command line (``ps``) or in the YAML.

The server runs as a child; SIGTERM (``systemctl stop``) is passed on, and its exit status is this one's.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.store import backup
from workers.cluster.secrets import read_secret

TOKEN_FILE = "admin-token"


def local_admin_token(home: Path) -> str:
    """The head's own admin token: made on first start, then the same one (``ray exec FILE 'cat ...'``)."""
    path = home / TOKEN_FILE
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def server_env(args: argparse.Namespace, base: Mapping[str, str], session: Any) -> dict[str, str]:
    """The server's environment: ``base`` with the admin token and, when named, the database URL."""
    env = dict(base)
    home = Path(env.get("GPUPLAN_HOME") or Path(env.get("HOME", "~")) / ".gpuplan").expanduser()
    region = args.region
    token = (read_secret(session, args.admin_token_secret, region) if args.admin_token_secret
             else local_admin_token(home))
    env["GPUPLAN_ADMIN_TOKEN"] = token
    if args.database_url_secret:
        env["GPUPLAN_DATABASE_URL"] = read_secret(session, args.database_url_secret, region)
    return env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scheduler.head")
    parser.add_argument("--admin-token-secret", help="Secrets Manager name/ARN or ssm:NAME of the admin token")
    parser.add_argument("--database-url-secret", help="Secrets Manager name/ARN or ssm:NAME of the database URL")
    parser.add_argument("--region", help="where the secrets are (the cluster's region; default: the session's)")
    parser.add_argument("--backup", help="s3://.../gpuplan.db: the SQLite database's backup (no database URL)")
    parser.add_argument("--db", type=Path, default=Path("~/.gpuplan/gpuplan.db"), help="the SQLite file")
    parser.add_argument("--every", type=float, default=300.0, help="seconds between backups")
    parser.add_argument("server", nargs=argparse.REMAINDER, help="-- then the server's command line")
    return parser


def run(argv: Sequence[str], session: Any = None,
        spawn: Callable[[list[str], dict[str, str]], subprocess.Popen[bytes]] | None = None) -> int:
    """Start the server (``spawn``: Popen) with its secrets and the SQLite backup around it; its exit status."""
    args = _parser().parse_args(argv)
    command = args.server[1:] if args.server[:1] == ["--"] else args.server
    if not command:
        _parser().error("give the server's command line after --")
    if session is None:
        import boto3

        session = boto3.session.Session()
    env = server_env(args, os.environ, session)
    db = args.db.expanduser()
    keep = args.backup and not args.database_url_secret
    if keep:
        backup.restore(db, args.backup, session.client("s3"))  # before the server: never an empty one over it
    child = (spawn or (lambda cmd, e: subprocess.Popen(cmd, env=e)))(command, env)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: child.terminate()) if main else None
    stop = threading.Event()
    saver = threading.Thread(target=backup.backup_loop, args=(db, args.backup, args.every, stop, session.client("s3")),
                             daemon=True) if keep else None
    if saver:
        saver.start()
    try:
        code = child.wait()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    stop.set()
    if saver:
        saver.join()
        backup.backup(db, args.backup, session.client("s3"))  # the last writes before the head goes
    return code


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
