"""`gpuplan report`: actual spend, how close plans came (accuracy), and the dry-run report of plans."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from commands import output
from commands.backend import open_backend
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table, usd
from commands.plan import check_objective, load_planning_inputs
from commands.settings import Settings
from errors import InvalidInput

app = typer.Typer(help="Cost reports: dry-run (what the planner would do) and actual spend; and how "
                         "close plans came (accuracy).\n\nExamples:\n\n"
                         "  gpuplan report dry-run examples/*.yaml --out report/\n\n"
                         "  gpuplan report spend --team ml --since 2026-11-01\n\n"
                         "  gpuplan report accuracy --plot accuracy.png",
                         no_args_is_help=True)

# Ids, names and numbers are never cut; ``drop`` orders what a narrow terminal leaves out (first the highest).
SPEND_COLS = [Col("job"), Col("name", drop=2), Col("market", drop=3), Col("attempts", right=True, drop=4),
              Col("hours", right=True, drop=1), Col("USD", right=True)]
ACCURACY_COLS = [Col("job"), Col("outcome", drop=9), Col("strategy", drop=10),
                 Col("alloc GiB pred", right=True, drop=3),
                 Col("GiB meas", right=True, drop=4), Col("GiB err", right=True, drop=1),
                 Col("tok/s pred", right=True, drop=5), Col("tok/s meas", right=True, drop=6),
                 Col("tok/s err", right=True, drop=2), Col("prompt / step err", right=True, drop=7),
                 Col("OOM b/o", right=True, drop=8)]
DRY_RUN_COLS = [Col("job"), Col("chosen", wrap=True, drop=5), Col("market", drop=3), Col("hours", right=True, drop=2),
                Col("expected $", right=True), Col("overhead h", right=True, drop=4),
                Col("P(deadline)", right=True, drop=1)]


@app.command("spend")
@handle_errors
def report_spend_command(team: str | None = typer.Option(None, "--team", help="Any team (admin); default: yours."),
                         all_teams: bool = typer.Option(False, "--all", help="Every team's totals, one row each "
                                                        "(admin); the default with only GPUPLAN_ADMIN_TOKEN set."),
                         since: str = typer.Option("30d", "--since", help="A window (30d, 12h, 90m) or a UTC date or "
                                                   "time (2026-11-01, 2026-11-01T08:00)."),
                         as_json: bool = JSON_OPTION) -> None:
    """Actual spend per job: price at launch x hours of every attempt, spot and on-demand.

    Examples:

      gpuplan report spend --since 7d

      gpuplan report spend --team ml --since 2026-11-01 --json

      gpuplan report spend --all
    """
    if team is not None and all_teams:
        raise InvalidInput("give --team or --all, not both", path="team")
    # Over HTTP with only the admin token there is no team of "yours": the admin's report is every team.
    settings = Settings.from_env()
    admin_only = settings.remote and not settings.token and bool(settings.admin_token)
    all_teams = all_teams or (team is None and admin_only)
    backend = open_backend(admin=team is not None or all_teams, settings=settings)
    report = backend.spend_report(since=since, team=team, all_teams=all_teams)
    if as_json:
        print_json(report)
        return
    if report.team is None:
        _print_teams_spend(report)
        return
    _print_team_spend(report)


def _print_team_spend(report: Any) -> None:
    print_table(f"spend of team {report.team} since {report.since:%Y-%m-%d %H:%M} UTC", SPEND_COLS,
                [[line.job_id, line.job_name, line.market, str(line.attempts), f"{line.hours:,.2f}", usd(line.usd)]
                 for line in report.jobs])
    markets = ", ".join(f"{m} {usd(v)}" for m, v in sorted(report.by_market.items())) or "nothing yet"
    output.console.print(f"total {usd(report.total_usd)} ({markets}); budget {usd(report.budget_usd)}, "
                         f"remaining {usd(report.remaining_usd)}", highlight=False)


@app.command("accuracy")
@handle_errors
def report_accuracy_command(
    source: str = typer.Option("local", "--source", help="local: this machine's `gpuplan run` results "
                               "(~/.gpuplan/runs); team: your team's finished attempts (the server, or the local "
                               "database)."),
    plot: str | None = typer.Option(None, "--plot", help="Also write a PNG of predicted vs measured here."),
    limit: int = typer.Option(200, "--limit", min=1, max=1000, help="team: how many recent jobs to read."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Predicted vs measured peak memory and tokens/s of finished runs: how close the plans came.

    Examples:

      gpuplan report accuracy

      gpuplan report accuracy --source team --plot accuracy.png --json
    """
    from pathlib import Path

    from scheduler.loop.accuracy import accuracy_png, accuracy_rows, local_records, summarize, team_records

    if source == "local":
        records = local_records(Settings.from_env().home)
    elif source == "team":
        backend = open_backend()
        records = team_records(backend.status(j.id) for j in backend.list_jobs(limit=limit))
    else:
        raise InvalidInput(f"--source must be local or team, got {source!r}", path="--source")
    rows = accuracy_rows(records)
    if plot:
        Path(plot).write_bytes(accuracy_png(rows))
    summary = summarize(rows)
    if as_json:
        print_json({"source": source, "rows": rows, "summary": summary, "plot": plot})
        return

    def gib(v: float | None) -> str:
        return "-" if v is None else f"{v / 2**30:.2f}"

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:+.1%}"

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}"

    split = any(r["error_prefill_s"] is not None or r["error_decode_step_s"] is not None for r in rows)
    cols = [c for c in ACCURACY_COLS if split or c.header != "prompt / step err"]
    table: list[list[str | Text]] = []
    for r in rows:
        # inference on the compiled decoder: the prompt pass's and the decode step's errors, each priced apart
        prompt_step = [f"{pct(r['error_prefill_s'])} / {pct(r['error_decode_step_s'])}"] if split else []
        table.append([r["job"], r["outcome"], r["strategy"] or "-", gib(r["predicted_peak_allocated_bytes"]),
                      gib(r["measured_peak_allocated_bytes"]), pct(r["error_peak_allocated_bytes"]),
                      rate(r["predicted_tokens_per_s"]), rate(r["measured_tokens_per_s"]),
                      pct(r["error_tokens_per_s"]), *prompt_step, str(r["oom_backoffs"])])
    print_table(f"predicted vs measured ({source}: {len(rows)} runs)", cols, table)
    for key, s in summary.items():
        if s["n"]:
            output.console.print(f"{key}: {s['n']} runs, median |error| {s['median_abs_error']:.1%}, "
                                 f"worst {s['max_abs_error']:.1%}", highlight=False)
    if plot:
        output.console.print(f"plot written to {plot}", highlight=False)


