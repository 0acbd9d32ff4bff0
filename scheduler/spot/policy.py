"""Spot vs on-demand under a deadline: which market (and zone) a job should be on right now.

Pure functions, no I/O, no clock: the caller says where the job stands and what it has seen of the
zones' spot capacity; the policy answers SPOT, ON_DEMAND or WAIT (and, with several zones, which
zone). The scheduler loop calls :func:`decide` for one job; the simulator calls
:func:`decide_arrays` for a thousand jobs at once. Both run the same rule (``decide`` is a
one-element call of ``decide_arrays``), so what the simulator measures is what the server does.

API (stable)::

    progress = JobStanding(work_done_h=10, work_total_h=48, now_h=12, deadline_h=70, restart_h=0.2,
                           current="spot", start_h=0.0, uncommitted_h=0.0)
    decide("gpuplan", progress, spot_available=True, tick_h=195/3600) -> Decision.SPOT
    rates = ZoneSeen(watched_h=30, up_h=24, preemptions=3).rates()   # online estimates, with a prior
    decide("gpuplan", progress, True, rates=rates, prices=PriceRatio(3.06, 0.92))
    choose_zone(available=[False, True, True], current_zone=None, run_length_h=[0, 3.0, 9.5]) -> 2
    young_daly_interval(checkpoint_cost_h=0.05, mtbf_h=6.0) -> hours of work between checkpoints
    mean_time_to_preemption(availability, gap_h) -> observed mean length of a spot run, in hours

Policies (``POLICIES``): ``on-demand``, ``spot-only``, ``greedy`` (spot while available, idle
while not, on-demand for good once the slack is gone), ``uniform-progress`` (Can't Be Late, Wu et
al., NSDI'24: keep progress on or above the straight line from start to deadline; on-demand when
behind; back to spot only when ahead by a hysteresis margin) and ``gpuplan`` (the default; below).

Every deadline-aware policy shares one safety net. Let ``slack`` be the time left to the deadline
minus the work left. Not being on on-demand for the next tick is safe only if, after the worst
case (no progress this tick, the work at risk lost to a preemption), on-demand can still finish:
``slack >= restart + tick + at_risk (+ the checkpoint write a voluntary changeover waits for)``.
When that fails the job goes on-demand and, because on-demand does not burn slack, it stays
feasible. Leaving on-demand for spot pays one more changeover, so it needs ``restart`` more slack on
top. Hence: any job whose initial slack covers one changeover meets its deadline under these
policies, whatever the spot trace does.

``gpuplan`` has three choices made on traces, on one family only (``RATE_HALF_LIFE_H``,
``PRIOR_MEAN_OUTAGE_H`` and the young/old shape of a spell in :mod:`scheduler.spot.slack_value`). It prices
slack with what it has seen of the zone, in spot dollars (``ratio`` = on-demand $/h over spot $/h; a
changeover = the restart, billed at the new market, plus the checkpoint write it waits for, billed at
the old; ``loss`` = the work a preemption loses):

- **Every choice the safety net leaves open** (wait, take spot, bridge an outage on on-demand, leave
  spot, return to it) is the cheapest expected action of :mod:`scheduler.spot.slack_value`'s dynamic program
  over (time left, work left, market held, capacity now, age of the current spell). Its model of the
  zone: runs of capacity and outages whose young phase (the first 30 minutes) ends several times as fast
  as the old one (the traces are heavy-tailed: half of all spells end within 30 minutes, the mean is
  hours), with the mean run and mean outage estimated online. Where slack is plentiful it waits out
  outages; where it is short it bridges them, as far as the zone's rates make that pay. Since
  2026-12-03 it also decides returns to spot and young outages, which a reserve formula and a gate
  decided while the model was memoryless (it overrated fresh runs and underrated young outages).
- **Rates online**: ``mean run = (hours up + prior) / (preemptions + 1)``, ``mean outage = (hours
  down + prior) / (outages ended + 1)``, counted from what the caller has watched (:class:`ZoneSeen`),
  recent hours weighing more (counts decay with a half-life of ``RATE_HALF_LIFE_H``: a zone's
  capacity comes in regimes of days); the run prior is one preemption per ``1 / spot_hazard`` hours
  (planner/calibration.py's AWS hazard), the outage prior one outage of ``PRIOR_MEAN_OUTAGE_H``;
  neither decays, so a zone never seen starts at the planner's estimate.

A job without a deadline (``deadline_h=None``) takes the cheapest expected cost: spot when
available, otherwise wait for it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from errors import InvalidInput, UnknownName
from scheduler.spot.market_codes import BOOT_SPOT, NONE, ON_DEMAND, SPOT, WAIT
from scheduler.spot.slack_value import NONE_DOWN, NONE_UP, OD_DOWN, OD_UP, SPOT_UP, best_actions

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int8]
BoolArray = npt.NDArray[np.bool_]


Current = Literal["spot", "on-demand", "none"]
_CURRENT_CODE: dict[str, int] = {"none": NONE, "spot": SPOT, "on-demand": ON_DEMAND}

POLICIES: tuple[str, ...] = ("gpuplan", "uniform-progress", "greedy", "spot-only", "on-demand")

# Prior for a zone never watched: planner/calibration.py CostCalibration.spot_hazard_per_h["aws"]
# (0.08 preemptions per instance-hour), counted as one observed preemption.
PRIOR_MEAN_RUN_H = 1.0 / 0.08
# Half-life of what was watched of a zone in the online rates (EWMA counts). Chosen on traces, on the
# tuning family only (AWS Feb 15 2023 availability, 9 zones; 24, 48, 96, 192 h and no decay tried; 48
# and 96 h tied on cells below greedy, 96 h had the lower median); see docs/lab-notes/spot-history.md.
RATE_HALF_LIFE_H = 96.0
# Prior mean outage of a zone never watched: the tuning family's mean outage (1.88 h over 1,893 outages).
PRIOR_MEAN_OUTAGE_H = 1.9


class Decision(enum.StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"
    WAIT = "wait"
    # Stay on on-demand, boot spot beside it and move once it is up (only where the caller can: ``make_before_break``).
    BOOT_SPOT = "boot-spot"


_DECISION_BY_CODE = {WAIT: Decision.WAIT, SPOT: Decision.SPOT, ON_DEMAND: Decision.ON_DEMAND,
                     BOOT_SPOT: Decision.BOOT_SPOT}


@dataclass(frozen=True)
class JobStanding:
    """Where one job stands. Hours are on one clock (any origin); ``deadline_h`` is absolute."""

    work_done_h: float  # progress so far, including work not yet checkpointed
    work_total_h: float
    now_h: float
    deadline_h: float | None
    restart_h: float  # delay of every (re)start or changeover before work resumes
    current: Current  # the market the job holds now ("none" after a preemption or while waiting)
    start_h: float = 0.0  # when the job was submitted (origin of the uniform-progress line)
    uncommitted_h: float = 0.0  # work a preemption now would lose (after any just-in-time checkpoint)


@dataclass(frozen=True)
class ZoneRates:
    """What the policy believes about one zone's spot capacity (hours)."""

    mean_run_h: float = PRIOR_MEAN_RUN_H  # mean length of a run of capacity before a preemption
    outage_age_h: float = 0.0  # how long the current outage (no capacity anywhere) has lasted
    loss_h: float = 0.0  # work a preemption loses on average (0: just-in-time checkpoint on the notice)
    switch_h: float = 0.0  # time a voluntary changeover waits for its checkpoint to be durable
    mean_outage_h: float = PRIOR_MEAN_OUTAGE_H  # mean length of an outage of capacity
    run_age_h: float = math.inf  # how long the current run of capacity has lasted (inf: unknown)


