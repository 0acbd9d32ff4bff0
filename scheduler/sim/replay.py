"""Replay spot traces through the policy code, every job at once (:func:`run_policy`).

The model is :mod:`scheduler.sim.simulate`'s; each tick is a sequence of named steps over arrays of
jobs: preemptions, the zone a spot start would take, the policy's decision
(:func:`scheduler.spot.policy.decide_arrays`, what the server's loop runs through ``decide``),
changeovers (checkpoint, restart, transfer), then the work. With ``SimOptions.make_before_break`` a
job on on-demand may boot spot beside it (BOOT_SPOT): on-demand keeps working, the booting instance is
billed by the tick while its zone keeps capacity, and the job moves at the first tick after the boot
(:func:`_boots`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from errors import InvalidInput
from scheduler.sim.model import FloatArray, IntArray, Jobs, PolicyOutcome, Prices, SimOptions, spot_prices
from scheduler.sim.traces import Zones
from scheduler.spot.market_codes import BOOT_SPOT, NONE, ON_DEMAND, SPOT, WAIT
from scheduler.spot.policy import (
    PRIOR_MEAN_OUTAGE_H,
    RATE_HALF_LIFE_H,
    check_policy,
    decide_arrays,
    mean_run_estimate,
)

_EPS = 1e-9


def young_daly_array(c: float, mtbf: FloatArray) -> FloatArray:
    """:func:`scheduler.spot.policy.young_daly_interval` over an array of mean times between failures."""
    if c <= 0:
        return np.zeros_like(mtbf)
    m = np.maximum(mtbf, 1e-12)
    ratio = np.minimum(c / (2 * m), 1.0)
    tau = np.sqrt(2 * c * m) * (1 + np.sqrt(ratio) / 3 + ratio / 9) - c
    return np.where(np.isinf(mtbf), np.inf, np.where(c >= 2 * m, m, tau))


def _online_mean(state: npt.NDArray[np.bool_], gap_h: float, prior_h: float, half_life_h: float) -> FloatArray:
    """Per row and tick: the mean length of a spell of ``state`` estimated from ticks before this one
    (:func:`scheduler.spot.policy.mean_run_estimate`), never from the future: hours in the state and spells
    ended (an end is seen at the first tick out of the state) weighted by recency, as
    :meth:`scheduler.spot.policy.ZoneSeen.step` counts them (``half_life_h`` inf: no decay)."""
    ended = np.zeros(state.shape)
    ended[:, 1:] = state[:, :-1] & ~state[:, 1:]
    if not np.isfinite(half_life_h):
        hours = np.concatenate([np.zeros((state.shape[0], 1)), np.cumsum(state, axis=1)[:, :-1]], axis=1) * gap_h
        return mean_run_estimate(hours, np.cumsum(ended, axis=1), prior_h)
    keep = 0.5 ** (gap_h / half_life_h)
    hours_w = np.zeros(state.shape)
    ends_w = np.zeros(state.shape)
    hours_k = np.zeros(state.shape[0])
    ends_k = np.zeros(state.shape[0])
    for k in range(state.shape[1]):  # ZoneSeen.step over ticks < k, then what tick k shows
        hours_w[:, k], ends_w[:, k] = hours_k, ends_k + ended[:, k]
        hours_k = hours_k * keep + state[:, k] * gap_h
        ends_k = ends_k * keep + ended[:, k]
    return mean_run_estimate(hours_w, ends_w, prior_h)


def online_mean_run(zones: Zones, prior_mean_run_h: float, half_life_h: float = RATE_HALF_LIFE_H) -> FloatArray:
    """Per zone and tick: the mean run of capacity the policy estimates from ticks before this one: hours up
    and preemptions (a preemption is seen at the tick without capacity), see :func:`_online_mean`."""
    return _online_mean(zones.available, zones.gap_h, prior_mean_run_h, half_life_h)


def online_mean_outage(zones: Zones, prior_mean_outage_h: float, half_life_h: float = RATE_HALF_LIFE_H) -> FloatArray:
    """Per zone and tick: the mean outage the policy estimates, counted like :func:`online_mean_run` with the
    roles of capacity and outage swapped (an outage ends at the tick that shows capacity again)."""
    return _online_mean(~zones.available, zones.gap_h, prior_mean_outage_h, half_life_h)


def _per_zone(given: tuple[float, ...] | None, online: Callable[[], FloatArray], zones: Zones,
              what: str) -> FloatArray:
    """(zones, ticks): the per-zone values the options give, else the online estimate."""
    if given is None:
        return online()
    if len(given) != len(zones.names) or not all(x > 0 for x in given):
        raise InvalidInput(f"give one positive {what} per zone ({len(zones.names)}), in hours")
    return np.broadcast_to(np.asarray(given, dtype=np.float64)[:, None], zones.available.shape)


def _mean_runs(zones: Zones, opts: SimOptions) -> FloatArray:
    """(zones, ticks) mean time to preemption the policy and the checkpoint interval use."""
    return _per_zone(opts.mttp_h, lambda: online_mean_run(zones, opts.prior_mean_run_h, opts.rate_half_life_h),
                     zones, "mean time to preemption")


def run_lengths(available: npt.NDArray[np.bool_]) -> FloatArray:
    """For each zone and tick: how many ticks the current run of availability has lasted (0 if none)."""
    z, t = available.shape
    idx = np.broadcast_to(np.arange(t), (z, t))
    last_off = np.maximum.accumulate(np.where(available, -1, idx), axis=1)
    return np.where(available, idx - last_off, 0).astype(np.float64)


@dataclass(frozen=True)
class _Setup:
    """What :func:`run_policy` derives from the traces and options once, per zone and tick."""

    opts: SimOptions
    gap: float
    spot_price: FloatArray  # (zones, ticks) $/h
    runs: FloatArray  # (zones, ticks) age of the current run of capacity, in ticks
    mean_run: FloatArray  # (zones, ticks) mean run of capacity the policy estimates
    mean_outage: FloatArray  # (zones, ticks) mean outage the policy estimates
    all_down: FloatArray  # (ticks,) hours the outage of every zone has lasted
    tau: FloatArray  # (zones, ticks) hours of spot work between periodic checkpoints
    loss: FloatArray  # (zones, ticks) work a preemption loses on average
    od_price: float

    @property
    def n_zones(self) -> int:
        return int(self.runs.shape[0])

    def at_risk(self, unc: FloatArray) -> FloatArray:
        """Work a preemption now loses: what is not checkpointed, at most the notice's loss with JIT."""
        return self.opts.preemption_loss_h(unc)


