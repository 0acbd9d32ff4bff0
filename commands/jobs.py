"""`gpuplan submit`, `status`, `logs`, `cancel` and `list`: a team's jobs on the scheduler."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.markup import escape

from commands import human, output
from commands.backend import open_backend
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table, styled, usd
from commands.settings import Settings
from errors import InvalidInput

app = typer.Typer()  # the job commands are top-level commands


# The id is the value users copy: it is never dropped nor wrapped, nor is the name (users copy it too), which
# goes before the id or state would; the rest goes as the terminal narrows.
JOB_COLS = [Col("id"), Col("name", drop=1), Col("state"), Col("gpus", right=True, drop=2),
            Col("market", drop=5), Col("$/h", right=True, drop=6), Col("estimate", right=True, drop=4),
            Col("spent", right=True, drop=3), Col("attempts", right=True, drop=7), Col("created", drop=8)]
ATTEMPT_COLS = [Col("#", right=True), Col("market"), Col("$/h at launch", right=True, drop=3),
                Col("started", drop=1), Col("ended", drop=2), Col("outcome", wrap=True)]
EVENT_COLS = [Col("time"), Col("from", drop=1), Col("to"), Col("reason", wrap=True)]


def _jobs_table(jobs: list[Any], title: str) -> None:
    print_table(title, JOB_COLS, [
        [j.id, j.name, j.state, f"{j.gpus}x{j.gpu}", j.market, usd(j.usd_per_h), usd(j.estimated_usd),
         usd(j.spent_usd), str(j.attempts), f"{j.created_at:%Y-%m-%d %H:%M}"] for j in jobs])


_OPTIONS = {"idempotency_key": "--key", "priority": "--priority"}


def _job_create(model: Any, spec: dict[str, Any], priority: int, key: str | None) -> Any:
    """The submit request, or an error that names the option it is about (a key too long, a control character
    in it) instead of a traceback."""
    from pydantic import ValidationError

    try:
        return model(spec=spec, priority=priority, idempotency_key=key)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        raise InvalidInput(str(first["msg"]).removeprefix("Value error, "), path=_OPTIONS.get(field, field) or None,
                           hint="see gpuplan submit --help") from None


@app.command("submit")
@handle_errors
def submit_command(
    spec: str = typer.Argument(..., help="Job spec file (YAML or JSON)."),
    priority: int = typer.Option(0, "--priority", min=-1000, max=1000, help="Higher runs first."),
    key: str | None = typer.Option(None, "--key", help="Idempotency key: resubmitting with it returns the same job."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Plan a job, reserve its estimate in the team's budget, and queue it; it starts once the
    team's GPU quota has room (until then `status` says why it waits).

    Examples:

      gpuplan submit examples/llama3-8b-sft.yaml

      GPUPLAN_API_URL=http://127.0.0.1:8000 GPUPLAN_TOKEN=gpt_... gpuplan submit job.yaml --key nightly-42 --json
    """
    from commands.specfile import load_spec
    from scheduler.store.models import JobCreate

    body = _job_create(JobCreate, load_spec(spec).model_dump(mode="json"), priority, key)
    settings = Settings.from_env()
    backend = open_backend(settings=settings)
    job = backend.submit(body)
    # A new job is always queued; any other state is the job this key already submitted.
    again = job.state != "queued"
    if not again and not settings.remote:
        # In-process there is no scheduling loop: without this, `logs --follow` waits on a queued job forever.
        output.err_console.print(f"note: queued in the local database as team {backend.principal.team_name} "
                                 "(GPUPLAN_TEAM picks another); a `gpuplan server` on this database runs it",
                                 highlight=False)
    if as_json:
        print_json(job)
        return
    if again:
        output.console.print(styled((job.state, "bold"), f" {job.id} ({job.name}): submitted earlier with key "
                                    f"{key!r} at {job.created_at:%Y-%m-%d %H:%M} UTC, not queued again (use a new "
                                    "--key to submit it anew)"), highlight=False)
        return
    output.console.print(styled(("queued", "bold green"), f" {job.id} ({job.name}): {job.gpus}x{job.gpu} "
                                f"{job.market} at {usd(job.usd_per_h)}/h, estimated {human.money(job.estimated_usd)} "
                                f"over {human.duration(job.estimated_hours)}"), highlight=False)
    if job.message:  # why it waits for the team's GPU quota
        output.console.print(job.message, highlight=False)