@dataclass(frozen=True)
class ZoneSeen:
    """Counts of what the caller watched of one zone: a pure summary, updated with :meth:`step`."""

    watched_h: float = 0.0
    up_h: float = 0.0  # hours with capacity, each weighted by its recency (half-life ``half_life_h``)
    preemptions: float = 0.0  # preemptions seen, weighted the same way
    run_h: float = 0.0  # age of the current run of capacity (0: none now)
    available: bool = False
    outage_age_h: float = 0.0  # age of the current outage (0: capacity now)
    half_life_h: float = RATE_HALF_LIFE_H  # inf: every hour watched weighs the same
    down_h: float = 0.0  # hours without capacity, weighted like ``up_h``
    recoveries: float = 0.0  # outages seen to end, weighted the same way

    def step(self, available: bool, dt_h: float) -> ZoneSeen:
        """The counts after watching ``dt_h`` more hours whose capacity was ``available``: what was
        counted before decays by ``0.5 ** (dt_h / half_life_h)``."""
        ended = self.available and not available
        recovered = self.watched_h > 0 and not self.available and available
        keep = 0.5 ** (dt_h / self.half_life_h)
        return ZoneSeen(
            watched_h=self.watched_h + dt_h,
            up_h=self.up_h * keep + (dt_h if available else 0.0),
            preemptions=self.preemptions * keep + float(ended),
            run_h=self.run_h + dt_h if available else 0.0,
            available=available,
            outage_age_h=0.0 if available else self.outage_age_h + dt_h,
            half_life_h=self.half_life_h,
            down_h=self.down_h * keep + (0.0 if available else dt_h),
            recoveries=self.recoveries * keep + float(recovered),
        )

    def rates(self, loss_h: float = 0.0, switch_h: float = 0.0,
              prior_mean_run_h: float = PRIOR_MEAN_RUN_H,
              prior_mean_outage_h: float = PRIOR_MEAN_OUTAGE_H) -> ZoneRates:
        mean = float(mean_run_estimate(self.up_h, self.preemptions, prior_mean_run_h))
        outage = float(mean_run_estimate(self.down_h, self.recoveries, prior_mean_outage_h))
        return ZoneRates(mean_run_h=mean, outage_age_h=self.outage_age_h, loss_h=loss_h, switch_h=switch_h,
                         mean_outage_h=outage,
                         # A zone believed up without being watched has a run of unknown age.
                         run_age_h=self.run_h if self.available and self.watched_h > 0 else math.inf)


