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

Pure: values in, values out; tables are cached by their bucketed inputs (:func:`table_for`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from catalog.errors import InvalidInput

FloatArray = npt.NDArray[np.float64]
Int8Array = npt.NDArray[np.int8]

# Action codes (the policy's: WAIT=0, SPOT=1, ON_DEMAND=2).
WAIT, SPOT, ON_DEMAND = 0, 1, 2
# State columns of a table: the market held and whether spot has capacity now.
NONE_UP, NONE_DOWN, SPOT_UP, OD_UP, OD_DOWN = range(5)

BASE_STEP_H = 1.0 / 12.0  # 5 minutes: the traces' tick and well under every restart delay worth modelling
GRID = 576  # steps of work and of slack a table covers (48 h each at the base step)
_INFEASIBLE = 1e7
# Buckets: rates and prices on a log grid (2^(1/4): 19% apart), loss to a tenth of a step.
_LOG_BUCKET = 4.0


@dataclass(frozen=True)
class SlackTable:
    """Best action per (time-left step, work-left step, state column) for one bucket."""

    step_h: float
    actions: Int8Array  # (GRID + 1 slack steps, GRID + 1 work steps, 5 state columns)

    def lookup(self, time_left_h: FloatArray, work_left_h: FloatArray, column: npt.NDArray[np.int64]) -> Int8Array:
        """Actions for many jobs; work rounds up and time down (the safe side); slack past the table's
        reach is read at its edge (there the table has long since settled on waiting out outages)."""
        w = np.clip(np.ceil(work_left_h / self.step_h - 1e-9), 0, GRID).astype(np.int64)
        s = np.clip(np.floor((time_left_h - work_left_h) / self.step_h + 1e-9), 0, GRID).astype(np.int64)
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
                                                             switch_h, price_ratio, step_h)))[0]
    return _table(*(float(x) for x in key))


def _keys(run: FloatArray, outage: FloatArray, restart: FloatArray, loss: FloatArray, switch: FloatArray,
          ratio: FloatArray, step: FloatArray) -> FloatArray:
    return np.stack([_log_bucket(run), _log_bucket(outage), np.maximum(1.0, np.round(restart / step)),
                     np.round(loss / step * 2.0) / 2.0, np.round(switch / step, 2), _log_bucket(ratio), step], axis=1)


def _table(run_b: float, outage_b: float, restart_steps: float, loss_steps: float, switch_steps: float,
           ratio_b: float, step_h: float) -> SlackTable:
    return _solve(2.0 ** (run_b / _LOG_BUCKET), 2.0 ** (outage_b / _LOG_BUCKET), int(restart_steps), loss_steps,
                  switch_steps, 2.0 ** (ratio_b / _LOG_BUCKET), step_h)


def best_actions(time_left_h: FloatArray, work_left_h: FloatArray, work_total_h: FloatArray,
                 column: npt.NDArray[np.int64], *, restart_h: FloatArray | float, switch_h: FloatArray | float,
                 loss_h: FloatArray | float, mean_run_h: FloatArray | float, mean_outage_h: FloatArray | float,
                 price_ratio: FloatArray | float) -> Int8Array:
    """The program's action (WAIT / SPOT / ON_DEMAND) for many jobs: one cached table per bucket of
    their inputs (jobs of one zone and restart share a few), looked up at each job's state."""
    n = time_left_h.shape[0]

    def full(x: FloatArray | float) -> FloatArray:
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))

    keys = _keys(full(mean_run_h), full(mean_outage_h), full(restart_h), full(loss_h), full(switch_h),
                 full(price_ratio), step_for(work_total_h))
    out = np.zeros(n, dtype=np.int8)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for g, key in enumerate(uniq):
        idx = np.nonzero(inverse == g)[0]
        table = _table(*(float(x) for x in key))
        out[idx] = table.lookup(time_left_h[idx], work_left_h[idx], column[idx])
    return out


