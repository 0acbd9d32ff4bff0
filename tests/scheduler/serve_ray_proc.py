"""A real server + loop process on a Ray cluster: ``python -m tests.scheduler.serve_ray_proc DB PORT DIR ADDRESS``.

Same assembly as ``gpuplan server --executor ray`` (scheduler.composition) with the CPU test planner
and a RayExecutor joined to the test's cluster (gloo, one thread per worker). Its runs hold at the
step written in ``DIR/gate`` (``tests.workers.tiny.Gate``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from catalog.loader import load_catalog
from scheduler.api.server import make_app, serve
from scheduler.composition import make_service
from tests.scheduler.loop.test_loop_inprocess import cpu_plan
from tests.workers.tiny import Gate
from workers.executors.ray_executor import RayExecutor


def main() -> None:
    db, port, workdir, address = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    executor = RayExecutor(address=address, storage_path=str(workdir / "ray"), backend="gloo", cpu_threads=1,
                           log_every_s=0.0, start_timeout_s=2.0, step_hook=Gate(str(workdir / "gate")),
                           init_kwargs={"logging_level": logging.ERROR, "log_to_driver": False})
    catalog = load_catalog()
    service = make_service(db, checkpoint_root=workdir / "ckpt", admin_token="admin-secret", planner=cpu_plan,
                           catalog=catalog)
    serve(make_app(service, catalog, executor, poll_s=0.2), "127.0.0.1", port, log_level="warning")


if __name__ == "__main__":
    main()
