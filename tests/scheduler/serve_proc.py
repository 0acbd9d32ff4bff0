"""A real server + loop process for crash tests: ``python -m tests.scheduler.serve_proc DB PORT DIR [W]``.

Same assembly as ``gpuplan server`` (scheduler.composition): the real planner on the packaged
catalog plus this machine's CPU (probed once, cached under DIR/home), and the in-process executor
running real training, whose attempts die with the process. W API worker processes (W > 1: the
loop runs in the supervising process, as with ``gpuplan server --workers W``).

A test holds a job mid-run through gate files, never through timing: while ``DIR/gates/<job name>``
exists and holds a step number N, that job's training stops at the start of step N + 1 (after the
checkpoint of step N was started), writes ``DIR/gates/<job name>.held`` and waits there; a kill -9
finds it there. A server started without the gate file runs the job through.
"""

from __future__ import annotations

import sys
import threading
import time
from datetime import date
from pathlib import Path

from catalog.loader import load_catalog
from catalog.local_cpu import with_this_machine
from scheduler.api.processes import ApiSettings, serve_workers
from scheduler.api.server import make_app, serve
from scheduler.composition import catalog_planner, make_loop, make_service
from workers.executors.inprocess import InProcessExecutor
from workers.train.hooks import StepHook


def gate_hook(gates: Path) -> StepHook:
    def hold(step: int, where: str) -> None:
        # the in-process executor names an attempt's thread gpuplan-<job name>-<job id>.<attempt>.<hex>
        name = threading.current_thread().name.removeprefix("gpuplan-").rsplit("-j-", 1)[0]
        gate = gates / name
        if where != "forward" or not gate.exists() or step != int(gate.read_text()):
            return
        (gates / f"{name}.held").write_text(str(step))
        while gate.exists():
            time.sleep(0.05)

    return hold


def main() -> None:
    db, port, workdir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    executor = InProcessExecutor(cpu_threads=1, step_hook=gate_hook(workdir / "gates"), log_every_s=0.0)
    catalog = with_this_machine(load_catalog(), workdir / "home", today=date.today())
    planner = catalog_planner(catalog)
    service = make_service(db, checkpoint_root=workdir / "ckpt", admin_token="admin-secret", planner=planner,
                           catalog=catalog)
    if workers == 1:
        serve(make_app(service, catalog, executor, poll_s=0.1, max_running=3), "127.0.0.1", port, log_level="warning")
        return
    settings = ApiSettings(database_url=db, checkpoint_root=str(workdir / "ckpt"), catalog=catalog,
                           admin_token="admin-secret", log_level="warning")  # workers: the real planner on catalog
    serve_workers(settings, "127.0.0.1", port, workers, loop=make_loop(service, executor, poll_s=0.1, max_running=3))


if __name__ == "__main__":
    main()
