"""What an hour of slack is worth: a dynamic program over (time left, work left, market) for one job
on an on/off spot market, solved once per (rates, restart, loss, prices) bucket and cached.

The market model is a two-state Markov chain: a run of spot capacity ends at rate ``1 / mean_run_h``,
an outage ends at rate ``1 / mean_outage_h`` (both estimated online from what the policy has watched,
:class:`scheduler.policy.ZoneSeen`). On a grid of ``step_h`` hours the program finds, for every
(time left, work left, availability, market held), the action with the lowest expected cost to finish
by the deadline, in spot-hours (spot costs 1 an hour, on-demand ``price_ratio``):

- hold spot (works; a preemption loses ``loss_h`` of work and drops the job to no market);
- hold on-demand (works at ``price_ratio`` an hour; never preempted);
- wait (free; burns an hour of slack);
- change market: ``restart_h`` of time billed at the new market's price, plus ``switch_h`` (the
  checkpoint a voluntary changeover waits for) billed at the old one.

A state whose work no longer fits before the deadline costs ``_INFEASIBLE``; the policy's safety net
keeps real jobs out of it. The program prices the slack that the reserve rule of earlier versions
set by formula: where slack is plentiful, waiting out an outage is free and the table says wait;
where it is short, it says bridge on on-demand or alternate, as far as the zone's rates make that pay.

Pure: values in, values out; tables are cached by their bucketed inputs (:func:`table_for`). The
induction is plain loops compiled by numba (a full table in ~7 ms; numpy's vectorised levels took
~60-120 ms, which made a 45-day, 9-zone replay of 1,000 jobs take 30 s).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from catalog.errors import InvalidInput
from scheduler.market_codes import ON_DEMAND, SPOT, WAIT

FloatArray = npt.NDArray[np.float64]
Int8Array = npt.NDArray[np.int8]

# State columns of a table: the market held and whether spot has capacity now.
NONE_UP, NONE_DOWN, SPOT_UP, OD_UP, OD_DOWN = range(5)

BASE_STEP_H = 1.0 / 12.0  # 5 minutes: the traces' tick and well under every restart delay worth modelling
GRID = 576  # steps of work and of slack a table covers (48 h each at the base step)
_INFEASIBLE = 1e7
# Buckets: rates and prices on a log grid (2^(1/4): 19% apart); restart in whole steps, loss in half steps.
_LOG_BUCKET = 4.0


@dataclass(frozen=True)
class SlackTable:
    """Best action per (time-left step, work-left step, state column) for one bucket."""

    step_h: float
    actions: Int8Array  # (GRID + 1 slack steps, GRID + 1 work steps, 5 state columns)

    def lookup(self, time_left_h: FloatArray, work_left_h: FloatArray, column: npt.NDArray[np.int64]) -> Int8Array:
        """Actions for many jobs at their (time left, work left, column); see :func:`_cells`."""
        w, s = _cells(time_left_h, work_left_h, self.step_h)
        return self.actions[s, w, column]


def step_for(work_total_h: FloatArray | float) -> FloatArray:
    """The table's grid step for a job of this much work: the base step, doubled until the work fits
    (fixed over the job's life, so its table does not change as the work shrinks)."""
    need = np.log2(np.maximum(np.asarray(work_total_h, dtype=np.float64), 1e-9) / (GRID * BASE_STEP_H))
    return np.asarray(BASE_STEP_H * 2.0 ** np.maximum(0.0, np.ceil(need - 1e-12)), dtype=np.float64)


def _log_bucket(x: FloatArray) -> FloatArray:
    """Index of x on a log grid of ratio 2^(1/_LOG_BUCKET) (relative error under 10%)."""
    return np.asarray(np.round(np.log2(np.clip(x, 1e-6, 1e4)) * _LOG_BUCKET), dtype=np.float64)


def table_for(mean_run_h: float, mean_outage_h: float, restart_h: float, loss_h: float, switch_h: float,
              price_ratio: float, step_h: float) -> SlackTable:
    """The cached table for these inputs, rounded to their buckets (restart to whole steps, at least
    one; loss to half steps)."""
    if not (mean_run_h > 0 and mean_outage_h > 0 and price_ratio > 0 and step_h > 0):
        raise InvalidInput("mean run, mean outage, price ratio and step must be positive")
    if min(restart_h, loss_h, switch_h) < 0:
        raise InvalidInput("restart, loss and switch hours must be >= 0")
    key = _keys(*(np.array([x], dtype=np.float64) for x in (mean_run_h, mean_outage_h, restart_h, loss_h,
                                                             switch_h, price_ratio, step_h)))
    return _tables(key)[0]


def _keys(run: FloatArray, outage: FloatArray, restart: FloatArray, loss: FloatArray, switch: FloatArray,
          ratio: FloatArray, step: FloatArray) -> FloatArray:
    return np.stack([_log_bucket(run), _log_bucket(outage), np.maximum(1.0, np.round(restart / step)),
                     np.round(loss / step * 2.0) / 2.0, np.round(switch / step, 2), _log_bucket(ratio), step], axis=1)


def best_actions(time_left_h: FloatArray, work_left_h: FloatArray, work_total_h: FloatArray,
                 column: npt.NDArray[np.int64], *, restart_h: FloatArray | float, switch_h: FloatArray | float,
                 loss_h: FloatArray | float, mean_run_h: FloatArray | float, mean_outage_h: FloatArray | float,
                 price_ratio: FloatArray | float) -> Int8Array:
    """The program's action (WAIT / SPOT / ON_DEMAND) for many jobs: one cached table per bucket of
    their inputs (jobs of one zone and restart share a few), looked up at each job's state."""
    n = time_left_h.shape[0]

    def full(x: FloatArray | float) -> FloatArray:
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))

    step = step_for(work_total_h)
    keys = _keys(full(mean_run_h), full(mean_outage_h), full(restart_h), full(loss_h), full(switch_h),
                 full(price_ratio), step)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    w, s = _cells(time_left_h, work_left_h, step)
    # Jobs grouped by table: sorted by group, each group one slice of the order.
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    out = np.zeros(n, dtype=np.int8)
    for g, table in enumerate(_tables(uniq)):
        idx = order[bounds[g]:bounds[g + 1]]
        out[idx] = table.actions[s[idx], w[idx], column[idx]]
    return out


