"""Probe (not the policy): the slack-value program with a two-phase spell model, young / old, for runs and
outages, against greedy on the bench's trace families. Results: docs/SPOT.md, session block of 2026-12-03.

The product's program (scheduler/slack_value.py) is memoryless: a run or an outage ends at one rate. The
traces are not (half of all spells end within 30 minutes, the mean is hours). Here each spell is young
until it is ``TAU`` hours old (a geometric clock in the program, the real age at lookup) and old after;
each phase has its own hazard, estimated online per bin of age with the same recency weights and prior as
the mean (``online_hazard``). State columns: no market / on-demand x (up young, up old, down young, down
old) and spot x (young, old). It replaces the policy's table lookup by monkeypatching, so the rest of
``gpuplan`` (safety net, young-outage gate, returns by the reserve rule) is unchanged.

    .venv/bin/python bench/spot_phases_probe.py --traces DIR "aws-02-15-2023 1-node availability"
    HAZARD_BUCKETS=2 .venv/bin/python bench/spot_phases_probe.py --traces DIR   # hazards 41% apart
    SHAPE=6,3 HAZARD_BUCKETS=2 .venv/bin/python bench/spot_phases_probe.py --traces DIR   # one shared shape
    TAU=0.25 .venv/bin/python bench/spot_phases_probe.py --traces DIR aws-08-27

Costs: with online hazards per phase, four numbers to bucket instead of two means: ~4x the replay time (the
tuning family: 428 s against 114 s) and 139 s for the speed bench. With ``SHAPE`` (young hazard = a x old,
the old set from the online mean; a = 6 for runs, 3 for outages: the medians over the tuning family's
zones) the tables are keyed by the two means again: 9.6 s for the speed bench.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import spot  # noqa: E402

import scheduler.policy as pol  # noqa: E402
import scheduler.replay as rp  # noqa: E402
from scheduler.market_codes import ON_DEMAND, SPOT, WAIT  # noqa: E402
from scheduler.slack_value import (  # noqa: E402
    _LOG_BUCKET,
    GRID,
    NONE_DOWN,
    NONE_UP,
    OD_DOWN,
    OD_UP,
    SPOT_UP,
    _cells,
    _log_bucket,
    step_for,
)

TAU = float(os.environ.get("TAU", "0.5"))  # hours: a spell is young until then
INF = 1e7
HAZARD_BUCKETS = float(os.environ.get("HAZARD_BUCKETS", "4"))  # per doubling (the product's means: 4)
# SHAPE="a_run,a_outage": one shared shape instead of online hazards per phase: a young spell ends a_run
# (a_outage) times as fast as an old one, the old hazard set so that the mean is the online mean.
SHAPE = tuple(float(x) for x in os.environ["SHAPE"].split(",")) if os.environ.get("SHAPE") else None


# Chain states: 0 up young, 1 up old, 2 down young, 3 down old. Table columns: no market at chain state c
# (0-3), spot at up phase p (4-5), on-demand at chain state c (6-9).


@numba.njit(cache=True)  # type: ignore[misc]
def induct(m: Any, kk: Any, ratio: Any, switch_h: Any, restart_steps: Any, loss_lo: Any, loss_frac: Any,
           step_h: Any, actions: Any) -> None:
    """Backward induction as scheduler/slack_value.py's, over the 4-state chain ``m`` (one step) and
    ``kk`` (a restart of k steps)."""
    n = actions.shape[2] - 1
    for b in range(actions.shape[0]):
        k, lo, frac = restart_steps[b], loss_lo[b], loss_frac[b]
        r, h, sw = ratio[b], step_h[b], switch_h[b]
        restart = k * h
        ring = np.full((k + 1, 10, n + lo + 2), INF)
        ring[:, :, 0] = 0.0
        for t in range(1, 2 * n + 1):
            now, prev, back = ring[t % (k + 1)], ring[(t - 1) % (k + 1)], ring[(t - k) % (k + 1)]
            for w in range(max(1, t - n), min(t, n) + 1):
                s = t - w
                for c in range(4):
                    e_none = 0.0
                    e_od = 0.0
                    land_spot = restart
                    land_od = r * restart
                    for c2 in range(4):
                        e_none += m[b, c, c2] * prev[c2, w]
                        e_od += m[b, c, c2] * prev[6 + c2, w - 1]
                        vs = INF
                        vo = INF
                        if t >= k:
                            vs = back[4 + c2, w] if c2 < 2 else back[c2, w]
                            vo = back[6 + c2, w]
                        land_spot += kk[b, c, c2] * vs
                        land_od += kk[b, c, c2] * vo
                    hold_od = r * h + e_od
                    if c < 2:
                        now[c, w] = min(min(e_none, land_spot), land_od)
                        best = SPOT if land_spot <= min(e_none, land_od) else (ON_DEMAND if land_od < e_none else WAIT)
                        actions[b, s, w, c] = best
                        hold = h
                        for c2 in range(4):
                            if c2 < 2:
                                hold += m[b, c, c2] * prev[4 + c2, w - 1]
                            else:
                                lost = (1 - frac) * prev[c2, w - 1 + lo] + frac * prev[c2, w + lo]
                                hold += m[b, c, c2] * lost
                        to_od = sw + land_od
                        now[4 + c, w] = min(hold, to_od)
                        actions[b, s, w, 4 + c] = ON_DEMAND if to_od < hold else SPOT
                        to_spot = r * sw + land_spot
                        now[6 + c, w] = min(hold_od, to_spot)
                        actions[b, s, w, 6 + c] = SPOT if to_spot < hold_od else ON_DEMAND
                    else:
                        now[c, w] = min(e_none, land_od)
                        actions[b, s, w, c] = ON_DEMAND if land_od < e_none else WAIT
                        leave = r * sw + e_none
                        now[6 + c, w] = min(hold_od, leave)
                        actions[b, s, w, 6 + c] = WAIT if leave < hold_od else ON_DEMAND


def chain(run_young: float, run_old: float, out_young: float, out_old: float, h: float) -> np.ndarray:
    """One step of the chain: hazards per phase; a young spell turns old at rate 1 / TAU."""
    e0, e1 = 1 - np.exp(-run_young * h), 1 - np.exp(-run_old * h)
    b0, b1 = 1 - np.exp(-out_young * h), 1 - np.exp(-out_old * h)
    g = min(1.0, h / TAU)
    m = np.zeros((4, 4))
    m[0] = ((1 - e0) * (1 - g), (1 - e0) * g, e0, 0.0)
    m[1] = (0.0, 1 - e1, e1, 0.0)
    m[2] = (b0, 0.0, (1 - b0) * (1 - g), (1 - b0) * g)
    m[3] = (b1, 0.0, 0.0, 1 - b1)
    return m


CACHE: OrderedDict[tuple[float, ...], np.ndarray] = OrderedDict()


def tables(keys: np.ndarray) -> list[np.ndarray]:
    wanted = [tuple(float(x) for x in row) for row in keys]
    missing = sorted({k for k in wanted if k not in CACHE})
    if missing:
        b = np.array(missing)
        lam = 2.0 ** (b[:, :4] / HAZARD_BUCKETS)
        steps = b[:, 8]
        ms = np.stack([chain(*lam[i], steps[i]) for i in range(len(b))])
        ks = np.stack([np.linalg.matrix_power(ms[i], int(b[i, 4])) for i in range(len(b))])
        lo = np.floor(b[:, 5]).astype(np.int64)
        acts = np.zeros((len(b), GRID + 1, GRID + 1, 10), dtype=np.int8)
        induct(ms, ks, 2.0 ** (b[:, 7] / _LOG_BUCKET), b[:, 6] * steps, b[:, 4].astype(np.int64), lo,
               b[:, 5] - lo, steps, acts)
        for i, k in enumerate(missing):
            CACHE[k] = acts[i].copy()
    out = []
    for k in wanted:
        CACHE.move_to_end(k)
        out.append(CACHE[k])
    while len(CACHE) > 200:
        CACHE.popitem(last=False)
    return out


STASH: dict[str, np.ndarray] = {}


def best_actions(time_left_h: np.ndarray, work_left_h: np.ndarray, work_total_h: np.ndarray, column: np.ndarray,
                 *, restart_h: Any, switch_h: Any, loss_h: Any, mean_run_h: Any, mean_outage_h: Any,
                 price_ratio: Any) -> np.ndarray:
    """Drop-in for scheduler.slack_value.best_actions: hazards and phases from STASH, not the means."""
    n = time_left_h.shape[0]

    def full(x: Any) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,))

    hz_r, hz_o, run_phase, out_phase = STASH["hz_r"], STASH["hz_o"], STASH["rp"], STASH["op"]
    step = step_for(work_total_h)
    def bucket(x: np.ndarray) -> np.ndarray:
        return np.round(np.log2(np.clip(x, 1e-6, 1e4)) * HAZARD_BUCKETS)

    keys = np.stack([bucket(hz_r[:, 0]), bucket(hz_r[:, 1]), bucket(hz_o[:, 0]),
                     bucket(hz_o[:, 1]), np.maximum(1.0, np.round(full(restart_h) / step)),
                     np.round(full(loss_h) / step * 2.0) / 2.0, np.round(full(switch_h) / step, 2),
                     _log_bucket(full(price_ratio)), step], axis=1)
    col = np.select([column == NONE_UP, column == NONE_DOWN, column == SPOT_UP, column == OD_UP, column == OD_DOWN],
                    [run_phase, 2 + out_phase, 4 + run_phase, 6 + run_phase, 8 + out_phase])
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    w, s = _cells(time_left_h, work_left_h, step)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(uniq) + 1))
    out = np.zeros(n, dtype=np.int8)
    for g, table in enumerate(tables(uniq)):
        idx = order[bounds[g]:bounds[g + 1]]
        out[idx] = table[s[idx], w[idx], col[idx]]
    return out


def online_hazard(state: np.ndarray, gap_h: float, prior_h: float, half_life_h: float,
                  edges_h: tuple[float, ...] = (TAU,)) -> tuple[np.ndarray, np.ndarray]:
    """Per row and tick: the hazard per bin of spell age, counted from earlier ticks like the online mean
    (a tick in the state adds its hours to the bin of the spell's age; a spell's end adds one to the bin of
    its last tick; prior: one exponential spell of mean ``prior_h``), and the age of the spell now."""
    rows, ticks = state.shape
    age_ticks = np.maximum(rp.run_lengths(state) - 1.0, 0.0)
    bin_of_tick = np.searchsorted(np.asarray(edges_h) / gap_h, age_ticks + 1e-9, side="right")
    lo, hi = np.array((0.0, *edges_h)), np.array((*edges_h, np.inf))
    prior_ends = np.exp(-lo / prior_h) - np.exp(-hi / prior_h)
    prior_hours = prior_h * prior_ends
    keep = 0.5 ** (gap_h / half_life_h)
    nb = len(edges_h) + 1
    hours_k, ends_k = np.zeros((rows, nb)), np.zeros((rows, nb))
    hazard = np.zeros((rows, ticks, nb))
    r = np.arange(rows)
    for k in range(ticks):
        ended = np.zeros((rows, nb))
        if k >= 1:
            gone = state[:, k - 1] & ~state[:, k]
            ended[r[gone], bin_of_tick[gone, k - 1]] = 1.0
        hazard[:, k] = (ends_k + ended + prior_ends) / (hours_k + prior_hours)
        hours_k = hours_k * keep
        hours_k[r, bin_of_tick[:, k]] += np.where(state[:, k], gap_h, 0.0)
        ends_k = ends_k * keep + ended
    return hazard, np.where(state, age_ticks * gap_h, 0.0)


_SETUP, _DECISIONS = rp._setup, rp._decisions
_EXTRA: dict[int, tuple[np.ndarray, ...]] = {}


def _setup(zones: Any, prices: Any, opts: Any) -> Any:
    st = _SETUP(zones, prices, opts)
    hr, ar = online_hazard(zones.available, zones.gap_h, opts.prior_mean_run_h, opts.rate_half_life_h)
    ho, ao = online_hazard(~zones.available, zones.gap_h, pol.PRIOR_MEAN_OUTAGE_H, opts.rate_half_life_h)
    _EXTRA[id(st)] = (hr, ar, ho, ao)
    return st


def shaped(mean_h: np.ndarray, alpha: float) -> np.ndarray:
    """(young, old) hazards with young = alpha x old whose spell has mean ``mean_h`` (bisection on the old)."""
    g = 1.0 / TAU
    lo, hi = np.full(mean_h.shape, -30.0), np.full(mean_h.shape, 30.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        lam = np.exp(mid)
        mean = 1 / (alpha * lam + g) + g / (alpha * lam + g) / lam
        lo, hi = np.where(mean > mean_h, mid, lo), np.where(mean > mean_h, hi, mid)
    lam = np.exp((lo + hi) / 2)
    return np.stack([alpha * lam, lam], axis=-1)


def _decisions(policy: str, s: Any, setup: Any, jobs: Any, now: float, tt: Any, target: Any, means: Any,
               spot_any: Any) -> Any:
    hr, ar, ho, ao = _EXTRA[id(setup)]
    if SHAPE is None:
        hz_r, hz_o = hr[target, tt], ho[target, tt]
    else:
        hz_r = shaped(means[np.arange(len(target)), target], SHAPE[0])
        hz_o = shaped(setup.mean_outage[target, tt], SHAPE[1])
    STASH.update(hz_r=hz_r, hz_o=hz_o, rp=(ar[target, tt] >= TAU - 1e-9).astype(np.int64),
                 op=(ao[target, tt] >= TAU - 1e-9).astype(np.int64))
    return _DECISIONS(policy, s, setup, jobs, now, tt, target, means, spot_any)


def install() -> None:
    """Route the simulator's gpuplan decisions through the two-phase program."""
    rp._setup = _setup
    rp._decisions = _decisions
    pol.best_actions = best_actions  # type: ignore[assignment]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", required=True)
    parser.add_argument("--baseline", action="store_true", help="the product's program, for comparison")
    parser.add_argument("families", nargs="*", help="substrings of family names (default: all)")
    args = parser.parse_args()
    if not args.baseline:
        install()
    dirs = [d for d in sorted(Path(args.traces).glob("*/*-node/*")) if any(d.glob("*.json"))]
    for d in dirs:
        fam = spot.load_family(d)
        if args.families and not any(s in fam.name for s in args.families):
            continue
        t0 = time.time()
        res = spot.run_family(fam, ("greedy", "gpuplan"))
        _, below, _, cells, level = spot.cell_table(res)
        g, gr = res["gpuplan"], res["greedy"]
        print(f"{fam.name}: cells below / level / above greedy {below}/{level}/{cells - below - level}, "
              f"median {np.median(g['ratio']):.4f} (greedy {np.median(gr['ratio']):.4f}), mean "
              f"{np.mean(g['ratio']):.4f} (greedy {np.mean(gr['ratio']):.4f}), met {g['met'].mean():.1%}, "
              f"{time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
