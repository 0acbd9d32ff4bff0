"""Replay spot availability traces and job arrivals through the policy code, on a simulated clock.

Model (one tick = the trace's ``gap_seconds``; decisions happen at tick boundaries):

- A job has ``work_h`` hours of work, a deadline ``deadline_h`` hours after it arrives (inf: none)
  and a restart delay ``restart_h`` paid (in time and money) on every start, restart after a
  preemption, and changeover between markets or zones.
- A job on spot in zone z is preempted at the first tick where z has no capacity. Work since its
  last checkpoint is lost. With a checkpoint cost C > 0 the job checkpoints every Young/Daly interval
  (from the zone's observed mean time to preemption), which slows spot work by interval/(interval+C);
  with C = 0 checkpoints are free and continuous (the just-in-time checkpoint on AWS's 2-minute
  notice), so only the restart delay is lost. A voluntary changeover keeps all work.
- Cost is paid for every hour an instance is held (restart delay included): spot at the trace's
  price for that tick (or the given spot price), on-demand at the on-demand price. Waiting is free.

Every policy of :mod:`scheduler.policy` runs through :func:`run_policy` (the same
``decide_arrays`` the server's loop calls through ``decide``), vectorised over jobs. The
:func:`omniscient` bound is a dynamic program over (tick, market, progress) that knows the whole
future trace; it rounds the restart delay and the work down and the deadline up to its grid, so it
is a true lower bound on the cost of every policy (which also pays checkpoint overhead and lost work).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from catalog.errors import InvalidInput
from scheduler.policy import (
    DEFAULT_PARAMS,
    NONE,
    ON_DEMAND,
    POLICIES,
    PRIOR_MEAN_RUN_H,
    SPOT,
    WAIT,
    PolicyParams,
    check_policy,
    decide_arrays,
    mean_run_estimate,
)
from scheduler.traces import Zones

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

ALL_POLICIES: tuple[str, ...] = ("uniform-progress", "on-demand", "spot-only", "greedy", "omniscient", "gpuplan")
_EPS = 1e-9


@dataclass(frozen=True)
class Prices:
    on_demand: float
    spot: float  # used where a trace has no price of its own

    def __post_init__(self) -> None:
        if not (self.on_demand > 0 and self.spot > 0):
            raise InvalidInput("prices must be positive $/h", hint="e.g. --on-demand-price 3.06 --spot-price 0.92")


@dataclass(frozen=True)
class Jobs:
    """A stream of jobs: arrival tick, work, deadline (hours after arrival; inf: none), restart."""

    start_tick: IntArray
    work_h: FloatArray
    deadline_h: FloatArray
    restart_h: FloatArray

    @staticmethod
    def make(
        start_tick: Sequence[int] | IntArray,
        work_h: float | Sequence[float] | FloatArray,
        deadline_h: float | Sequence[float] | FloatArray,
        restart_h: float | Sequence[float] | FloatArray,
    ) -> Jobs:
        starts = np.asarray(start_tick, dtype=np.int64)
        n = starts.shape[0]

        def arr(x: float | Sequence[float] | FloatArray) -> FloatArray:
            return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,)).copy()

        jobs = Jobs(starts, arr(work_h), arr(deadline_h), arr(restart_h))
        if n == 0:
            raise InvalidInput("no jobs to simulate")
        if np.any(starts < 0):
            raise InvalidInput("job arrival ticks must be >= 0")
        if np.any(~(jobs.work_h > 0)) or np.any(~np.isfinite(jobs.work_h)):
            raise InvalidInput("job hours must be a positive number")
        if np.any(~(jobs.restart_h >= 0)) or np.any(~np.isfinite(jobs.restart_h)):
            raise InvalidInput("restart hours must be >= 0")
        if np.any(~(jobs.deadline_h >= jobs.work_h)):
            raise InvalidInput(
                "a deadline is shorter than the job's work; no market can finish it",
                hint="give --deadline-hours >= --job-hours (plus the restart delay)",
            )
        return jobs

    def __len__(self) -> int:
        return int(self.start_tick.shape[0])


@dataclass
class Outcome:
    """Per-job results of one policy (arrays over jobs). ``finish_h`` is hours after arrival."""

    policy: str
    cost_usd: FloatArray
    finish_h: FloatArray  # nan: not finished by the end of the trace
    preemptions: IntArray
    work_lost_h: FloatArray
    spot_h: FloatArray
    on_demand_h: FloatArray
    deadline_h: FloatArray
    # Per-tick record for plots (only when asked for): market code and progress, shape (ticks, jobs).
    timeline_market: npt.NDArray[np.int8] | None = None
    timeline_done: FloatArray | None = None
    timeline_zone: IntArray | None = None

    @property
    def deadline_met(self) -> npt.NDArray[np.bool_]:
        return np.isfinite(self.finish_h) & (self.finish_h <= self.deadline_h + 1e-6)

    def row(self, i: int = 0) -> dict[str, object]:
        """One job's result; numbers that do not exist (a bound has no schedule) are None."""

        def num(x: float) -> float | None:
            return None if not math.isfinite(x) else round(x, 4)

        return {
            "policy": self.policy,
            "cost_usd": num(float(self.cost_usd[i])),
            "finish_hours": num(float(self.finish_h[i])),
            "deadline_met": bool(self.deadline_met[i]),
            "preemptions": int(self.preemptions[i]),
            "work_lost_hours": num(float(self.work_lost_h[i])),
            "spot_hours": num(float(self.spot_h[i])),
            "on_demand_hours": num(float(self.on_demand_h[i])),
        }