def _cells(time_left_h: FloatArray, work_left_h: FloatArray,
           step_h: FloatArray | float) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(work, slack) cells of a table: work rounds up and time down (the safe side); slack past the
    table's reach is read at its edge (there the table has long since settled on waiting out outages)."""
    w = np.clip(np.ceil(work_left_h / step_h - 1e-9), 0, GRID).astype(np.int64)
    s = np.clip(np.floor((time_left_h - work_left_h) / step_h + 1e-9), 0, GRID).astype(np.int64)
    return w, s


# Solved tables by bucket key, least recently used first. A table is 1.7 MB; one zone's replay meets ~200
# buckets, a live server a handful. Memoisation only: a table is a pure function of its key.
_CACHE: OrderedDict[tuple[float, ...], SlackTable] = OrderedDict()
_CACHE_SIZE = 256


def _tables(keys: FloatArray) -> list[SlackTable]:
    """The table of every key (rows of :func:`_keys`); those not cached are solved in one call."""
    wanted = [tuple(float(x) for x in row) for row in keys]
    missing = sorted({k for k in wanted if k not in _CACHE})
    if missing:
        b = np.array(missing)
        solved = _solve_batch(2.0 ** (b[:, 0] / _LOG_BUCKET), 2.0 ** (b[:, 1] / _LOG_BUCKET),
                              b[:, 2].astype(np.int64), b[:, 3], b[:, 4], 2.0 ** (b[:, 5] / _LOG_BUCKET), b[:, 6])
        for k, table in zip(missing, solved, strict=True):
            _CACHE[k] = table
    out = []
    for k in wanted:
        _CACHE.move_to_end(k)
        out.append(_CACHE[k])
    while len(_CACHE) > max(_CACHE_SIZE, len(wanted)):
        _CACHE.popitem(last=False)
    return out


def _solve_batch(mean_run_h: FloatArray, mean_outage_h: FloatArray, restart_steps: npt.NDArray[np.int64],
                 loss_steps: FloatArray, switch_steps: FloatArray, price_ratio: FloatArray,
                 step_h: FloatArray) -> list[SlackTable]:
    """Tables for B buckets (arrays (B,)): the per-step probabilities in numpy, the induction compiled."""
    p_end = 1.0 - np.exp(-step_h / mean_run_h)  # a run of capacity ends within a step
    p_back = 1.0 - np.exp(-step_h / mean_outage_h)  # an outage ends within a step
    # Availability after a restart of k steps, from up / down: the one-step chain to the k-th power.
    pk = np.stack([np.linalg.matrix_power(np.array([[1.0 - e, e], [b, 1.0 - b]]), int(k))
                   for e, b, k in zip(p_end, p_back, restart_steps, strict=True)])
    lo = np.floor(loss_steps).astype(np.int64)
    actions = np.zeros((len(mean_run_h), GRID + 1, GRID + 1, 5), dtype=np.int8)
    _compiled_induction()(p_end, p_back, pk[:, 0, 0].copy(), pk[:, 0, 1].copy(), pk[:, 1, 0].copy(),
                          pk[:, 1, 1].copy(), price_ratio, switch_steps * step_h, restart_steps, lo,
                          loss_steps - lo, step_h, actions)
    # One array per table, so that evicting one from the cache frees it.
    return [SlackTable(step_h=float(h), actions=actions[i].copy()) for i, h in enumerate(step_h)]