def _setup(zones: Zones, prices: Prices, opts: SimOptions) -> _Setup:
    if min(opts.checkpoint_cost_h, opts.checkpoint_write_h, opts.notice_h, opts.move_h, opts.jit_reserve_h) < 0:
        raise InvalidInput("checkpoint, write, notice, move and just-in-time reserve hours must be >= 0")
    spot_price = spot_prices(zones, prices)
    mean_run = _mean_runs(zones, opts)
    # Age of the outage of spot capacity in every zone (what a job without spot waits through);
    # the tick that shows an outage starts it: it has lasted 0 h when first seen.
    down_all = np.asarray(~zones.available.any(axis=0), dtype=bool)
    all_down = np.maximum(run_lengths(down_all[None, :])[0] - 1.0, 0.0) * zones.gap_h
    tau = young_daly_array(opts.checkpoint_cost_h, mean_run)
    half = np.where(np.isfinite(tau), tau / 2, 0.0)  # a preemption loses half an interval on average
    loss = opts.preemption_loss_h(half)
    mean_outage = _per_zone(opts.mean_outage_h,
                            lambda: online_mean_outage(zones, PRIOR_MEAN_OUTAGE_H, opts.rate_half_life_h),
                            zones, "mean outage")
    return _Setup(opts, zones.gap_h, spot_price, run_lengths(zones.available), mean_run, mean_outage, all_down, tau,
                  loss, prices.on_demand)


@dataclass
class _State:
    """Every job's state and tallies during :func:`run_policy` (arrays over jobs)."""

    market: npt.NDArray[np.int8]
    zone: IntArray
    ckpt_zone: IntArray  # where the job's checkpoint is (-1: nowhere yet)
    done: FloatArray
    unc: FloatArray  # work since the last checkpoint
    restart_left: FloatArray
    cost: FloatArray
    spot_h: FloatArray
    od_h: FloatArray
    lost: FloatArray
    preempt: IntArray
    finish: FloatArray
    finished: npt.NDArray[np.bool_]
    booting: npt.NDArray[np.bool_]  # a spot instance boots beside the job's on-demand one
    boot_zone: IntArray
    boot_left: FloatArray  # hours of the boot still to go
    boots: IntArray  # boots begun
    boots_lost: IntArray  # boots whose zone lost its capacity before the job moved

    @staticmethod
    def start(n: int) -> _State:
        return _State(np.zeros(n, dtype=np.int8), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                      np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n),
                      np.zeros(n, dtype=np.int64), np.full(n, np.nan), np.zeros(n, dtype=bool),
                      np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n, dtype=np.int64),
                      np.zeros(n, dtype=np.int64))


