"""`gpuplan server`: the REST API and the scheduling loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from commands import output
from commands.output import handle_errors
from commands.settings import Settings

if TYPE_CHECKING:
    from scheduler.composition import ServerParts

app = typer.Typer()  # server: a top-level command


@app.command("server")
@handle_errors
def server_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    executor: str = typer.Option("inprocess", "--executor", help="inprocess | ray | none (API only, no loop)."),
    admin_token: str = typer.Option(None, "--admin-token", envvar="GPUPLAN_ADMIN_TOKEN",
                                    help="Token for /v1/teams (budgets, quotas, tokens)."),
    poll: float = typer.Option(1.0, "--poll", min=0.05, help="Seconds between scheduling ticks."),
    max_running: int | None = typer.Option(None, "--max-running", min=1, help="Cap on concurrent attempts."),
    workers: str = typer.Option("auto", "--workers",
                                help="API processes, or auto: 1 on SQLite (one writer at a time), up to 4 (one per "
                                "core) on PostgreSQL. With more than 1 the scheduling loop runs in the supervising "
                                "process."),
    ray_namespace: str | None = typer.Option(
        None, "--ray-namespace", help="Ray namespace of this server's attempts (with --executor ray). Default: "
        "gpuplan- and a hash of the database URL, so servers of different databases can share one Ray cluster."),
    checkpoint_root: str | None = typer.Option(
        None, "--checkpoint-root", envvar="GPUPLAN_CHECKPOINT_ROOT",
        help="Where jobs checkpoint (ROOT/<job id>): a directory, or s3://bucket/prefix, which every node of a "
        "Ray cluster reads (with --executor ray, Ray Train's storage goes to ROOT/_ray too). "
        "Default: ~/.gpuplan/checkpoints."),
    ray_cluster_config: str | None = typer.Option(
        None, "--ray-cluster-config", envvar="GPUPLAN_RAY_CLUSTER_CONFIG",
        help="With --executor ray: the autoscaler's cluster YAML (~/ray_bootstrap_config.yaml on the head). Its "
        "node types count as capacity before their nodes join, runs ask for the planned GPU, market and zone, and "
        "plans use the link speed its node types provide (their gpuplan/network-gbps label: EFA or one interface)."),
    launch_timeout: float = typer.Option(
        300.0, "--launch-timeout", min=0.0,
        help="Seconds a job waits for nodes the cloud refuses to launch (no spot capacity) before it moves to the "
        "next node type its plan priced: another zone, then on-demand (spot: auto); spot: always waits on."),
) -> None:
    """Run the REST API and the scheduling loop (uvicorn). Upgrades the database schema first.

    Examples:

      GPUPLAN_ADMIN_TOKEN=s3cret gpuplan server --port 8000

      GPUPLAN_DATABASE_URL=postgresql://gpuplan@db/gpuplan gpuplan server --host 0.0.0.0 --executor ray --workers 4

      gpuplan server --executor ray --checkpoint-root s3://my-bucket/gpuplan \\
        --ray-cluster-config ~/ray_bootstrap_config.yaml
    """
    import os

    from scheduler.api.processes import ApiSettings, api_workers, serve_workers
    from scheduler.api.server import listen, make_app, serve
    from scheduler.composition import make_loop, server_parts
    from scheduler.ui.session import load_or_create_secret

    settings = Settings.from_env()
    home, db_url = settings.home, settings.database_url
    count = api_workers(workers, db_url, os.cpu_count())
    sock = listen(host, port)  # before the executor and the loop: a taken port must touch nothing
    parts = server_parts(db_url, home, executor=executor, admin_token=admin_token, checkpoint_root=checkpoint_root,
                         ray_namespace=ray_namespace, ray_cluster_config=ray_cluster_config, api_processes=count)
    service, catalog, run, calibration = parts.service, parts.catalog, parts.executor, parts.calibration
    _say_what_serves(parts, executor, host, port, count, admin_token)
    ui_secret = load_or_create_secret(home)  # dashboard sessions at /ui: one secret for every API process
    if count == 1:
        serve(make_app(service, catalog, run, poll_s=poll, max_running=max_running, calibration=calibration,
                       ui_secret=ui_secret, spot_zones=parts.spot_zones, launch_timeout_s=launch_timeout), host, port,
              sock=sock)
        return
    api = ApiSettings(database_url=service.store.url, checkpoint_root=service.checkpoint_root, catalog=catalog,
                      admin_token=admin_token, calibration=calibration, ui_secret=ui_secret)
    loop = make_loop(service, run, poll_s=poll, max_running=max_running, calibration=calibration,
                     spot_zones=parts.spot_zones, launch_timeout_s=launch_timeout)
    serve_workers(api, host, port, count, loop=loop, sock=sock)


def _say_what_serves(parts: ServerParts, executor: str, host: str, port: int, count: int,
                     admin_token: str | None) -> None:
    """On stderr: where the server listens, on which database and executor, and what is disabled."""
    if not admin_token:
        output.err_console.print("no --admin-token / GPUPLAN_ADMIN_TOKEN: team admin endpoints are disabled",
                                 style="yellow")
    where = f" (Ray namespace {parts.ray_namespace})" if executor == "ray" else ""
    output.err_console.print(f"gpuplan server on http://{host}:{port} (docs at /docs, dashboard at /ui), "
                             f"database {parts.service.store.dialect}, executor {executor}{where}, "
                             f"{count} API worker{'s' if count > 1 else ''}")
