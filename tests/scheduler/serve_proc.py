"""A real server + loop process for crash tests: ``python -m tests.scheduler.serve_proc DB PORT DIR``.

Same assembly as ``gpuplan server`` (scheduler.api.server) with the test planner and a
SleepExecutor whose attempts die with the process.
"""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.loader import load_catalog
from scheduler.api.server import make_app, make_service, serve
from tests.scheduler.conftest import toy_plan
from tests.scheduler.fakes import SleepExecutor


def main() -> None:
    db, port, workdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    executor = SleepExecutor(seconds=float(sys.argv[4]) if len(sys.argv) > 4 else 2.0,
                             journal=str(workdir / "journal"))
    catalog = load_catalog()
    service = make_service(db, checkpoint_root=workdir / "ckpt", admin_token="admin-secret", planner=toy_plan,
                           catalog=catalog, executor=executor)
    serve(make_app(service, catalog, executor, poll_s=0.1, max_running=3), "127.0.0.1", port, log_level="warning")


if __name__ == "__main__":
    main()
