"""The `gpuplan` command line. Thin: parse, call a package, render (rich table or --json).

Each command group lives in its own section below; keep rendering here and logic in the packages.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console

from catalog.errors import GpuplanError

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(
    name="gpuplan",
    help="Cost-aware GPU job planner and scheduler.\n\nExamples:\n\n"
    "  gpuplan plan examples/llama3-8b-sft.yaml\n\n"
    "  gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json\n\n"
    "  gpuplan catalog offers --gpu H100 --spot\n\n"
    "  gpuplan run examples/tiny-train.yaml",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, default=str) + "\n")


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print a GpuplanError as one actionable line and exit with its code (no traceback)."""

    @wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except GpuplanError as exc:
            if kwargs.get("as_json"):
                print_json({"error": exc.to_dict()})
            else:
                err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")

# ---------------------------------------------------------------- catalog (issue 2: catalog)

# ---------------------------------------------------------------- plan / estimate (issue 2: planner)


def _load_planning_inputs(spec_path: str) -> tuple[Any, Any, Any, Any]:
    """(spec, catalog, model, calibration) for the plan/estimate commands."""
    from catalog.loader import load_catalog, resolve_model
    from planner.calibration import load_calibration
    from planner.spec import ModelRef, load_spec

    spec = load_spec(spec_path)
    catalog = load_catalog()
    model = resolve_model(catalog, spec.model.config if isinstance(spec.model, ModelRef) else spec.model)
    return spec, catalog, model, load_calibration()


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f}"