@dataclass(frozen=True)
class SimOptions:
    """How checkpoints and changeovers cost (hours), and what the policy may know.

    checkpoint_cost_h: what the training loop stops for at each periodic checkpoint (the snapshot;
        0: free continuous checkpoints, nothing is ever lost). Checkpoints come every Young/Daly
        interval from the zone's mean time to preemption (``mttp_h``; None: estimated online).
    checkpoint_write_h: time until a checkpoint is durable. A voluntary changeover waits for it (the
        old instance is billed meanwhile; the new one boots in parallel).
    notice_h: preemption notice (AWS 2 min, GCP 30 s; 0: none). When it covers the snapshot and the
        write, the job checkpoints just in time and loses at most the notice window; otherwise it
        loses the work since its last periodic checkpoint.
    move_h: checkpoint transfer when the job starts in another zone than the one its checkpoint is in.
    prior_mean_run_h: the policy's prior mean run of capacity for a zone it has not watched yet.
    """

    checkpoint_cost_h: float = 0.0
    params: PolicyParams = field(default_factory=lambda: DEFAULT_PARAMS)
    mttp_h: tuple[float, ...] | None = None  # per zone; None: estimated online from the trace so far
    timeline: bool = False
    checkpoint_write_h: float = 0.0
    notice_h: float = 0.0
    move_h: float = 0.0
    prior_mean_run_h: float = PRIOR_MEAN_RUN_H

    @property
    def just_in_time(self) -> bool:
        return self.notice_h > 0 and self.notice_h >= self.checkpoint_cost_h + self.checkpoint_write_h

    @staticmethod
    def measured(state_gb: float = 14.8, write_gbps: float | None = None, snapshot_gbps: float | None = None,
                 notice_s: float = 120.0, transfer_gbps: float | None = None) -> SimOptions:
        """Honest costs from the checkpoint issue's measured speeds (planner/calibration.py
        CostCalibration: ``checkpoint_write_gbps``, ``checkpoint_snapshot_gbps``, ``min_checkpoint_h``;
        docs/PERFORMANCE.md: 14.8 GB of state durable in ~3.3 s, the loop stalls 0.29 s). A zone move
        copies the checkpoint at ``transfer_gbps`` (default: the write speed)."""
        from planner.calibration import CostCalibration

        cal = CostCalibration()
        write = write_gbps or cal.checkpoint_write_gbps
        snap = snapshot_gbps or cal.checkpoint_snapshot_gbps
        return SimOptions(
            checkpoint_cost_h=state_gb / snap / 3600.0 + cal.min_checkpoint_h,
            checkpoint_write_h=state_gb / write / 3600.0,
            notice_h=notice_s / 3600.0,
            move_h=state_gb / (transfer_gbps or write) / 3600.0,
        )


def _spot_prices(zones: Zones, prices: Prices) -> FloatArray:
    return np.where(np.isnan(zones.prices), prices.spot, zones.prices)


