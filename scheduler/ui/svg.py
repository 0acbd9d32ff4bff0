"""Plots as SVG text made on the server: no JavaScript, no charting library, nothing to fetch.

Pure functions (numbers in, markup out). Every label is escaped; colours are presentation
attributes, not ``style=`` (the Content-Security-Policy allows no inline styles).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from html import escape

W, H = 640, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 44
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
CHOSEN = "#6a1b9a"
MARKET_COLORS = {"spot": "#2ca02c", "on-demand": "#d62728", "local": "#7f7f7f"}


@dataclass(frozen=True)
class Axis:
    lo: float
    hi: float
    log: bool = False

    def frac(self, v: float) -> float:
        if self.log:
            lo, hi, v = math.log10(self.lo), math.log10(self.hi), math.log10(max(v, self.lo))
        else:
            lo, hi = self.lo, self.hi
        return 0.5 if hi == lo else (v - lo) / (hi - lo)

    def ticks(self) -> list[float]:
        if self.log:  # decades; 1-2-5 (then every digit) where that gives fewer than five ticks
            first, last = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            for mantissas in ((1,), (1, 2, 5), tuple(range(1, 10))):
                ticks = [m * 10.0 ** k for k in range(first, last + 1) for m in mantissas
                         if self.lo <= m * 10.0 ** k <= self.hi * 1.0001]
                if len(ticks) >= 5:
                    break
            return ticks
        span = self.hi - self.lo
        if span <= 0:
            return [self.lo]
        raw = span / 5
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        start = math.ceil(self.lo / step) * step
        return [start + i * step for i in range(int((self.hi - start) / step) + 1)]


def axis(values: Sequence[float], *, log: bool = False, zero: bool = False) -> Axis:
    vals = [v for v in values if math.isfinite(v) and (v > 0 or not log)]
    if not vals:
        return Axis(1.0, 10.0, log) if log else Axis(0.0, 1.0)
    lo, hi = min(vals), max(vals)
    if log:
        lo, hi = lo / 1.3, hi * 1.3
        return Axis(lo, hi if hi > lo else lo * 10, True)
    if zero:
        lo = min(lo, 0.0)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.1 or 1.0
    return Axis(lo if zero else lo - pad, hi + pad)


def fmt(v: float) -> str:
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e3:
        return f"{v / 1e3:g}k"
    if a >= 1 or a == 0:
        return f"{v:g}"
    return f"{v:.2g}"


class Canvas:
    """A plot: the frame's area is ``width`` x ``height``; a legend goes in a band below it, never
    over the data. Plotted marks carry class="data" and the frame class="frame" (the tests check
    every mark lies inside the frame and clear of the legend)."""

    def __init__(self, title: str, x: Axis, y: Axis, xlabel: str, ylabel: str, width: int = W, height: int = H):
        self.x, self.y, self.w, self.h = x, y, width, height
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.parts: list[str] = []
        self.below = 0  # the legend band's height

    def _head(self) -> str:
        w, h, mid = self.w, self.h + self.below, TOP + (self.h - TOP - BOTTOM) / 2
        return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" class="plot" role="img" '
                f'aria-label="{escape(self.title)}"><title>{escape(self.title)}</title>'
                f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff"/>'
                f'<text x="{w / 2}" y="15" text-anchor="middle" font-size="13">{escape(self.title)}</text>'
                f'<text x="{LEFT + (w - LEFT - RIGHT) / 2}" y="{self.h - 6}" text-anchor="middle" '
                f'font-size="11">{escape(self.xlabel)}</text>'
                f'<text x="12" y="{mid}" text-anchor="middle" font-size="11" '
                f'transform="rotate(-90 12 {mid})">{escape(self.ylabel)}</text>')

    def px(self, v: float) -> float:
        return round(LEFT + self.x.frac(v) * (self.w - LEFT - RIGHT), 1)

    def py(self, v: float) -> float:
        return round(self.h - BOTTOM - self.y.frac(v) * (self.h - TOP - BOTTOM), 1)

    def frame(self, xticks: Sequence[tuple[float, str]] | None = None, yticks: Sequence[float] | None = None) -> None:
        x0, x1, y0, y1 = LEFT, self.w - RIGHT, TOP, self.h - BOTTOM
        for t in self.y.ticks() if yticks is None else yticks:
            y = self.py(t)
            self.parts.append(f'<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/>'
                              f'<text class="tick y" x="{x0 - 4}" y="{y + 4}" text-anchor="end" font-size="10">'
                              f'{fmt(t)}</text>')
        for t, label in (xticks if xticks is not None else [(t, fmt(t)) for t in self.x.ticks()]):
            x = self.px(t)
            self.parts.append(f'<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#eee"/>'
                              f'<text class="tick x" x="{x}" y="{y1 + 14}" text-anchor="middle" font-size="10">'
                              f'{escape(label)}</text>')
        self.parts.append(f'<rect class="frame" x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" '
                          'stroke="#888"/>')

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        """Swatches in rows below the x-axis label, wrapped at the frame's width."""
        x, row = LEFT, 0
        for label, color in items:
            width = 24 + 6 * len(label)
            if x > LEFT and x + width > self.w - RIGHT:
                x, row = LEFT, row + 1
            y = self.h + 4 + 16 * row
            self.parts.append(f'<g class="legend"><rect x="{x}" y="{y}" width="10" height="10" fill="{color}"/>'
                              f'<text x="{x + 14}" y="{y + 9}" font-size="10">{escape(label)}</text></g>')
            x += width
        self.below = 16 * (row + 1) + 4 if items else 0

    def svg(self) -> str:
        return self._head() + "".join(self.parts) + "</svg>"


