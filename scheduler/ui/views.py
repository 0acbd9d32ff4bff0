"""What the pages show, computed from service results: pure functions, no I/O (the routes fetch).

Kept apart from the routes so they stay thin and these can be tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

import yaml

from errors import InvalidInput
from planner.types import Candidate, Plan
from scheduler.store.models import SpendReport
from scheduler.ui import svg

MAX_SPEC_CHARS = 64_000
RATE_DAYS = 7  # the "current rate" of the burn-down: the mean daily spend of the last week
TOP_JOBS = 10  # the Spend page's "top jobs by cost"


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / (1 << 30):.1f}"


def money(x: float | None) -> str:
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


# ------------------------------------------------------------------ specs


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases: a few aliases can expand to billions of nodes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise InvalidInput(f"the spec uses a YAML alias (*name) at line {mark.line + 1}; write the value out",
                               path="spec")
        return super().compose_node(parent, index)


def parse_spec_text(text: str) -> dict[str, Any]:
    """A pasted or uploaded spec (YAML, or JSON which is YAML) as a mapping; InvalidInput says what is wrong."""
    if not text.strip():
        raise InvalidInput("the spec is empty", path="spec", hint="paste a job spec (see examples/*.yaml)")
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidInput(f"the spec is {len(text):,} characters long; at most {MAX_SPEC_CHARS:,} are allowed",
                           path="spec")
    if "\x00" in text:
        raise InvalidInput(f"the spec contains a NUL byte at character {text.index(chr(0)) + 1}; remove it",
                           path="spec")
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise InvalidInput(f"the spec is not valid YAML or JSON: {problem}{where}", path="spec",
                           hint="see examples/*.yaml for well-formed specs") from None
    except RecursionError:
        raise InvalidInput("the spec nests too deeply", path="spec") from None
    if not isinstance(data, dict):
        raise InvalidInput("a job spec must be a mapping with at least 'task' and 'model'", path="spec",
                           hint="see examples/*.yaml")
    return data


# ------------------------------------------------------------------ plans


@dataclass(frozen=True)
class PlanRow:
    rank: str
    strategy: str
    where: str
    market: str
    memory: str
    tokens_per_s: str
    hours: str
    preempt_h: str
    p_deadline: str
    usd_per_h: str
    usd: str
    chosen: bool


def plan_rows(candidates: Sequence[Candidate], chosen: Candidate | None) -> list[PlanRow]:
    """The rows of `gpuplan plan`'s table (* marks the cost/time Pareto front)."""
    rows = []
    for i, c in enumerate(candidates, 1):
        e = c.estimate
        rows.append(PlanRow(
            rank=f"{i}*" if c.pareto else str(i), strategy=e.strategy.label(),
            where=f"{c.offer.cloud} {c.offer.instance_type} {c.offer.region}" + (f" x{c.nodes}" if c.nodes > 1 else ""),
            market=c.cost.market, memory=f"{gib(e.memory.required_bytes)}/{gib(e.memory.limit_bytes)}",
            tokens_per_s=f"{e.throughput.tokens_per_s:,.0f}", hours=f"{c.cost.hours:,.1f}",
            preempt_h=f"{c.cost.preemption_overhead_h:,.2f}" if c.cost.market == "spot" else "-",
            p_deadline="-" if c.cost.deadline_probability is None else f"{c.cost.deadline_probability:.0%}",
            usd_per_h=f"{c.cost.usd_per_h:,.2f}", usd=f"{c.cost.usd:,.0f}", chosen=c == chosen))
    return rows


def chosen_line(c: Candidate | None) -> str:
    if c is None:
        return "no option fits every constraint"
    e = c.estimate
    extra = ""
    if c.cost.market == "spot" and c.cost.checkpoint_interval_h:
        extra = f", checkpoint every {c.cost.checkpoint_interval_h * 60:.0f} min"
    if c.cost.deadline_probability is not None:
        extra += f", {c.cost.deadline_probability:.0%} chance to meet the deadline"
    return (f"{e.strategy.label()} on {c.offer.cloud} {c.offer.instance_type} ({c.offer.region}, {c.cost.market}): "
            f"{c.cost.hours:,.1f} h, ${c.cost.usd:,.0f}, needs {gib(e.memory.required_bytes)} of "
            f"{gib(e.memory.limit_bytes)} GiB{extra}")