def _print_teams_spend(report: Any) -> None:
    markets = sorted(report.by_market)
    cols = [Col("team"), *(Col(m, right=True, drop=2) for m in markets), Col("total", right=True),
            Col("budget", right=True, drop=1), Col("remaining", right=True)]
    print_table(f"spend of every team since {report.since:%Y-%m-%d %H:%M} UTC", cols,
                [[t.team, *(usd(t.by_market.get(m, 0.0)) for m in markets), usd(t.total_usd), usd(t.budget_usd),
                  usd(t.remaining_usd)] for t in report.teams])
    output.console.print(f"total {usd(report.total_usd)} over {len(report.teams)} team(s); "
                         "per job: gpuplan report spend --team TEAM", highlight=False)



@app.command("dry-run")
@handle_errors
def report_dry_run_command(
    specs: list[str] = typer.Argument(..., help="Job specs (YAML or JSON)."),
    out: str = typer.Option("gpuplan-report", "--out", help="Directory for report.md, report.html and plots."),
    top: int = typer.Option(12, "--top", min=1, help="Ranked options per job in the tables."),
    objective: str = typer.Option("cheapest", "--objective", help="cheapest (meeting the deadline) or fastest."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Plan jobs without running them and write a Markdown + self-contained HTML report with plots.

    Shows each job's ranked options, the cost vs time Pareto front, and spot vs on-demand with the
    expected preemption overhead and the probability of meeting the deadline.

    Examples:

      gpuplan report dry-run examples/llama3-8b-sft.yaml --out report/

      gpuplan report dry-run job-a.yaml job-b.yaml --json
    """
    from planner.search import plan
    from scheduler.report import build_dry_run, write_dry_run

    check_objective(objective)
    plans = []
    for path in specs:
        job, catalog, model, calibration = load_planning_inputs(path)
        plans.append(plan(job, catalog, objective=objective, calibration=calibration, model=model))  # type: ignore[arg-type]
    report = build_dry_run(plans, top=top)
    files = write_dry_run(report, out)
    if as_json:
        print_json({"files": files, "jobs": report.summary})
        return
    table: list[list[str | Text]] = []
    for item in report.summary:
        chosen = item["chosen"]
        if not isinstance(chosen, dict):
            table.append([str(item["job"]), "-", "-", "-", "-", "-", "-"])
            continue
        prob = chosen["deadline_probability"]
        table.append([str(item["job"]), str(chosen["option"]), str(chosen["market"]), f"{chosen['hours']:,.2f}",
                      f"{chosen['expected_usd']:,.2f}", f"{chosen['preemption_overhead_h']:,.2f}",
                      "-" if prob is None else f"{prob:.0%}"])
    print_table("dry run", DRY_RUN_COLS, table)
    output.console.print(f"wrote {files['markdown']} and {files['html']}", highlight=False)
