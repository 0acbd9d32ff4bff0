"""The `gpuplan` command line. Thin: parse, call a package, render (rich table or --json).

Each command group lives in its own section below; keep rendering here and logic in the packages.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

import typer
from pydantic import BaseModel
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from catalog.errors import GpuplanError, InvalidInput, NoFeasiblePlan

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


def make_console(*, stderr: bool = False, width: int | None = None) -> Console:
    """The one way the CLI prints. Markup is off: text from a message, a spec or a table cell prints as
    written ('[aws]' stays), and styling is given as Text / style=, never as markup inside a string."""
    return Console(stderr=stderr, width=width, markup=False)


console = make_console()
err_console = make_console(stderr=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Text from plain strings and (text, style) pairs; nothing in them is parsed as markup."""
    return Text.assemble(*parts)


@dataclass(frozen=True)
class Col:
    """A table column. ``drop``: 0 never; otherwise columns are dropped highest first while the table is
    wider than the terminal. ``wrap``: free text that may wrap between words; other cells (ids, numbers,
    states) never wrap or shorten."""

    header: str
    right: bool = False
    drop: int = 0
    wrap: bool = False


_TABLE_EDGE = 1  # the left border; each column adds 2 of padding and 1 of border on its right


def _widths(col: Col, cells: list[str]) -> tuple[int, int]:
    """(narrowest, natural) width: ids and numbers never shrink; text and headers wrap between words only."""
    header_word = max(cell_len(w) for w in col.header.split())
    if not col.wrap:
        fixed = max([header_word, *(cell_len(c) for c in cells)])
        return fixed, max(fixed, cell_len(col.header))
    words = [w for c in cells for w in c.split()]
    narrowest = max([header_word, *(cell_len(w) for w in words)])
    return narrowest, max([cell_len(col.header), *(cell_len(c) for c in cells)])


def _column_widths(spans: list[tuple[int, int]], wrap: list[bool], width: int) -> list[int] | None:
    """Widths that fit ``width`` (None if even the narrowest do not): numbers at their full width, the
    space left shared by the text columns in proportion to how much they would use."""
    room = width - _TABLE_EDGE - 3 * len(spans)
    widths = [lo for lo, _ in spans]
    if sum(widths) > room:
        return None
    spare = room - sum(widths)
    for i, (lo, hi) in enumerate(spans):  # fixed columns first take their natural width (whole headers)
        if not wrap[i]:
            extra = min(hi - lo, spare)
            widths[i] += extra
            spare -= extra
    want = [hi - lo if wrap[i] else 0 for i, (lo, hi) in enumerate(spans)]
    total = sum(want)
    for i, w in enumerate(want):
        if w:
            widths[i] += w if spare >= total else spare * w // total
    return widths


def fit_table(title: str, cols: list[Col], rows: list[list[str | Text]], width: int) -> tuple[Table, list[str]]:
    """A table that fits ``width`` without truncating or splitting an id or a number: columns are dropped
    (highest ``drop`` first) until the narrowest rendering fits; returns the table and the dropped headers.
    Headers and text wrap between words only."""
    plain = [[c.plain if isinstance(c, Text) else c for c in row] for row in rows]
    keep = list(range(len(cols)))
    while True:
        spans = [_widths(cols[i], [r[i] for r in plain]) for i in keep]
        widths = _column_widths(spans, [cols[i].wrap for i in keep], width)
        if widths is not None or not any(cols[i].drop for i in keep):
            break
        keep.remove(max((i for i in keep if cols[i].drop), key=lambda i: cols[i].drop))
    table = Table(title=title, title_justify="left")
    for n, i in enumerate(keep):
        col = cols[i]
        size = widths[n] if widths is not None else spans[n][0]
        table.add_column(Text(col.header, no_wrap=False, overflow="fold"), justify="right" if col.right else "left",
                         no_wrap=not col.wrap, overflow="fold", width=size)
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table, [c.header for i, c in enumerate(cols) if i not in keep]


def print_table(title: str, cols: list[Col], rows: list[list[str | Text]]) -> None:
    """Print a width-fitted table; name the columns a narrow terminal hid (--json has them all)."""
    table, dropped = fit_table(title, cols, rows, console.width)
    console.print(table)
    if dropped:
        console.print(f"({', '.join(dropped)} hidden at {console.width} columns; widen the terminal or use --json)",
                      style="dim", highlight=False)


def escape_help(group: typer.Typer) -> None:
    """Help texts are rich markup to typer: escape every command's and option's help once, so '[default: ...]'
    and other bracketed text in them print as written."""
    if group.info.help and isinstance(group.info.help, str):
        group.info.help = escape(group.info.help)
    for command in group.registered_commands:
        callback = command.callback
        if callback is None:
            continue
        if command.help:
            command.help = escape(command.help)
        if callback.__doc__:
            callback.__doc__ = escape(callback.__doc__)
        for param in inspect.signature(callback).parameters.values():
            info = param.default
            if isinstance(info, typer.models.ParameterInfo) and info.help:
                info.help = escape(info.help)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            escape_help(sub.typer_instance)


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
                # One line however long; the consoles read no markup, so a quoted input prints as written.
                err_console.print(styled(("error:", "bold red"), f" {exc}"), highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of a table.")

# ---------------------------------------------------------------- catalog (issue 2: catalog)

catalog_app = typer.Typer(
    help="GPU specs, priced cloud offers and model presets (like `sky show-gpus`).\n\nExamples:\n\n"
    "  gpuplan catalog gpus\n\n"
    "  gpuplan catalog offers --gpu H100 --spot\n\n"
    "  gpuplan catalog offers --cloud aws --region us-east-1 --json\n\n"
    "  gpuplan catalog models\n\n"
    "  gpuplan catalog refresh aws --regions us-east-1,us-west-2",
    no_args_is_help=True,
)
app.add_typer(catalog_app, name="catalog")


_LINK_SHORT = {"nvlink": "NVL", "infinity-fabric": "IF", "pcie": "PCIe", "ici": "ICI"}


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}" if value >= 10 else f"{value:.3f}"


def _warn_stale(catalog: Any, offers: Any) -> None:
    """Prices older than 30 days: one warning line on stderr (never on stdout, so --json stays clean)."""
    from datetime import date

    from catalog.loader import stale_offer_warning

    today = date.today()
    shown = {id(o) for o in offers}
    stale = [o for o in catalog.stale_offers(today) if id(o) in shown]
    text = stale_offer_warning(stale, today)
    if text:
        err_console.print(styled(("warning:", "yellow"), f" {text}"), highlight=False)


@catalog_app.command("gpus")
@handle_errors
def catalog_gpus(as_json: bool = JSON_OPTION) -> None:
    """Every GPU: memory, dense bf16/fp8 TFLOPS, bandwidth, and the cheapest on-demand and spot $/GPU/h.

    Examples:

      gpuplan catalog gpus

      gpuplan catalog gpus --json
    """
    from rich.table import Table

    from catalog.loader import load_catalog
    from catalog.query import cheapest_by_gpu

    catalog = load_catalog()
    cheapest = cheapest_by_gpu(catalog)
    if as_json:
        print_json([
            {**g.model_dump(mode="json"),
             "cheapest_on_demand_usd_per_gpu_h": cheapest[g.id].on_demand_per_gpu,
             "cheapest_on_demand_offer": cheapest[g.id].on_demand,
             "cheapest_spot_usd_per_gpu_h": cheapest[g.id].spot_per_gpu,
             "cheapest_spot_offer": cheapest[g.id].spot}
            for g in catalog.gpus
        ])
    else:
        table = Table(title="GPUs: dense TFLOPS; cheapest $ per GPU-hour in the catalog", title_justify="left")
        for col in ("GPU", "GiB", "bf16", "fp8", "GB/s", "link GB/s", "OD $/h", "spot $/h", "cheapest at"):
            table.add_column(col, justify="left" if col in ("GPU", "cheapest at") else "right")
        for g in catalog.gpus:
            c = cheapest[g.id]
            where = c.spot or c.on_demand
            link = g.interconnect
            table.add_row(
                g.id, f"{g.memory_gib:.1f}",
                *(f"{g.tflops[d]:,.0f}" if d in g.tflops else "-" for d in ("bf16", "fp8")),
                f"{g.memory_bandwidth_gbps:,.0f}",
                f"{link.gbps_per_gpu:,.0f} {_LINK_SHORT.get(link.kind, link.kind)}" if link.gbps_per_gpu else link.kind,
                _money(c.on_demand_per_gpu), _money(c.spot_per_gpu),
                f"{where.cloud} {where.instance_type}" if where else "-",
            )
        console.print(table)
    _warn_stale(catalog, catalog.offers)