def _preempt(s: _State, setup: _Setup, pre: npt.NDArray[np.bool_]) -> None:
    """Jobs on spot whose zone lost its capacity: the work at risk is lost, the market is gone."""
    if not pre.any():
        return
    at_risk = setup.at_risk(s.unc)
    s.lost += np.where(pre, at_risk, 0.0)
    s.done -= np.where(pre, at_risk, 0.0)
    s.unc[pre] = 0.0
    s.market[pre] = NONE
    s.restart_left[pre] = 0.0
    s.preempt += pre


def _boots(s: _State, setup: _Setup, av: npt.NDArray[np.bool_], rows: IntArray,
           active: npt.NDArray[np.bool_], tt: IntArray) -> npt.NDArray[np.bool_]:
    """Spot instances booting beside on-demand, at a tick's start: one whose zone has no capacity now is
    gone (it was billed while it lived); one whose boot has run its time takes the job, a changeover whose new
    instance is up already (:func:`_change_over` without a restart: on-demand is billed until the checkpoint
    is durable, the spot instance waits for it and its transfer from another zone). Returns the jobs that
    moved."""
    if not s.booting.any():
        return np.zeros_like(s.booting)
    up = av[rows, s.boot_zone]
    lost = s.booting & active & ~up
    s.boots_lost += lost
    s.booting &= ~lost
    moving = s.booting & active & (s.boot_left <= _EPS)
    if moving.any():
        _change_over(s, setup, 0.0, moving, np.where(moving, SPOT, s.market).astype(np.int8),
                     np.where(moving, s.boot_zone, s.zone), tt)
        s.booting &= ~moving
    return moving


def _boot_ticks(s: _State, setup: _Setup, running: npt.NDArray[np.bool_], tt: IntArray) -> None:
    """A booting spot instance is billed for every tick it lives (whole ticks: the job moves at a tick's
    start); a job that finishes on on-demand meanwhile gives it up."""
    billed = s.booting & running
    if billed.any():
        s.cost += np.where(billed, setup.spot_price[s.boot_zone, tt] * setup.gap, 0.0)
        s.spot_h += np.where(billed, setup.gap, 0.0)
        s.boot_left = np.where(billed, s.boot_left - setup.gap, s.boot_left)
    s.booting &= ~s.finished


def _zones_for(s: _State, setup: _Setup, av: npt.NDArray[np.bool_], here: npt.NDArray[np.bool_],
               means: FloatArray, tt: IntArray) -> tuple[IntArray, IntArray]:
    """(the zone a spot (re)start takes now, the zone whose rates the policy reads) per job: a job on
    spot stays where capacity lasts; a start takes the longest estimated mean run, then the oldest run
    (:func:`scheduler.spot.policy.choose_zone`); with no capacity anywhere, the best zone once it returns."""
    if setup.n_zones == 1:
        return s.zone, s.zone
    score = np.where(av, means * 1e6 + setup.runs[:, tt].T, -1.0)
    best_zone = np.argmax(score, axis=1)
    spot_any = av.any(axis=1)
    target = np.where((s.market == SPOT) & here, s.zone, np.where(spot_any, best_zone, np.argmax(means, axis=1)))
    return best_zone, target


def _decisions(policy: str, s: _State, setup: _Setup, jobs: Jobs, now: float, tt: IntArray, target: IntArray,
               means: FloatArray, spot_any: npt.NDArray[np.bool_]) -> npt.NDArray[np.int8]:
    """The policy's market per job (:func:`scheduler.spot.policy.decide_arrays`, what the server runs); a start
    away from the checkpoint's zone pays the transfer on top of the restart."""
    move = setup.opts.move_h * (target != s.ckpt_zone)
    return decide_arrays(
        policy, work_done_h=s.done, work_total_h=jobs.work_h, now_h=now, deadline_h=jobs.deadline_h,
        start_h=np.zeros(len(jobs)), restart_h=jobs.restart_h + np.where(s.ckpt_zone >= 0, move, 0.0),
        current=s.market, spot_available=spot_any, uncommitted_h=setup.at_risk(s.unc), tick_h=setup.gap,
        mean_run_h=means[np.arange(len(jobs)), target], outage_age_h=setup.all_down[tt],
        loss_h=setup.loss[target, tt], switch_h=setup.opts.checkpoint_write_h,
        # The spot price now in the zone the job would run in: what the caller sees (the median over
        # the whole trace, used before, read the future).
        price_ratio=setup.od_price / setup.spot_price[target, tt],
        mean_outage_h=setup.mean_outage[target, tt],
        # The run of capacity in the zone the job would run in: its age at the tick's start (none: unknown).
        run_age_h=np.where(setup.runs[target, tt] > 0, (setup.runs[target, tt] - 1.0) * setup.gap, np.inf),
        make_before_break=setup.opts.make_before_break,
    )


