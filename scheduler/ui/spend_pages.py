"""Spend (per team over time, budget burn-down, top jobs) and Accuracy (predicted vs measured)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response
from markupsafe import Markup

from errors import InvalidInput
from scheduler.inputs import Name, Word, printable
from scheduler.loop import accuracy
from scheduler.service import ADMIN
from scheduler.store import ledger
from scheduler.ui import svg, views
from scheduler.ui.web import CtxDep, acting, render

router = APIRouter()


@router.get("/spend")
def spend_page(ctx: CtxDep, since: Annotated[Word, Query()] = "30d", period: Annotated[Word, Query()] = "day",
               team: Annotated[Name, Query()] = "") -> Response:
    """The totals and top jobs are the service's spend report (what `gpuplan report spend` prints);
    the charts are per-day sums of the same ledger."""
    if period not in ("day", "week"):
        raise InvalidInput(f"period must be day or week, not {printable(period, 20)!r}", path="period")
    service = ctx.service
    now = service.clock()
    start = ledger.since_start(since, now)
    teams: list[str] = []
    if ctx.is_admin:
        teams = ctx.reads.team_names(ctx.principal)
        report = service.spend_report(ADMIN, since=start, team=team or None, top=views.TOP_JOBS)
    else:
        report = service.spend_report(ctx.principal, since=start, top=views.TOP_JOBS)
    who = ctx.principal  # the admin without a team: every team's spend
    if report.team is not None and ctx.is_admin:
        who = service.team_principal(report.team)
    # The chart: the window's whole UTC days (the totals above are to the minute); the
    # burn-down: every day since the team's first spend, as per-day totals.
    daily = ctx.reads.spend_by_day(who, start, now)
    series = views.spend_series(daily, period, start.date(), now.date(),
                                f"{'team ' + report.team if report.team else 'every team'}: USD per {period} "
                                "by GPU type and market")
    burn = None
    if report.team is not None and report.budget_usd is not None and report.remaining_usd is not None:
        burn = views.burn_down(ctx.reads.spend_per_day(who, now), report.budget_usd,
                               report.remaining_usd, now.date(), report.team)
    return render(ctx, "spend.html", report=report, series=series, plot=Markup(series.plot),
                  burn=burn, burn_plot=Markup(burn.plot) if burn else "", top=views.top_jobs(report),
                  since=since, period=period, team=report.team or "", spend_teams=teams,
                  markets=sorted(report.by_market.items()))


@router.get("/accuracy")
def accuracy_page(ctx: CtxDep, team: Annotated[Name, Query()] = "") -> Response:
    who, teams = acting(ctx, team)
    rows = accuracy.accuracy_rows(ctx.reads.accuracy_records(who)) if who else []
    gib = 1 / (1 << 30)
    mem = [(r["predicted_peak_allocated_bytes"] * gib, r["measured_peak_allocated_bytes"] * gib, r["job"])
           for r in rows if r["error_peak_allocated_bytes"] is not None]
    tps = [(r["predicted_tokens_per_s"], r["measured_tokens_per_s"], r["job"]) for r in rows
           if r["error_tokens_per_s"] is not None]
    return render(ctx, "accuracy.html", rows=rows, summary=accuracy.summarize(rows),
                  team=who.team_name if who else "", teams=teams,
                  mem_plot=Markup(svg.predicted_measured_svg(mem, "peak allocated memory per GPU", "GiB")),
                  tps_plot=Markup(svg.predicted_measured_svg(tps, "throughput", "tokens/s")))
