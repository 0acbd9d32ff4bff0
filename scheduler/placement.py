"""Where the loop starts a job's next attempt: spot in which zone, on-demand, or not yet.

The edge between the scheduling loop (scheduler/loop.py) and the pure spot policy
(scheduler.policy): it turns a queued job and what has been watched of each zone's spot capacity
into a :class:`Placement`, through the same ``decide`` / ``choose_zone`` the simulator replays. No
clock of its own (the loop passes ``now``) and no I/O of its own (zone observations come from an
injected :class:`ZoneFeed`).

Interface the cluster side provides (``gpuplan cluster config`` / the Ray cluster; the "cluster"
work): one spot worker node type per (instance type, zone), each carrying the Ray custom resource
``zone:<zone name>``, plus an on-demand node type; and a :class:`ZoneFeed` that reports, per zone,
what was watched of its spot capacity (:class:`scheduler.policy.ZoneSeen`: hours watched, hours
with capacity, preemptions seen, whether capacity is there now, age of the outage). The executor
pins an attempt with ``RunRequest.zone`` set to that zone's node type (resource ``zone:<name>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from planner.spec import spec_from_dict
from planner.types import Candidate
from scheduler.models import Job
from scheduler.policy import (
    Decision,
    JobProgress,
    PriceRatio,
    ZoneRates,
    ZoneSeen,
    choose_zone,
    decide,
)


@dataclass(frozen=True)
class Placement:
    """The next attempt's market, $/h at launch and zone; ``wait_s`` set: leave the job queued and
    ask again after that many seconds (no spot capacity and the deadline can afford waiting)."""

    market: str
    usd_per_h: float
    zone: str | None = None
    wait_s: float | None = None
    mttp_h: float | None = None  # spot: the zone's online mean time to preemption (checkpoint interval)


class ZoneFeed(Protocol):
    def seen(self, now: datetime) -> Mapping[str, ZoneSeen]:
        """Per zone name: what has been watched of its spot capacity up to ``now``."""
        ...


@dataclass
class StaticZones:
    """A feed that answers what it was last told (tests; a watcher process that updates it)."""

    zones: dict[str, ZoneSeen]

    def seen(self, now: datetime) -> Mapping[str, ZoneSeen]:
        return dict(self.zones)


def no_progress(job: Job) -> float:
    """Hours of work a job has done, when nothing better is known: 0 (safe: the policy then sees
    less slack than there is, never more)."""
    return 0.0


class SpotChooser:
    """A ``MarketChooser`` for :class:`scheduler.loop.Scheduler`: ``Scheduler(..., choose_market=SpotChooser(feed))``.

    restart_h: delay of a start or changeover (planner CostCalibration.restart_h); recheck_s: how
    soon a waiting job is looked at again (the policy's tick); progress: hours of work a job has
    done (e.g. from its last checkpoint's step); switch_h / loss_h: see :class:`ZoneRates`.
    """

    def __init__(self, feed: ZoneFeed, *, policy: str = "gpuplan", restart_h: float | None = None,
                 recheck_s: float = 300.0, progress: Callable[[Job], float] = no_progress,
                 switch_h: float = 0.0, loss_h: float = 0.0) -> None:
        from planner.calibration import CostCalibration

        self.feed = feed
        self.policy = policy
        self.restart_h = CostCalibration().restart_h if restart_h is None else restart_h
        self.recheck_s = recheck_s
        self.progress = progress
        self.switch_h = switch_h
        self.loss_h = loss_h

    def __call__(self, job: Job, now: datetime) -> Placement:
        chosen = Candidate.model_validate(job.plan["chosen"])
        offer, nodes = chosen.offer, max(chosen.nodes, 1)
        resources = spec_from_dict(job.spec).resources
        spot_price, od_price = offer.spot_usd_per_h, offer.on_demand_usd_per_h
        if resources.spot == "never" or spot_price is None:
            return Placement("on-demand", (od_price or chosen.cost.usd_per_h / nodes) * nodes)
        seen = self.feed.seen(now)
        names = sorted(seen)
        available = [seen[z].available for z in names]
        zone_i = choose_zone(available, None, [seen[z].run_h for z in names],
                             [seen[z].rates().mean_run_h for z in names])
        zone = names[zone_i] if zone_i is not None else None
        if resources.spot == "always" or od_price is None:
            if zone is None:
                return Placement("spot", spot_price * nodes, None, wait_s=self.recheck_s)
            return Placement("spot", spot_price * nodes, zone, mttp_h=seen[zone].rates().mean_run_h)
        if zone is not None:
            rates = seen[zone].rates(loss_h=self.loss_h, switch_h=self.switch_h)
        elif names:  # no capacity anywhere: the zone a start would take once it comes back
            best = max(names, key=lambda z: seen[z].rates().mean_run_h)
            age = min(seen[z].outage_age_h for z in names)
            rates = ZoneRates(mean_run_h=seen[best].rates().mean_run_h, outage_age_h=age,
                              loss_h=self.loss_h, switch_h=self.switch_h)
        else:
            rates = ZoneRates(outage_age_h=math.inf, loss_h=self.loss_h, switch_h=self.switch_h)
        decision = decide(self.policy, JobProgress(
            work_done_h=self.progress(job), work_total_h=max(chosen.estimate.hours, 1e-6),
            now_h=(now - job.created_at).total_seconds() / 3600.0, deadline_h=resources.deadline,
            restart_h=self.restart_h, current="none", start_h=0.0,
        ), zone is not None, tick_h=self.recheck_s / 3600.0, rates=rates,
            prices=PriceRatio(on_demand=od_price, spot=spot_price))
        if decision is Decision.SPOT and zone is not None:
            return Placement("spot", spot_price * nodes, zone, mttp_h=rates.mean_run_h)
        if decision is Decision.WAIT:
            return Placement("spot", spot_price * nodes, None, wait_s=self.recheck_s)
        return Placement("on-demand", od_price * nodes)
