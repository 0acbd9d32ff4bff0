"""A real server + loop process for crash tests: ``python -m tests.scheduler.serve_proc DB PORT DIR [S [W]]``.

Same assembly as ``gpuplan server`` (scheduler.api.server) with the test planner and a
SleepExecutor whose attempts die with the process: S seconds per attempt, W API worker processes
(W > 1: the loop runs in the supervising process, as with ``gpuplan server --workers W``). Attempts
of the jobs named in ``DIR/hold`` wait mid-run while they are named there (``SleepExecutor``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.loader import load_catalog
from scheduler.api.processes import ApiSettings, serve_workers
from scheduler.api.server import make_app, make_loop, make_service, serve
from tests.scheduler.conftest import toy_plan
from tests.scheduler.fakes import SleepExecutor


def main() -> None:
    db, port, workdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    executor = SleepExecutor(seconds=float(sys.argv[4]) if len(sys.argv) > 4 else 2.0,
                             journal=str(workdir / "journal"), hold=str(workdir / "hold"))
    catalog = load_catalog()
    service = make_service(db, checkpoint_root=workdir / "ckpt", admin_token="admin-secret", planner=toy_plan,
                           catalog=catalog)
    workers = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    if workers == 1:
        serve(make_app(service, catalog, executor, poll_s=0.1, max_running=3), "127.0.0.1", port, log_level="warning")
        return
    settings = ApiSettings(database_url=db, checkpoint_root=str(workdir / "ckpt"), catalog=catalog,
                           admin_token="admin-secret", planner=toy_plan, log_level="warning")
    serve_workers(settings, "127.0.0.1", port, workers, loop=make_loop(service, executor, poll_s=0.1, max_running=3))


if __name__ == "__main__":
    main()