def _change_over(s: _State, setup: _Setup, restart_h: FloatArray | float, switch: npt.NDArray[np.bool_],
                 dec: npt.NDArray[np.int8], new_zone: IntArray, tt: IntArray) -> None:
    """A voluntary changeover checkpoints on the way out: the old instance is billed until the
    checkpoint is durable; the new one boots meanwhile (``restart_h``; 0: it is up already). A spot start
    in another zone than the checkpoint's copies it there first."""
    if switch.any():
        write, move = setup.opts.checkpoint_write_h, setup.opts.move_h
        leaving = switch & (s.market != NONE)
        old_price = np.where(s.market == SPOT, setup.spot_price[s.zone, tt], setup.od_price)
        s.cost += np.where(leaving, old_price * write, 0.0)
        s.spot_h += np.where(leaving & (s.market == SPOT), write, 0.0)
        s.od_h += np.where(leaving & (s.market == ON_DEMAND), write, 0.0)
        s.ckpt_zone = np.where(leaving, np.where(s.market == SPOT, s.zone, s.ckpt_zone), s.ckpt_zone)
        s.unc[switch] = 0.0
        moved = (dec == SPOT) & (s.ckpt_zone >= 0) & (new_zone != s.ckpt_zone)
        delay = np.maximum(restart_h, np.where(leaving, write, 0.0)) + np.where(moved, move, 0.0)
        s.restart_left = np.where(switch, np.where(dec != WAIT, delay, 0.0), s.restart_left)
        s.market = dec
        s.zone = new_zone
        s.ckpt_zone = np.where(switch & (dec == SPOT), s.zone, s.ckpt_zone)
    s.ckpt_zone = np.where((s.market == ON_DEMAND) & (s.ckpt_zone < 0), s.zone, s.ckpt_zone)


def _work(s: _State, setup: _Setup, jobs: Jobs, running: npt.NDArray[np.bool_], tt: IntArray, now: float) -> None:
    """One tick on the instances held: restart first, then work (slowed by periodic checkpoints on
    spot), billed at the tick's price; a job that reaches its work finishes within the tick."""
    if not running.any():
        return
    gap, c = setup.gap, setup.opts.checkpoint_cost_h
    on_spot = s.market == SPOT
    price = np.where(on_spot, setup.spot_price[s.zone, tt], setup.od_price)
    r_used = np.where(running, np.minimum(s.restart_left, gap), 0.0)
    s.restart_left -= r_used
    tau_z = setup.tau[s.zone, tt]
    periodic = on_spot & (tau_z > 0) & np.isfinite(tau_z)
    safe_tau = np.where(periodic, tau_z, 1.0)
    rate = np.where(periodic, safe_tau / (safe_tau + c), 1.0)
    gain = np.where(running, np.minimum((gap - r_used) * rate, jobs.work_h - s.done), 0.0)
    used = r_used + gain / rate
    s.cost += price * used
    s.spot_h += np.where(on_spot, used, 0.0)
    s.od_h += np.where(s.market == ON_DEMAND, used, 0.0)
    s.done += gain
    if c > 0:
        s.unc = np.where(periodic, s.unc + gain, 0.0)
        s.unc = np.where(periodic & (s.unc >= safe_tau), np.fmod(s.unc, safe_tau), s.unc)
    now_done = running & (s.done >= jobs.work_h - _EPS)
    if now_done.any():
        s.finish = np.where(now_done, now + used, s.finish)
        s.finished |= now_done
        s.market = np.where(now_done, NONE, s.market).astype(np.int8)
        s.unc[now_done] = 0.0