def young_daly_array(c: float, mtbf: FloatArray) -> FloatArray:
    """:func:`scheduler.policy.young_daly_interval` over an array of mean times between failures."""
    if c <= 0:
        return np.zeros_like(mtbf)
    m = np.maximum(mtbf, 1e-12)
    ratio = np.minimum(c / (2 * m), 1.0)
    tau = np.sqrt(2 * c * m) * (1 + np.sqrt(ratio) / 3 + ratio / 9) - c
    return np.where(np.isinf(mtbf), np.inf, np.where(c >= 2 * m, m, tau))


def online_mean_run(zones: Zones, prior_mean_run_h: float) -> FloatArray:
    """Per zone and tick: the mean run of capacity the policy estimates from ticks before this one
    (:func:`scheduler.policy.mean_run_estimate`), never from the future."""
    av = zones.available
    up = np.concatenate([np.zeros((av.shape[0], 1)), np.cumsum(av, axis=1)[:, :-1]], axis=1) * zones.gap_h
    ends = np.zeros(av.shape)
    ends[:, 1:] = np.cumsum(av[:, :-1] & ~av[:, 1:], axis=1)
    return mean_run_estimate(up, ends, prior_mean_run_h)


def _mean_runs(zones: Zones, opts: SimOptions) -> FloatArray:
    """(zones, ticks) mean time to preemption the policy and the checkpoint interval use."""
    if opts.mttp_h is None:
        return online_mean_run(zones, opts.prior_mean_run_h)
    if len(opts.mttp_h) != len(zones.names):
        raise InvalidInput(f"give one mean time to preemption per zone ({len(zones.names)})")
    return np.broadcast_to(np.asarray(opts.mttp_h, dtype=np.float64)[:, None], zones.available.shape)


def run_lengths(available: npt.NDArray[np.bool_]) -> FloatArray:
    """For each zone and tick: how many ticks the current run of availability has lasted (0 if none)."""
    z, t = available.shape
    idx = np.broadcast_to(np.arange(t), (z, t))
    last_off = np.maximum.accumulate(np.where(available, -1, idx), axis=1)
    return np.where(available, idx - last_off, 0).astype(np.float64)