def mean_run_estimate(up_h: float | FloatArray, preemptions: float | FloatArray,
                      prior_mean_run_h: float = PRIOR_MEAN_RUN_H) -> FloatArray:
    """Online mean run: (hours up + prior) / (preemptions + 1); the prior counts as one preemption
    after ``prior_mean_run_h`` hours, so an unwatched zone starts at the planner's hazard."""
    return np.asarray((np.asarray(up_h) + prior_mean_run_h) / (np.asarray(preemptions) + 1.0), dtype=np.float64)


@dataclass(frozen=True)
class PriceRatio:
    """On-demand and spot $/h (only their ratio matters to the policy)."""

    on_demand: float = 3.06
    spot: float = 0.92


DEFAULT_RATES = ZoneRates()
DEFAULT_PRICES = PriceRatio()


@dataclass(frozen=True)
class PolicyParams:
    """Knobs of the reserve rule that ``greedy`` and ``uniform-progress`` are special cases of.

    reserve_fraction: share of the initial slack kept in reserve, shrinking linearly to 0 at the
        deadline (0 = greedy's "idle until the slack is gone", 1 = uniform progress).
    reserve_cap_h: the reserve never exceeds this many hours.
    return_restarts: extra slack, in restart delays, before going back from on-demand to spot
        (inf = never go back, like greedy).
    """

    reserve_fraction: float = 0.0
    reserve_cap_h: float = math.inf
    return_restarts: float = math.inf


GREEDY_PARAMS = PolicyParams(reserve_fraction=0.0, return_restarts=math.inf)
UNIFORM_PARAMS = PolicyParams(reserve_fraction=1.0, reserve_cap_h=math.inf, return_restarts=2.0)


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise UnknownName("policy", name, POLICIES)
    return name


