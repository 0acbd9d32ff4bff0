"""What an hour of slack is worth: a dynamic program over (time left, work left, market) for one job
on a spot market whose capacity comes and goes, solved once per (rates, restart, loss, prices) bucket
and cached.

The market model is a four-state Markov chain: capacity is up or down, and the current spell (a run of
capacity, an outage) is young (its first ``YOUNG_H`` hours) or old. A young spell ends several times as
fast as an old one (``YOUNG_RUN_HAZARD_RATIO``, ``YOUNG_OUTAGE_HAZARD_RATIO``), and the two hazards are
set so that a spell's mean is the zone's mean run or mean outage, estimated online from what the policy
has watched (:class:`scheduler.spot.policy.ZoneSeen`). On a grid of ``step_h`` hours the program finds, for
every (time left, work left, chain state, market held), the action with the lowest expected cost to
finish by the deadline, in spot-hours (spot costs 1 an hour, on-demand ``price_ratio``):

- hold spot (works; a preemption loses ``loss_h`` of work and drops the job to no market);
- hold on-demand (works at ``price_ratio`` an hour; never preempted);
- wait (free; burns an hour of slack);
- change market: ``restart_h`` of time billed at the new market's price, plus ``switch_h`` (the
  checkpoint a voluntary changeover waits for) billed at the old one;
- with ``make_before_break``, on on-demand with capacity: boot spot beside it (BOOT_SPOT). On-demand works
  through the boot (``restart_h``, whole steps), the spot instance is billed while it lives; if capacity
  lasts the whole boot the job moves to spot (the checkpoint write billed on both), else it is still on
  on-demand, having paid only the boot. In the program the job stays on on-demand to the end of the boot
  either way (the replay lets it decide again at once: the program slightly undervalues a boot).

A state whose work no longer fits before the deadline costs ``_INFEASIBLE``; the policy's safety net
keeps real jobs out of it. Where slack is plentiful, waiting out an outage is free and the table says
wait; where it is short, it says bridge on on-demand or alternate, as far as the zone's rates make that
pay; a fresh run or outage is judged by how young spells end.

Pure: values in, values out; tables are cached by their bucketed inputs (:func:`table_for`). The
induction is plain loops compiled by numba (a full table in ~11 ms; numpy's vectorised levels took
~60-120 ms for the two-state chain, which made a 45-day, 9-zone replay of 1,000 jobs take 30 s).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import numpy.typing as npt

from errors import ExecutionError, InvalidInput
from scheduler.spot.market_codes import BOOT_SPOT, ON_DEMAND, SPOT, WAIT

FloatArray = npt.NDArray[np.float64]
Int8Array = npt.NDArray[np.int8]

# What the caller holds and sees: the market held and whether spot has capacity now.
NONE_UP, NONE_DOWN, SPOT_UP, OD_UP, OD_DOWN = range(5)
# A spell (a run of capacity, an outage) is young until YOUNG_H old, then old: on the traces the young ones
# end several times as fast (half of all spells end within 30 min, the mean is hours). The ratios are the
# medians over the tuning family's nine zones (young / old hazard, pooled per zone: runs 2.4-16, outages
# 2.0-8.6); the old hazard is set so that a spell's mean is the online mean (:func:`phase_hazards`).
YOUNG_H = 0.5
YOUNG_RUN_HAZARD_RATIO = 6.0
YOUNG_OUTAGE_HAZARD_RATIO = 3.0
# Chain states of the market (up young, up old, down young, down old) and the table's ten columns: no
# market at each chain state (0-3), spot at each up phase (4-5), on-demand at each chain state (6-9).
UP_YOUNG, UP_OLD, DOWN_YOUNG, DOWN_OLD = range(4)
_SPOT_COL, _OD_COL = 4, 6
# The columns by name, for the induction's written-out chain products: spot at each up phase, on-demand at each
# chain state (the no-market columns are the chain states themselves).
_SPOT_UY, _SPOT_UO = _SPOT_COL + UP_YOUNG, _SPOT_COL + UP_OLD
_OD_UY, _OD_UO, _OD_DY, _OD_DO = (_OD_COL + UP_YOUNG, _OD_COL + UP_OLD, _OD_COL + DOWN_YOUNG, _OD_COL + DOWN_OLD)

BASE_STEP_H = 1.0 / 12.0  # 5 minutes: the traces' tick and well under every restart delay worth modelling
GRID = 576  # steps of work and of slack a table covers (48 h each at the base step)
_INFEASIBLE = 1e7
# Buckets: rates and prices on a log grid (2^(1/4): 19% apart); restart in whole steps, loss in half steps.
_LOG_BUCKET = 4.0


@dataclass(frozen=True)
class SlackTable:
    """Best action per (time-left step, work-left step, state column) for one bucket."""

    step_h: float
    packed: Int8Array  # (GRID + 1 slack steps, GRID + 1 work steps, 5): columns 2j and 2j + 1 in byte j

    def lookup(self, time_left_h: FloatArray, work_left_h: FloatArray, column: npt.NDArray[np.int64]) -> Int8Array:
        """Actions for many jobs at their (time left, work left, table column); see :func:`_cells`."""
        w, s = _cells(time_left_h, work_left_h, self.step_h)
        return self.at(s, w, column)

    def at(self, s: npt.NDArray[np.int64], w: npt.NDArray[np.int64], column: npt.NDArray[np.int64]) -> Int8Array:
        """Actions at (slack step, work step, table column) cells: two bits of the column's byte."""
        return np.asarray((self.packed[s, w, column // 2] >> (2 * (column % 2))) & 3, dtype=np.int8)


def table_column(column: npt.NDArray[np.int64], run_age_h: FloatArray | float,
                 outage_age_h: FloatArray | float) -> npt.NDArray[np.int64]:
    """The table's column for what the caller holds and sees (NONE_UP ... OD_DOWN) and the age of the
    zone's current run of capacity or outage (inf: unknown, read as old)."""
    run = np.where(np.asarray(run_age_h) < YOUNG_H, UP_YOUNG, UP_OLD)
    out = np.where(np.asarray(outage_age_h) < YOUNG_H, DOWN_YOUNG, DOWN_OLD)
    return np.asarray(np.select([column == NONE_UP, column == NONE_DOWN, column == SPOT_UP, column == OD_UP],
                                [run, out, _SPOT_COL + run, _OD_COL + run], _OD_COL + out), dtype=np.int64)


def step_for(work_total_h: FloatArray | float) -> FloatArray:
    """The table's grid step for a job of this much work: the base step, doubled until the work fits
    (fixed over the job's life, so its table does not change as the work shrinks)."""
    need = np.log2(np.maximum(np.asarray(work_total_h, dtype=np.float64), 1e-9) / (GRID * BASE_STEP_H))
    return np.asarray(BASE_STEP_H * 2.0 ** np.maximum(0.0, np.ceil(need - 1e-12)), dtype=np.float64)


def _log_bucket(x: FloatArray) -> FloatArray:
    """Index of x on a log grid of ratio 2^(1/_LOG_BUCKET) (relative error under 10%)."""
    return np.asarray(np.round(np.log2(np.clip(x, 1e-6, 1e4)) * _LOG_BUCKET), dtype=np.float64)


def table_for(mean_run_h: float, mean_outage_h: float, restart_h: float, loss_h: float, switch_h: float,
              price_ratio: float, step_h: float, make_before_break: bool = False) -> SlackTable:
    """The cached table for these inputs, rounded to their buckets (restart to whole steps, at least
    one; loss to half steps); ``make_before_break``: the job may boot spot beside on-demand (BOOT_SPOT)."""
    if not (mean_run_h > 0 and mean_outage_h > 0 and price_ratio > 0 and step_h > 0):
        raise InvalidInput("mean run, mean outage, price ratio and step must be positive")
    if min(restart_h, loss_h, switch_h) < 0:
        raise InvalidInput("restart, loss and switch hours must be >= 0")
    key = _keys(*(np.array([x], dtype=np.float64) for x in (mean_run_h, mean_outage_h, restart_h, loss_h,
                                                             switch_h, price_ratio, step_h, float(make_before_break))))
    return _tables(key)[0]


def _keys(run: FloatArray, outage: FloatArray, restart: FloatArray, loss: FloatArray, switch: FloatArray,
          ratio: FloatArray, step: FloatArray, warm: FloatArray) -> FloatArray:
    """One row per job: the bucket of its table (the last column: 1 if it may boot spot beside on-demand)."""
    return np.stack([_log_bucket(run), _log_bucket(outage), np.maximum(1.0, np.round(restart / step)),
                     np.round(loss / step * 2.0) / 2.0, np.round(switch / step, 2), _log_bucket(ratio), step,
                     warm], axis=1)


def best_actions(time_left_h: FloatArray, work_left_h: FloatArray, work_total_h: FloatArray,
                 column: npt.NDArray[np.int64], *, restart_h: FloatArray | float, switch_h: FloatArray | float,
                 loss_h: FloatArray | float, mean_run_h: FloatArray | float, mean_outage_h: FloatArray | float,
                 price_ratio: FloatArray | float, run_age_h: FloatArray | float = np.inf,
                 outage_age_h: FloatArray | float = np.inf,
                 make_before_break: npt.NDArray[np.bool_] | bool = False) -> Int8Array:
    """The program's action (WAIT / SPOT / ON_DEMAND, and BOOT_SPOT where ``make_before_break``) for many
    jobs: one cached table per bucket of their inputs (jobs of one zone and restart share a few), looked up
    at each job's state: ``column`` (NONE_UP ... OD_DOWN) and the age of the zone's run of capacity or
    outage (young or old)."""
    n = time_left_h.shape[0]

    def full(x: FloatArray | float) -> FloatArray:
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))

    step = step_for(work_total_h)
    keys = _keys(full(mean_run_h), full(mean_outage_h), full(restart_h), full(loss_h), full(switch_h),
                 full(price_ratio), step, full(np.asarray(make_before_break, dtype=np.float64)))
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    w, s = _cells(time_left_h, work_left_h, step)
    column = table_column(column, run_age_h, outage_age_h)
    # Jobs grouped by table: sorted by group, each group one slice of the order.
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    out = np.zeros(n, dtype=np.int8)
    for g, table in enumerate(_tables(uniq)):
        idx = order[bounds[g]:bounds[g + 1]]
        out[idx] = table.at(s[idx], w[idx], column[idx])
    return out


def _cells(time_left_h: FloatArray, work_left_h: FloatArray,
           step_h: FloatArray | float) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(work, slack) cells of a table: work rounds up and time down (the safe side); slack past the
    table's reach is read at its edge (there the table has long since settled on waiting out outages)."""
    w = np.clip(np.ceil(work_left_h / step_h - 1e-9), 0, GRID).astype(np.int64)
    s = np.clip(np.floor((time_left_h - work_left_h) / step_h + 1e-9), 0, GRID).astype(np.int64)
    return w, s


# Solved tables by bucket key, least recently used first. A table is 1.7 MB (two actions a byte); one zone's
# replay meets ~200 buckets, a live server a handful. Memoisation only: a table is a pure function of its key.
_CACHE: OrderedDict[tuple[float, ...], SlackTable] = OrderedDict()
_CACHE_SIZE = 256
_SOLVE_CHUNK = 16  # buckets solved per call: one scratch array, copied out per table


def _tables(keys: FloatArray) -> list[SlackTable]:
    """The table of every key (rows of :func:`_keys`); those not cached are solved in one call."""
    wanted = [tuple(float(x) for x in row) for row in keys]
    missing = sorted({k for k in wanted if k not in _CACHE})
    if missing:
        b = np.array(missing)
        solved = _solve_batch(2.0 ** (b[:, 0] / _LOG_BUCKET), 2.0 ** (b[:, 1] / _LOG_BUCKET),
                              b[:, 2].astype(np.int64), b[:, 3], b[:, 4], 2.0 ** (b[:, 5] / _LOG_BUCKET), b[:, 6],
                              b[:, 7] > 0)
        for k, table in zip(missing, solved, strict=True):
            _CACHE[k] = table
    out = []
    for k in wanted:
        _CACHE.move_to_end(k)
        out.append(_CACHE[k])
    while len(_CACHE) > max(_CACHE_SIZE, len(wanted)):
        _CACHE.popitem(last=False)
    return out


def phase_hazards(mean_h: FloatArray, young_ratio: float) -> tuple[FloatArray, FloatArray]:
    """(young, old) hazards per hour of a spell whose young phase (the first YOUNG_H hours, a geometric
    clock in the program) ends ``young_ratio`` times as fast as its old one, and whose mean is ``mean_h``:
    the mean falls as the old hazard grows, so bisection on its log finds it."""
    age_out = 1.0 / YOUNG_H
    lo, hi = np.full(mean_h.shape, -30.0), np.full(mean_h.shape, 30.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        old = np.exp(mid)
        leave = young_ratio * old + age_out  # rate of leaving the young phase
        mean = 1.0 / leave + age_out / leave / old
        lo, hi = np.where(mean > mean_h, mid, lo), np.where(mean > mean_h, hi, mid)
    old = np.exp((lo + hi) / 2)
    return young_ratio * old, old


def market_chain(mean_run_h: FloatArray, mean_outage_h: FloatArray, step_h: FloatArray,
           run_ratio: float = YOUNG_RUN_HAZARD_RATIO,
           outage_ratio: float = YOUNG_OUTAGE_HAZARD_RATIO) -> npt.NDArray[np.float64]:
    """One step of the market's chain per bucket (B, 4, 4): a run or an outage ends at its phase's
    hazard; a young one that goes on turns old with probability step / YOUNG_H (ratios 1: memoryless)."""
    run_y, run_o = phase_hazards(mean_run_h, run_ratio)
    out_y, out_o = phase_hazards(mean_outage_h, outage_ratio)
    e_y, e_o = -np.expm1(-run_y * step_h), -np.expm1(-run_o * step_h)  # a run ends within a step
    b_y, b_o = -np.expm1(-out_y * step_h), -np.expm1(-out_o * step_h)  # an outage ends within a step
    g = np.minimum(1.0, step_h / YOUNG_H)
    m = np.zeros((len(step_h), 4, 4))
    m[:, UP_YOUNG, UP_YOUNG], m[:, UP_YOUNG, UP_OLD] = (1 - e_y) * (1 - g), (1 - e_y) * g
    m[:, UP_YOUNG, DOWN_YOUNG] = e_y
    m[:, UP_OLD, UP_OLD], m[:, UP_OLD, DOWN_YOUNG] = 1 - e_o, e_o
    m[:, DOWN_YOUNG, DOWN_YOUNG], m[:, DOWN_YOUNG, DOWN_OLD] = (1 - b_y) * (1 - g), (1 - b_y) * g
    m[:, DOWN_YOUNG, UP_YOUNG] = b_y
    m[:, DOWN_OLD, DOWN_OLD], m[:, DOWN_OLD, UP_YOUNG] = 1 - b_o, b_o
    return m


def boot_odds(one: npt.NDArray[np.float64], steps: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """A spot boot of ``steps`` steps begun at each up state, on the one-step chain ``one`` (4, 4): (ok (2, 2):
    capacity all the way, ending at each up phase; failed (2, 4): it went down on the way, the chain's state at
    the end; billed (2,): expected steps the booting instance lives, each billed whole)."""
    up = one[:2, :2]  # up -> up without a break
    stay = np.eye(2)
    billed = np.zeros(2)
    for _ in range(steps):
        billed += stay.sum(axis=1)
        stay = stay @ up
    failed = np.linalg.matrix_power(one, steps)[:2].copy()
    failed[:, :2] -= stay
    return stay, np.maximum(failed, 0.0), billed


def _solve_batch(mean_run_h: FloatArray, mean_outage_h: FloatArray, restart_steps: npt.NDArray[np.int64],
                 loss_steps: FloatArray, switch_steps: FloatArray, price_ratio: FloatArray,
                 step_h: FloatArray, warm: npt.NDArray[np.bool_]) -> list[SlackTable]:
    """Tables for B buckets (arrays (B,)): the chain in numpy, the induction compiled."""
    one = market_chain(mean_run_h, mean_outage_h, step_h)
    after_restart = np.stack([np.linalg.matrix_power(one[i], int(k)) for i, k in enumerate(restart_steps)])
    boot_ok, boot_failed, boot_billed = np.zeros((len(one), 2, 2)), np.zeros((len(one), 2, 4)), np.zeros((len(one), 2))
    for i, k in enumerate(restart_steps):
        boot_ok[i], boot_failed[i], boot_billed[i] = boot_odds(one[i], int(k))
    lo = np.floor(loss_steps).astype(np.int64)
    switch_h = switch_steps * step_h
    tables = []
    for a in range(0, len(mean_run_h), _SOLVE_CHUNK):
        part = slice(a, a + _SOLVE_CHUNK)
        packed = np.zeros((len(mean_run_h[part]), GRID + 1, GRID + 1, 5), dtype=np.int8)
        _compiled_induction()(one[part], after_restart[part], price_ratio[part], switch_h[part],
                              restart_steps[part], lo[part], loss_steps[part] - lo[part], step_h[part], warm[part],
                              boot_ok[part], boot_failed[part], boot_billed[part], packed)
        tables += [SlackTable(step_h=float(h), packed=packed[i].copy()) for i, h in enumerate(step_h[part])]
    return tables


def _induction(one: npt.NDArray[np.float64], after_restart: npt.NDArray[np.float64], ratio: FloatArray,
               switch_h: FloatArray, restart_steps: npt.NDArray[np.int64], loss_lo: npt.NDArray[np.int64],
               loss_frac: FloatArray, step_h: FloatArray, warm: npt.NDArray[np.bool_],
               boot_ok: npt.NDArray[np.float64], boot_failed: npt.NDArray[np.float64],
               boot_billed: npt.NDArray[np.float64], packed: Int8Array) -> None:
    """Backward induction over time left t (in steps) for each bucket, writing the best action of every
    (slack s = t - w, work w, column c) into ``packed`` (B, GRID + 1, GRID + 1, 5): two bits each, column
    c in byte c // 2 at bit 2 (c % 2) (the tables' size halves).

    ``one`` / ``after_restart``: the chain's transition over one step / over a restart of k steps (B, 4,
    4); ``warm`` / ``boot_*``: whether the bucket may boot spot beside on-demand and the odds of a boot
    (:func:`boot_odds`). Values are kept for the last k + 1 levels of t (a restart reads level t - k) over work 0..GRID
    plus a pad past it (a preemption can add work), the ten columns of a work step side by side; a level
    only computes the work whose slack is within the table (transitions never add slack), the rest of a
    level is infeasible or unread. Plain loops: compiled by numba (:func:`_compiled_induction`), ~10x
    numpy's vectorised levels; runs as Python too. One level is :func:`_level`."""
    n = packed.shape[2] - 1
    for b in range(packed.shape[0]):
        k, lo, frac = restart_steps[b], loss_lo[b], loss_frac[b]
        r, h, switch, may_boot = ratio[b], step_h[b], switch_h[b], warm[b]
        m, land = one[b], after_restart[b]
        ok, failed, billed = boot_ok[b], boot_failed[b], boot_billed[b]
        ring = np.full((k + 1, n + lo + 2, 10), _INFEASIBLE)
        ring[:, 0, :] = 0.0  # no work left: done
        never = np.full(10, _INFEASIBLE)  # what a restart reads before level k exists
        codes = np.zeros(10, dtype=np.int8)  # one work step's actions, packed into five bytes
        for t in range(1, 2 * n + 1):
            _level(ring[t % (k + 1)], ring[(t - 1) % (k + 1)], ring[(t - k) % (k + 1)], never, t, n, m, land, r, h,
                   switch, k, lo, frac, may_boot, ok, failed, billed, codes, packed[b])


def _level(now: FloatArray, prev: FloatArray, back: FloatArray, never: FloatArray, t: int, n: int, m: FloatArray,
           land: FloatArray, r: float, h: float, switch: float, k: int, lo: int, frac: float, warm: bool,
           boot_ok: FloatArray, boot_failed: FloatArray, boot_billed: FloatArray, codes: Int8Array,
           packed: Int8Array) -> None:
    """Level ``t``: the ten columns' values of every work ``w`` (into ``now``) and their actions (into the
    bucket's ``packed``, at slack t - w); ``prev`` / ``back``: the levels one step / a restart (k steps)
    earlier (a restart before level k exists reads ``never``). The one-step chain ``m`` is sparse (a run ends
    in a young outage, an outage in a young run, a young spell may turn old), so its products are written out
    and its zeros (an old spell never turns young) left out."""
    restart = k * h
    for w in range(max(1, t - n), min(t, n) + 1):
        s = t - w
        after = back[w] if t >= k else never
        p, q = prev[w], prev[w - 1]  # next step's values: no progress / one step of work done
        # Next step without a change, per chain state now: no market waits, on-demand works, spot works
        # (a preemption, into a young outage, adds the loss to the work, between two steps).
        wait_uy = (m[UP_YOUNG, UP_YOUNG] * p[UP_YOUNG] + m[UP_YOUNG, UP_OLD] * p[UP_OLD]
                   + m[UP_YOUNG, DOWN_YOUNG] * p[DOWN_YOUNG])
        wait_uo = m[UP_OLD, UP_OLD] * p[UP_OLD] + m[UP_OLD, DOWN_YOUNG] * p[DOWN_YOUNG]
        wait_dy = (m[DOWN_YOUNG, UP_YOUNG] * p[UP_YOUNG] + m[DOWN_YOUNG, DOWN_YOUNG] * p[DOWN_YOUNG]
                   + m[DOWN_YOUNG, DOWN_OLD] * p[DOWN_OLD])
        wait_do = m[DOWN_OLD, UP_YOUNG] * p[UP_YOUNG] + m[DOWN_OLD, DOWN_OLD] * p[DOWN_OLD]
        hold_od_uy = r * h + (m[UP_YOUNG, UP_YOUNG] * q[_OD_UY] + m[UP_YOUNG, UP_OLD] * q[_OD_UO]
                              + m[UP_YOUNG, DOWN_YOUNG] * q[_OD_DY])
        hold_od_uo = r * h + (m[UP_OLD, UP_OLD] * q[_OD_UO] + m[UP_OLD, DOWN_YOUNG] * q[_OD_DY])
        hold_od_dy = r * h + (m[DOWN_YOUNG, UP_YOUNG] * q[_OD_UY] + m[DOWN_YOUNG, DOWN_YOUNG] * q[_OD_DY]
                              + m[DOWN_YOUNG, DOWN_OLD] * q[_OD_DO])
        hold_od_do = r * h + (m[DOWN_OLD, UP_YOUNG] * q[_OD_UY] + m[DOWN_OLD, DOWN_OLD] * q[_OD_DO])
        preempted = (1 - frac) * prev[w - 1 + lo, DOWN_YOUNG] + frac * prev[w + lo, DOWN_YOUNG]
        hold_spot_uy = (h + m[UP_YOUNG, UP_YOUNG] * q[_SPOT_UY] + m[UP_YOUNG, UP_OLD] * q[_SPOT_UO]
                        + m[UP_YOUNG, DOWN_YOUNG] * preempted)
        hold_spot_uo = h + m[UP_OLD, UP_OLD] * q[_SPOT_UO] + m[UP_OLD, DOWN_YOUNG] * preempted
        for c in range(4):
            # A change of market lands after the restart: spot on capacity (work on) or on an outage (none).
            land_spot = (restart + land[c, UP_YOUNG] * after[_SPOT_UY] + land[c, UP_OLD] * after[_SPOT_UO]
                         + land[c, DOWN_YOUNG] * after[DOWN_YOUNG] + land[c, DOWN_OLD] * after[DOWN_OLD])
            land_od = (r * restart + land[c, UP_YOUNG] * after[_OD_UY] + land[c, UP_OLD] * after[_OD_UO]
                       + land[c, DOWN_YOUNG] * after[_OD_DY] + land[c, DOWN_OLD] * after[_OD_DO])
            if c < DOWN_YOUNG:
                (now[w, c], codes[c], now[w, _SPOT_COL + c], codes[_SPOT_COL + c], now[w, _OD_COL + c],
                 codes[_OD_COL + c]) = _choose_up(
                    wait_uy if c == UP_YOUNG else wait_uo, hold_spot_uy if c == UP_YOUNG else hold_spot_uo,
                    hold_od_uy if c == UP_YOUNG else hold_od_uo, land_spot, land_od, r, switch)
                # Or boot spot beside on-demand (on-demand works k steps; the move pays the write on both), where
                # the policy's safety net lets it (scheduler.spot.policy: slack for the restart, two ticks and the
                # checkpoint); below that a boot the program counted on never comes.
                if warm and w >= k and s * h >= restart + 2 * h + switch - 1e-9:
                    boot = _boot_cost(back, w - k, c, r, h, switch, k, boot_ok, boot_failed, boot_billed)
                    if boot < now[w, _OD_COL + c]:
                        now[w, _OD_COL + c], codes[_OD_COL + c] = boot, BOOT_SPOT
            else:
                now[w, c], codes[c], now[w, _OD_COL + c], codes[_OD_COL + c] = _choose_down(
                    wait_dy if c == DOWN_YOUNG else wait_do, hold_od_dy if c == DOWN_YOUNG else hold_od_do, land_od, r,
                    switch)
        for j in range(5):
            packed[s, w, j] = codes[2 * j] | (codes[2 * j + 1] << 2)


def _boot_cost(back: FloatArray, done: int, c: int, r: float, h: float, switch: float, k: int,
               boot_ok: FloatArray, boot_failed: FloatArray, boot_billed: FloatArray) -> float:
    """Booting spot beside on-demand at up state ``c``: on-demand works the k steps of the boot (``back``'s row
    ``done``: the work left after them), the move to spot pays the checkpoint write on both."""
    boot = k * r * h + h * boot_billed[c]
    for e in range(2):
        boot += boot_ok[c, e] * (back[done, _SPOT_COL + e] + (r + 1) * switch)
    for e in range(4):
        boot += boot_failed[c, e] * back[done, _OD_COL + e]
    return float(boot)


def _choose_up(wait: float, hold_spot: float, hold_od: float, land_spot: float, land_od: float, r: float,
               switch: float) -> tuple[float, int, float, int, float, int]:
    """(value, action) of an up state's three columns: no market, spot and on-demand (the boot of spot beside
    on-demand is weighed after, by the caller)."""
    # No market, capacity: wait / spot / on-demand.
    none = min(min(wait, land_spot), land_od)
    none_code = SPOT if land_spot <= min(wait, land_od) else ON_DEMAND if land_od < wait else WAIT
    # Spot: hold / on-demand (pays the checkpoint write on spot).
    to_od = switch + land_od
    spot_code = ON_DEMAND if to_od < hold_spot else SPOT
    # On-demand, capacity: hold / spot (pays the write on on-demand).
    to_spot = r * switch + land_spot
    best, code = (to_spot, SPOT) if to_spot < hold_od else (hold_od, ON_DEMAND)
    return none, none_code, min(hold_spot, to_od), spot_code, best, code


def _choose_down(wait: float, hold_od: float, land_od: float, r: float, switch: float) -> tuple[float, int, float, int]:
    """(value, action) of a down state's two columns: no market and on-demand (spot has no capacity to hold)."""
    # No market, no capacity: wait / on-demand. On-demand, no capacity: hold / leave it and wait.
    leave = r * switch + wait
    return (min(wait, land_od), ON_DEMAND if land_od < wait else WAIT,
            min(hold_od, leave), WAIT if leave < hold_od else ON_DEMAND)


# The induction's parts, compiled beside it (numba inlines them into its loops)
_CELL_PARTS = (_level, _boot_cost, _choose_up, _choose_down)


_Induction = Callable[[npt.NDArray[np.float64], npt.NDArray[np.float64], FloatArray, FloatArray,
                       npt.NDArray[np.int64], npt.NDArray[np.int64], FloatArray, FloatArray, npt.NDArray[np.bool_],
                       npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], Int8Array], None]


@functools.cache
def _compiled_induction() -> _Induction:
    """:func:`_induction` compiled on first use (a few seconds; numba caches the machine code on disk)."""
    try:
        import numba
    except ImportError as exc:  # interpreted, a table takes minutes: no silent fallback
        raise ExecutionError(f"the spot policy's slack-value program needs numba, which is not installed ({exc})",
                             hint="pip install 'numba>=0.60' (gpuplan's own requirements include it)") from None

    from numba.extending import register_jitable

    for part in _CELL_PARTS:  # each stays a plain function for Python; numba compiles it into its caller
        register_jitable(inline="always")(part)
    return cast(_Induction, numba.njit(cache=True, nogil=True)(_induction))