def run_policy(zones: Zones, jobs: Jobs, policy: str, prices: Prices, opts: SimOptions | None = None) -> Outcome:
    """Simulate ``policy`` for every job at once until each finishes or the trace ends.

    Jobs advance in lock-step on their own clocks (step k = tick ``start + k`` of job i), so a thousand
    jobs spread over 45 days cost one pass over the longest job, not over the whole trace. With
    several zones a job on spot stays in its zone while it has capacity; when it (re)starts on spot it
    takes the available zone with the longest estimated mean run (:func:`scheduler.policy.choose_zone`).
    """
    check_policy(policy)
    opts = opts or SimOptions()
    c = opts.checkpoint_cost_h
    if min(c, opts.checkpoint_write_h, opts.notice_h, opts.move_h) < 0:
        raise InvalidInput("checkpoint, write, notice and move hours must be >= 0")
    n, gap = len(jobs), zones.gap_h
    spot_price = _spot_prices(zones, prices)
    if np.any(jobs.start_tick >= zones.ticks):
        raise InvalidInput(f"a job arrives after the trace ends ({zones.hours:.1f} h); use an earlier start hour")
    runs = run_lengths(zones.available)
    mean_run = _mean_runs(zones, opts)
    # Age of the outage of spot capacity in every zone (what a job without spot waits through).
    down_all = np.asarray(~zones.available.any(axis=0), dtype=bool)
    # (the tick that shows an outage starts it: it has lasted 0 h when first seen)
    all_down = np.maximum(run_lengths(down_all[None, :])[0] - 1.0, 0.0) * gap
    tau_all = young_daly_array(c, mean_run)  # hours of spot work between periodic checkpoints
    jit = opts.just_in_time
    write, move = opts.checkpoint_write_h, opts.move_h
    # Work a preemption loses on average: half an interval, at most the notice window with JIT.
    half = np.where(np.isfinite(tau_all), tau_all / 2, 0.0)
    loss_all = np.minimum(half, opts.notice_h) if jit else half
    n_zones = zones.available.shape[0]
    rows = np.arange(n)
    ratio = prices.on_demand / float(np.nanmedian(spot_price))

    market = np.zeros(n, dtype=np.int8)
    zone = np.zeros(n, dtype=np.int64)
    ckpt_zone = np.full(n, -1, dtype=np.int64)  # where the job's checkpoint is (-1: nowhere yet)
    done = np.zeros(n)
    unc = np.zeros(n)
    restart_left = np.zeros(n)
    cost = np.zeros(n)
    spot_h = np.zeros(n)
    od_h = np.zeros(n)
    lost = np.zeros(n)
    preempt = np.zeros(n, dtype=np.int64)
    finish = np.full(n, np.nan)
    finished = np.zeros(n, dtype=bool)
    start_h = np.zeros(n)
    steps = zones.ticks - int(jobs.start_tick.min())
    if np.all(np.isfinite(jobs.deadline_h)) and policy != "spot-only":
        # Deadline-aware policies finish by the deadline; nothing happens after the last one.
        steps = min(steps, int(np.ceil(np.max(jobs.deadline_h) / gap)) + 1)
    keep = opts.timeline
    tl_market = np.zeros((steps, n), dtype=np.int8) if keep else None
    tl_done = np.zeros((steps, n)) if keep else None
    tl_zone = np.zeros((steps, n), dtype=np.int64) if keep else None

    ran = 0
    for k in range(steps):
        ticks = jobs.start_tick + k
        in_trace = ticks < zones.ticks
        active = in_trace & ~finished
        if not active.any():
            break
        ran = k + 1
        tt = np.minimum(ticks, zones.ticks - 1)
        av = zones.available[:, tt].T  # (jobs, zones)
        here = av[rows, zone]
        # Preemption: capacity gone in the zone the job holds.
        pre = active & (market == SPOT) & ~here
        if pre.any():
            at_risk = np.minimum(unc, opts.notice_h) if jit else unc
            lost += np.where(pre, at_risk, 0.0)
            done -= np.where(pre, at_risk, 0.0)
            unc[pre] = 0.0
            market[pre] = NONE
            restart_left[pre] = 0.0
            preempt += pre
        spot_any: npt.NDArray[np.bool_] = np.asarray(av.any(axis=1), dtype=bool)
        means = mean_run[:, tt].T  # (jobs, zones)
        if n_zones > 1:
            # The zone a (re)start on spot would take: longest estimated mean run, then oldest run.
            score = np.where(av, means * 1e6 + runs[:, tt].T, -1.0)
            best_zone = np.argmax(score, axis=1)
            target = np.where((market == SPOT) & here, zone, np.where(spot_any, best_zone, np.argmax(means, axis=1)))
        else:
            best_zone = target = zone
        now = k * gap
        dec = decide_arrays(
            policy,
            work_done_h=done,
            work_total_h=jobs.work_h,
            now_h=now,
            deadline_h=jobs.deadline_h,
            start_h=start_h,
            restart_h=jobs.restart_h + np.where(ckpt_zone >= 0, move * (target != ckpt_zone), 0.0),
            current=market,
            spot_available=spot_any,
            uncommitted_h=np.minimum(unc, opts.notice_h) if jit else unc,
            tick_h=gap,
            params=opts.params,
            mean_run_h=means[rows, target],
            outage_age_h=all_down[tt],
            loss_h=loss_all[target, tt],
            switch_h=write,
            price_ratio=ratio,
        )
        dec = np.where(active, dec, market).astype(np.int8)
        new_zone = np.where((dec == SPOT) & ~((market == SPOT) & here), best_zone, zone) if n_zones > 1 else zone
        switch = active & ((dec != market) | (new_zone != zone))
        if switch.any():
            # A voluntary changeover checkpoints on the way out: the old instance is billed until the
            # checkpoint is durable; the new one boots meanwhile. A spot start in another zone than the
            # checkpoint's copies it there first.
            leaving = switch & (market != NONE)
            old_price = np.where(market == SPOT, spot_price[zone, tt], prices.on_demand)
            cost += np.where(leaving, old_price * write, 0.0)
            spot_h += np.where(leaving & (market == SPOT), write, 0.0)
            od_h += np.where(leaving & (market == ON_DEMAND), write, 0.0)
            ckpt_zone = np.where(leaving, np.where(market == SPOT, zone, ckpt_zone), ckpt_zone)
            unc[switch] = 0.0
            moved = (dec == SPOT) & (ckpt_zone >= 0) & (new_zone != ckpt_zone)
            delay = np.maximum(jobs.restart_h, np.where(leaving, write, 0.0)) + np.where(moved, move, 0.0)
            restart_left = np.where(switch, np.where(dec != WAIT, delay, 0.0), restart_left)
            market = dec
            zone = new_zone
            ckpt_zone = np.where(switch & (dec == SPOT), zone, ckpt_zone)
        ckpt_zone = np.where((market == ON_DEMAND) & (ckpt_zone < 0), zone, ckpt_zone)
        running = active & (market != NONE)
        if running.any():
            on_spot = market == SPOT
            price = np.where(on_spot, spot_price[zone, tt], prices.on_demand)
            r_used = np.where(running, np.minimum(restart_left, gap), 0.0)
            restart_left -= r_used
            tau_z = tau_all[zone, tt]
            periodic = on_spot & (tau_z > 0) & np.isfinite(tau_z)
            rate = np.where(periodic, np.where(periodic, tau_z, 1.0) / (np.where(periodic, tau_z, 1.0) + c), 1.0)
            gain = np.where(running, np.minimum((gap - r_used) * rate, jobs.work_h - done), 0.0)
            used = r_used + gain / rate
            cost += price * used
            spot_h += np.where(on_spot, used, 0.0)
            od_h += np.where(market == ON_DEMAND, used, 0.0)
            done += gain
            if c > 0:
                safe_tau = np.where(periodic, tau_z, 1.0)
                unc = np.where(periodic, unc + gain, 0.0)
                unc = np.where(periodic & (unc >= safe_tau), np.fmod(unc, safe_tau), unc)
            now_done = running & (done >= jobs.work_h - _EPS)
            if now_done.any():
                finish = np.where(now_done, now + used, finish)
                finished |= now_done
                market = np.where(now_done, NONE, market).astype(np.int8)
                unc[now_done] = 0.0
        if keep:
            assert tl_market is not None and tl_done is not None and tl_zone is not None
            tl_market[k] = np.where(finished & (finish > now), dec, market)
            tl_done[k], tl_zone[k] = done, zone
    return Outcome(
        policy=policy,
        cost_usd=cost,
        finish_h=finish,
        preemptions=preempt,
        work_lost_h=lost,
        spot_h=spot_h,
        on_demand_h=od_h,
        deadline_h=jobs.deadline_h.copy(),
        timeline_market=None if tl_market is None else tl_market[:ran],
        timeline_done=None if tl_done is None else tl_done[:ran],
        timeline_zone=None if tl_zone is None else tl_zone[:ran],
    )