@app.command("status")
@handle_errors
def status_command(job_id: str = typer.Argument(..., help="Job id (see `gpuplan list`)."),
                   as_json: bool = JSON_OPTION) -> None:
    """Show a job: state, plan, attempts and every state change.

    Example:  gpuplan status j-0123456789abcdef
    """
    job = open_backend().status(job_id)
    if as_json:
        print_json(job)
        return
    _jobs_table([job], f"job {job.id}")
    if job.progress is not None:
        output.console.print(f"progress: {human.progress(job.progress)}", highlight=False)
    if job.message:
        output.console.print(job.message, highlight=False)
    for warning in job.warnings:  # e.g. NCCL over sockets where the plan priced EFA
        output.console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if job.attempt_list:
        print_table("attempts", ATTEMPT_COLS,
                    [[str(a.number), a.market, usd(a.usd_per_h), f"{a.started_at:%H:%M:%S}",
                      f"{a.ended_at:%H:%M:%S}" if a.ended_at else "-", a.outcome or "running"]
                     for a in job.attempt_list])
    print_table("events", EVENT_COLS,
                [[f"{e.at:%Y-%m-%d %H:%M:%S}", e.from_state or "-", e.to_state, e.reason] for e in job.events])


LOG_TAIL_GRACE_S = 30.0


@app.command("logs")
@handle_errors
def logs_command(
    job_id: str = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until the job ends."),
    interval: float = typer.Option(1.0, "--interval", min=0.1, help="Seconds between polls with --follow."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print a job's state changes and its attempts' log lines.

    Example:  gpuplan logs j-0123456789abcdef --follow
    """
    import time

    backend = open_backend()
    since = 0
    ended_at: float | None = None  # when the job's state turned terminal with its attempt still open
    while True:
        page = backend.logs(job_id, since)
        for line in page.lines:
            if as_json:
                sys.stdout.write(json.dumps({"job_id": job_id, "line": line}) + "\n")
            else:  # verbatim: rich would wrap long lines at the terminal width (80 when piped) and expand :emoji:
                sys.stdout.write(line + "\n")
        sys.stdout.flush()
        since = page.next
        if not follow or page.complete:
            return
        if page.state.terminal:
            # The loop closes a cancelled job's attempt (and copies its last lines) on its next tick;
            # without a running loop that never happens, so wait a while, not forever.
            ended_at = ended_at if ended_at is not None else time.monotonic()
            if time.monotonic() - ended_at > LOG_TAIL_GRACE_S:
                output.err_console.print(f"job {job_id} is {page.state} but its last attempt is not closed yet (is a "
                                         f"gpuplan server running its loop?); its last lines may follow later")
                return
        time.sleep(interval)


@app.command("cancel")
@handle_errors
def cancel_command(job_id: str = typer.Argument(..., help="Job id."),
                   reason: str = typer.Option("", "--reason", help="Recorded in the job's events."),
                   as_json: bool = JSON_OPTION) -> None:
    """Cancel a job; a running attempt is stopped and charged up to now.

    Example:  gpuplan cancel j-0123456789abcdef --reason "wrong dataset"
    """
    job = open_backend().cancel(job_id, reason)
    if as_json:
        print_json(job)
        return
    output.console.print(f"{job.id} cancelled", highlight=False)


@app.command("list")
@handle_errors
def list_command(state: str | None = typer.Option(None, "--state", help="Only jobs in this state."),
                 limit: int = typer.Option(50, "--limit", min=1, max=1000),
                 as_json: bool = JSON_OPTION) -> None:
    """List your team's jobs, newest first.

    Example:  gpuplan list --state running
    """
    jobs = open_backend().list_jobs(state=state, limit=limit)
    if as_json:
        print_json(jobs)
        return
    _jobs_table(jobs, f"{len(jobs)} job(s)")
    for job in jobs:  # why a queued job has not started (the team's GPU quota); how far a running one is
        if job.state == "queued" and job.message:
            output.console.print(f"{job.id} {job.message}", highlight=False)
        elif job.progress is not None:
            output.console.print(f"{job.id} {human.progress(job.progress)}", highlight=False)