def pareto_svg(points: Sequence[tuple[float, float, str, bool, str]], title: str,
               chosen: tuple[float, float] | None = None) -> str:
    """Cost vs time, log-log: (hours, usd, market, on_front, label) per option; the front as a line,
    the ``chosen`` option's (hours, usd) ringed."""
    cv = Canvas(title, axis([p[0] for p in points], log=True), axis([p[1] for p in points], log=True),
                "expected hours (spot: preemption overhead included)", "expected cost (USD)")
    cv.frame()
    for h, u, market, _front, label in points:
        cv.parts.append(f'<circle class="data" cx="{cv.px(h)}" cy="{cv.py(u)}" r="3" '
                        f'fill="{MARKET_COLORS.get(market, "#1f77b4")}" '
                        f'fill-opacity="0.6"><title>{escape(label)}: {h:,.2f} h, ${u:,.2f}</title></circle>')
    front = sorted((p for p in points if p[3]), key=lambda p: p[0])
    if front:
        path = " ".join(f"{cv.px(p[0])},{cv.py(p[1])}" for p in front)
        cv.parts.append(f'<polyline class="data" points="{path}" fill="none" stroke="#000" stroke-width="1"/>')
    if chosen is not None:
        cv.parts.append(f'<circle class="data chosen" cx="{cv.px(chosen[0])}" cy="{cv.py(chosen[1])}" r="7" '
                        f'fill="none" stroke="{CHOSEN}" stroke-width="2.5"><title>chosen: {chosen[0]:,.2f} h, '
                        f'${chosen[1]:,.2f}</title></circle>')
    markets = sorted({p[2] for p in points})
    cv.legend([(m, MARKET_COLORS.get(m, "#1f77b4")) for m in markets] + ([("Pareto front", "#000")] if front else [])
              + ([("chosen", CHOSEN)] if chosen is not None else []))
    return cv.svg()


def stacked_bars_svg(periods: Sequence[str], series: Mapping[str, Sequence[float]], title: str,
                     ylabel: str = "USD") -> str:
    """One bar per period, stacked by series (a GPU type and market); ``series[name][i]`` is period i."""
    totals = [sum(values[i] for values in series.values()) for i in range(len(periods))]
    cv = Canvas(title, Axis(0, max(len(periods), 1)), axis([*totals, 0.0], zero=True), "", ylabel)
    step = max(1, math.ceil(len(periods) / 10))
    cv.frame([(i + 0.5, p) for i, p in enumerate(periods) if i % step == 0])
    width = (cv.w - LEFT - RIGHT) / max(len(periods), 1) * 0.8
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(series)}
    for i, period in enumerate(periods):
        base = 0.0
        for name, values in series.items():
            v = values[i]
            if v <= 0:
                continue
            y_top, y_bottom = cv.py(base + v), cv.py(base)
            cv.parts.append(f'<rect class="data" x="{round(cv.px(i + 0.5) - width / 2, 1)}" y="{y_top}" '
                            f'width="{round(width, 1)}" '
                            f'height="{round(y_bottom - y_top, 1)}" fill="{colors[name]}"><title>{escape(period)} '
                            f'{escape(name)}: ${v:,.2f}</title></rect>')
            base += v
    cv.legend(list(colors.items()))
    return cv.svg()