def pareto_plot(plan: Plan) -> str:
    points = [(c.cost.hours, c.cost.usd, c.cost.market, c.pareto,
               f"{c.offer.instance_type} {c.estimate.strategy.label()}") for c in plan.candidates]
    chosen = (plan.chosen.cost.hours, plan.chosen.cost.usd) if plan.chosen else None
    return svg.pareto_svg(points, f"{plan.job}: cost vs time ({len(plan.candidates)} options)", chosen)


# ------------------------------------------------------------------ spend


@dataclass
class SpendSeries:
    periods: list[str]
    series: dict[str, list[float]]  # "GPU market" -> USD per period
    totals: list[float]
    plot: str


def period_of(day: date, period: str) -> str:
    if period == "week":
        year, week, _ = day.isocalendar()
        return f"{year}-W{week:02d}"
    return day.isoformat()


def spend_series(rows: Iterable[tuple[date, str, str, float]], period: str, start: date, end: date,
                 title: str) -> SpendSeries:
    """USD per day or ISO week from ``start`` to ``end`` (every period shown, empty ones too), one
    series per GPU type and market."""
    periods: list[str] = []
    day = start
    while day <= end:
        p = period_of(day, period)
        if not periods or periods[-1] != p:
            periods.append(p)
        day += timedelta(days=1)
    index = {p: i for i, p in enumerate(periods)}
    series: dict[str, list[float]] = {}
    for d, gpu, market, usd in rows:
        i = index.get(period_of(d, period))
        if i is None:
            continue
        series.setdefault(f"{gpu} {market}", [0.0] * len(periods))[i] += usd
    series = dict(sorted(series.items()))
    totals = [sum(v[i] for v in series.values()) for i in range(len(periods))]
    return SpendSeries(periods, series, totals, svg.stacked_bars_svg(periods, series, title))


@dataclass
class BurnDown:
    budget: float
    spent: float
    reserved: float
    remaining: float
    rate_per_day: float
    runs_out: date | None
    plot: str
    words: str


def burn_down(daily: Iterable[tuple[date, float]], budget: float, remaining: float, today: date,
              team: str) -> BurnDown:
    """Budget left day by day (budget less spend to date) and where the last week's rate takes the
    remaining budget (the service's: less what active jobs still reserve)."""
    per_day: dict[date, float] = {}
    for d, usd in daily:
        per_day[d] = per_day.get(d, 0.0) + usd
    days = sorted(per_day)
    left, cum = [], 0.0
    for d in days:
        cum += per_day[d]
        left.append(budget - cum)
    week = [per_day.get(today - timedelta(days=k), 0.0) for k in range(RATE_DAYS)]
    rate = sum(week) / RATE_DAYS
    runs_out = None
    projection: list[tuple[date, float]] = []
    if remaining <= 0:
        words = f"The budget is used up: {money(remaining)} left after what active jobs reserve"
        runs_out = today
    elif rate > 0:
        days_left = remaining / rate
        runs_out = today + timedelta(days=min(days_left, 3650))
        # The plot shows as far ahead as it shows back (at least 30 days), so a run-out years away
        # does not squash the history into a sliver; the sentence gives the date.
        history = (today - days[0]).days if days else 0
        horizon = min(days_left, max(30.0, float(history)))
        projection = [(today, remaining), (today + timedelta(days=horizon), remaining - rate * horizon)]
        words = (f"At the last {RATE_DAYS} days' rate ({money(rate)}/day) the remaining {money(remaining)} runs out "
                 f"on {runs_out:%Y-%m-%d} (in {days_left:,.1f} days)")
    else:
        words = f"Nothing was spent in the last {RATE_DAYS} days: no run-out date at the current rate"
    spent = cum
    reserved = max(budget - spent - remaining, 0.0)
    plot = svg.burndown_svg(days, left, projection, budget, f"team {team}: budget {money(budget)}",
                            reserved=(today, budget - spent, remaining))
    return BurnDown(budget, spent, reserved, remaining, rate, runs_out, plot, words)


@dataclass
class TopJob:
    job_id: str
    name: str
    usd: float
    hours: float
    markets: list[str] = field(default_factory=list)


def top_jobs(report: SpendReport, n: int = TOP_JOBS) -> list[TopJob]:
    """The report's jobs by cost (its lines are per job and market; the Spend page asks the service
    for the lines of the ``TOP_JOBS`` costliest only)."""
    jobs: dict[str, TopJob] = {}
    for line in report.jobs:
        job = jobs.setdefault(line.job_id, TopJob(line.job_id, line.job_name, 0.0, 0.0))
        job.usd += line.usd
        job.hours += line.hours
        job.markets.append(line.market)
    return sorted(jobs.values(), key=lambda j: -j.usd)[:n]


def since_day(since: datetime) -> date:
    return since.date()