def decide_arrays(
    policy: str,
    *,
    work_done_h: FloatArray,
    work_total_h: FloatArray,
    now_h: FloatArray | float,
    deadline_h: FloatArray,
    start_h: FloatArray,
    restart_h: FloatArray | float,
    current: IntArray,
    spot_available: BoolArray,
    uncommitted_h: FloatArray | float = 0.0,
    tick_h: float = 0.0,
    mean_run_h: FloatArray | float = PRIOR_MEAN_RUN_H,
    outage_age_h: FloatArray | float = math.inf,
    loss_h: FloatArray | float = 0.0,
    switch_h: FloatArray | float = 0.0,
    price_ratio: FloatArray | float = DEFAULT_PRICES.on_demand / DEFAULT_PRICES.spot,
    mean_outage_h: FloatArray | float = PRIOR_MEAN_OUTAGE_H,
    run_age_h: FloatArray | float = math.inf,
    make_before_break: BoolArray | bool = False,
) -> IntArray:
    """Vectorised :func:`decide`: one decision code (WAIT/SPOT/ON_DEMAND, BOOT_SPOT) per job.

    ``deadline_h`` may hold ``inf`` for jobs without a deadline. ``current`` holds NONE/SPOT/ON_DEMAND
    codes; a job whose spot instance was just preempted must be passed as NONE. ``mean_run_h``,
    ``outage_age_h`` (inf: unknown), ``loss_h``, ``switch_h``: the zone's
    :class:`ZoneRates` (per job or one for all);
    ``price_ratio``: on-demand $/h over spot $/h; ``mean_outage_h``: the zone's mean outage (online);
    ``run_age_h``: how long the zone's current run of capacity has lasted (inf: unknown);
    ``make_before_break``: the caller can boot spot beside a running on-demand instance and move the job
    once it is up (BOOT_SPOT; only ``gpuplan`` uses it).
    """
    check_policy(policy)
    n = work_done_h.shape[0]
    if policy == "on-demand":
        return np.full(n, ON_DEMAND, dtype=np.int8)
    spot_or_wait = np.where(spot_available, SPOT, WAIT).astype(np.int8)
    if policy == "spot-only":
        return spot_or_wait

    has_deadline = np.isfinite(deadline_h)
    time_left = np.where(has_deadline, deadline_h - now_h, 0.0)
    work_left = work_total_h - work_done_h
    slack = time_left - work_left
    on_od = current == ON_DEMAND
    # Safety net: a voluntary changeover to on-demand waits for its checkpoint (switch_h).
    need = restart_h + tick_h + uncommitted_h + np.where(on_od, 0.0, switch_h)
    safe = slack >= need
    # Leaving on-demand pays one more changeover (and its checkpoint) on top; booting spot beside it costs
    # no time until the move, which waits for the checkpoint and comes at a tick's end.
    may_leave = slack >= need + restart_h + switch_h
    may_boot = slack >= need + switch_h + tick_h

    if policy == "gpuplan":
        # Every choice the safety net leaves open (wait, take spot, bridge on on-demand, leave spot, return
        # to it): the slack-value program, priced on the zone's online rates and the age of its spell.
        column = np.where(on_od, np.where(spot_available, OD_UP, OD_DOWN),
                          np.where(spot_available, np.where(current == SPOT, SPOT_UP, NONE_UP), NONE_DOWN))
        dp = best_actions(time_left, work_left, work_total_h, column, restart_h=restart_h, switch_h=switch_h,
                          loss_h=loss_h, mean_run_h=mean_run_h, mean_outage_h=mean_outage_h, price_ratio=price_ratio,
                          run_age_h=run_age_h, outage_age_h=outage_age_h, make_before_break=make_before_break)
        may_go = np.where(dp == BOOT_SPOT, may_boot, may_leave)
        deadline_rule = np.where(~safe | (on_od & ~may_go), ON_DEMAND, dp)
    else:
        span = np.where(has_deadline, deadline_h - start_h, 1.0)
        deadline_rule = _reserve_line_rule(policy, span=span, work_total_h=work_total_h, time_left=time_left,
                                           slack=slack, need=need, restart_h=restart_h, on_od=on_od,
                                           spot_available=spot_available, safe=safe)
    return np.where(has_deadline, deadline_rule, spot_or_wait).astype(np.int8)


def _reserve_line_rule(policy: str, *, span: FloatArray, work_total_h: FloatArray, time_left: FloatArray,
                       slack: FloatArray, need: FloatArray, restart_h: FloatArray | float, on_od: BoolArray,
                       spot_available: BoolArray, safe: BoolArray) -> IntArray:
    """The baselines' deadline rule (greedy, uniform-progress): a reserve of slack that shrinks with the time
    left, on-demand below it."""
    p = GREEDY_PARAMS if policy == "greedy" else UNIFORM_PARAMS
    initial_slack = np.maximum(span - work_total_h, 0.0)
    frac_left = np.clip(time_left / np.maximum(span, 1e-12), 0.0, 1.0)
    reserve = need + np.minimum(p.reserve_fraction * initial_slack, p.reserve_cap_h) * frac_left
    if policy == "uniform-progress":
        # Return to spot only when ahead of the line by a hysteresis of two changeovers.
        may_return = slack >= reserve + p.return_restarts * np.asarray(restart_h)
    else:
        may_return = np.zeros(slack.shape[0], dtype=bool)
    # With spot available: take it, unless on on-demand without room (or reason) to come back.
    with_spot = np.where(on_od & ~may_return, ON_DEMAND, SPOT)
    # Without spot: wait while above the reserve line; on-demand stays put a changeover longer (greedy:
    # for good).
    keep_reserve = reserve + np.where(on_od, restart_h, 0.0)
    without_spot = np.where(slack >= keep_reserve, WAIT, ON_DEMAND)
    if policy == "greedy":
        without_spot = np.where(on_od, ON_DEMAND, without_spot)
    return np.asarray(np.where(~safe, ON_DEMAND, np.where(spot_available, with_spot, without_spot)))