def burndown_svg(days: Sequence[date], remaining: Sequence[float], projection: Sequence[tuple[date, float]],
                 budget: float, title: str, reserved: tuple[date, float, float] | None = None) -> str:
    """Budget left at the end of each day (solid), what active jobs reserve today (a drop from
    ``reserved[1]`` to ``reserved[2]`` on day ``reserved[0]``) and, dashed, where the current rate takes it."""
    every = [*days, *(d for d, _ in projection), *([reserved[0]] if reserved else [])]
    if not every:
        every = [date.today()]
    origin = min(every)
    xs = [(d - origin).days for d in every]
    drop = list(reserved[1:]) if reserved else []  # the drop to what is left after reservations
    cv = Canvas(title, axis([*xs, 0.0], zero=True),
                axis([*remaining, *(v for _, v in projection), *drop, budget, 0.0], zero=True), "", "USD left")
    ticks = sorted(set(xs))
    step = max(1, math.ceil(len(ticks) / 8))
    cv.frame([(t, f"{date.fromordinal(origin.toordinal() + int(t)):%m-%d}") for t in ticks[::step]])
    cv.parts.append(f'<line x1="{LEFT}" y1="{cv.py(budget)}" x2="{cv.w - RIGHT}" y2="{cv.py(budget)}" '
                    f'stroke="#888" stroke-dasharray="2 3"/>')
    if days:
        pts = " ".join(f"{cv.px((d - origin).days)},{cv.py(v)}" for d, v in zip(days, remaining, strict=True))
        cv.parts.append(f'<polyline class="data" points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    if reserved is not None and reserved[1] > reserved[2]:
        x = cv.px((reserved[0] - origin).days)
        held = reserved[1] - reserved[2]
        cv.parts.append(f'<line class="data" x1="{x}" y1="{cv.py(reserved[1])}" x2="{x}" y2="{cv.py(reserved[2])}" '
                        f'stroke="#ff7f0e" stroke-width="3"><title>reserved by active jobs: ${held:,.2f}</title>'
                        '</line>')
    if projection:
        pts = " ".join(f"{cv.px((d - origin).days)},{cv.py(v)}" for d, v in projection)
        cv.parts.append(f'<polyline class="data" points="{pts}" fill="none" stroke="#d62728" stroke-width="1.5" '
                        f'stroke-dasharray="6 4"/>')
    cv.legend([("budget less spend", "#1f77b4"), ("reserved by active jobs", "#ff7f0e"),
               ("projected at the current rate", "#d62728")])
    return cv.svg()


def predicted_measured_svg(pairs: Sequence[tuple[float, float, str]], title: str, unit: str) -> str:
    """Predicted (x) vs measured (y), one dot per run, with the y = x line."""
    top = max([p for pr in pairs for p in pr[:2]] + [1e-9]) * 1.05 if pairs else 1.0
    cv = Canvas(title, Axis(0, top), Axis(0, top), f"predicted {unit}", f"measured {unit}", width=420, height=360)
    if pairs:
        cv.frame()
    else:  # no scale to show: no numbers on the axes
        cv.frame([], [])
    cv.parts.append(f'<line x1="{cv.px(0)}" y1="{cv.py(0)}" x2="{cv.px(top)}" y2="{cv.py(top)}" stroke="#888" '
                    f'stroke-dasharray="4 3"/>')
    for p, m, label in pairs:
        cv.parts.append(f'<circle class="data" cx="{cv.px(p)}" cy="{cv.py(m)}" r="3.5" fill="#1f77b4">'
                        f'<title>{escape(label)}: '
                        f'predicted {fmt(p)}, measured {fmt(m)} {escape(unit)}</title></circle>')
    if not pairs:
        cv.parts.append(f'<text x="{cv.w / 2}" y="{cv.h / 2}" text-anchor="middle" font-size="12">no runs with both '
                        f'numbers yet</text>')
    return cv.svg()
