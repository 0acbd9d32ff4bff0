"""`gpuplan simulate`: replay spot traces under each policy (cost, finish time, work lost)."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from commands import output
from commands.output import JSON_OPTION, Col, handle_errors, print_json, print_table
from errors import InvalidInput

app = typer.Typer()  # simulate: a top-level command


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
    make_before_break: bool = typer.Option(
        True, "--make-before-break/--break-before-make",
        help="gpuplan's returns to spot may boot spot beside the running on-demand instance and move once it is "
             "up, as the scheduler loop does (the bound may too); --break-before-make: stop on-demand first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Replay spot traces: what each policy would have paid, when it finished, and what it lost.

    Policies: uniform-progress, on-demand, spot-only, greedy, omniscient (lower bound: knows the future),
    gpuplan (default policy).

    Examples:

      gpuplan simulate --trace us-east-1a.json --job-hours 48 --deadline-hours 70 --restart-hours 0.2 --json

      gpuplan simulate --trace a.json --trace b.json --deadline-hours 60 --plot timeline.png

      gpuplan simulate --trace a.json --deadline-hours 70 --jobs 30 --every-hours 24 --json

      gpuplan simulate --trace a.json --deadline-hours 52 --restart-hours 0.4 --break-before-make
    """
    from scheduler.sim.simulate import ALL_POLICIES, Prices
    from scheduler.sim.traces import load_zones

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
                         restart_hours, checkpoint_hours, plot, as_json, make_before_break)
        return
    _simulate_one(zones, names, prices, start_hour, job_hours, deadline_hours, restart_hours, checkpoint_hours, plot,
                  as_json, make_before_break)


def _boots(row: dict[str, Any]) -> str:
    """Spot boots beside on-demand and, in brackets, those whose capacity went first ("-": none, or a bound)."""
    boots, lost = row.get("spot_boots"), row.get("spot_boots_lost")
    return "-" if not boots else f"{boots} ({lost})"


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
    output.warn(f"the trace ends at {end:g} h, {who}: a policy still running at the end is reported unfinished, "
                "with no cost ratio")


SIM_COLS = [Col("policy"), Col("cost $", right=True), Col("x bound", right=True), Col("finish h", right=True),
             Col("outcome"), Col("preemptions", right=True, drop=3), Col("work lost h", right=True, drop=4),
             Col("spot h", right=True, drop=2), Col("OD h", right=True, drop=1),
             Col("spot boots (lost)", right=True, drop=5)]


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
            *("-" if row[k] is None else _hours(row[k]) for k in ("work_lost_hours", "spot_hours", "on_demand_hours")),
            _boots(row)])
    print_table(f"{job_hours:g} h job, {_deadline_words(deadline_hours)}, restart {restart_hours:g} h, "
                f"zones: {', '.join(zones.names)}", SIM_COLS, table_rows)
    if any(row["finish_hours"] is None for row in rows.values()):
        output.console.print(f"unfinished: the trace ends at {zones.hours:g} h ({hours_left:g} h after the job "
                             "arrived) before the job finished; + marks the cost spent until then, with no ratio to "
                             "the bound.", style="yellow", highlight=False)
    if "omniscient" in rows:
        output.console.print("omniscient is a lower bound (it knows the future trace), not a schedule.", style="dim")


def _simulate_one(zones: Any, names: list[str], prices: Any, start_hour: float, job_hours: float,
                  deadline_hours: float | None, restart_hours: float, checkpoint_hours: float, plot: str | None,
                  as_json: bool, make_before_break: bool) -> None:
    """One job arriving at ``start_hour``: each policy's row, and its timeline plotted with ``plot``."""
    from pathlib import Path

    from scheduler.sim.simulate import Jobs, SimOptions, compare, start_tick_for

    tick = start_tick_for(zones, start_hour)
    _warn_trace_too_short(zones, start_hour, start_hour, job_hours, deadline_hours)  # stderr: --json stays clean
    jobs = Jobs.make([tick], job_hours, float("inf") if deadline_hours is None else deadline_hours, restart_hours)
    results = compare(zones, jobs, prices, names, SimOptions(checkpoint_cost_h=checkpoint_hours, timeline=bool(plot),
                                                             make_before_break=make_before_break))
    rows = {name: out.row(0) for name, out in results.items()}
    for row in rows.values():
        row.pop("policy")
        row["outcome"] = _outcome(row, deadline_hours, zones.hours - start_hour)
    if plot:
        from scheduler.sim.plots import timeline_png

        Path(plot).write_bytes(timeline_png(zones, int(jobs.start_tick[0]), results, job_hours, deadline_hours))
    if as_json:
        print_json({
            "job": {"hours": job_hours, "deadline_hours": deadline_hours, "restart_hours": restart_hours,
                    "start_hour": start_hour, "checkpoint_hours": checkpoint_hours,
                    "make_before_break": make_before_break},
            "prices": {"on_demand": prices.on_demand, "spot": prices.spot},
            "trace_hours": zones.hours,
            "zones": list(zones.names),
            "policies": rows,
            "plot": plot,
        })
        return
    _print_simulation(rows, zones, start_hour, job_hours, deadline_hours, restart_hours)
    if plot:
        output.console.print(f"timeline plot written to {plot}", highlight=False)


def _simulate_stream(zones: Any, names: list[str], prices: Any, n_jobs: int, every_hours: float, start_hour: float,
                     job_hours: float, deadline_hours: float | None, restart_hours: float, checkpoint_hours: float,
                     plot: str | None, as_json: bool, make_before_break: bool) -> None:
    from scheduler.sim.simulate import Jobs, SimOptions, compare, start_tick_for, summarize

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
    summary = summarize(compare(zones, jobs, prices, names, SimOptions(checkpoint_cost_h=checkpoint_hours,
                                                                       make_before_break=make_before_break)))
    if as_json:
        print_json({"job": {"hours": job_hours, "deadline_hours": deadline_hours, "restart_hours": restart_hours,
                            "checkpoint_hours": checkpoint_hours, "make_before_break": make_before_break},
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
        output.console.print(f"unfinished: still running when the trace ends at {zones.hours:g} h; their costs count "
                             "what they spent until then, and they have no ratio to the bound.", style="yellow",
                             highlight=False)
