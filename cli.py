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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
