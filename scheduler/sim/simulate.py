"""Replay spot availability traces and job arrivals through the policy code, on a simulated clock.

Model (one tick = the trace's ``gap_seconds``; decisions happen at tick boundaries):

- A job has ``work_h`` hours of work, a deadline ``deadline_h`` hours after it arrives (inf: none)
  and a restart delay ``restart_h`` paid (in time and money) on every start, restart after a
  preemption, and changeover between markets or zones.
- A job on spot in zone z is preempted at the first tick where z has no capacity. Work since its
  last checkpoint is lost. With a checkpoint cost C > 0 the job checkpoints every Young/Daly interval
  (from the zone's observed mean time to preemption), which slows spot work by interval/(interval+C);
  with C = 0 checkpoints are free and continuous (the just-in-time checkpoint on AWS's 2-minute
  notice), so only the restart delay is lost. A voluntary changeover keeps all work, once the
  checkpoint it waits for is durable (``SimOptions.checkpoint_write_h``, billed on the old instance).
- Cost is paid for every hour an instance is held (restart delay included): spot at the trace's
  price for that tick (or the given spot price), on-demand at the on-demand price. Waiting is free.

Modules: :mod:`scheduler.sim.model` (inputs, outputs, costs), :mod:`scheduler.sim.replay`
(:func:`run_policy`), :mod:`scheduler.spot.bound` (:func:`omniscient`); this one compares and summarises.

Every policy of :mod:`scheduler.spot.policy` runs through :func:`run_policy` (the same
``decide_arrays`` the server's loop calls through ``decide``), vectorised over jobs. The
:func:`omniscient` bound is a dynamic program over (tick, market, progress) that knows the whole
future trace; it rounds the restart delay and the work down and the deadline up to its grid, so it
is a true lower bound on the cost of every policy (which also pays checkpoint overhead and lost work).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from errors import InvalidInput
from scheduler.sim.model import Jobs, PolicyOutcome, Prices, SimOptions
from scheduler.sim.replay import online_mean_run, run_lengths, run_policy, young_daly_array
from scheduler.sim.traces import Zones
from scheduler.spot.bound import default_resolution, omniscient
from scheduler.spot.market_codes import ON_DEMAND, SPOT, WAIT
from scheduler.spot.policy import POLICIES

ALL_POLICIES: tuple[str, ...] = ("uniform-progress", "on-demand", "spot-only", "greedy", "omniscient", "gpuplan")


def compare(
    zones: Zones,
    jobs: Jobs,
    prices: Prices,
    policies: Sequence[str] = ALL_POLICIES,
    opts: SimOptions | None = None,
    resolution: int | None = None,
) -> dict[str, PolicyOutcome]:
    """Every policy (and the omniscient bound) on the same jobs and traces."""
    out: dict[str, PolicyOutcome] = {}
    for name in policies:
        if name == "omniscient":
            out[name] = omniscient(zones, jobs, prices, resolution=resolution or default_resolution(zones, jobs),
                                   make_before_break=opts is not None and opts.make_before_break)
        elif name in POLICIES:
            out[name] = run_policy(zones, jobs, name, prices, opts)
        else:
            from errors import UnknownName

            raise UnknownName("policy", name, ALL_POLICIES)
    return out


def summarize(outcomes: dict[str, PolicyOutcome]) -> dict[str, dict[str, object]]:
    """Per policy over a stream of jobs: totals, medians, deadlines met and cost / bound."""
    bound = outcomes["omniscient"].cost_usd if "omniscient" in outcomes else None
    out: dict[str, dict[str, object]] = {}
    for name, o in outcomes.items():
        done = np.isfinite(o.finish_h)
        finished = o.finish_h[done]
        row: dict[str, object] = {
            "jobs": len(o.cost_usd),
            "deadlines_met": int(o.deadline_met.sum()),
            "unfinished": int((~done).sum()),  # still running when the trace ended
            "cost_usd": round(float(np.nansum(o.cost_usd)), 2),
            "median_cost_usd": round(float(np.nanmedian(o.cost_usd)), 4),
            "median_finish_hours": round(float(np.median(finished)), 4) if finished.size else None,
            "preemptions": int(o.preemptions.sum()),
            "work_lost_hours": round(float(o.work_lost_h.sum()), 4),
        }
        if bound is not None:
            # An unfinished job's cost is what it spent until the trace ended: no ratio to a finished bound.
            ok = np.isfinite(bound) & (bound > 0) & done
            row["median_x_bound"] = round(float(np.median(o.cost_usd[ok] / bound[ok])), 4) if ok.any() else None
        out[name] = row
    return out


def start_tick_for(zones: Zones, start_hour: float) -> int:
    """The tick a job arriving at ``start_hour`` (hours from the trace's start) begins at."""
    if not (start_hour >= 0 and math.isfinite(start_hour)):
        raise InvalidInput(f"start hour must be >= 0, got {start_hour}")
    tick = math.floor(start_hour / zones.gap_h + 1e-9)
    if tick >= zones.ticks:
        raise InvalidInput(
            f"start hour {start_hour} is past the end of the trace ({zones.hours:.1f} h)",
            hint=f"give --start-hour below {zones.hours:.1f}",
        )
    return tick


__all__ = [
    "ALL_POLICIES",
    "ON_DEMAND",
    "SPOT",
    "WAIT",
    "Jobs",
    "PolicyOutcome",
    "Prices",
    "SimOptions",
    "compare",
    "default_resolution",
    "omniscient",
    "online_mean_run",
    "run_lengths",
    "run_policy",
    "start_tick_for",
    "summarize",
    "young_daly_array",
]
