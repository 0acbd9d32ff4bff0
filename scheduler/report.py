"""Dry-run reports: what the planner would do for one or more jobs, as Markdown and a self-contained HTML page.

``build_dry_run(plans)`` is pure (plans in, text and PNG bytes out); ``write_dry_run`` writes
``report.md``, ``report.html`` (plots embedded as base64 PNG, no external files or scripts) and the
plots as PNG files next to the Markdown. Spot rows show the expected cost with preemption overhead
and the probability of meeting the deadline, from the planner's ``CostEstimate``.
"""

from __future__ import annotations

import base64
import html
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path

from errors import InvalidInput
from planner.types import Candidate, Plan
from scheduler.sim.plots import market_bars_png, pareto_png

TOP = 12


@dataclass(frozen=True)
class SpotPair:
    option: str
    on_demand_usd: float
    spot_usd: float
    spot_overhead_h: float
    spot_overhead_usd: float
    deadline_probability: float | None
    saving: float  # share of the on-demand cost saved by spot (expected)

    def to_dict(self) -> dict[str, object]:
        return {
            "option": self.option,
            "on_demand_usd": round(self.on_demand_usd, 2),
            "spot_expected_usd": round(self.spot_usd, 2),
            "spot_preemption_overhead_h": round(self.spot_overhead_h, 3),
            "spot_preemption_overhead_usd": round(self.spot_overhead_usd, 2),
            "deadline_probability": self.deadline_probability,
            "saving": round(self.saving, 4),
        }


@dataclass
class JobSection:
    plan: Plan
    rows: list[Candidate]
    pairs: list[SpotPair]
    pareto_png: bytes
    bars_png: bytes | None


@dataclass
class DryRun:
    markdown: str
    html: str
    images: dict[str, bytes] = field(default_factory=dict)  # file name -> PNG (referenced by the Markdown)
    summary: list[dict[str, object]] = field(default_factory=list)


def _option(c: Candidate) -> str:
    nodes = f" x{c.nodes} nodes" if c.nodes > 1 else ""
    return f"{c.estimate.strategy.label()} on {c.offer.instance_type}{nodes} ({c.offer.region})"


def spot_pairs(plan: Plan) -> list[SpotPair]:
    """The same option on spot and on demand, side by side (cheapest spot first)."""
    by_key: dict[tuple[str, str, str], dict[str, Candidate]] = {}
    for c in plan.candidates:
        key = (c.estimate.strategy.label(), f"{c.offer.cloud}/{c.offer.instance_type}/{c.nodes}", c.offer.region)
        by_key.setdefault(key, {}).setdefault(c.cost.market, c)
    pairs = []
    for both in by_key.values():
        spot, od = both.get("spot"), both.get("on-demand")
        if spot is None or od is None:
            continue
        pairs.append(SpotPair(
            option=_option(spot),
            on_demand_usd=od.cost.usd,
            spot_usd=spot.cost.usd,
            spot_overhead_h=spot.cost.preemption_overhead_h,
            spot_overhead_usd=spot.cost.preemption_overhead_h * spot.cost.usd_per_h,
            deadline_probability=spot.cost.deadline_probability,
            saving=1.0 - spot.cost.usd / od.cost.usd if od.cost.usd > 0 else 0.0,
        ))
    return sorted(pairs, key=lambda p: p.spot_usd)


def _prob(p: float | None) -> str:
    return "-" if p is None else f"{p:.0%}"


def _rows(plan: Plan, top: int) -> list[Candidate]:
    shown = list(plan.candidates[:top])
    shown += [c for c in plan.candidates[top:] if c.pareto]
    return shown


def _section(plan: Plan, top: int) -> JobSection:
    if not plan.candidates:
        raise InvalidInput(f"plan {plan.job!r} has no candidates to report")
    points = [(c.cost.hours, c.cost.usd, c.cost.market, c.pareto, f"{c.offer.instance_type} {c.cost.market}")
              for c in plan.candidates]
    pairs = spot_pairs(plan)
    bars = None
    if pairs:
        bars = market_bars_png([(p.option[:60], p.on_demand_usd, p.spot_usd, p.spot_overhead_usd) for p in pairs[:8]],
                               f"{plan.job}: spot vs on-demand (expected cost)")
    return JobSection(plan, _rows(plan, top), pairs,
                      pareto_png(points, f"{plan.job}: cost vs time ({len(plan.candidates)} options)"), bars)


def _table_cells(c: Candidate) -> list[str]:
    cost = c.cost
    return [
        c.estimate.strategy.label(), f"{c.offer.cloud} {c.offer.instance_type}", c.offer.region, cost.market,
        str(c.nodes), f"{cost.hours:,.2f}", f"{cost.usd_per_h:,.2f}", f"{cost.usd:,.2f}",
        f"{cost.preemption_overhead_h:,.2f}" if cost.market == "spot" else "-",
        f"{cost.checkpoint_interval_h * 60:,.0f}" if cost.checkpoint_interval_h else "-",
        _prob(cost.deadline_probability), "yes" if c.pareto else "",
    ]


HEADERS = ["strategy", "instance", "region", "market", "nodes", "hours", "$/h", "expected $",
           "preemption overhead h", "checkpoint every (min)", "P(deadline)", "Pareto"]


def _chosen_line(plan: Plan) -> str:
    c = plan.chosen
    if c is None:
        return "no option was chosen"
    line = (f"{_option(c)}, {c.cost.market}: {c.cost.hours:,.2f} h, expected ${c.cost.usd:,.2f}")
    if c.cost.market == "spot":
        line += (f" (incl. {c.cost.preemption_overhead_h:,.2f} h preemption overhead; "
                 f"P(deadline) {_prob(c.cost.deadline_probability)})")
    return line