@app.command("plan")
@handle_errors
def plan_command(
    spec: str = typer.Argument(..., help="Job spec, YAML or JSON (see examples/)."),
    objective: str = typer.Option("cheapest", "--objective", help="cheapest (meeting the deadline) or fastest."),
    top: int = typer.Option(10, "--top", min=1, help="How many ranked candidates to show."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every way to run the job: GPU x count x strategy x offer x spot/on-demand, ranked, with rejections.

    Examples:

      gpuplan plan examples/llama3-8b-sft.yaml

      gpuplan plan examples/llama3-8b-sft.yaml --objective fastest --top 5 --json
    """
    from datetime import date

    from rich.table import Table

    from planner.search import plan, summarize_rejections

    if objective not in ("cheapest", "fastest"):
        from catalog.errors import InvalidInput

        raise InvalidInput(f"--objective must be cheapest or fastest, got {objective!r}", path="--objective")
    job, catalog, model, calibration = _load_planning_inputs(spec)
    result = plan(job, catalog, objective=objective, calibration=calibration, model=model,  # type: ignore[arg-type]
                  today=date.today())
    if as_json:
        print_json(result)
        return
    table = Table(title=f"{result.job}: {len(result.candidates)} candidates ({objective}; * = cost/time Pareto front)",
                  title_justify="left", pad_edge=False)
    for col in ("#", "GPUs / strategy", "cloud instance region", "market", "GiB need/usable", "tok/s", "hours",
                "$/h", "total $", "*"):
        right = col in ("#", "tok/s", "hours", "$/h", "total $")
        table.add_column(col, justify="right" if right else "left", overflow="fold")
    for i, c in enumerate(result.candidates[:top], 1):
        e = c.estimate
        table.add_row(
            str(i), e.strategy.label(), f"{c.offer.cloud} {c.offer.instance_type} {c.offer.region}",
            c.cost.market, f"{_gib(e.memory.required_bytes)}/{_gib(e.memory.usable_bytes)}",
            f"{e.throughput.tokens_per_s:,.0f}", f"{c.cost.hours:,.1f}", f"{c.cost.usd_per_h:,.2f}",
            f"{c.cost.usd:,.0f}", "*" if c.pareto else "",
        )
    console.print(table)
    chosen = result.chosen
    if chosen is not None:
        e = chosen.estimate
        extra = ""
        if chosen.cost.market == "spot" and chosen.cost.checkpoint_interval_h:
            extra = (f", checkpoint every {chosen.cost.checkpoint_interval_h * 60:.0f} min, "
                     f"{(chosen.cost.deadline_probability or 0):.0%} chance to meet the deadline")
        console.print(
            f"[bold]chosen:[/] {e.strategy.label()} on {chosen.offer.cloud} {chosen.offer.instance_type} "
            f"({chosen.offer.region}, {chosen.cost.market}): {chosen.cost.hours:,.1f} h, "
            f"${chosen.cost.usd:,.0f}, peak {_gib(e.memory.peak_allocated_bytes)} GiB allocated / "
            f"{_gib(e.memory.usable_bytes)} GiB usable{extra}",
            highlight=False,
        )
    groups = summarize_rejections(result.rejections)
    if groups:
        rej = Table(title=f"{len(result.rejections)} rejected options (all in --json)", title_justify="left")
        rej.add_column("constraint")
        rej.add_column("count", justify="right")
        rej.add_column("example")
        for constraint, count, example in groups:
            rej.add_row(constraint, str(count), example)
        console.print(rej)
    for warning in result.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False)


@app.command("estimate")
@handle_errors
def estimate_command(
    spec: str = typer.Argument(..., help="Job spec, YAML or JSON."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id or alias, e.g. H200, H100, A100-80GB."),
    count: int = typer.Option(1, "--count", min=1, help="Number of GPUs."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Memory, throughput and time of the job on a pinned placement ('auto' fields resolved).

    Examples:

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H100 --count 8
    """
    from rich.table import Table

    from planner.search import estimate

    job, catalog, model, calibration = _load_planning_inputs(spec)
    result = estimate(job, catalog, gpu, count, model=model, calibration=calibration)
    if as_json:
        print_json(result)
        return
    mem, thr = result.memory, result.throughput
    verdict = "[green]fits[/]" if mem.fits else "[red]does not fit[/]"
    console.print(f"[bold]{result.strategy.label()}[/]: {verdict} — needs {_gib(mem.required_bytes)} GiB of "
                  f"{_gib(mem.usable_bytes)} GiB usable (peak at {mem.peak_moment})", highlight=False)
    table = Table(title="memory per GPU (most loaded rank)", title_justify="left")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    for name, value in sorted(mem.breakdown.items(), key=lambda kv: -kv[1]):
        table.add_row(name, _gib(value))
    table.add_row("[bold]peak allocated[/]", _gib(mem.peak_allocated_bytes))
    table.add_row("[bold]peak reserved[/]", _gib(mem.peak_reserved_bytes))
    table.add_row("[bold]total (with context)[/]", _gib(mem.total_bytes))
    console.print(table)
    line = f"throughput: {thr.tokens_per_s:,.0f} tokens/s"
    if thr.mfu:
        line += f" (MFU {thr.mfu:.0%})"
    if thr.requests_per_s is not None:
        line += f", {thr.requests_per_s:,.2f} requests/s"
    console.print(f"{line}; {result.hours:,.1f} h for the job", highlight=False)


# ---------------------------------------------------------------- run (issue 3: workers)

# ---------------------------------------------------------------- scheduler (issue 4)

# ---------------------------------------------------------------- spot economics (issue 5)


@app.command("simulate")
@handle_errors
def simulate_command(
    trace: list[str] = typer.Option(
        ..., "--trace", help="Spot trace JSON; repeat for several zones to fall back across."),
    job_hours: float = typer.Option(48.0, "--job-hours", help="Hours of work the job needs."),
    deadline_hours: float | None = typer.Option(
        None, "--deadline-hours", help="Hours after arrival; omit: no deadline."),
    restart_hours: float = typer.Option(0.2, "--restart-hours", help="Delay of every (re)start or changeover."),
    on_demand_price: float = typer.Option(3.06, "--on-demand-price", help="$/h on demand."),
    spot_price: float = typer.Option(0.92, "--spot-price", help="$/h on spot (where the trace has no prices)."),
    start_hour: float = typer.Option(0.0, "--start-hour", help="When the job arrives, hours into the trace."),
    checkpoint_hours: float = typer.Option(
        0.0, "--checkpoint-hours", help="Cost of one checkpoint; 0 = free (just-in-time on the spot notice)."),
    policies: list[str] = typer.Option(None, "--policy", help="Only these policies (repeatable); default: all."),
    plot: str | None = typer.Option(None, "--plot", help="Write a timeline plot (PNG) here."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay spot traces: what each policy would have paid, when it finished, and what it lost.

    Policies: uniform-progress, on-demand, spot-only, greedy, omniscient (lower bound: knows the future),
    gpuplan (default policy).

    Examples:

      gpuplan simulate --trace us-east-1a.json --job-hours 48 --deadline-hours 70 --restart-hours 0.2 --json

      gpuplan simulate --trace a.json --trace b.json --deadline-hours 60 --plot timeline.png
    """
    from pathlib import Path

    from rich.table import Table

    from catalog.errors import InvalidInput
    from scheduler.simulate import ALL_POLICIES, Jobs, Prices, SimOptions, compare, start_tick_for
    from scheduler.traces import load_zones

    zones = load_zones(trace)
    if deadline_hours is not None and deadline_hours < job_hours:
        raise InvalidInput(f"--deadline-hours {deadline_hours} is shorter than --job-hours {job_hours}",
                           hint="no market can finish the work before the deadline; give a later deadline")
    if checkpoint_hours < 0:
        raise InvalidInput("--checkpoint-hours must be >= 0")
    names = list(policies) if policies else list(ALL_POLICIES)
    prices = Prices(on_demand=on_demand_price, spot=spot_price)
    jobs = Jobs.make([start_tick_for(zones, start_hour)], job_hours,
                     float("inf") if deadline_hours is None else deadline_hours, restart_hours)
    results = compare(zones, jobs, prices, names, SimOptions(checkpoint_cost_h=checkpoint_hours, timeline=bool(plot)))
    rows = {name: out.row(0) for name, out in results.items()}
    for row in rows.values():
        row.pop("policy")
    if plot:
        from scheduler.plots import timeline_png

        Path(plot).write_bytes(timeline_png(zones, int(jobs.start_tick[0]), results, job_hours, deadline_hours))
    if as_json:
        print_json({
            "job": {"hours": job_hours, "deadline_hours": deadline_hours, "restart_hours": restart_hours,
                    "start_hour": start_hour, "checkpoint_hours": checkpoint_hours},
            "prices": {"on_demand": on_demand_price, "spot": spot_price},
            "zones": list(zones.names),
            "policies": rows,
            "plot": plot,
        })
        return
    bound = rows.get("omniscient", {}).get("cost_usd")
    table = Table(title=f"{job_hours:g} h job, deadline {deadline_hours if deadline_hours is not None else 'none'} h, "
                  f"restart {restart_hours:g} h, zones: {', '.join(zones.names)}", title_justify="left")
    for col in ("policy", "cost $", "x bound", "finish h", "deadline", "preemptions", "work lost h", "spot h", "OD h"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, row in rows.items():
        cost = row["cost_usd"]
        ratio = f"{cost / bound:.3f}" if isinstance(cost, float) and isinstance(bound, float) and bound > 0 else "-"
        def cell(key: str, row: dict[str, object] = row) -> str:
            value = row[key]
            return "-" if value is None else f"{value:,.2f}"

        table.add_row(name, cell("cost_usd"), ratio, cell("finish_hours"),
                      "[green]met[/]" if row["deadline_met"] else "[red]missed[/]", str(row["preemptions"]),
                      cell("work_lost_hours"), cell("spot_hours"), cell("on_demand_hours"))
    console.print(table)
    if "omniscient" in rows:
        console.print("omniscient is a lower bound (it knows the future trace), not a schedule.", style="dim")
    if plot:
        console.print(f"timeline plot written to {plot}", highlight=False)


cluster_app = typer.Typer(help="Ray cluster configs for running plans on spot instances.", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")


def _plan_from_file(path: str) -> Any:
    """A Plan from `gpuplan plan --json` output, or planned now from a job spec."""
    import json as _json
    from pathlib import Path

    from catalog.errors import InvalidInput
    from planner.types import Plan

    file = Path(path)
    if not file.is_file():
        raise InvalidInput(f"{path!r} does not exist",
                           hint="give a job spec (YAML/JSON) or a `gpuplan plan --json` file")
    if file.suffix == ".json":
        try:
            doc = _json.loads(file.read_text())
        except _json.JSONDecodeError as exc:
            raise InvalidInput(f"not valid JSON ({exc})", path=path) from None
        if isinstance(doc, dict) and "candidates" in doc and "chosen" in doc:
            try:
                return Plan.model_validate(doc)
            except ValueError as exc:
                raise InvalidInput(f"not a gpuplan plan: {exc}", path=path) from None
    from planner.search import plan

    job, catalog, model, calibration = _load_planning_inputs(path)
    return plan(job, catalog, calibration=calibration, model=model)


@cluster_app.command("config")
@handle_errors
def cluster_config_command(
    plan_or_spec: str = typer.Argument(..., help="A job spec, or the output of `gpuplan plan --json`."),
    out: str | None = typer.Option(None, "--out", help="Write the YAML here (default: print it)."),
    source_dir: str | None = typer.Option(None, "--source-dir", help="Sync this gpuplan checkout to the nodes."),
    alternatives: int = typer.Option(2, "--alternatives", min=0, help="Extra spot instance types to fall back on."),
    head_instance: str = typer.Option("m5.2xlarge", "--head-instance", help="On-demand head node type."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A Ray cluster-launcher YAML for AWS: on-demand head, spot GPU workers with the preemption watcher.

    Examples:

      gpuplan cluster config examples/llama3-8b-sft.yaml --out cluster.yaml && ray up cluster.yaml

      gpuplan plan job.yaml --json > plan.json && gpuplan cluster config plan.json --json
    """
    from pathlib import Path

    from workers.cluster import ClusterOptions, cluster_config, to_yaml

    opts = ClusterOptions(source_dir=source_dir, alternatives=alternatives, head_instance=head_instance)
    config = cluster_config(_plan_from_file(plan_or_spec), opts)
    text = to_yaml(config)
    if out:
        Path(out).write_text(text)
    if as_json:
        print_json({"path": out, "config": config})
    elif out:
        console.print(f"wrote {out}: {len(config['available_node_types']) - 1} worker type(s); start with "
                      f"`ray up {out}`", highlight=False)
    else:
        sys.stdout.write(text)


# `report` belongs to the scheduler's section (issue 4); it is created here until that section has one.
report_app = typer.Typer(help="Cost reports: dry-run (what the planner would do) and actual spend.",
                         no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("dry-run")
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

    if objective not in ("cheapest", "fastest"):
        from catalog.errors import InvalidInput

        raise InvalidInput(f"--objective must be cheapest or fastest, got {objective!r}", path="--objective")
    plans = []
    for path in specs:
        job, catalog, model, calibration = _load_planning_inputs(path)
        plans.append(plan(job, catalog, objective=objective, calibration=calibration, model=model))  # type: ignore[arg-type]
    report = build_dry_run(plans, top=top)
    files = write_dry_run(report, out)
    if as_json:
        print_json({"files": files, "jobs": report.summary})
        return
    from rich.table import Table

    table = Table(title="dry run", title_justify="left")
    for col in ("job", "chosen", "market", "hours", "expected $", "overhead h", "P(deadline)"):
        numeric = col in ("hours", "expected $", "overhead h", "P(deadline)")
        table.add_column(col, justify="right" if numeric else "left")
    for item in report.summary:
        chosen = item["chosen"]
        if not isinstance(chosen, dict):
            table.add_row(str(item["job"]), "-", "-", "-", "-", "-", "-")
            continue
        prob = chosen["deadline_probability"]
        table.add_row(str(item["job"]), str(chosen["option"]), str(chosen["market"]), f"{chosen['hours']:,.2f}",
                      f"{chosen['expected_usd']:,.2f}", f"{chosen['preemption_overhead_h']:,.2f}",
                      "-" if prob is None else f"{prob:.0%}")
    console.print(table)
    console.print(f"wrote {files['markdown']} and {files['html']}", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
