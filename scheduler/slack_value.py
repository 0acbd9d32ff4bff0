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

from collections import OrderedDict
from dataclasses import dataclass

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
# Buckets: rates and prices on a log grid (2^(1/4): 19% apart); restart in whole steps, loss in half steps.
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

    keys = _keys(full(mean_run_h), full(mean_outage_h), full(restart_h), full(loss_h), full(switch_h),
                 full(price_ratio), step_for(work_total_h))
    out = np.zeros(n, dtype=np.int8)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for g, table in enumerate(_tables(uniq)):
        idx = np.nonzero(inverse == g)[0]
        out[idx] = table.lookup(time_left_h[idx], work_left_h[idx], column[idx])
    return out


# Solved tables by bucket key, least recently used first. A table is 1.7 MB; one zone's replay meets ~200
# buckets, a live server a handful. Memoisation only: a table is a pure function of its key.
_CACHE: OrderedDict[tuple[float, ...], SlackTable] = OrderedDict()
_CACHE_SIZE = 256


def _tables(keys: FloatArray) -> list[SlackTable]:
    """The table of every key (rows of :func:`_keys`); those not cached are solved together, one batch per
    (restart steps, grid step): the loop over levels runs once per batch (16 tables: 0.9 s, about half the
    time of solving them one by one)."""
    wanted = [tuple(float(x) for x in row) for row in keys]
    groups: dict[tuple[float, float], list[tuple[float, ...]]] = {}
    for k in sorted({k for k in wanted if k not in _CACHE}):
        groups.setdefault((k[2], k[6]), []).append(k)
    for (restart_steps, step_h), batch in groups.items():
        b = np.array(batch)
        solved = _solve_batch(2.0 ** (b[:, 0] / _LOG_BUCKET), 2.0 ** (b[:, 1] / _LOG_BUCKET), int(restart_steps),
                              b[:, 3], b[:, 4], 2.0 ** (b[:, 5] / _LOG_BUCKET), step_h)
        for k, table in zip(batch, solved, strict=True):
            _CACHE[k] = table
    out = []
    for k in wanted:
        _CACHE.move_to_end(k)
        out.append(_CACHE[k])
    while len(_CACHE) > max(_CACHE_SIZE, len(wanted)):
        _CACHE.popitem(last=False)
    return out


def _solve_batch(mean_run_h: FloatArray, mean_outage_h: FloatArray, restart_steps: int, loss_steps: FloatArray,
                 switch_steps: FloatArray, price_ratio: FloatArray, step_h: float) -> list[SlackTable]:
    """Backward induction over time left, for B buckets sharing a restart and a grid step (arrays (B, work))."""
    h, k = step_h, restart_steps
    col = (slice(None), None)
    r = price_ratio[col]
    p_end = (1.0 - np.exp(-h / mean_run_h))  # a run of capacity ends within a step
    p_back = (1.0 - np.exp(-h / mean_outage_h))  # an outage ends within a step
    one = np.stack([np.stack([1.0 - p_end, p_end], axis=1), np.stack([p_back, 1.0 - p_back], axis=1)], axis=1)
    pk = np.linalg.matrix_power(one, k)  # (B, 2, 2): availability after a restart of k steps, from up / down
    pe, pb = p_end[col], p_back[col]
    k00, k01, k10, k11 = (pk[:, i, j][col] for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    restart = k * h
    switch = (switch_steps * h)[col]
    nb = mean_run_h.shape[0]
    n = GRID + 1
    w = np.arange(n)
    lo = np.floor(loss_steps).astype(np.int64)
    frac = (loss_steps - lo)[col]
    pad = int(lo.max()) + 3
    # Gather indices into [0 (done), values..., infeasible pad] for w - 1 + lo and w + lo.
    at_lo = np.clip(w[None, :] + lo[:, None], 0, n + pad)
    at_hi = np.clip(w[None, :] + lo[:, None] + 1, 0, n + pad)
    rows = np.arange(nb)[:, None]
    actions = np.zeros((nb, n, n, 5), dtype=np.int8)
    ring = np.zeros((k + 1, 5, nb, n))
    infeasible = np.full((5, nb, n), _INFEASIBLE)
    ext = np.full((nb, n + 1 + pad), _INFEASIBLE)
    ext[:, 0] = 0.0

    def minus_one(arr: FloatArray) -> FloatArray:
        """arr[w - 1] for every w (w = 0 is done: 0)."""
        return np.concatenate([np.zeros((nb, 1)), arr[:, :-1]], axis=1)

    for t in range(GRID * 2 + 1):
        nu, nd, su, ou, od = ring[(t - 1) % (k + 1)] if t >= 1 else infeasible
        _, bd, bsu, bou, bod = ring[(t - k) % (k + 1)] if t >= k else infeasible
        # Expected next-step values by availability now (up / down).
        n_up, n_dn = (1 - pe) * nu + pe * nd, pb * nu + (1 - pb) * nd
        o_up, o_dn = (1 - pe) * ou + pe * od, pb * ou + (1 - pb) * od
        ext[:, 1:n + 1] = nd
        preempted = (1 - frac) * ext[rows, at_lo] + frac * ext[rows, at_hi]  # nd at w - 1 + loss
        hold_spot = h + (1 - pe) * minus_one(su) + pe * preempted
        hold_od_up = r * h + minus_one(o_up)
        hold_od_dn = r * h + minus_one(o_dn)
        # After a restart of k steps: spot lands on capacity or on an outage (no work lost yet).
        land_spot = restart + k00 * bsu + k01 * bd
        land_od_up = r * restart + k00 * bou + k01 * bod
        land_od_dn = r * restart + k10 * bou + k11 * bod
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
        vals[:, :, w > t] = _INFEASIBLE
        vals[:, :, 0] = 0.0
        ring[t % (k + 1)] = vals
        ws = np.arange(max(0, t - GRID), min(t, GRID) + 1)
        actions[:, t - ws, ws] = np.stack([a_nu, a_nd, a_su, a_ou, a_od], axis=2)[:, ws]
    return [SlackTable(step_h=h, actions=actions[i]) for i in range(nb)]