def omniscient(zones: Zones, jobs: Jobs, prices: Prices, resolution: int = 2) -> Outcome:
    """The cheapest way to meet each deadline knowing the whole future trace (a lower bound).

    Dynamic program over ticks; state = (idle | on-demand | spot in zone z, progress on a grid of
    ``gap / resolution``). A start or changeover moves progress back by the restart delay (a debt
    paid before work resumes). Jobs are batched by (work, deadline, restart). Jobs without a deadline
    get the bound over the rest of the trace.
    """
    if resolution < 1:
        raise InvalidInput("resolution must be >= 1")
    n = len(jobs)
    out = Outcome(
        policy="omniscient",
        cost_usd=np.full(n, np.nan),
        finish_h=np.full(n, np.nan),
        preemptions=np.zeros(n, dtype=np.int64),
        work_lost_h=np.zeros(n),
        spot_h=np.full(n, np.nan),
        on_demand_h=np.full(n, np.nan),
        deadline_h=jobs.deadline_h.copy(),
    )
    keys = np.stack([jobs.work_h, jobs.deadline_h, jobs.restart_h], axis=1)
    groups: dict[tuple[float, float, float], list[int]] = {}
    for i, key in enumerate(map(tuple, keys)):
        groups.setdefault((float(key[0]), float(key[1]), float(key[2])), []).append(i)
    spot_price = _spot_prices(zones, prices)
    for (work, deadline, restart), idx in groups.items():
        cost, fin = _omniscient_group(zones, spot_price, prices.on_demand, jobs.start_tick[idx], work, deadline,
                                      restart, resolution)
        out.cost_usd[idx] = cost
        out.finish_h[idx] = fin
    # A bound, not a schedule: report finish only where the job could finish at all.
    out.finish_h = np.where(np.isfinite(out.cost_usd), out.finish_h, np.nan)
    return out


