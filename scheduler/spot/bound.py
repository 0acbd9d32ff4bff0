"""The omniscient bound: the cheapest way to meet each deadline knowing the whole future trace."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from errors import InvalidInput
from scheduler.sim.model import FloatArray, IntArray, Jobs, PolicyOutcome, Prices, spot_prices
from scheduler.sim.traces import Zones


def omniscient(zones: Zones, jobs: Jobs, prices: Prices, resolution: int = 2,
               make_before_break: bool = False) -> PolicyOutcome:
    """The cheapest way to meet each deadline knowing the whole future trace (a lower bound).

    Dynamic program over ticks; state = (idle | on-demand | spot in zone z, progress on a grid of
    ``gap / resolution``). A start or changeover moves progress back by the restart delay (a debt
    paid before work resumes). Jobs are batched by (work, deadline, restart). Jobs without a deadline
    get the bound over the rest of the trace.

    ``make_before_break``: what the replay's BOOT_SPOT does (:func:`boot_windows`): from on-demand to spot
    without losing time, where the zone had capacity through the boot's whole ticks before, paying the spot
    price of those ticks (the replay pays that too, then the checkpoint write).
    """
    if resolution < 1:
        raise InvalidInput("resolution must be >= 1")
    n = len(jobs)
    out = PolicyOutcome(
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
    spot_price = spot_prices(zones, prices)
    for (work, deadline, restart), idx in groups.items():
        cost, fin = _omniscient_group(zones, spot_price, prices.on_demand, jobs.start_tick[idx], work, deadline,
                                      restart, resolution, make_before_break)
        out.cost_usd[idx] = cost
        out.finish_h[idx] = fin
    # A bound, not a schedule: report finish only where the job could finish at all.
    out.finish_h = np.where(np.isfinite(out.cost_usd), out.finish_h, np.nan)
    return out


def boot_windows(available: npt.NDArray[np.bool_], spot_price: FloatArray, gap_h: float,
                 restart_h: float) -> tuple[npt.NDArray[np.bool_], FloatArray]:
    """Per zone and tick T: whether a spot boot beside on-demand could have moved the job to spot at T (the zone
    had capacity at every tick from T - K to T, K = the restart in whole ticks, the replay's boot), and what the
    boot cost (the spot price of ticks T - K .. T - 1, a whole tick each)."""
    k = math.ceil(restart_h / gap_h - 1e-9)
    zones, ticks = available.shape
    up = np.concatenate([np.zeros((zones, 1)), np.cumsum(available, axis=1)], axis=1)
    paid = np.concatenate([np.zeros((zones, 1)), np.cumsum(spot_price, axis=1)], axis=1)
    t = np.arange(ticks)
    first = np.maximum(t - k, 0)
    ok = (t >= k) & (up[:, t + 1] - up[:, first] == k + 1)
    return ok, (paid[:, t] - paid[:, first]) * gap_h


def _omniscient_group(
    zones: Zones,
    spot_price: FloatArray,
    od_price: float,
    starts: IntArray,
    work: float,
    deadline: float,
    restart: float,
    k: int,
    warm: bool = False,
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
    if warm:
        boot_ok, boot_usd = boot_windows(zones.available, spot_price, gap, restart)
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
        best, best_t = _run_tick(new, cw, launched, av, valid, prices_now, (lo, hi), k, gap, need_h, best, best_t,
                                 step * gap + gap, (boot_ok[:, tt], boot_usd[:, tt]) if warm else None)
        c = new
    # Finish time: the tick in which the cheapest schedule ends (upper end of that tick).
    return best, np.minimum(best_t, deadline)


def _run_tick(new: FloatArray, cw: FloatArray, launched: FloatArray, av: npt.NDArray[np.bool_],
              valid: npt.NDArray[np.bool_], prices_now: FloatArray, window: tuple[int, int], k: int, gap: float,
              need_h: npt.NDArray[np.floating[Any]], best: FloatArray, best_t: FloatArray, tick_end_h: float,
              boot: tuple[npt.NDArray[np.bool_], FloatArray] | None) -> tuple[FloatArray, FloatArray]:
    """One tick in each market state (on-demand, spot in each zone) over the grid's ``window`` [lo, hi): the
    cheapest way into the state (held, or launched), run for the tick into ``new``; schedules that finish within
    it improve (best cost, finish time), returned. ``boot``: spot booted beside on-demand (ok, $ per zone)."""
    lo, hi = window
    length = new.shape[2]
    for s in range(1, new.shape[1]):
        pre = np.minimum(cw[:, s], launched)
        if boot is not None and s >= 2:  # on-demand through the boot, then spot without a restart's wait
            booted = boot[0][s - 2] & valid
            pre = np.minimum(pre, np.where(booted[:, None], cw[:, 1] + boot[1][s - 2][:, None], np.inf))
        held = av[:, s - 2 : s - 1] if s >= 2 else valid[:, None]
        pre = np.where(held, pre, np.inf)
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
            best_t = np.where(improved, tick_end_h, best_t)
    return best, best_t


def default_resolution(zones: Zones, jobs: Jobs) -> int:
    """Grid steps per tick for the bound: finer for coarse traces, keeping ~2000 progress steps per job."""
    ticks_of_work = float(np.max(jobs.work_h)) / zones.gap_h
    return int(max(1, min(4, 2000 // max(ticks_of_work, 1.0))))