def run_policy(zones: Zones, jobs: Jobs, policy: str, prices: Prices, opts: SimOptions | None = None) -> PolicyOutcome:
    """Simulate ``policy`` for every job at once until each finishes or the trace ends.

    Jobs advance in lock-step on their own clocks (step k = tick ``start + k`` of job i), so a thousand
    jobs spread over 45 days cost one pass over the longest job, not over the whole trace. Each step:
    preemptions, the zone a spot start would take, the policy's decision, changeovers, then the work.
    """
    check_policy(policy)
    opts = opts or SimOptions()
    if np.any(jobs.start_tick >= zones.ticks):
        raise InvalidInput(f"a job arrives after the trace ends ({zones.hours:.1f} h); use an earlier start hour")
    setup = _setup(zones, prices, opts)
    n = len(jobs)
    rows = np.arange(n)
    s = _State.start(n)
    steps = _steps(zones, jobs, policy)
    timeline = _Timeline.empty(steps, n) if opts.timeline else None
    ran = 0
    for k in range(steps):
        ticks = jobs.start_tick + k
        active = (ticks < zones.ticks) & ~s.finished
        if not active.any():
            break
        ran = k + 1
        tt = np.minimum(ticks, zones.ticks - 1)
        av = zones.available[:, tt].T  # (jobs, zones)
        here = av[rows, s.zone]
        _preempt(s, setup, active & (s.market == SPOT) & ~here)
        moved = _boots(s, setup, av, rows, active, tt)
        here = av[rows, s.zone]
        spot_any: npt.NDArray[np.bool_] = np.asarray(av.any(axis=1), dtype=bool)
        means = setup.mean_run[:, tt].T  # (jobs, zones)
        best_zone, target = _zones_for(s, setup, av, here, means, tt)
        dec = _decisions(policy, s, setup, jobs, k * setup.gap, tt, target, means, spot_any)
        # A job booting spot, or just moved onto it, holds its market this tick.
        dec = np.where(active & ~s.booting & ~moved, dec, s.market).astype(np.int8)
        # Beside an on-demand instance that is up: one still starting works through nothing, and the slack the
        # policy saw did not count what is left of its start.
        boot = active & (dec == BOOT_SPOT)
        dec = np.where(boot & (s.restart_left > _EPS), ON_DEMAND, dec).astype(np.int8)
        boot &= s.restart_left <= _EPS
        if boot.any():
            s.booting |= boot
            s.boots += boot
            s.boot_zone = np.where(boot, best_zone, s.boot_zone)
            s.boot_left = np.where(boot, jobs.restart_h, s.boot_left)
            dec = np.where(boot, s.market, dec).astype(np.int8)
        new_zone = np.where((dec == SPOT) & ~((s.market == SPOT) & here), best_zone, s.zone)
        _change_over(s, setup, jobs.restart_h, active & ((dec != s.market) | (new_zone != s.zone)), dec, new_zone,
                     tt)
        running = active & (s.market != NONE)
        _work(s, setup, jobs, running, tt, k * setup.gap)
        _boot_ticks(s, setup, running, tt)
        if timeline is not None:
            timeline.record(k, np.where(s.finished & (s.finish > k * setup.gap), dec, s.market), s)
    out = PolicyOutcome(policy=policy, cost_usd=s.cost, finish_h=s.finish, preemptions=s.preempt, work_lost_h=s.lost,
                  spot_h=s.spot_h, on_demand_h=s.od_h, deadline_h=jobs.deadline_h.copy(), boots=s.boots,
                  boots_lost=s.boots_lost)
    if timeline is not None:
        out.timeline_market, out.timeline_done, out.timeline_zone = timeline.upto(ran)
    return out


def _steps(zones: Zones, jobs: Jobs, policy: str) -> int:
    """How many ticks to replay: to the end of the trace, or just past the last deadline when every
    job has one (deadline-aware policies finish by it; nothing happens after)."""
    steps = zones.ticks - int(jobs.start_tick.min())
    if np.all(np.isfinite(jobs.deadline_h)) and policy != "spot-only":
        steps = min(steps, int(np.ceil(np.max(jobs.deadline_h) / zones.gap_h)) + 1)
    return steps


@dataclass
class _Timeline:
    """Per tick and job, for plots: market code, progress and zone."""

    market: npt.NDArray[np.int8]
    done: FloatArray
    zone: IntArray

    @staticmethod
    def empty(steps: int, n: int) -> _Timeline:
        shape = (steps, n)
        return _Timeline(np.zeros(shape, dtype=np.int8), np.zeros(shape), np.zeros(shape, dtype=np.int64))

    def record(self, k: int, market: npt.NDArray[np.int8], s: _State) -> None:
        self.market[k], self.done[k], self.zone[k] = market, s.done, s.zone

    def upto(self, ran: int) -> tuple[npt.NDArray[np.int8], FloatArray, IntArray]:
        return self.market[:ran], self.done[:ran], self.zone[:ran]