def build_dry_run(plans: Sequence[Plan], *, top: int = TOP, title: str = "gpuplan dry-run report",
                  now: datetime | None = None) -> DryRun:
    if not plans:
        raise InvalidInput("give at least one job spec to report on")
    generated = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    md: list[str] = [f"# {title}", "", f"Generated {generated}. Nothing was run: these are the planner's estimates. "
                     "Spot costs are expected values including preemption overhead; P(deadline) is the probability "
                     "of finishing in time.", ""]
    body: list[str] = []
    out = DryRun(markdown="", html="")
    for i, plan in enumerate(plans, 1):
        sec = _section(plan, top)
        slug = f"{i:02d}-{plan.job}"
        out.images[f"{slug}-pareto.png"] = sec.pareto_png
        if sec.bars_png is not None:
            out.images[f"{slug}-spot.png"] = sec.bars_png
        md += [f"## {plan.job}", "", f"**Chosen:** {_chosen_line(plan)}", ""]
        for w in plan.warnings:
            md.append(f"> warning: {w}")
        md += ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        md += ["| " + " | ".join(_table_cells(c)) + " |" for c in sec.rows]
        md += ["", f"![cost vs time]({slug}-pareto.png)", ""]
        if sec.pairs:
            md += ["### Spot vs on-demand", "", "| option | on-demand $ | spot expected $ | overhead h | P(deadline) "
                   "| saving |", "|---|---|---|---|---|---|"]
            md += [f"| {p.option} | {p.on_demand_usd:,.2f} | {p.spot_usd:,.2f} | {p.spot_overhead_h:,.2f} | "
                   f"{_prob(p.deadline_probability)} | {p.saving:.0%} |" for p in sec.pairs[:10]]
            md += ["", f"![spot vs on-demand]({slug}-spot.png)", ""]
        md += [f"{len(plan.rejections)} options were rejected (see `gpuplan plan --json`).", ""]
        body.append(_html_section(sec))
        out.summary.append({
            "job": plan.job,
            "objective": plan.objective,
            "chosen": None if plan.chosen is None else {
                "option": _option(plan.chosen),
                "market": plan.chosen.cost.market,
                "hours": round(plan.chosen.cost.hours, 3),
                "expected_usd": round(plan.chosen.cost.usd, 2),
                "preemption_overhead_h": round(plan.chosen.cost.preemption_overhead_h, 3),
                "deadline_probability": plan.chosen.cost.deadline_probability,
            },
            "candidates": len(plan.candidates),
            "pareto": sum(1 for c in plan.candidates if c.pareto),
            "rejections": len(plan.rejections),
            "spot_vs_on_demand": [p.to_dict() for p in sec.pairs[:10]],
        })
    out.markdown = "\n".join(md) + "\n"
    template = string.Template(resources.files("scheduler").joinpath("templates/dry_run.html").read_text())
    out.html = template.substitute(title=html.escape(title), generated=generated, body="\n".join(body))
    return out


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _html_section(sec: JobSection) -> str:
    e = html.escape
    plan = sec.plan
    parts = [f"<section><h2>{e(plan.job)}</h2>", f'<p class="summary"><b>Chosen:</b> {e(_chosen_line(plan))}</p>']
    parts += [f'<p class="note">warning: {e(w)}</p>' for w in plan.warnings]
    head = "".join(f'<th class="{"l" if i < 4 else ""}">{e(h)}</th>' for i, h in enumerate(HEADERS))
    rows = []
    for c in sec.rows:
        cells = _table_cells(c)
        tds = "".join(
            f'<td class="{"l" if i < 4 else ""}{" " + e(c.cost.market) if i == 3 else ""}">{e(v)}</td>'
            for i, v in enumerate(cells)
        )
        rows.append(f'<tr{" class=chosen" if c == plan.chosen else ""}>{tds}</tr>')
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")
    parts.append(_img(sec.pareto_png, f"{plan.job}: cost vs time"))
    if sec.pairs:
        parts.append("<h3>Spot vs on-demand</h3><table><thead><tr><th class=l>option</th><th>on-demand $</th>"
                     "<th>spot expected $</th><th>overhead h</th><th>P(deadline)</th><th>saving</th></tr></thead>"
                     "<tbody>")
        parts += [f"<tr><td class=l>{e(p.option)}</td><td>{p.on_demand_usd:,.2f}</td><td>{p.spot_usd:,.2f}</td>"
                  f"<td>{p.spot_overhead_h:,.2f}</td><td>{_prob(p.deadline_probability)}</td>"
                  f"<td>{p.saving:.0%}</td></tr>" for p in sec.pairs[:10]]
        parts.append("</tbody></table>")
        if sec.bars_png is not None:
            parts.append(_img(sec.bars_png, f"{plan.job}: spot vs on-demand"))
    parts.append(f'<p class="note">{len(plan.rejections)} options were rejected (see <code>gpuplan plan --json</code>).'
                 "</p></section>")
    return "\n".join(parts)


def write_dry_run(report: DryRun, out_dir: str | Path) -> dict[str, str]:
    """Write report.md, report.html and the PNGs; returns their paths."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InvalidInput(f"--out {str(out)!r} is a file", hint="give a directory for the report")
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(report.markdown)
        (out / "report.html").write_text(report.html)
        for name, png in report.images.items():
            (out / name).write_bytes(png)
    except OSError as exc:
        raise InvalidInput(f"cannot write the report to {str(out)!r}: {exc.strerror or exc}", path="out",
                           hint="give --out a directory you can write to") from None
    return {"markdown": str(out / "report.md"), "html": str(out / "report.html")}