def _induction(p_end: FloatArray, p_back: FloatArray, k00: FloatArray, k01: FloatArray, k10: FloatArray,
               k11: FloatArray, ratio: FloatArray, switch_h: FloatArray, restart_steps: npt.NDArray[np.int64],
               loss_lo: npt.NDArray[np.int64], loss_frac: FloatArray, step_h: FloatArray,
               actions: Int8Array) -> None:
    """Backward induction over time left t (in steps) for each bucket, writing the best action of every
    (slack s = t - w, work w, column) into ``actions`` (B, GRID + 1, GRID + 1, 5).

    Values are kept for the last k + 1 levels of t (a restart of k steps reads level t - k) over work
    0..GRID plus a pad past it (a preemption can add work); a level only computes the work whose slack
    is within the table (transitions never add slack), the rest of a level is infeasible or unread.
    Plain loops: compiled by numba (:func:`_compiled_induction`), about 10x numpy's vectorised levels;
    runs as Python too (the tests' reference on small cases)."""
    n = actions.shape[2] - 1
    for b in range(actions.shape[0]):
        k, lo, frac = restart_steps[b], loss_lo[b], loss_frac[b]
        pe, pb, r, h, switch = p_end[b], p_back[b], ratio[b], step_h[b], switch_h[b]
        restart = k * h
        ring = np.full((k + 1, 5, n + lo + 2), _INFEASIBLE)
        ring[:, :, 0] = 0.0  # no work left: done
        for t in range(1, 2 * n + 1):
            now, prev, back = ring[t % (k + 1)], ring[(t - 1) % (k + 1)], ring[(t - k) % (k + 1)]
            for w in range(max(1, t - n), min(t, n) + 1):
                nu, nd = prev[NONE_UP, w], prev[NONE_DOWN, w]
                # Expected next-step values by availability now (up / down).
                n_up, n_dn = (1 - pe) * nu + pe * nd, pb * nu + (1 - pb) * nd
                o_up = (1 - pe) * prev[OD_UP, w - 1] + pe * prev[OD_DOWN, w - 1]
                o_dn = pb * prev[OD_UP, w - 1] + (1 - pb) * prev[OD_DOWN, w - 1]
                # A preemption drops to no market with the loss added to the work (between two steps).
                preempted = (1 - frac) * prev[NONE_DOWN, w - 1 + lo] + frac * prev[NONE_DOWN, w + lo]
                hold_spot = h + (1 - pe) * prev[SPOT_UP, w - 1] + pe * preempted
                hold_od_up = r * h + o_up
                hold_od_dn = r * h + o_dn
                # After a restart of k steps: spot lands on capacity or on an outage (no work lost yet).
                if t >= k:
                    bd, bsu, bou, bod = back[NONE_DOWN, w], back[SPOT_UP, w], back[OD_UP, w], back[OD_DOWN, w]
                else:
                    bd = bsu = bou = bod = _INFEASIBLE
                land_spot = restart + k00[b] * bsu + k01[b] * bd
                land_od_up = r * restart + k00[b] * bou + k01[b] * bod
                land_od_dn = r * restart + k10[b] * bou + k11[b] * bod
                s = t - w
                # NONE_UP: wait / spot / on-demand.
                now[NONE_UP, w] = min(min(n_up, land_spot), land_od_up)
                actions[b, s, w, NONE_UP] = (SPOT if land_spot <= min(n_up, land_od_up)
                                             else ON_DEMAND if land_od_up < n_up else WAIT)
                # NONE_DOWN: wait / on-demand.
                now[NONE_DOWN, w] = min(n_dn, land_od_dn)
                actions[b, s, w, NONE_DOWN] = ON_DEMAND if land_od_dn < n_dn else WAIT
                # SPOT_UP: hold / on-demand (pays the checkpoint write on spot).
                to_od = switch + land_od_up
                now[SPOT_UP, w] = min(hold_spot, to_od)
                actions[b, s, w, SPOT_UP] = ON_DEMAND if to_od < hold_spot else SPOT
                # OD_UP: hold / spot (pays the write on on-demand).
                to_spot = r * switch + land_spot
                now[OD_UP, w] = min(hold_od_up, to_spot)
                actions[b, s, w, OD_UP] = SPOT if to_spot < hold_od_up else ON_DEMAND
                # OD_DOWN: hold / wait.
                leave = r * switch + n_dn
                now[OD_DOWN, w] = min(hold_od_dn, leave)
                actions[b, s, w, OD_DOWN] = WAIT if leave < hold_od_dn else ON_DEMAND


_Induction = Callable[[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray, FloatArray,
                       FloatArray, npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray, FloatArray,
                       Int8Array], None]


@functools.cache
def _compiled_induction() -> _Induction:
    """:func:`_induction` compiled on first use (about 2 s; numba caches the machine code on disk)."""
    import numba

    return cast(_Induction, numba.njit(cache=True, nogil=True)(_induction))