def decide(
    policy_name: str,
    progress: JobStanding,
    spot_available: bool,
    *,
    tick_h: float = 0.0,
    rates: ZoneRates = DEFAULT_RATES,
    prices: PriceRatio = DEFAULT_PRICES,
    make_before_break: bool = False,
) -> Decision:
    """What one job should do now. ``tick_h``: how long until the caller asks again; ``rates``:
    what the caller has seen of the zone (:meth:`ZoneSeen.rates`); ``prices``: on-demand and spot $/h;
    ``make_before_break``: the caller can boot spot beside running on-demand (else never BOOT_SPOT)."""
    if progress.current not in _CURRENT_CODE:
        raise InvalidInput(f"current market {progress.current!r} is not one of spot, on-demand, none")
    if progress.work_total_h <= 0 or progress.restart_h < 0:
        raise InvalidInput("work_total_h must be > 0 and restart_h >= 0")
    if not (prices.on_demand > 0 and prices.spot > 0):
        raise InvalidInput("prices must be positive $/h")

    def one(x: float) -> FloatArray:
        return np.array([x], dtype=np.float64)

    code = decide_arrays(
        policy_name,
        work_done_h=one(progress.work_done_h),
        work_total_h=one(progress.work_total_h),
        now_h=progress.now_h,
        deadline_h=one(math.inf if progress.deadline_h is None else progress.deadline_h),
        start_h=one(progress.start_h),
        restart_h=progress.restart_h,
        current=np.array([_CURRENT_CODE[progress.current]], dtype=np.int8),
        spot_available=np.array([spot_available]),
        uncommitted_h=progress.uncommitted_h,
        tick_h=tick_h,
        mean_run_h=rates.mean_run_h,
        outage_age_h=rates.outage_age_h,
        loss_h=rates.loss_h,
        switch_h=rates.switch_h,
        price_ratio=prices.on_demand / prices.spot,
        mean_outage_h=rates.mean_outage_h,
        run_age_h=rates.run_age_h,
        make_before_break=make_before_break,
    )
    return _DECISION_BY_CODE[int(code[0])]


def choose_zone(
    available: Sequence[bool], current_zone: int | None, run_length_h: Sequence[float],
    mean_run_h: Sequence[float] | None = None,
) -> int | None:
    """Which zone to run spot in: stay where we are if it still has capacity (a move costs a
    changeover); otherwise the available zone with the longest observed mean run of capacity
    (``mean_run_h``, online estimates), ties broken by how long its current run has lasted (runs of
    spot availability are heavy-tailed, so an old run is likelier to last). None if no zone has
    capacity."""
    if current_zone is not None and 0 <= current_zone < len(available) and available[current_zone]:
        return current_zone
    means = list(mean_run_h) if mean_run_h is not None else [0.0] * len(available)
    best: int | None = None
    for zone, ok in enumerate(available):
        if ok and (best is None or (means[zone], run_length_h[zone]) > (means[best], run_length_h[best])):
            best = zone
    return best


def mean_time_to_preemption(availability: Sequence[float] | FloatArray, gap_h: float) -> float:
    """Observed mean length (hours) of a spot run that ended in a preemption.

    Runs cut by the end of the trace count toward the time but not as preemptions (censored), so the
    estimate is total available time / preemptions observed; ``inf`` if none was observed.
    """
    avail = np.asarray(availability, dtype=np.float64) > 0
    if avail.size == 0:
        raise InvalidInput("an availability trace needs at least one tick")
    ends = int(np.count_nonzero(avail[:-1] & ~avail[1:]))
    up_h = float(np.count_nonzero(avail)) * gap_h
    return math.inf if ends == 0 else up_h / ends


def young_daly_interval(checkpoint_cost_h: float, mtbf_h: float) -> float:
    """Hours of work between checkpoints minimising expected overhead (Daly 2006's higher-order
    form of Young 1974's sqrt(2 C M)). 0 for a free checkpoint, inf when nothing fails."""
    if checkpoint_cost_h < 0 or mtbf_h <= 0:
        raise InvalidInput("checkpoint cost must be >= 0 and mean time between failures > 0")
    if checkpoint_cost_h == 0:
        return 0.0
    if math.isinf(mtbf_h):
        return math.inf
    if checkpoint_cost_h >= 2 * mtbf_h:
        return mtbf_h
    ratio = checkpoint_cost_h / (2 * mtbf_h)
    return math.sqrt(2 * checkpoint_cost_h * mtbf_h) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - checkpoint_cost_h
