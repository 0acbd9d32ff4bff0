"""Where the loop runs a job's attempt: spot in which zone, on-demand, or not yet; and when to move it.

The edge between the scheduling loop (scheduler/loop/scheduling.py) and the pure spot policy
(scheduler.spot.policy): it turns a job and what has been watched of each zone's spot capacity into a
:class:`MarketChoice`, through the same ``decide`` / ``choose_zone`` the simulator replays. No clock of
its own (the loop passes ``now``) and no I/O of its own (zone observations come from a
:class:`ZoneFeed`).

- :meth:`SpotChooser.__call__`: where a queued job's next attempt starts (or "wait").
- :meth:`SpotChooser.reconsider`: whether a *running* attempt should change over (spot in another
  zone, spot after on-demand, on-demand after spot); priced as the simulator prices it: the
  restart, the wait for a durable checkpoint, and a checkpoint transfer when the zone changes.

Interface the cluster side provides (``gpuplan cluster config``): one worker node type per
(instance type, market, zone), carrying the Ray resource ``gpuplan-zone:<zone id>``; the executor
pins an attempt to ``RunRequest.zone``. :class:`ObservedZones` is the feed ``gpuplan server``
uses: what the loop itself saw of each zone (a spot attempt running there: capacity; one
preempted there: none), plus anything a watcher reports through ``observe``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable

from planner.calibration import CostCalibration
from planner.spec import spec_from_dict
from scheduler.spot.policy import (
    Current,
    Decision,
    JobStanding,
    PriceRatio,
    ZoneRates,
    ZoneSeen,
    choose_zone,
    decide,
)
from scheduler.store.models import Job
from scheduler.store.states import Market


@dataclass(frozen=True)
class MarketChoice:
    """The next attempt's market, $/h at launch and zone; ``wait_s`` set: leave the job queued and
    ask again after that many seconds (no spot capacity and the deadline can afford waiting)."""

    market: str
    usd_per_h: float
    zone: str | None = None
    wait_s: float | None = None
    mttp_h: float | None = None  # spot: the zone's online mean time to preemption (checkpoint interval)
    why: str = ""  # what the spot policy weighed, in words, for the job's log ("" when no policy decided)
    # a changeover to make before it breaks: boot the target beside the running attempt, move once it is up
    boot: bool = False


# (market, $/h) or a MarketChoice (adds the zone, or "wait: ask again later"): the loop's choose_market.
MarketChooser = Callable[[Job, datetime], tuple[str, float] | MarketChoice]


class ZoneFeed(Protocol):
    def seen(self, now: datetime) -> Mapping[str, ZoneSeen]:
        """Per zone name: what has been watched of its spot capacity up to ``now``."""
        ...


def plan_market(job: Job, now: datetime, *, restart_h: float) -> tuple[Market, float]:
    """(market, $/h at launch) for the next attempt.

    When the spec allows both markets and the planned offer has both prices, the spot policy
    decides (scheduler.spot.policy, pure), given the delay of a (re)start (``restart_h``, the
    calibration's); otherwise the plan's own market and price stand.
    """
    chosen = job.plan.chosen
    offer = chosen.offer
    planned = Market(chosen.cost.market)
    spot_mode = (job.spec.get("resources") or {}).get("spot", "auto")
    if spot_mode != "auto" or offer.spot_usd_per_h is None or offer.on_demand_usd_per_h is None:
        return planned, chosen.cost.usd_per_h
    from scheduler.spot.policy import Decision, JobStanding, decide

    deadline = spec_from_dict(job.spec).resources.deadline
    elapsed_h = (now - job.created_at).total_seconds() / 3600.0
    decision = decide("gpuplan", JobStanding(
        work_done_h=0.0, work_total_h=max(chosen.estimate.hours, 1e-6), now_h=elapsed_h,
        deadline_h=deadline, restart_h=restart_h, current="none", start_h=0.0,
    ), spot_available=True)
    # Waiting is not a market: an attempt is being launched now, so anything but on-demand is spot.
    market = Market.ON_DEMAND if decision is Decision.ON_DEMAND else Market.SPOT
    if market is planned:
        return market, chosen.cost.usd_per_h
    per_instance = offer.on_demand_usd_per_h if market is Market.ON_DEMAND else offer.spot_usd_per_h
    return market, per_instance * max(chosen.nodes, 1)


def market_chooser(cost: CostCalibration) -> MarketChooser:
    """:func:`plan_market` with the calibration's restart delay."""
    return functools.partial(plan_market, restart_h=cost.restart_h)


@runtime_checkable
class ObservesZones(Protocol):
    def observe(self, zone: str, available: bool, now: datetime) -> None:
        """Spot capacity in ``zone`` was (``available``) or was not there at ``now``."""
        ...


@dataclass
class StaticZones:
    """A feed that answers what it was last told (tests; a watcher process that updates it)."""

    zones: dict[str, ZoneSeen]

    def seen(self, now: datetime) -> Mapping[str, ZoneSeen]:
        return dict(self.zones)


@dataclass
class ObservedZones:
    """A live feed built from observations (:meth:`observe`), kept as :class:`ZoneSeen` counts.

    A zone is believed to have capacity until an observation says otherwise (a spot start is the
    probe); a zone seen without capacity is offered again after ``probe_s`` (there is no other way to
    learn that capacity is back than to ask for it), its outage age still counting. Safe to call from
    the loop and a watcher thread at once.
    """

    names: tuple[str, ...]
    probe_s: float = 1800.0
    _seen: dict[str, ZoneSeen] = field(default_factory=dict)
    _at: dict[str, datetime] = field(default_factory=dict)
    _start: datetime | None = None  # watching began with the first question or observation
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _advanced(self, zone: str, now: datetime) -> ZoneSeen:
        self._start = self._start or now
        seen = self._seen.get(zone, ZoneSeen(available=True))
        at = self._at.get(zone, self._start)
        return seen.step(seen.available, max((now - at).total_seconds(), 0.0) / 3600.0)

    def observe(self, zone: str, available: bool, now: datetime) -> None:
        if zone not in self.names:
            return
        with self._lock:
            self._seen[zone] = self._advanced(zone, now).step(available, 0.0)
            self._at[zone] = now

    def seen(self, now: datetime) -> Mapping[str, ZoneSeen]:
        out = {}
        for zone in self.names:
            with self._lock:
                seen = self._advanced(zone, now)
            if not seen.available and seen.outage_age_h * 3600.0 >= self.probe_s:
                seen = dataclasses.replace(seen, available=True, run_h=0.0)  # worth asking again
            out[zone] = seen
        return out


def spot_zones(node_types: Sequence[Mapping[str, float]]) -> tuple[str, ...]:
    """The zones a gpuplan cluster has spot worker node types in (``gpuplan-zone:`` resources on
    types that also carry ``gpuplan-market:spot``; workers.executors.cluster_fit's scheme), sorted."""
    from workers.executors.cluster_fit import MARKET_PREFIX, ZONE_PREFIX

    zones = {key.removeprefix(ZONE_PREFIX) for node in node_types if node.get(MARKET_PREFIX + "spot")
             for key in node if key.startswith(ZONE_PREFIX)}
    return tuple(sorted(zones))


def no_progress(job: Job) -> float:
    """Hours of work a job has done, when nothing better is known: 0 (safe: the policy then sees
    less slack than there is, never more)."""
    return 0.0


@dataclass(frozen=True)
class Running:
    """Where a running attempt is: its market, its zone (None: unknown) and the job's work done (hours)."""

    market: str
    zone: str | None
    work_done_h: float = 0.0


@dataclass(frozen=True)
class _Offer:
    """What the policy needs from a job's spec and plan."""

    spot_mode: str  # auto | always | never
    deadline_h: float | None  # hours after the job was created
    hours: float  # planned hours of work
    nodes: int
    spot: float | None  # $/h per node
    on_demand: float | None
    planned: float  # the plan's $/h per node

    @staticmethod
    def of(job: Job) -> _Offer:
        chosen = job.plan.chosen
        resources = spec_from_dict(job.spec).resources
        nodes = max(chosen.nodes, 1)
        return _Offer(resources.spot, resources.deadline, max(chosen.estimate.hours, 1e-6), nodes,
                      chosen.offer.spot_usd_per_h, chosen.offer.on_demand_usd_per_h, chosen.cost.usd_per_h / nodes)

    @property
    def both(self) -> bool:
        """The policy chooses the market (spec ``spot: auto`` and both prices known)."""
        return self.spot_mode == "auto" and self.spot is not None and self.on_demand is not None


class SpotChooser:
    """A ``MarketChooser`` for :class:`scheduler.loop.scheduling.Scheduler`: ``Scheduler(...,
    choose_market=SpotChooser(feed))``.

    restart_h: delay of a start or changeover (default: the calibration's ``restart_h``); recheck_s:
    how soon a waiting job is looked at again (the policy's tick); progress: hours of work a queued
    job has done (e.g. from its last checkpoint's step; default 0, which is safe: less slack than
    there is); state_gb: checkpoint size. A voluntary changeover waits for the checkpoint to be
    durable (``switch_h``) and a move to another zone copies it (``move_h``); both default to
    ``state_gb`` at the calibration's measured ``checkpoint_write_gbps``. loss_h: work a preemption
    loses (0: the just-in-time checkpoint on the notice). make_before_break: the loop's executor can boot
    nodes ahead (``workers.executors.protocol.BootsAhead``), so a return from on-demand to spot may boot spot beside
    the running attempt and move once it is up (``MarketChoice.boot``).
    """

    def __init__(self, feed: ZoneFeed, *, policy: str = "gpuplan", restart_h: float | None = None,
                 recheck_s: float = 300.0, progress: Callable[[Job], float] = no_progress,
                 switch_h: float | None = None, move_h: float | None = None, loss_h: float = 0.0,
                 state_gb: float = 14.8, cost: CostCalibration | None = None,
                 make_before_break: bool = False) -> None:
        cost = cost or CostCalibration()
        durable_h = state_gb / cost.checkpoint_write_gbps / 3600.0
        self.feed = feed
        self.policy = policy
        self.restart_h = cost.restart_h if restart_h is None else restart_h
        self.recheck_s = recheck_s
        self.progress = progress
        self.switch_h = durable_h if switch_h is None else switch_h
        self.move_h = durable_h if move_h is None else move_h
        self.loss_h = loss_h
        self.make_before_break = make_before_break

    def observe(self, zone: str, available: bool, now: datetime) -> None:
        """Pass what the loop saw of a zone to the feed, if the feed learns from observations."""
        if isinstance(self.feed, ObservesZones):
            self.feed.observe(zone, available, now)

    # -------------------------------------------------------------- a queued job

    def __call__(self, job: Job, now: datetime) -> MarketChoice:
        offer = _Offer.of(job)
        if offer.spot_mode == "never" or offer.spot is None:
            return self._on_demand(offer)
        seen = self.feed.seen(now)
        zone = _best_zone(seen)
        if not offer.both:  # spot: always (or no on-demand price): spot where there is capacity, else wait
            return self._spot(offer, seen, zone) if zone is not None else self._wait(offer)
        decision, why = self._decide(job, offer, now, seen, zone, current="none", work_done_h=self.progress(job))
        if decision is Decision.SPOT and zone is not None:
            return self._spot(offer, seen, zone, why)
        return self._wait(offer, why) if decision is Decision.WAIT else self._on_demand(offer, why)

    # -------------------------------------------------------------- a running attempt

    def reconsider(self, job: Job, running: Running, now: datetime) -> MarketChoice | None:
        """Where the running attempt should change over to, or None to leave it where it is.

        - spot, and its zone still has capacity: on-demand only when the safety net says so;
        - spot, and its zone has lost capacity (the attempt waits for a node there): spot in the
          zone that has capacity (restart + checkpoint transfer), on-demand, or None (wait there);
        - on-demand, and spot has capacity somewhere: back to spot when the policy says it pays, booted
          beside the running attempt first where the loop can (``make_before_break``: ``MarketChoice.boot``).
        """
        offer = _Offer.of(job)
        if offer.spot is None or running.market not in ("spot", "on-demand"):
            return None
        seen = self.feed.seen(now)
        here = running.zone is None or running.zone not in seen or seen[running.zone].available
        if running.market == "spot" and here:
            if not offer.both:
                return None
            decision, why = self._decide(job, offer, now, seen, running.zone, current="spot",
                                         work_done_h=running.work_done_h)
            return self._on_demand(offer, why) if decision is Decision.ON_DEMAND else None
        zone = _best_zone(seen)
        if running.market == "spot":
            if not offer.both:
                return self._spot(offer, seen, zone) if zone is not None else None
            decision, why = self._decide(job, offer, now, seen, zone, current="none",
                                         work_done_h=running.work_done_h, moves=zone != running.zone)
        elif offer.both and zone is not None:
            decision, why = self._decide(job, offer, now, seen, zone, current="on-demand",
                                         work_done_h=running.work_done_h, moves=zone != running.zone)
        else:
            return None
        if decision is Decision.SPOT and zone is not None:
            return self._spot(offer, seen, zone, why)
        if decision is Decision.BOOT_SPOT and zone is not None:
            return dataclasses.replace(self._spot(offer, seen, zone, why), boot=True)
        if decision is Decision.ON_DEMAND and running.market == "spot":
            return self._on_demand(offer, why)
        return None

    # -------------------------------------------------------------- the policy, and what it answers

    def _decide(self, job: Job, offer: _Offer, now: datetime, seen: Mapping[str, ZoneSeen], zone: str | None, *,
                current: Current, work_done_h: float, moves: bool = False) -> tuple[Decision, str]:
        """The policy's answer for this job, and what it weighed in words; spot counts as available when
        there is a zone to run it in (or the job runs on spot now)."""
        assert offer.spot is not None and offer.on_demand is not None
        progress = JobStanding(
            work_done_h=min(work_done_h, offer.hours), work_total_h=offer.hours,
            now_h=(now - job.created_at).total_seconds() / 3600.0, deadline_h=offer.deadline_h,
            restart_h=self.restart_h + (self.move_h if moves else 0.0), current=current, start_h=0.0,
            uncommitted_h=self.loss_h if current == "spot" else 0.0,
        )
        available, rates = zone is not None or current == "spot", self._rates(seen, zone)
        decision = decide(self.policy, progress, available, tick_h=self.recheck_s / 3600.0, rates=rates,
                          prices=PriceRatio(on_demand=offer.on_demand, spot=offer.spot),
                          make_before_break=self.make_before_break and current == "on-demand")
        return decision, situation(progress, available, rates)

    def _rates(self, seen: Mapping[str, ZoneSeen], zone: str | None) -> ZoneRates:
        if zone is not None and zone in seen:
            return seen[zone].rates(loss_h=self.loss_h, switch_h=self.switch_h)
        if seen:  # no capacity anywhere: the zone a start would take once it comes back
            best = max(seen, key=lambda z: seen[z].rates().mean_run_h)
            age = min(s.outage_age_h for s in seen.values())
            # The outage of every zone ends when any zone comes back: the shortest mean outage.
            outage = min(s.rates().mean_outage_h for s in seen.values())
            return ZoneRates(mean_run_h=seen[best].rates().mean_run_h, outage_age_h=age,
                             loss_h=self.loss_h, switch_h=self.switch_h, mean_outage_h=outage)
        return ZoneRates(outage_age_h=math.inf, loss_h=self.loss_h, switch_h=self.switch_h)

    def _spot(self, offer: _Offer, seen: Mapping[str, ZoneSeen], zone: str, why: str = "") -> MarketChoice:
        assert offer.spot is not None
        return MarketChoice("spot", offer.spot * offer.nodes, zone, mttp_h=seen[zone].rates().mean_run_h, why=why)

    def _wait(self, offer: _Offer, why: str = "") -> MarketChoice:
        assert offer.spot is not None
        return MarketChoice("spot", offer.spot * offer.nodes, None, wait_s=self.recheck_s, why=why)

    @staticmethod
    def _on_demand(offer: _Offer, why: str = "") -> MarketChoice:
        return MarketChoice("on-demand", (offer.on_demand or offer.planned) * offer.nodes, why=why)


def situation(progress: JobStanding, available: bool, rates: ZoneRates) -> str:
    """What the spot policy weighed, in words: slack and work left, capacity now and for how long, and the
    zone's mean run and outage (e.g. "3.2 h of slack for 20.0 h of work; no spot capacity for 1.4 h;
    runs last 6.0 h and outages 1.9 h on average")."""
    left = progress.work_total_h - progress.work_done_h
    if progress.deadline_h is None:
        budget = f"no deadline, {left:.1f} h of work"
    else:
        budget = f"{progress.deadline_h - progress.now_h - left:.1f} h of slack for {left:.1f} h of work"
    if available:
        now = f"spot capacity for {rates.run_age_h:.1f} h" if math.isfinite(rates.run_age_h) else "spot capacity"
    else:
        now = (f"no spot capacity for {rates.outage_age_h:.1f} h" if math.isfinite(rates.outage_age_h)
               else "no spot capacity")
    return (f"{budget}; {now}; runs last {rates.mean_run_h:.1f} h and outages {rates.mean_outage_h:.1f} h "
            "on average")


def _best_zone(seen: Mapping[str, ZoneSeen]) -> str | None:
    """The zone a spot start takes: the available one with the longest estimated mean run (then the
    oldest current run); None if none has capacity."""
    names = sorted(seen)
    index = choose_zone([seen[z].available for z in names], None, [seen[z].run_h for z in names],
                        [seen[z].rates().mean_run_h for z in names])
    return names[index] if index is not None else None