def _omniscient_group(
    zones: Zones,
    spot_price: FloatArray,
    od_price: float,
    starts: IntArray,
    work: float,
    deadline: float,
    restart: float,
    k: int,
) -> tuple[FloatArray, FloatArray]:
    gap = zones.gap_h
    q = gap / k
    p_units = max(1, math.floor(work / q + 1e-9))
    r_units = math.floor(restart / q + 1e-9)
    length = p_units + r_units  # index j = progress + r_units, progress in [-r_units, p_units)
    n_zones = zones.available.shape[0]
    b = starts.shape[0]
    horizon = zones.ticks - int(starts.max()) if not math.isfinite(deadline) else math.ceil(deadline / gap - 1e-9)
    inf = np.inf
    states = 2 + n_zones  # 0 idle, 1 on-demand, 2+z spot in zone z
    c = np.full((b, states, length), inf)
    c[:, 0, r_units] = 0.0
    best = np.full(b, inf)
    best_t = np.full(b, np.nan)
    # Finishing from index j within a tick costs price * (length - j) * q (the work left, restart debt included).
    need_h = (length - np.arange(length)) * q
    for step in range(horizon):
        ticks = starts + step
        valid = ticks < zones.ticks
        if not valid.any():
            break
        # Only progress that can still finish by the deadline and that could have been reached
        # matters: a window [lo, hi) of the grid (this keeps tight deadlines cheap).
        lo = max(0, length - (horizon - step) * k) if math.isfinite(deadline) else 0
        hi = min(length, r_units + step * k + 1)
        if lo >= hi:
            break
        tt = np.minimum(ticks, zones.ticks - 1)
        av = zones.available[:, tt].T & valid[:, None]  # (b, zones)
        cw = c[:, :, lo:hi]
        any_state = cw.min(axis=1)  # (b, width)
        width = hi - lo
        launched = np.full((b, width), inf)
        # Launching moves progress back by the restart delay (index j -> j - r_units).
        src_lo = lo + r_units
        if src_lo < hi:
            launched[:, : hi - src_lo] = any_state[:, r_units:] if r_units else any_state
        new = np.full((b, states, length), inf)
        new[:, 0, lo:hi] = any_state
        prices_now = np.concatenate([np.full((b, 1), od_price), spot_price[:, tt].T], axis=1)
        for s in range(1, states):
            pre = np.minimum(cw[:, s], launched)
            held = av[:, s - 2 : s - 1] if s >= 2 else valid[:, None]
            pre = np.where(held, pre, inf)
            price = prices_now[:, s - 1 : s]
            # Running a whole tick: j -> j + k, unless that reaches the end (finish within the tick).
            cut = max(lo, min(hi, length - k))  # indices < cut do not finish this tick
            if cut > lo:
                new[:, s, lo + k : cut + k] = pre[:, : cut - lo] + price * gap
            if cut < hi:
                tail = pre[:, cut - lo :] + price * need_h[cut:hi]
                fin = tail.min(axis=1)
                improved = fin < best - 1e-12
                best = np.where(improved, fin, best)
                best_t = np.where(improved, step * gap + gap, best_t)
        c = new
    # Finish time: the tick in which the cheapest schedule ends (upper end of that tick).
    return best, np.minimum(best_t, deadline)


def default_resolution(zones: Zones, jobs: Jobs) -> int:
    """Grid steps per tick for the bound: finer for coarse traces, keeping ~2000 progress steps per job."""
    ticks_of_work = float(np.max(jobs.work_h)) / zones.gap_h
    return int(max(1, min(4, 2000 // max(ticks_of_work, 1.0))))


def compare(
    zones: Zones,
    jobs: Jobs,
    prices: Prices,
    policies: Sequence[str] = ALL_POLICIES,
    opts: SimOptions | None = None,
    resolution: int | None = None,
) -> dict[str, Outcome]:
    """Every policy (and the omniscient bound) on the same jobs and traces."""
    out: dict[str, Outcome] = {}
    for name in policies:
        if name == "omniscient":
            out[name] = omniscient(zones, jobs, prices, resolution=resolution or default_resolution(zones, jobs))
        elif name in POLICIES:
            out[name] = run_policy(zones, jobs, name, prices, opts)
        else:
            from catalog.errors import UnknownName

            raise UnknownName("policy", name, ALL_POLICIES)
    return out


def summarize(outcomes: dict[str, Outcome]) -> dict[str, dict[str, object]]:
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
    "Outcome",
    "Prices",
    "SimOptions",
    "compare",
    "omniscient",
    "run_policy",
    "start_tick_for",
    "summarize",
]