# A table is 1.7 MB; one zone's replay visits ~200 buckets, a live server a handful.
@lru_cache(maxsize=256)
def _solve(mean_run_h: float, mean_outage_h: float, restart_steps: int, loss_steps: float, switch_steps: float,
           price_ratio: float, step_h: float) -> SlackTable:
    h, r, k = step_h, price_ratio, restart_steps
    p_end = 1.0 - math.exp(-h / mean_run_h)  # a run of capacity ends within a step
    p_back = 1.0 - math.exp(-h / mean_outage_h)  # an outage ends within a step
    one = np.array([[1.0 - p_end, p_end], [p_back, 1.0 - p_back]])
    pk = np.linalg.matrix_power(one, k)  # availability after a restart of k steps, from up / down
    restart = k * h
    switch = switch_steps * h
    levels = GRID * 2 + 1
    n = GRID + 1
    w = np.arange(n)
    lo = math.floor(loss_steps)
    frac = loss_steps - lo
    actions = np.zeros((n, n, 5), dtype=np.int8)
    # Ring of the last k + 1 levels' values: columns NONE_UP .. OD_DOWN.
    ring = np.zeros((k + 1, 5, n))
    pad = np.full(lo + 3, _INFEASIBLE)

    def ahead(arr: FloatArray, offset: int) -> FloatArray:
        """arr[w + offset] for every w (offset >= -1; past the grid: infeasible; w + offset < 0 is done)."""
        ext = np.concatenate([[0.0], arr, pad])
        return ext[1 + offset: 1 + offset + n]

    for t in range(levels):
        prev = ring[(t - 1) % (k + 1)] if t >= 1 else np.full((5, n), _INFEASIBLE)
        back = ring[(t - k) % (k + 1)] if t >= k else np.full((5, n), _INFEASIBLE)
        nu, nd, su, ou, od = prev
        # Expected next-step values by availability now (up / down).
        n_up, n_dn = (1 - p_end) * nu + p_end * nd, p_back * nu + (1 - p_back) * nd
        o_up, o_dn = (1 - p_end) * ou + p_end * od, p_back * ou + (1 - p_back) * od
        preempted = (1 - frac) * ahead(nd, lo - 1) + frac * ahead(nd, lo)
        hold_spot = h + (1 - p_end) * ahead(su, -1) + p_end * preempted
        hold_od_up = r * h + ahead(o_up, -1)
        hold_od_dn = r * h + ahead(o_dn, -1)
        _, bd, bsu, bou, bod = back
        # After a restart of k steps: spot lands on capacity or on an outage (no work lost yet).
        land_spot = restart + pk[0, 0] * bsu + pk[0, 1] * bd
        land_od_up = r * restart + pk[0, 0] * bou + pk[0, 1] * bod
        land_od_dn = r * restart + pk[1, 0] * bou + pk[1, 1] * bod
        # NONE_UP: wait / spot / on-demand.
        v_nu = np.minimum(np.minimum(n_up, land_spot), land_od_up)
        a_nu = np.where(land_spot <= np.minimum(n_up, land_od_up), SPOT, np.where(land_od_up < n_up, ON_DEMAND, WAIT))
        # NONE_DOWN: wait / on-demand.
        v_nd = np.minimum(n_dn, land_od_dn)
        a_nd = np.where(land_od_dn < n_dn, ON_DEMAND, WAIT)
        # SPOT_UP: hold / on-demand (pays the checkpoint write on spot).
        to_od = switch + land_od_up
        v_su = np.minimum(hold_spot, to_od)
        a_su = np.where(to_od < hold_spot, ON_DEMAND, SPOT)
        # OD_UP: hold / spot (pays the write on on-demand).
        to_spot = r * switch + land_spot
        v_ou = np.minimum(hold_od_up, to_spot)
        a_ou = np.where(to_spot < hold_od_up, SPOT, ON_DEMAND)
        # OD_DOWN: hold / wait.
        leave = r * switch + n_dn
        v_od = np.minimum(hold_od_dn, leave)
        a_od = np.where(leave < hold_od_dn, WAIT, ON_DEMAND)
        vals = np.stack([v_nu, v_nd, v_su, v_ou, v_od])
        vals[:, w > t] = _INFEASIBLE
        vals[:, 0] = 0.0
        ring[t % (k + 1)] = vals
        ws = np.arange(max(0, t - GRID), min(t, GRID) + 1)
        actions[t - ws, ws] = np.stack([a_nu, a_nd, a_su, a_ou, a_od], axis=1)[ws]
    return SlackTable(step_h=h, actions=actions)
