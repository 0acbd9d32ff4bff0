"""Plots for the simulator and the reports (matplotlib, Agg backend: no display needed).

Each function returns PNG bytes, so callers can write a file or embed it (base64) in HTML.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.sim.simulate import PolicyOutcome
from scheduler.sim.traces import Zones
from scheduler.spot.market_codes import ON_DEMAND, SPOT

MARKET_COLORS = {SPOT: "#2ca02c", ON_DEMAND: "#d62728"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def timeline_png(zones: Zones, start_tick: int, outcomes: Mapping[str, PolicyOutcome], work_h: float,
                 deadline_h: float | None) -> bytes:
    """Availability per zone, the market each policy held per tick, and progress against the deadline."""
    plt = _pyplot()
    policies = [name for name, o in outcomes.items() if o.timeline_market is not None]
    steps = max((outcomes[p].timeline_market.shape[0] for p in policies), default=1)  # type: ignore[union-attr]
    hours = np.arange(steps) * zones.gap_h
    n_rows = len(zones.names) + len(policies)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 2.2 + 0.32 * n_rows + 3.2), sharex=True,
                                      gridspec_kw={"height_ratios": [0.32 * n_rows + 0.6, 3.2]})
    labels: list[str] = []
    row = 0
    end = min(start_tick + steps, zones.ticks)
    for name, avail in zip(zones.names, zones.available, strict=True):
        seg = np.zeros(steps, dtype=bool)
        seg[: end - start_tick] = avail[start_tick:end]
        top.fill_between(hours, row, row + 0.8 * seg, step="post", color="#1f77b4", linewidth=0)
        labels.append(f"spot available: {name}")
        row += 1
    for name in policies:
        market = outcomes[name].timeline_market
        assert market is not None
        col = market[:, 0]
        for code, color in MARKET_COLORS.items():
            seg = np.zeros(steps, dtype=bool)
            seg[: col.shape[0]] = col == code
            top.fill_between(hours, row, row + 0.8 * seg, step="post", color=color, linewidth=0)
        labels.append(name)
        row += 1
    top.set_yticks(np.arange(row) + 0.4)
    top.set_yticklabels(labels, fontsize=8)
    top.set_ylim(-0.2, row)
    top.set_title("availability and market held (green: spot, red: on-demand, blank: waiting)", fontsize=9)
    for name in policies:
        done = outcomes[name].timeline_done
        assert done is not None
        bottom.plot(hours[: done.shape[0]], done[:, 0], label=name, linewidth=1.3)
    if deadline_h is not None:
        bottom.plot([0, deadline_h], [0, work_h], "k:", linewidth=1, label="uniform progress")
        bottom.axvline(deadline_h, color="k", linestyle="--", linewidth=1, label="deadline")
    bottom.axhline(work_h, color="grey", linewidth=0.6)
    finishes = [float(o.finish_h[0]) for o in outcomes.values() if np.isfinite(o.finish_h[0])]
    right = max([*finishes, deadline_h or 0.0, work_h]) * 1.04
    bottom.set_xlim(-0.01 * right, right)
    bottom.set_xlabel("hours since the job arrived")
    bottom.set_ylabel("work done (h)")
    bottom.legend(fontsize=8, loc="upper left")
    return _png(fig)


def pareto_png(points: Sequence[tuple[float, float, str, bool, str]], title: str) -> bytes:
    """Cost vs time: (hours, usd, market, on_front, label) per option; the front is drawn as a line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for market, color in (("spot", "#2ca02c"), ("on-demand", "#d62728"), ("local", "#7f7f7f")):
        xs = [p[0] for p in points if p[2] == market]
        ys = [p[1] for p in points if p[2] == market]
        if xs:
            ax.scatter(xs, ys, s=18, alpha=0.6, color=color, label=market)
    front = sorted((p for p in points if p[3]), key=lambda p: p[0])
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], "k-", linewidth=1, label="Pareto front")
        for p in front[:6]:
            ax.annotate(p[4], (p[0], p[1]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("expected hours (spot: preemption overhead included)")
    ax.set_ylabel("expected cost (USD)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    return _png(fig)


def market_bars_png(rows: Sequence[tuple[str, float, float, float]], title: str) -> bytes:
    """Spot vs on-demand per option: (label, on-demand usd, spot expected usd, spot overhead usd)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * max(len(rows), 2) + 1.2))
    y = np.arange(len(rows))
    od = [r[1] for r in rows]
    spot = [r[2] - r[3] for r in rows]
    over = [r[3] for r in rows]
    ax.barh(y + 0.2, od, height=0.38, color="#d62728", label="on-demand")
    ax.barh(y - 0.2, spot, height=0.38, color="#2ca02c", label="spot (work)")
    ax.barh(y - 0.2, over, left=spot, height=0.38, color="#98df8a", label="spot preemption overhead")
    ax.set_yticks(y)
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("expected cost (USD)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.7 / max(len(rows), 2) - 0.12), ncol=3)
    return _png(fig)