@catalog_app.command("offers")
@handle_errors
def catalog_offers(
    gpu: str | None = typer.Option(None, "--gpu", help="GPU id or alias, e.g. H100, A100-80GB, L40S."),
    spot: bool = typer.Option(False, "--spot", help="Only offers with a spot price; sort by spot $/GPU/h."),
    cloud: str | None = typer.Option(None, "--cloud", help="aws, gcp, azure, lambda, runpod."),
    region: str | None = typer.Option(None, "--region", help="Region (or zone prefix), e.g. us-east-1."),
    limit: int = typer.Option(50, "--limit", min=1, help="Rows to show in the table (JSON has all)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Priced offers, cheapest $/GPU-hour first.

    Examples:

      gpuplan catalog offers --gpu H100 --spot

      gpuplan catalog offers --gpu A100 --cloud gcp

      gpuplan catalog offers --region us-east-1 --json
    """
    from rich.table import Table

    from catalog.loader import load_catalog
    from catalog.query import filter_offers, price_per_gpu_hour

    catalog = load_catalog()
    offers = filter_offers(catalog, gpu=gpu, cloud=cloud, region=region, spot=spot)
    if as_json:
        print_json([{**o.model_dump(mode="json"), "usd_per_gpu_h": price_per_gpu_hour(o, spot)} for o in offers])
    else:
        what = catalog.gpu(gpu).id if gpu else "all GPUs"
        table = Table(title=f"{len(offers)} offers for {what}, cheapest {'spot' if spot else 'on-demand'} "
                      "$/GPU-hour first", title_justify="left")
        for col in ("cloud", "instance", "GPUs", "vCPU", "RAM GiB", "region / zone", "on-demand $/h", "spot $/h",
                    "$/GPU/h", "as of"):
            table.add_column(col, justify="right" if col in ("vCPU", "RAM GiB", "on-demand $/h", "spot $/h",
                                                             "$/GPU/h") else "left")
        for o in offers[:limit]:
            where = f"{o.region} {o.zone}" if o.zone else o.region
            table.add_row(o.cloud, o.instance_type, f"{o.gpu_count} x {o.gpu}", str(o.vcpus), f"{o.ram_gib:,.0f}",
                          where, _money(o.on_demand_usd_per_h), _money(o.spot_usd_per_h),
                          _money(price_per_gpu_hour(o, spot)), o.source.as_of.isoformat())
        console.print(table)
        if len(offers) > limit:
            err_console.print(f"({len(offers) - limit} more; --limit or --json to see them)")
    _warn_stale(catalog, offers)


@catalog_app.command("models")
@handle_errors
def catalog_models(as_json: bool = JSON_OPTION) -> None:
    """Model presets (shapes, no weights) usable as `model:` in a job spec.

    Examples:

      gpuplan catalog models

      gpuplan catalog models --json
    """
    from rich.table import Table

    from catalog.loader import load_catalog
    from catalog.params import count_params

    catalog = load_catalog()
    if as_json:
        rows = []
        for m in catalog.models:
            p = count_params(m)
            rows.append({**m.model_dump(mode="json"), "params_total": p.total, "params_active": p.active})
        print_json(rows)
        return
    table = Table(title="Model presets (or give `model: {config: path/to/config.json}`)", title_justify="left")
    for col in ("id", "family", "params", "active", "layers", "hidden", "heads/kv", "ffn", "vocab", "context"):
        table.add_column(col, justify="left" if col in ("id", "family") else "right")
    for m in catalog.models:
        p = count_params(m)
        table.add_row(m.id, m.family, f"{p.total / 1e9:.2f}B", f"{p.active / 1e9:.2f}B" if p.active != p.total
                      else "", str(m.num_layers), str(m.hidden_size), f"{m.num_attention_heads}/{m.num_kv_heads}",
                      str(m.intermediate_size), f"{m.vocab_size:,}", f"{m.max_position_embeddings:,}")
    console.print(table)


@catalog_app.command("local")
@handle_errors
def catalog_local(as_json: bool = JSON_OPTION) -> None:
    """The accelerator of this machine (torch / NVML), the catalog GPU it maps to, and its CPU as measured.

    The CPU is measured once (fp32 matmul GFLOP/s and memory GB/s, under a second) and cached in
    ~/.gpuplan/cpu-probe.json; `gpuplan server` and `gpuplan submit` offer both at $0/h.

    Examples:

      gpuplan catalog local --json
    """
    import os
    from datetime import date
    from pathlib import Path

    from catalog.loader import load_catalog
    from catalog.local import detect_local_device, local_offer, match_device_name
    from catalog.local_cpu import local_cpu
    from scheduler.store import default_home

    catalog = load_catalog()
    device = detect_local_device()
    gpu = match_device_name(device.name, catalog, device.memory_bytes) if device else None
    offer = local_offer(catalog, device, today=date.today())
    cpu, cpu_offer = local_cpu(Path(os.environ.get("GPUPLAN_HOME", "") or default_home()), today=date.today())
    if as_json:
        print_json({"device": None if device is None else device.__dict__, "gpu": gpu, "offer": offer,
                    "cpu": cpu, "cpu_offer": cpu_offer})
        return
    console.print(f"CPU: {cpu.architecture}, {cpu.memory_gib:.1f} GiB RAM ({cpu.torch_total_gib or 0:.1f} free), "
                  f"{cpu.tflops['fp32'] * 1000:,.1f} fp32 GFLOP/s, {cpu.memory_bandwidth_gbps:,.1f} GB/s -> "
                  "[bold]cpu[/], offered to the planner at $0/h as cloud 'local' (pin it with accelerators: [cpu]).")
    if device is None:
        console.print("No GPU found: plans weigh this CPU against the cloud offers; `gpuplan run` uses the CPU.")
    elif gpu is None:
        console.print(f"{device.count} x {device.name!r} found, but it is not in the catalog: plans ignore it.")
    else:
        console.print(styled(f"{device.count} x {device.name!r} -> ", (gpu.id, "bold"),
                             f" ({gpu.memory_gib:.1f} GiB); offered to the planner at $0/h as cloud 'local'."))


@catalog_app.command("refresh")
@handle_errors
def catalog_refresh(
    cloud: str = typer.Argument(..., help="Cloud to refresh (aws)."),
    regions: str = typer.Option("us-east-1,us-east-2,us-west-2", "--regions", help="Comma-separated regions."),
    out: str | None = typer.Option(
        None, "--out",
        help="Offers file to write [default: ~/.gpuplan/catalog/offers/<cloud>.csv, which overrides the packaged one].",
    ),
    ec2_endpoint_url: str | None = typer.Option(None, "--ec2-endpoint-url", help="EC2 endpoint (e.g. a moto server)."),
    price_list_url: str | None = typer.Option(None, "--price-list-url",
                                              help="On-demand offer-file URL template with {region}."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Rebuild a cloud's offers from the cloud itself (AWS: EC2 API via boto3 + the public price list).

    Needs AWS credentials allowed ec2:DescribeInstanceTypes and ec2:DescribeSpotPriceHistory. The us-east-1
    price-list file is large (hundreds of MB): expect a few minutes.

    Examples:

      gpuplan catalog refresh aws

      gpuplan catalog refresh aws --regions us-east-1 --out ./aws.csv --json
    """
    from datetime import date
    from pathlib import Path

    from catalog.loader import load_catalog
    from catalog.refresh import check_cloud, default_offers_path
    from catalog.refresh_aws import PRICE_LIST_URL, AwsEndpoints, refresh_aws

    check_cloud(cloud)
    region_list = [r.strip() for r in regions.split(",") if r.strip()]
    if not region_list:
        raise InvalidInput("give at least one region", path="--regions", hint="e.g. --regions us-east-1")
    path = Path(out).expanduser() if out else default_offers_path(cloud)
    endpoints = AwsEndpoints(ec2_endpoint_url=ec2_endpoint_url, price_list_url=price_list_url or PRICE_LIST_URL)
    with err_console.status("refreshing AWS offers...") as status:
        result = refresh_aws(load_catalog(), region_list, path, today=date.today(), endpoints=endpoints,
                             progress=lambda msg: status.update(f"refreshing AWS offers: {msg}"))
    if as_json:
        print_json({"path": str(path), "regions": result.regions, "offers": len(result.offers),
                    "skipped": result.skipped})
        return
    gpus = sorted({o.gpu for o in result.offers})
    console.print(f"Wrote {len(result.offers)} AWS offers ({', '.join(gpus) or 'none'}) for "
                  f"{', '.join(result.regions)} to {path}")
    if result.skipped:
        err_console.print(f"skipped {len(result.skipped)} instance types whose GPU is not in the catalog or "
                          "that have no price (see --json)")


# ---------------------------------------------------------------- plan / estimate (issue 2: planner)


def _load_planning_inputs(spec_path: str) -> tuple[Any, Any, Any, Any]:
    """(spec, catalog, model, calibration) for the plan/estimate commands."""
    from catalog.loader import load_catalog, resolve_model
    from planner.calibration import load_calibration
    from planner.spec import ModelRef, load_spec

    spec = load_spec(spec_path)
    catalog = load_catalog()
    model = resolve_model(catalog, spec.model.config if isinstance(spec.model, ModelRef) else spec.model)
    return spec, catalog, model, load_calibration(overlay=_user_calibration())


def _user_calibration() -> Any:
    """``gpuplan calibrate``'s file under the gpuplan home, laid over the shipped calibration if present."""
    import os
    from pathlib import Path

    from planner.calibration import user_calibration_path
    from scheduler.store import default_home

    return user_calibration_path(Path(os.environ.get("GPUPLAN_HOME", "") or default_home()))


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

    from planner.search import plan, summarize_rejections

    if objective not in ("cheapest", "fastest"):
        from catalog.errors import InvalidInput

        raise InvalidInput(f"must be cheapest or fastest, got {objective!r}", path="--objective")
    job, catalog, model, calibration = _load_planning_inputs(spec)
    result = plan(job, catalog, objective=objective, calibration=calibration, model=model,  # type: ignore[arg-type]
                  today=date.today())
    if as_json:
        print_json(result)
        return
    _print_plan_table(result, objective, top, deadline=job.resources.deadline)
    chosen = result.chosen
    if chosen is not None:
        console.print(styled(("chosen:", "bold"), " " + _chosen_line(chosen)), highlight=False)
    groups = summarize_rejections(result.rejections)
    if groups:
        print_table(f"{len(result.rejections)} rejected options (all in --json)",
                    [Col("constraint"), Col("count", right=True), Col("example", wrap=True)],
                    [[constraint, str(count), example] for constraint, count, example in groups])
    for warning in result.warnings:
        err_console.print(styled(("warning:", "yellow"), f" {warning}"), highlight=False)


# Plan table columns, most important first; ``drop`` says which go first on a narrow terminal.
_PLAN_COLS = [
    Col("#", right=True), Col("GPUs / strategy", wrap=True), Col("cloud instance region", wrap=True),
    Col("market"), Col("GiB need/limit", right=True, drop=1), Col("tok/s", right=True, drop=4),
    Col("hours", right=True), Col("preempt h", right=True, drop=5), Col("P(deadline)", right=True, drop=6),
    Col("$/h", right=True, drop=3), Col("total $", right=True),
]


def _print_plan_table(result: Any, objective: str, top: int, *, deadline: float | None) -> None:
    # hours and total $ are expected values: on spot they include the preemption overhead column
    cols = [c for c in _PLAN_COLS if deadline is not None or c.header != "P(deadline)"]
    rows: list[list[str | Text]] = []
    for i, c in enumerate(result.candidates[:top], 1):
        e = c.estimate
        row: list[str | Text] = [
            f"{i}*" if c.pareto else str(i), e.strategy.label(),
            f"{c.offer.cloud} {c.offer.instance_type} {c.offer.region}", c.cost.market,
            f"{_gib(e.memory.required_bytes)}/{_gib(e.memory.limit_bytes)}", f"{e.throughput.tokens_per_s:,.0f}",
            f"{c.cost.hours:,.1f}", f"{c.cost.preemption_overhead_h:,.2f}" if c.cost.market == "spot" else "-"]
        if deadline is not None:
            row.append("-" if c.cost.deadline_probability is None else f"{c.cost.deadline_probability:.0%}")
        rows.append([*row, f"{c.cost.usd_per_h:,.2f}", f"{c.cost.usd:,.0f}"])
    headroom = result.candidates[0].estimate.memory.headroom if result.candidates else 0.0
    print_table(f"{result.job}: {len(result.candidates)} candidates ({objective}; * = cost/time Pareto front; "
                f"limit = usable memory less {headroom:.0%} headroom)", cols, rows)


def _chosen_line(chosen: Any) -> str:
    e = chosen.estimate
    extra = ""
    if chosen.cost.market == "spot" and chosen.cost.checkpoint_interval_h:
        extra = f", checkpoint every {chosen.cost.checkpoint_interval_h * 60:.0f} min"
    if chosen.cost.deadline_probability is not None:  # None: the job has no deadline
        extra += f", {chosen.cost.deadline_probability:.0%} chance to meet the deadline"
    return (f"{e.strategy.label()} on {chosen.offer.cloud} {chosen.offer.instance_type} ({chosen.offer.region}, "
            f"{chosen.cost.market}): {chosen.cost.hours:,.1f} h, ${chosen.cost.usd:,.0f}, needs "
            f"{_gib(e.memory.required_bytes)} of {_gib(e.memory.limit_bytes)} GiB "
            f"({_gib(e.memory.usable_bytes)} GiB usable less {e.memory.headroom:.0%} headroom){extra}")


DOES_NOT_FIT_EXIT = NoFeasiblePlan.exit_code  # `estimate` when the placement does not fit: 3, as `plan` with no plan


@app.command("estimate")
@handle_errors
def estimate_command(
    spec: str = typer.Argument(..., help="Job spec, YAML or JSON."),
    gpu: str = typer.Option(..., "--gpu", help="GPU id or alias, e.g. H200, H100, A100-80GB."),
    count: int = typer.Option(1, "--count", min=1, help="Number of GPUs."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Memory, throughput and time of the job on a pinned placement ('auto' fields resolved).

    Exit codes: 0 it fits; 3 it does not fit in memory (the least memory-hungry strategy is shown, with
    how much it needs, and no time: it would not run; in --json "hours" is null); 2 a bad spec or option.

    Memory (per GPU, most loaded rank): "peak allocated" is what torch.cuda.max_memory_allocated()
    reports; "peak reserved" adds the caching allocator's cached blocks when memory is ample;
    "total" adds the CUDA context (what nvidia-smi shows). "needs" is the least the run needs under
    memory pressure (allocated + a small slack + context, since the allocator frees its cache before an
    out-of-memory error): it is what is compared with "usable", so it can be below "total".

    Examples:

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H200 --count 1 --json

      gpuplan estimate examples/llama3-8b-sft.yaml --gpu H100 --count 8
    """
    from planner.search import estimate

    job, catalog, model, calibration = _load_planning_inputs(spec)
    result = estimate(job, catalog, gpu, count, model=model, calibration=calibration)
    fits = result.memory.fits
    if as_json:
        print_json(result if fits else {**to_jsonable(result), "hours": None})
    else:
        _print_estimate(result, calibration.memory.pressure_slack)
    for warning in result.warnings:
        err_console.print(styled(("warning:", "yellow"), f" {warning}"), highlight=False)
    if not fits:
        raise typer.Exit(DOES_NOT_FIT_EXIT)


# Memory rows outside the allocator's peak, and the allocator's cache, come after its components.
_OUTSIDE_ALLOCATOR = ("allocator_cache", "cuda_context", "nccl")


def _print_estimate(result: Any, slack: float) -> None:
    mem, thr = result.memory, result.throughput
    verdict = ("fits", "green") if mem.fits else ("does not fit", "bold red")
    console.print(styled((result.strategy.label(), "bold"), ": ", verdict,
                         f" — needs {_gib(mem.required_bytes)} GiB of {_gib(mem.limit_bytes)} GiB "
                         f"({_gib(mem.usable_bytes)} GiB usable less {mem.headroom:.0%} headroom; "
                         f"peak at {mem.peak_moment})"), highlight=False)
    parts = sorted(((k, v) for k, v in mem.breakdown.items() if k not in _OUTSIDE_ALLOCATOR), key=lambda kv: -kv[1])
    bold = "bold"
    rows: list[list[str | Text]] = [[name, _gib(value), ""] for name, value in parts]
    rows.append([Text("= peak allocated", bold), _gib(mem.peak_allocated_bytes), "torch.cuda.max_memory_allocated()"])
    rows.append(["allocator_cache", _gib(mem.breakdown.get("allocator_cache", 0)),
                 "cached blocks, freed under pressure"])
    rows.append([Text("= peak reserved", bold), _gib(mem.peak_reserved_bytes),
                 "torch.cuda.max_memory_reserved() when memory is ample"])
    for name in ("cuda_context", "nccl"):
        if name in mem.breakdown:
            rows.append([name, _gib(mem.breakdown[name]), "outside the allocator"])
    rows.append([Text("= total", bold), _gib(mem.total_bytes), "what nvidia-smi shows when memory is ample"])
    rows.append([Text("needs", bold), _gib(mem.required_bytes),
                 f"peak allocated + {slack:.0%} slack + context: the least it runs in; compared with limit"])
    rows.append([Text("usable", bold), _gib(mem.usable_bytes), "what the GPU offers the job"])
    rows.append([Text("limit", bold), _gib(mem.limit_bytes), f"usable less {mem.headroom:.0%} headroom"])
    print_table("memory per GPU (most loaded rank)",
                [Col("component"), Col("GiB", right=True), Col("meaning", wrap=True, drop=1)], rows)
    if not mem.fits:
        short = mem.required_bytes - mem.limit_bytes
        fix = ("lora/qlora, activation_checkpointing, fsdp over more GPUs (--count), a smaller micro_batch or "
               "seq_len, or a GPU with more memory" if result.strategy.task == "train" else
               "int8/int4 weights, tensor parallel over more GPUs (--count), a smaller batch or context, or a GPU "
               "with more memory")
        console.print(styled(("does not fit:", "bold red"), f" {_gib(short)} GiB short, so no time estimate "
                             f"(exit code {DOES_NOT_FIT_EXIT}). To fit: {fix}; `gpuplan plan` searches them all."),
                      highlight=False)
        return
    line = f"throughput: {thr.tokens_per_s:,.0f} tokens/s"
    if thr.mfu:
        line += f" (MFU {thr.mfu:.0%})"
    if thr.requests_per_s is not None:
        line += f", {thr.requests_per_s:,.2f} requests/s"
    console.print(f"{line}; {result.hours:,.1f} h for the job", highlight=False)


# ---------------------------------------------------------------- run (issue 3: workers)


@app.command("run")
@handle_errors
def run_command(
    spec_path: str = typer.Argument(..., metavar="SPEC", help="Job spec (YAML or JSON), task train or infer."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Where checkpoints (train) or "
                                              "outputs.jsonl (infer) go (default ~/.gpuplan/checkpoints/<job name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in the directory."),
    use_ray: bool = typer.Option(False, "--ray/--no-ray", help="Run through a local Ray started on demand "
                                 "(Ray Train, like a cluster) instead of bare in this process (the default: "
                                 "one local device needs no Ray and starts in seconds)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run a job on this machine: the local GPU, else the CPU; checkpoints in a local directory.

    The model is a preset, {config: path/to/config.json} (random init), or a folder written by
    save_pretrained (training starts from its weights); paths are relative to the spec file.
    Training data is synthetic, or train.data: token ids (.npy/.bin) or JSONL text/chat with
    train.tokenizer. task: infer reads infer.prompts (JSONL) and appends to <checkpoint-dir>/outputs.jsonl;
    a rerun skips the prompts already answered. The local GPU's strategy comes from the planner; on
    a CPU-only machine the run is fp32 on one worker. Ctrl-C cancels (the last checkpoint stays;
    --resume continues from it). `gpuplan export` takes the trained model out.

    Examples:

      gpuplan run examples/tiny-train.yaml

      gpuplan run examples/tiny-train.yaml --json --checkpoint-dir /tmp/ck

      gpuplan run examples/tiny-train.yaml --resume --ray

      gpuplan run examples/tiny-infer.yaml --checkpoint-dir /tmp/answers
    """
    from pathlib import Path

    from planner.spec import load_spec
    from workers.runner import run_local

    spec = load_spec(spec_path)
    ckpt = Path(checkpoint_dir) if checkpoint_dir else None
    if as_json:
        run = run_local(spec, checkpoint_dir=ckpt, resume=resume, use_ray=use_ray)
    else:
        run = _run_with_progress(spec, ckpt, resume, use_ray)
    result = run.to_dict()
    if as_json:
        print_json(result)
    else:
        _print_run_summary(result)
    if result["status"] != "succeeded":
        raise typer.Exit(1)


def _run_with_progress(spec: Any, ckpt: Any, resume: bool, use_ray: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from workers.executor import RunStatus
    from workers.runner import run_local

    if spec.task == "infer":
        columns: tuple[Any, ...] = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("prompts"), TextColumn("ETA"), TimeRemainingColumn(),
                                    TextColumn("cost $0.00 (local)"))
    else:
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} tok/s"),
                   TextColumn("ETA"), TimeRemainingColumn(), TextColumn("cost $0.00 (local)"))
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task(f"{spec.name}: starting", total=None, loss="-", rate="-")

        def show(status: RunStatus) -> None:
            p = status.progress
            bar.update(task, description=f"{spec.name}: {status.state.value}", completed=p.step,
                       total=p.total_steps or None, loss=f"{p.loss:.4f}" if p.loss is not None else "-",
                       rate=f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-")

        return run_local(spec, checkpoint_dir=ckpt, resume=resume, use_ray=use_ray, on_status=show)


def _print_run_summary(result: dict[str, Any]) -> None:
    from rich.table import Table

    def gib(value: float | None) -> str:
        return f"{value / 2**30:.2f} GiB" if value else "-"

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value else "-"

    table = Table(title=f"{result['job']}: {result['status']}", show_header=False)
    measured, predicted = result["measured"], result["predicted"]
    if result.get("task") == "infer":
        rows = [("message", result["message"]),
                ("strategy", f"{result['strategy_label']} ({result['engine']}, {result['device']})"),
                ("prompts answered", f"{result['steps']} / {result['total_steps']}"),
                ("outputs", result["outputs"]),
                ("wall time", f"{result['wall_s']:.1f} s"),
                ("cost", "$0.00 (local machine)")]
        for key, value in rows:
            table.add_row(key, str(value))
        console.print(table)
        return
    rows = [
        ("message", result["message"]),
        ("strategy", f"{result['strategy_label']} ({result['engine']}, {result['device']})"),
        ("steps", f"{result['steps']} / {result['total_steps']}"),
        ("final loss", f"{result['final_loss']:.4f}" if result["final_loss"] is not None else "-"),
        ("checkpoints", f"{result['checkpoints_written']} written to {result['checkpoint_dir']}"),
        ("resumes", str(result["resumes"]) + (f" (from step {result['resumed_from_step']})"
                                              if result["resumed_from_step"] is not None else "")),
        ("tokens/s measured / predicted", f"{rate(measured['tokens_per_s'])} / {rate(predicted['tokens_per_s'])}"),
        ("peak memory measured / predicted",
         f"{gib(measured['peak_allocated_bytes'] or measured['peak_rss_bytes'])}"
         f"{' (RSS)' if not measured['peak_allocated_bytes'] else ''} / {gib(predicted['peak_allocated_bytes'])}"),
        ("wall time", f"{result['wall_s']:.1f} s"),
        ("cost", "$0.00 (local machine)"),
    ]
    for key, value in rows:
        table.add_row(key, str(value))
    console.print(table)


@app.command("export")
@handle_errors
def export_command(
    source: str = typer.Argument(..., metavar="SOURCE", help="A checkpoint directory, the name of a "
                                 "`gpuplan run` job, or a job id in the database (`gpuplan list`)."),
    out: str = typer.Option(..., "--out", "-o", help="New folder for the model (must not exist or be empty)."),
    merge: bool = typer.Option(False, "--merge", help="LoRA/QLoRA: fold the adapters into the weights and write "
                               "a plain model folder instead of a peft adapter."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a job's trained model as a Hugging Face folder (from its newest checkpoint).

    A full fine-tune gives a folder AutoModelForCausalLM.from_pretrained loads. LoRA/QLoRA gives a
    peft adapter folder on its base model (the weights folder it was trained from, or a copy in
    OUT/base); --merge gives merged weights. The run's tokenizer, if any, is saved beside them.

    Examples:

      gpuplan export tiny-train --out ./tiny-model

      gpuplan export ~/.gpuplan/checkpoints/my-lora --out ./adapter

      gpuplan export j-0123456789abcdef --out ./merged --merge --json
    """
    from pathlib import Path

    from workers.export import export_checkpoint

    uri, note = _export_source(source)
    if note and not as_json:
        err_console.print(f"note: {note}", highlight=False)
    result = export_checkpoint(uri, Path(out).expanduser(), merge=merge).to_dict()
    if as_json:
        print_json({**result, "note": note})
        return
    what = {"model": "model", "adapter": f"peft adapter on {result['base']}", "merged": "merged model"}
    console.print(styled(("exported", "bold green"), f" step {result['step']} of {result['job'] or source} as a "
                         f"{what[result['kind']]} to {result['out']}"
                         + (" (with its tokenizer)" if result["tokenizer"] else "")), highlight=False)


def _export_source(source: str) -> tuple[str, str | None]:
    """(checkpoint uri, a note for the user) for a directory, a local run's name or a database job id."""
    from pathlib import Path

    from catalog.errors import NotFound
    from workers.runner import default_home

    if "://" in source or Path(source).expanduser().is_dir():
        return source, None
    local = default_home() / "runs" / source / "result.json"
    if local.is_file():
        run = json.loads(local.read_text())
        return str(run["checkpoint_dir"]), None
    try:
        job = _backend().status(source)
    except NotFound:
        raise NotFound(f"{source!r} is not a checkpoint directory, a `gpuplan run` job or a job id in the database",
                       hint="give the directory of its checkpoints, or see `gpuplan list`") from None
    uri = job.checkpoint_uri
    if not uri or ("://" not in uri and not Path(uri).expanduser().is_dir()):
        raise NotFound(f"job {job.id} ({job.state}) has no checkpoint to export",
                       hint=f"a job has one once it has saved a step; see `gpuplan status {job.id}`")
    note = None if job.state == "succeeded" else f"job {job.id} is {job.state}: exporting its newest checkpoint"
    return uri, note


# ---------------------------------------------------------------- scheduler (issue 4)

# Talks to `gpuplan server` when GPUPLAN_API_URL is set (token: GPUPLAN_TOKEN; team admin commands
# use GPUPLAN_ADMIN_TOKEN), else runs the same service in-process on the local database
# (GPUPLAN_DATABASE_URL or ~/.gpuplan/gpuplan.db) as team GPUPLAN_TEAM (default "default").


def _backend(*, admin: bool = False) -> Any:
    import os
    from pathlib import Path

    from scheduler.client import DEFAULT_TEAM, HttpClient, local_client
    from scheduler.store import database_url, default_home

    url = os.environ.get("GPUPLAN_API_URL", "").strip()
    if url:
        token = (os.environ.get("GPUPLAN_ADMIN_TOKEN") if admin else None) or os.environ.get("GPUPLAN_TOKEN")
        if not token:
            # Said here, in the user's terms (environment variables), not as the server's HTTP header hint.
            from catalog.errors import AuthError

            if admin:
                raise AuthError("no admin token: set GPUPLAN_ADMIN_TOKEN",
                                hint="the token `gpuplan server` was started with (its GPUPLAN_ADMIN_TOKEN)")
            raise AuthError("no team token: set GPUPLAN_TOKEN",
                            hint="an admin issues one with `gpuplan team token TEAM`")
        return HttpClient(url, token)
    home = Path(os.environ.get("GPUPLAN_HOME", "") or default_home())
    return local_client(database_url(os.environ, home=home), checkpoint_root=str(home / "checkpoints"),
                        team=os.environ.get("GPUPLAN_TEAM", "").strip() or DEFAULT_TEAM, machine_home=home)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


# The id is the value users copy: it is never dropped nor wrapped; the rest goes as the terminal narrows.
_JOB_COLS = [Col("id"), Col("name", wrap=True), Col("state"), Col("gpus", right=True, drop=1),
             Col("market", drop=4), Col("$/h", right=True, drop=5), Col("estimate", right=True, drop=3),
             Col("spent", right=True, drop=2), Col("attempts", right=True, drop=6), Col("created", drop=7)]


def _jobs_table(jobs: list[Any], title: str) -> None:
    print_table(title, _JOB_COLS, [
        [j.id, j.name, j.state, f"{j.gpus}x{j.gpu}", j.market, _usd(j.usd_per_h), _usd(j.estimated_usd),
         _usd(j.spent_usd), str(j.attempts), f"{j.created_at:%Y-%m-%d %H:%M}"] for j in jobs])


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
        "node types count as capacity before their nodes join, and runs ask for the planned GPU, market and zone."),
) -> None:
    """Run the REST API and the scheduling loop (uvicorn). Upgrades the database schema first.

    Examples:

      GPUPLAN_ADMIN_TOKEN=s3cret gpuplan server --port 8000

      GPUPLAN_DATABASE_URL=postgresql://gpuplan@db/gpuplan gpuplan server --host 0.0.0.0 --executor ray --workers 4

      gpuplan server --executor ray --checkpoint-root s3://my-bucket/gpuplan \\
        --ray-cluster-config ~/ray_bootstrap_config.yaml
    """
    import os
    from pathlib import Path

    from catalog.loader import load_catalog
    from scheduler.api.processes import ApiSettings, api_workers, serve_workers
    from scheduler.api.server import (
        checkpoint_root_for,
        listen,
        make_app,
        make_executor,
        make_loop,
        make_service,
        ray_namespace_for,
        ray_storage_for,
        serve,
    )
    from scheduler.store import database_url, default_home
    from scheduler.ui.session import load_or_create_secret

    home = Path(os.environ.get("GPUPLAN_HOME", "") or default_home())
    db_url = database_url(os.environ, home=home)
    count = api_workers(workers, db_url, os.cpu_count())
    sock = listen(host, port)  # before the executor and the loop: a taken port must touch nothing
    namespace = ray_namespace or ray_namespace_for(db_url)
    root = checkpoint_root_for(checkpoint_root, home)
    if root.startswith("s3://"):  # a missing bucket or no credentials fail now, not in every job
        from workers.checkpoint import open_store

        open_store(root)
    run = make_executor(executor, ray_namespace=namespace, storage_path=ray_storage_for(root),
                        ray_cluster_config=ray_cluster_config)
    catalog = load_catalog()
    if executor != "none":  # this machine's GPUs, if any, and its CPU as $0/h placements the planner may pick
        from datetime import date

        from catalog.local_cpu import with_this_machine

        catalog = with_this_machine(catalog, home, today=date.today())
    from planner.calibration import load_calibration

    calibration = load_calibration(overlay=_user_calibration())  # gpuplan calibrate's refit, if any
    service = make_service(db_url, checkpoint_root=root, admin_token=admin_token, catalog=catalog,
                           calibration=calibration)
    if not admin_token:
        err_console.print("no --admin-token / GPUPLAN_ADMIN_TOKEN: team admin endpoints are disabled", style="yellow")
    err_console.print(f"gpuplan server on http://{host}:{port} (docs at /docs, dashboard at /ui), "
                      f"database {service.store.dialect}, "
                      f"executor {executor}{f' (Ray namespace {namespace})' if executor == 'ray' else ''}, "
                      f"{count} API worker{'s' if count > 1 else ''}")
    ui_secret = load_or_create_secret(home)  # dashboard sessions at /ui: one secret for every API process
    if count == 1:
        serve(make_app(service, catalog, run, poll_s=poll, max_running=max_running, ui_secret=ui_secret), host, port,
              sock=sock)
        return
    settings = ApiSettings(database_url=service.store.url, checkpoint_root=service.checkpoint_root, catalog=catalog,
                           admin_token=admin_token, calibration=calibration, ui_secret=ui_secret)
    serve_workers(settings, host, port, count, loop=make_loop(service, run, poll_s=poll, max_running=max_running),
                  sock=sock)


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
    import os

    from planner.spec import load_spec
    from scheduler.models import JobCreate

    body = JobCreate(spec=load_spec(spec).model_dump(mode="json"), priority=priority, idempotency_key=key)
    backend = _backend()
    job = backend.submit(body)
    # A new job is always queued; any other state is the job this key already submitted.
    again = job.state != "queued"
    if not again and not os.environ.get("GPUPLAN_API_URL", "").strip():
        # In-process there is no scheduling loop: without this, `logs --follow` waits on a queued job forever.
        err_console.print(f"note: queued in the local database as team {backend.principal.team_name} "
                          "(GPUPLAN_TEAM picks another); a `gpuplan server` on this database runs it",
                          highlight=False)
    if as_json:
        print_json(job)
        return
    if again:
        console.print(styled((job.state, "bold"), f" {job.id} ({job.name}): submitted earlier with key {key!r} at "
                             f"{job.created_at:%Y-%m-%d %H:%M} UTC, not queued again (use a new --key to submit it "
                             "anew)"), highlight=False)
        return
    console.print(styled(("queued", "bold green"), f" {job.id} ({job.name}): {job.gpus}x{job.gpu} {job.market} at "
                  f"{_usd(job.usd_per_h)}/h, estimated {_usd(job.estimated_usd)} over {job.estimated_hours:,.2f} h"),
                  highlight=False)
    if job.message:  # why it waits for the team's GPU quota
        console.print(job.message, highlight=False)


@app.command("status")
@handle_errors
def status_command(job_id: str = typer.Argument(..., help="Job id (see `gpuplan list`)."),
                   as_json: bool = JSON_OPTION) -> None:
    """Show a job: state, plan, attempts and every state change.

    Example:  gpuplan status j-0123456789abcdef
    """
    job = _backend().status(job_id)
    if as_json:
        print_json(job)
        return
    _jobs_table([job], f"job {job.id}")
    if job.message:
        console.print(job.message, highlight=False)
    if job.attempt_list:
        print_table("attempts", [Col("#", right=True), Col("market"), Col("$/h at launch", right=True),
                                 Col("started"), Col("ended"), Col("outcome", wrap=True)],
                    [[str(a.number), a.market, _usd(a.usd_per_h), f"{a.started_at:%H:%M:%S}",
                      f"{a.ended_at:%H:%M:%S}" if a.ended_at else "-", a.outcome or "running"]
                     for a in job.attempt_list])
    print_table("events", [Col("time"), Col("from"), Col("to"), Col("reason", wrap=True)],
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

    from scheduler.states import JobState

    backend = _backend()
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
        if JobState(page.state).terminal:
            # The loop closes a cancelled job's attempt (and copies its last lines) on its next tick;
            # without a running loop that never happens, so wait a while, not forever.
            ended_at = ended_at if ended_at is not None else time.monotonic()
            if time.monotonic() - ended_at > LOG_TAIL_GRACE_S:
                err_console.print(f"job {job_id} is {page.state} but its last attempt is not closed yet (is a "
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
    job = _backend().cancel(job_id, reason)
    if as_json:
        print_json(job)
        return
    console.print(f"{job.id} cancelled", highlight=False)


@app.command("list")
@handle_errors
def list_command(state: str | None = typer.Option(None, "--state", help="Only jobs in this state."),
                 limit: int = typer.Option(50, "--limit", min=1, max=1000),
                 as_json: bool = JSON_OPTION) -> None:
    """List your team's jobs, newest first.

    Example:  gpuplan list --state running
    """
    jobs = _backend().list_jobs(state=state, limit=limit)
    if as_json:
        print_json(jobs)
        return
    _jobs_table(jobs, f"{len(jobs)} job(s)")
    for job in jobs:  # why a queued job has not started (the team's GPU quota)
        if job.state == "queued" and job.message:
            console.print(f"{job.id} {job.message}", highlight=False)


report_app = typer.Typer(help="Cost reports: dry-run (what the planner would do) and actual spend; and how "
                         "close plans came (accuracy).\n\nExamples:\n\n"
                         "  gpuplan report dry-run examples/*.yaml --out report/\n\n"
                         "  gpuplan report spend --team ml --since 2026-11-01\n\n"
                         "  gpuplan report accuracy --plot accuracy.png",
                         no_args_is_help=True)
app.add_typer(report_app, name="report")


@report_app.command("spend")
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
    import os

    if team is not None and all_teams:
        raise InvalidInput("give --team or --all, not both", path="team")
    # Over HTTP with only the admin token there is no team of "yours": the admin's report is every team.
    admin_only = (bool(os.environ.get("GPUPLAN_API_URL", "").strip()) and not os.environ.get("GPUPLAN_TOKEN")
                  and bool(os.environ.get("GPUPLAN_ADMIN_TOKEN")))
    all_teams = all_teams or (team is None and admin_only)
    report = _backend(admin=team is not None or all_teams).spend_report(since=since, team=team, all_teams=all_teams)
    if as_json:
        print_json(report)
        return
    if report.team is None:
        _print_teams_spend(report)
        return
    _print_team_spend(report)


def _print_team_spend(report: Any) -> None:
    from rich.table import Table

    table = Table(title=f"spend of team {report.team} since {report.since:%Y-%m-%d %H:%M} UTC")
    for col in ("job", "name", "market", "attempts", "hours", "USD"):
        table.add_column(col, justify="right" if col in ("attempts", "hours", "USD") else "left")
    for line in report.jobs:
        table.add_row(line.job_id, line.job_name, line.market, str(line.attempts), f"{line.hours:,.2f}",
                      _usd(line.usd))
    console.print(table)
    markets = ", ".join(f"{m} {_usd(v)}" for m, v in sorted(report.by_market.items())) or "nothing yet"
    console.print(f"total {_usd(report.total_usd)} ({markets}); budget {_usd(report.budget_usd)}, "
                  f"remaining {_usd(report.remaining_usd)}", highlight=False)


@report_app.command("accuracy")
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
    import os
    from pathlib import Path

    from rich.table import Table

    from catalog.errors import InvalidInput
    from scheduler.accuracy import accuracy_png, accuracy_rows, local_records, summarize, team_records
    from scheduler.store import default_home

    if source == "local":
        home = Path(os.environ.get("GPUPLAN_HOME", "") or default_home())
        records = local_records(home)
    elif source == "team":
        backend = _backend()
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

    table = Table(title=f"predicted vs measured ({source}: {len(rows)} runs)", title_justify="left")
    for col in ("job", "outcome", "strategy", "alloc GiB pred", "meas", "err", "tok/s pred", "meas", "err", "OOM b/o"):
        table.add_column(col, justify="left" if col in ("job", "outcome", "strategy") else "right")
    for r in rows:
        table.add_row(r["job"], r["outcome"], r["strategy"] or "-", gib(r["predicted_peak_allocated_bytes"]),
                      gib(r["measured_peak_allocated_bytes"]), pct(r["error_peak_allocated_bytes"]),
                      rate(r["predicted_tokens_per_s"]), rate(r["measured_tokens_per_s"]),
                      pct(r["error_tokens_per_s"]), str(r["oom_backoffs"]))
    console.print(table)
    for key, s in summary.items():
        if s["n"]:
            console.print(f"{key}: {s['n']} runs, median |error| {s['median_abs_error']:.1%}, "
                          f"worst {s['max_abs_error']:.1%}", highlight=False)
    if plot:
        console.print(f"plot written to {plot}", highlight=False)


@app.command("calibrate")
@handle_errors
def calibrate_command(
    source: str = typer.Option("local", "--source", help="local: this machine's `gpuplan run` results; team: your "
                               "team's finished attempts (the server, or the local database); all: both."),
    holdout: float = typer.Option(1 / 3, "--holdout", min=0.1, max=0.5,
                                  help="Share of the records held out to judge the refit on (never fitted on)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the refit and its held-out effect; write nothing."),
    reset: bool = typer.Option(False, "--reset", help="Delete your calibration file: plan with the shipped one again."),
    limit: int = typer.Option(200, "--limit", min=1, max=1000, help="team: how many recent jobs to read."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Refit the planner's calibration from your finished runs (predicted vs measured).

    The constants are fitted on part of the records and judged on the held-out rest; a quantity
    whose held-out error would grow keeps the shipped constants. The result goes to
    ~/.gpuplan/calibration.json (GPUPLAN_HOME), which plan, estimate, run and server then use.

    Examples:

      gpuplan calibrate --dry-run

      gpuplan calibrate --source all --json

      gpuplan calibrate --reset
    """
    import os
    from pathlib import Path

    from scheduler import calibrate as calib
    from scheduler.store import default_home

    home = Path(os.environ.get("GPUPLAN_HOME", "") or default_home())
    if reset:
        removed = calib.reset(home)
        if as_json:
            print_json({"reset": removed, "path": str(_user_calibration())})
        else:
            console.print(f"removed {_user_calibration()}: plans use the shipped calibration" if removed
                          else "no calibration file to remove: plans already use the shipped calibration",
                          highlight=False)
        return

    def team_jobs() -> list[Any]:
        backend = _backend()
        return [backend.status(j.id) for j in backend.list_jobs(limit=limit)]

    out = calib.calibrate(home, source=source, holdout=holdout, write=not dry_run,
                          team_jobs=team_jobs if source in ("team", "all") else None)
    if as_json:
        print_json(out)
        return
    _print_calibration(out)


def _print_calibration(out: dict[str, Any]) -> None:
    from rich.table import Table

    def err(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    def num(v: float) -> str:
        return f"{v:.4g}"

    console.print(f"{out['records']} recorded runs: fitted on {out['fit']}, judged on {out['held_out']} held out",
                  highlight=False)
    table = Table(title="held-out error, |predicted - measured| / measured", title_justify="left")
    for col in ("quantity", "runs", "median before", "after", "worst before", "after", "refit"):
        table.add_column(col, justify="left" if col in ("quantity", "refit") else "right")
    for r in out["report"]:
        table.add_row(r["quantity"], str(r["held_out"]), err(r["median_before"]), err(r["median_after"]),
                      err(r["max_before"]), err(r["max_after"]), "kept" if r["kept"] else (r["note"] or "-"))
    console.print(table)
    if out["changes"] or out["reverted"]:
        changes = Table(title="constants", title_justify="left")
        for col in ("constant", "shipped", "refit", "fit runs", ""):
            changes.add_column(col, justify="left" if col in ("constant", "") else "right")
        for c in out["changes"]:
            changes.add_row(c["name"], num(c["before"]), num(c["after"]), str(c["records"]), "kept")
        for c in out["reverted"]:
            changes.add_row(c["name"], num(c["before"]), num(c["after"]), str(c["records"]), "dropped")
        console.print(changes)
    if out["skipped_records"]:
        console.print(f"{len(out['skipped_records'])} records not usable (see --json: skipped_records)",
                      highlight=False)
    if out["written"]:
        console.print(f"wrote {out['path']}: plan, estimate, run and server now use it "
                      "(gpuplan calibrate --reset goes back to the shipped calibration)", highlight=False)
    elif not out["changes"]:
        console.print("nothing to change: the shipped calibration stays", highlight=False)
    else:
        console.print(f"--dry-run: {out['path']} not written", highlight=False)


def _print_teams_spend(report: Any) -> None:
    from rich.table import Table

    markets = sorted(report.by_market)
    table = Table(title=f"spend of every team since {report.since:%Y-%m-%d %H:%M} UTC")
    for col in ("team", *markets, "total", "budget", "remaining"):
        table.add_column(col, justify="left" if col == "team" else "right")
    for t in report.teams:
        table.add_row(t.team, *(_usd(t.by_market.get(m, 0.0)) for m in markets), _usd(t.total_usd),
                      _usd(t.budget_usd), _usd(t.remaining_usd))
    console.print(table)
    console.print(f"total {_usd(report.total_usd)} over {len(report.teams)} team(s); "
                  "per job: gpuplan report spend --team TEAM", highlight=False)


team_app = typer.Typer(help="Teams, budgets, GPU quotas and tokens (admin).\n\nExamples:\n\n"
                       "  gpuplan team create ml --budget 5000 --quota 16\n\n"
                       "  gpuplan team token ml\n\n"
                       "  gpuplan team list --json", no_args_is_help=True)
app.add_typer(team_app, name="team")


def _print_team(team: Any, as_json: bool) -> None:
    if as_json:
        print_json(team)
        return
    quota = "none" if team.gpu_quota is None else str(team.gpu_quota)
    console.print(f"team {team.name}: budget {_usd(team.budget_usd)} (spent {_usd(team.spent_usd)}, reserved "
                  f"{_usd(team.reserved_usd)}, remaining {_usd(team.remaining_usd)}), GPU quota {quota} "
                  f"({team.gpus_in_use} in use)", highlight=False)


def _limit(value: str, kind: type[float] | type[int], what: str) -> tuple[Any, bool]:
    import math

    if value.lower() in ("none", "unlimited"):
        return None, True
    try:
        number = kind(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        whole = "a whole number" if kind is int else "a number"
        raise InvalidInput(f"must be {whole} >= 0 or 'none', got {value!r}", path=what) from None
    return number, False


def _team_body(model: type[BaseModel], **fields: Any) -> Any:
    """The team request body; a value the model refuses (over its cap) is one error line, not a traceback."""
    from pydantic import ValidationError

    try:
        return model(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        if first["type"] == "value_error":  # our own validator: its message already names the value
            raise InvalidInput(str(first["msg"]).removeprefix("Value error, "), path=name) from None
        raise InvalidInput(f"{first['msg']}, got {first.get('input')!r}",
                           path={"budget_usd": "budget", "gpu_quota": "quota"}.get(name, name)) from None


# A negative number is a value to refuse with a reason, not an unknown option ("No such option: -5").
_NUMBER_ARGS = {"ignore_unknown_options": True}


@team_app.command("create")
@handle_errors
def team_create_command(name: str = typer.Argument(...),
                        budget: float | None = typer.Option(None, "--budget", min=0, help="USD; omit: no limit."),
                        quota: int | None = typer.Option(None, "--quota", min=0, help="GPUs; omit: no limit."),
                        as_json: bool = JSON_OPTION) -> None:
    """Create a team.  Example:  gpuplan team create ml --budget 500 --quota 16"""
    from scheduler.models import TeamCreate

    body = _team_body(TeamCreate, name=name, budget_usd=budget, gpu_quota=quota)
    _print_team(_backend(admin=True).create_team(body), as_json)


@team_app.command("budget", context_settings=_NUMBER_ARGS)
@handle_errors
def team_budget_command(name: str = typer.Argument(...), usd: str = typer.Argument(..., help="USD or 'none'."),
                        as_json: bool = JSON_OPTION) -> None:
    """Set a team's budget.  Example:  gpuplan team budget ml 1000"""
    from scheduler.models import TeamUpdate

    value, clear = _limit(usd, float, "budget")
    body = _team_body(TeamUpdate, budget_usd=value, clear_budget=clear)
    _print_team(_backend(admin=True).update_team(name, body), as_json)


@team_app.command("quota", context_settings=_NUMBER_ARGS)
@handle_errors
def team_quota_command(name: str = typer.Argument(...), gpus: str = typer.Argument(..., help="GPUs or 'none'."),
                       as_json: bool = JSON_OPTION) -> None:
    """Set a team's GPU quota.  Example:  gpuplan team quota ml 32"""
    from scheduler.models import TeamUpdate

    value, clear = _limit(gpus, int, "quota")
    body = _team_body(TeamUpdate, gpu_quota=value, clear_quota=clear)
    _print_team(_backend(admin=True).update_team(name, body), as_json)


@team_app.command("token")
@handle_errors
def team_token_command(name: str = typer.Argument(...),
                       revoke: int | None = typer.Option(None, "--revoke", help="Revoke this token id instead."),
                       list_them: bool = typer.Option(False, "--list", help="List the team's token ids instead."),
                       label: str = typer.Option("default", "--name", help="A label for the new token."),
                       as_json: bool = JSON_OPTION) -> None:
    """Issue a team token (shown once), list the team's tokens, or revoke one of them.

    Examples:

      gpuplan team token ml

      gpuplan team token ml --list

      gpuplan team token ml --revoke 3
    """
    backend = _backend(admin=True)
    if list_them:
        _print_tokens(backend.list_tokens(name), name, as_json)
        return
    if revoke is not None:
        row = backend.revoke_token(name, revoke)
        if as_json:
            print_json(row)
        else:
            console.print(f"token {row.id} of team {name} revoked", highlight=False)
        return
    created = backend.create_token(name, label)
    if as_json:
        print_json(created)
        return
    console.print(f"token {created.id} for team {name} (shown once, store it now):", highlight=False)
    sys.stdout.write(created.token + "\n")


def _print_tokens(tokens: list[Any], team: str, as_json: bool) -> None:
    from rich.table import Table

    if as_json:
        print_json(tokens)
        return
    table = Table(title=f"tokens of team {team}")
    for col in ("id", "name", "created", "revoked"):
        table.add_column(col)
    for t in tokens:
        table.add_row(str(t.id), t.name, f"{t.created_at:%Y-%m-%d %H:%M}",
                      f"{t.revoked_at:%Y-%m-%d %H:%M}" if t.revoked_at else "-")
    console.print(table)


@team_app.command("list")
@handle_errors
def team_list_command(as_json: bool = JSON_OPTION) -> None:
    """List teams with budget, spend and quota (admin).  Example:  gpuplan team list --json"""
    from rich.table import Table

    teams = _backend(admin=True).list_teams()
    if as_json:
        print_json(teams)
        return
    table = Table(title="teams")
    for col in ("name", "budget", "spent", "reserved", "remaining", "GPU quota", "GPUs in use"):
        table.add_column(col)
    for t in teams:
        table.add_row(t.name, _usd(t.budget_usd), _usd(t.spent_usd), _usd(t.reserved_usd), _usd(t.remaining_usd),
                      "-" if t.gpu_quota is None else str(t.gpu_quota), str(t.gpus_in_use))
    console.print(table)

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
    plot: str | None = typer.Option(None, "--plot", help="Write a timeline plot (PNG) here (single job only)."),
    n_jobs: int = typer.Option(1, "--jobs", min=1, help="A stream of this many jobs, one every --every-hours."),
    every_hours: float = typer.Option(24.0, "--every-hours", help="Hours between arrivals in a stream."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay spot traces: what each policy would have paid, when it finished, and what it lost.

    Policies: uniform-progress, on-demand, spot-only, greedy, omniscient (lower bound: knows the future),
    gpuplan (default policy).

    Examples:

      gpuplan simulate --trace us-east-1a.json --job-hours 48 --deadline-hours 70 --restart-hours 0.2 --json

      gpuplan simulate --trace a.json --trace b.json --deadline-hours 60 --plot timeline.png

      gpuplan simulate --trace a.json --deadline-hours 70 --jobs 30 --every-hours 24 --json
    """
    from pathlib import Path

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
    if n_jobs > 1:
        _simulate_stream(zones, names, prices, n_jobs, every_hours, start_hour, job_hours, deadline_hours,
                         restart_hours, checkpoint_hours, plot, as_json)
        return
    tick = start_tick_for(zones, start_hour)
    _warn_trace_too_short(zones, start_hour, start_hour, job_hours, deadline_hours)  # stderr: --json stays clean
    jobs = Jobs.make([tick], job_hours, float("inf") if deadline_hours is None else deadline_hours, restart_hours)
    results = compare(zones, jobs, prices, names, SimOptions(checkpoint_cost_h=checkpoint_hours, timeline=bool(plot)))
    rows = {name: out.row(0) for name, out in results.items()}
    for row in rows.values():
        row.pop("policy")
        row["outcome"] = _outcome(row, deadline_hours, zones.hours - start_hour)
    if plot:
        from scheduler.plots import timeline_png

        Path(plot).write_bytes(timeline_png(zones, int(jobs.start_tick[0]), results, job_hours, deadline_hours))
    if as_json:
        print_json({
            "job": {"hours": job_hours, "deadline_hours": deadline_hours, "restart_hours": restart_hours,
                    "start_hour": start_hour, "checkpoint_hours": checkpoint_hours},
            "prices": {"on_demand": on_demand_price, "spot": spot_price},
            "trace_hours": zones.hours,
            "zones": list(zones.names),
            "policies": rows,
            "plot": plot,
        })
        return
    _print_simulation(rows, zones, start_hour, job_hours, deadline_hours, restart_hours)
    if plot:
        console.print(f"timeline plot written to {plot}", highlight=False)


def _hours(value: Any) -> str:
    return f"{float(value):,.2f}"


def _outcome(row: dict[str, Any], deadline_hours: float | None, hours_left: float) -> str:
    """met | missed | finished (no deadline) | unfinished (the trace ended first, deadline not yet reached)."""
    finished = row["finish_hours"] is not None
    if deadline_hours is None:
        return "finished" if finished else "unfinished"
    if finished:
        return "met" if row["deadline_met"] else "missed"
    return "missed" if hours_left >= deadline_hours else "unfinished"


def _deadline_words(deadline_hours: float | None) -> str:
    return "no deadline" if deadline_hours is None else f"deadline {deadline_hours:g} h"


def _warn_trace_too_short(zones: Any, first_hour: float, last_hour: float, job_hours: float,
                          deadline_hours: float | None) -> None:
    """Said before the run: a job the trace cannot see to its end (or deadline) is reported unfinished."""
    end = zones.hours
    needed = job_hours if deadline_hours is None else deadline_hours
    if last_hour + needed <= end:
        return
    if first_hour != last_hour:
        what = "can finish" if deadline_hours is None else "reach their deadline"
        who = f"before jobs arriving after {max(first_hour, end - needed):g} h {what}"
    elif deadline_hours is None:
        who = f"before the job can finish (it arrives at {first_hour:g} h and needs {job_hours:g} h of work)"
    else:
        who = f"before the job's deadline at {first_hour + deadline_hours:g} h"
    err_console.print(styled(("warning:", "yellow"), f" the trace ends at {end:g} h, {who}: a policy still running "
                             "at the end is reported unfinished, with no cost ratio"), highlight=False)


_SIM_COLS = [Col("policy"), Col("cost $", right=True), Col("x bound", right=True), Col("finish h", right=True),
             Col("outcome"), Col("preemptions", right=True, drop=3), Col("work lost h", right=True, drop=4),
             Col("spot h", right=True, drop=2), Col("OD h", right=True, drop=1)]


def _print_simulation(rows: dict[str, dict[str, Any]], zones: Any, start_hour: float, job_hours: float,
                      deadline_hours: float | None, restart_hours: float) -> None:
    hours_left = zones.hours - start_hour
    outcomes = {name: _outcome(row, deadline_hours, hours_left) for name, row in rows.items()}
    bound_row = rows.get("omniscient")
    bound = bound_row["cost_usd"] if bound_row and bound_row["finish_hours"] is not None else None
    table_rows: list[list[str | Text]] = []
    for name, row in rows.items():
        cost, done = row["cost_usd"], row["finish_hours"] is not None
        money = "-" if cost is None else f"{cost:,.2f}" + ("" if done else "+")
        ratio = f"{cost / bound:.3f}" if done and cost is not None and bound else "-"
        outcome = outcomes[name]
        style = {"met": "green", "finished": "green", "missed": "red"}.get(outcome, "yellow")
        table_rows.append([
            name, money, ratio, "-" if row["finish_hours"] is None else _hours(row["finish_hours"]),
            Text(outcome, style=style), str(row["preemptions"]),
            *("-" if row[k] is None else _hours(row[k]) for k in ("work_lost_hours", "spot_hours", "on_demand_hours"))])
    print_table(f"{job_hours:g} h job, {_deadline_words(deadline_hours)}, restart {restart_hours:g} h, "
                f"zones: {', '.join(zones.names)}", _SIM_COLS, table_rows)
    if any(row["finish_hours"] is None for row in rows.values()):
        console.print(f"unfinished: the trace ends at {zones.hours:g} h ({hours_left:g} h after the job arrived) "
                      "before the job finished; + marks the cost spent until then, with no ratio to the bound.",
                      style="yellow", highlight=False)
    if "omniscient" in rows:
        console.print("omniscient is a lower bound (it knows the future trace), not a schedule.", style="dim")


def _simulate_stream(zones: Any, names: list[str], prices: Any, n_jobs: int, every_hours: float, start_hour: float,
                     job_hours: float, deadline_hours: float | None, restart_hours: float, checkpoint_hours: float,
                     plot: str | None, as_json: bool) -> None:
    from catalog.errors import InvalidInput
    from scheduler.simulate import Jobs, SimOptions, compare, start_tick_for, summarize

    if plot:
        raise InvalidInput("--plot draws one job's timeline; drop --jobs or --plot")
    if not every_hours > 0:
        raise InvalidInput("--every-hours must be > 0")
    last = start_hour + (n_jobs - 1) * every_hours
    starts = [start_tick_for(zones, start_hour + i * every_hours) for i in range(n_jobs)] if last < zones.hours else []
    if not starts:
        raise InvalidInput(f"the last of {n_jobs} arrivals ({last:g} h) is past the end of the trace "
                           f"({zones.hours:.1f} h)", hint="use fewer --jobs or a smaller --every-hours")
    _warn_trace_too_short(zones, start_hour, last, job_hours, deadline_hours)
    deadline = float("inf") if deadline_hours is None else deadline_hours
    jobs = Jobs.make(starts, job_hours, deadline, restart_hours)
    summary = summarize(compare(zones, jobs, prices, names, SimOptions(checkpoint_cost_h=checkpoint_hours)))
    if as_json:
        print_json({"job": {"hours": job_hours, "deadline_hours": deadline_hours, "restart_hours": restart_hours,
                            "checkpoint_hours": checkpoint_hours},
                    "arrivals": {"jobs": n_jobs, "first_hour": start_hour, "every_hours": every_hours},
                    "trace_hours": zones.hours, "zones": list(zones.names), "policies": summary})
        return
    unfinished = any(row["unfinished"] for row in summary.values())
    cols = [Col("policy"), Col("finished" if deadline_hours is None else "deadlines met", right=True),
            *([Col("unfinished", right=True)] if unfinished else []), Col("total $", right=True, drop=1),
            Col("median $", right=True), Col("median x bound", right=True), Col("median finish h", right=True),
            Col("preemptions", right=True, drop=3), Col("work lost h", right=True, drop=2)]
    rows: list[list[str | Text]] = []
    for name, row in summary.items():
        ratio, finish = row.get("median_x_bound"), row["median_finish_hours"]
        rows.append([name, f"{row['deadlines_met']}/{row['jobs']}",
                     *([str(row["unfinished"])] if unfinished else []), f"{row['cost_usd']:,.2f}",
                     f"{row['median_cost_usd']:,.2f}", "-" if ratio is None else f"{ratio:.3f}",
                     "-" if finish is None else _hours(finish), str(row["preemptions"]),
                     _hours(row["work_lost_hours"])])
    print_table(f"{n_jobs} jobs of {job_hours:g} h, one every {every_hours:g} h, {_deadline_words(deadline_hours)}",
                cols, rows)
    if unfinished:
        console.print(f"unfinished: still running when the trace ends at {zones.hours:g} h; their costs count what "
                      "they spent until then, and they have no ratio to the bound.", style="yellow", highlight=False)


cluster_app = typer.Typer(help="Ray cluster configs for running plans on spot instances.\n\nExample:\n\n"
                          "  gpuplan cluster config examples/llama3-8b-sft.yaml --out cluster.yaml",
                          no_args_is_help=True)
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
    wheel: str | None = typer.Option(None, "--wheel", help="A gpuplan wheel to install on the nodes "
                                     "(pip wheel --no-deps -w dist . in the checkout)."),
    source_dir: str | None = typer.Option(None, "--source-dir", help="Or sync this gpuplan checkout to the nodes."),
    checkpoint_root: str | None = typer.Option(None, "--checkpoint-root", help="s3://bucket/prefix the nodes "
                                               "checkpoint to (the head's server gets it)."),
    ami: str | None = typer.Option(None, "--ami", help="AMI for every node (default: the region's current Deep "
                                   "Learning Base AMI, Ubuntu 24.04, through SSM)."),
    subnet: list[str] = typer.Option([], "--subnet", help="ZONE_ID=SUBNET_ID, e.g. use1-az1=subnet-0abc "
                                     "(default: the account's subnets of each zone)."),
    instance_profile: str = typer.Option("gpuplan-node", "--instance-profile", help="IAM instance profile of "
                                         "head and workers (the YAML's header has its policy)."),
    database_url: str | None = typer.Option(None, "--database-url", help="The head server's database "
                                            "(default: SQLite on the head)."),
    alternatives: int = typer.Option(2, "--alternatives", min=0, help="Extra offers to give node types."),
    every_zone: bool = typer.Option(False, "--every-zone", help="Node types for the chosen instance type in every "
                                    "zone of the region the plan priced it in (for zone switching)."),
    head_instance: str = typer.Option("m5.2xlarge", "--head-instance", help="On-demand head node type."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A Ray cluster-launcher YAML for AWS: the plan's GPU, market and zone as node types, the gpuplan
    server on the head, the preemption watcher on every worker. Looks up AMIs, subnets, the instance
    profile and the bucket in the account first (AWS credentials needed).

    Examples:

      pip wheel --no-deps -w dist . && gpuplan cluster config examples/llama3-8b-sft.yaml \\
        --wheel dist/gpuplan-0.1.0-py3-none-any.whl --checkpoint-root s3://my-bucket/gpuplan --out cluster.yaml \\
        && ray up cluster.yaml

      gpuplan plan job.yaml --json > plan.json && gpuplan cluster config plan.json --source-dir . --json
    """
    from pathlib import Path

    from catalog.errors import InvalidInput
    from workers.cluster import ClusterOptions
    from workers.cluster_aws import generate

    subnets = dict(item.split("=", 1) for item in subnet if "=" in item)
    if len(subnets) != len(subnet):
        raise InvalidInput("--subnet takes ZONE_ID=SUBNET_ID", path="subnet", hint="e.g. --subnet use1-az1=subnet-0abc")
    opts = ClusterOptions(wheel=wheel, source_dir=source_dir, checkpoint_root=checkpoint_root, ami=ami,
                          subnets=subnets, instance_profile=instance_profile, database_url=database_url,
                          alternatives=alternatives, every_zone=every_zone, head_instance=head_instance)
    config, text = generate(_plan_from_file(plan_or_spec), opts)
    if out:
        Path(out).write_text(text)
    if as_json:
        print_json({"path": out, "config": config})
    elif out:
        console.print(f"wrote {out}: {len(config['available_node_types']) - 1} worker type(s); start with "
                      f"`ray up {out}`", highlight=False)
    else:
        sys.stdout.write(text)


# `report_app` is created in the scheduler's section (issue 4) above.


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

        raise InvalidInput(f"must be cheapest or fastest, got {objective!r}", path="--objective")
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


def _quiet_third_party_logs() -> None:
    # torchao warns at import about optional CUDA kernels built for other Pythons, and torch's pytree
    # about deprecations inside torchao: noise for a CLI user, never actionable by them.
    import logging

    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def main() -> None:
    _quiet_third_party_logs()
    app()


escape_help(app)  # after every command is registered

if __name__ == "__main__":
    main()
