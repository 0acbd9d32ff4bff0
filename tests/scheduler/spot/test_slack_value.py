"""The slack-value program (scheduler.spot.slack_value): what it decides where the answer is known, and its inputs."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import ExecutionError, InvalidInput
from scheduler.spot.market_codes import BOOT_SPOT, ON_DEMAND, SPOT, WAIT
from scheduler.spot.slack_value import (
    GRID,
    NONE_DOWN,
    NONE_UP,
    OD_DOWN,
    OD_UP,
    SPOT_UP,
    YOUNG_H,
    _compiled_induction,
    _induction,
    best_actions,
    boot_odds,
    market_chain,
    phase_hazards,
    step_for,
    table_column,
    table_for,
)


def act(column: int, work_left: float, slack: float, run_age_h: float = np.inf, outage_age_h: float = np.inf,
        make_before_break: bool = False, **kw: float) -> int:
    rates = {"mean_run_h": 5.0, "mean_outage_h": 1.0, "restart_h": 0.2, "loss_h": 0.03, "switch_h": 0.001,
             "price_ratio": 3.3, **kw}
    table = table_for(rates["mean_run_h"], rates["mean_outage_h"], rates["restart_h"], rates["loss_h"],
                      rates["switch_h"], rates["price_ratio"], float(step_for(48.0)), make_before_break)
    col = table_column(np.array([column]), run_age_h, outage_age_h)
    return int(table.lookup(np.array([work_left + slack]), np.array([work_left]), col)[0])


def test_plentiful_slack_waits_out_an_outage_and_takes_spot_when_it_comes() -> None:
    assert act(NONE_DOWN, 24.0, 30.0) == WAIT
    assert act(NONE_UP, 24.0, 30.0) == SPOT
    assert act(SPOT_UP, 24.0, 30.0) == SPOT
    assert act(OD_UP, 24.0, 30.0) == SPOT  # back to spot: runs of 5 h pay two 0.2 h changeovers


def test_scarce_slack_with_long_outages_goes_on_demand_and_stays() -> None:
    assert act(NONE_DOWN, 24.0, 1.0, mean_outage_h=10.0) == ON_DEMAND
    assert act(OD_DOWN, 24.0, 1.0, mean_outage_h=10.0) == ON_DEMAND


def test_prices_decide_when_the_market_never_fails() -> None:
    # Spot never preempted: it is the cheaper way to work; with on-demand cheaper than spot, on-demand is
    # (or waiting for it, which costs the same when the slack is worth nothing).
    assert act(NONE_UP, 24.0, 5.0, mean_run_h=1e4) == SPOT
    assert act(NONE_UP, 24.0, 5.0, mean_run_h=1e4, price_ratio=0.5) in (WAIT, ON_DEMAND)
    assert act(SPOT_UP, 24.0, 5.0, mean_run_h=1e4, price_ratio=0.5) == ON_DEMAND


def test_tables_are_shared_within_a_bucket_and_inputs_are_checked() -> None:
    a = table_for(5.0, 1.0, 0.2, 0.03, 0.0, 3.3, 1 / 12)
    assert table_for(5.05, 1.01, 0.205, 0.03, 0.0, 3.31, 1 / 12) is a
    assert table_for(50.0, 1.0, 0.2, 0.03, 0.0, 3.3, 1 / 12) is not a
    with pytest.raises(InvalidInput, match="positive"):
        table_for(0.0, 1.0, 0.2, 0.0, 0.0, 3.3, 1 / 12)
    with pytest.raises(InvalidInput, match=">= 0"):
        table_for(5.0, 1.0, -0.2, 0.0, 0.0, 3.3, 1 / 12)


def test_the_grid_step_grows_with_the_work_so_every_job_fits() -> None:
    assert float(step_for(48.0)) == pytest.approx(1 / 12)
    assert float(step_for(500.0)) * GRID >= 500.0
    assert float(step_for(500.0)) < 1000.0 / GRID


@given(work=st.floats(0.1, 200.0), slack=st.floats(0.0, 500.0), run=st.floats(0.05, 500.0),
       outage=st.floats(0.05, 100.0), restart=st.floats(0.0, 1.0), column=st.sampled_from([NONE_DOWN, OD_DOWN]))
@settings(max_examples=40, deadline=None)
def test_no_spot_is_ever_chosen_without_capacity(work: float, slack: float, run: float, outage: float,
                                                 restart: float, column: int) -> None:
    out = best_actions(np.array([work + slack]), np.array([work]), np.array([work]), np.array([column]),
                       restart_h=restart, switch_h=0.0, loss_h=0.0, mean_run_h=run, mean_outage_h=outage,
                       price_ratio=3.3)
    assert int(out[0]) in (WAIT, ON_DEMAND)


def _vectorised_reference(run: np.ndarray, outage: np.ndarray, k: int, loss_steps: np.ndarray,
                          switch_steps: np.ndarray, ratio: np.ndarray, h: float, n: int) -> np.ndarray:
    """The memoryless program written another way (the module's first, numpy-vectorised form): every level
    of time left at once over all work, with the infeasible region masked. Returns actions (B, n+1, n+1, 5)
    and each choice's margin (the second-best value minus the best; near 0: a tie)."""
    big = 1e7
    col = (slice(None), None)
    r = ratio[col]
    p_end, p_back = 1.0 - np.exp(-h / run), 1.0 - np.exp(-h / outage)
    one = np.stack([np.stack([1.0 - p_end, p_end], axis=1), np.stack([p_back, 1.0 - p_back], axis=1)], axis=1)
    pk = np.linalg.matrix_power(one, k)
    pe, pb = p_end[col], p_back[col]
    k00, k01, k10, k11 = (pk[:, i, j][col] for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    restart, switch = k * h, (switch_steps * h)[col]
    nb, width = run.shape[0], n + 1
    w = np.arange(width)
    lo = np.floor(loss_steps).astype(np.int64)
    frac = (loss_steps - lo)[col]
    pad = int(lo.max()) + 3
    at_lo = np.clip(w[None, :] + lo[:, None], 0, width + pad)
    at_hi = np.clip(w[None, :] + lo[:, None] + 1, 0, width + pad)
    rows = np.arange(nb)[:, None]
    actions = np.zeros((nb, width, width, 5), dtype=np.int8)
    margins = np.zeros((nb, width, width, 5))
    ring = np.zeros((k + 1, 5, nb, width))
    infeasible = np.full((5, nb, width), big)
    ext = np.full((nb, width + 1 + pad), big)
    ext[:, 0] = 0.0

    def minus_one(arr: np.ndarray) -> np.ndarray:
        return np.concatenate([np.zeros((nb, 1)), arr[:, :-1]], axis=1)

    for t in range(2 * n + 1):
        nu, nd, su, ou, od = ring[(t - 1) % (k + 1)] if t >= 1 else infeasible
        _, bd, bsu, bou, bod = ring[(t - k) % (k + 1)] if t >= k else infeasible
        n_up, n_dn = (1 - pe) * nu + pe * nd, pb * nu + (1 - pb) * nd
        o_up, o_dn = (1 - pe) * ou + pe * od, pb * ou + (1 - pb) * od
        ext[:, 1:width + 1] = nd
        preempted = (1 - frac) * ext[rows, at_lo] + frac * ext[rows, at_hi]
        hold_spot = h + (1 - pe) * minus_one(su) + pe * preempted
        hold_od_up, hold_od_dn = r * h + minus_one(o_up), r * h + minus_one(o_dn)
        land_spot = restart + k00 * bsu + k01 * bd
        land_od_up = r * restart + k00 * bou + k01 * bod
        land_od_dn = r * restart + k10 * bou + k11 * bod
        a_nu = np.where(land_spot <= np.minimum(n_up, land_od_up), SPOT, np.where(land_od_up < n_up, ON_DEMAND, WAIT))
        a_nd = np.where(land_od_dn < n_dn, ON_DEMAND, WAIT)
        to_od, to_spot, leave = switch + land_od_up, r * switch + land_spot, r * switch + n_dn
        a_su = np.where(to_od < hold_spot, ON_DEMAND, SPOT)
        a_ou = np.where(to_spot < hold_od_up, SPOT, ON_DEMAND)
        a_od = np.where(leave < hold_od_dn, WAIT, ON_DEMAND)
        vals = np.stack([np.minimum(np.minimum(n_up, land_spot), land_od_up), np.minimum(n_dn, land_od_dn),
                         np.minimum(hold_spot, to_od), np.minimum(hold_od_up, to_spot), np.minimum(hold_od_dn, leave)])
        vals[:, :, w > t] = big
        vals[:, :, 0] = 0.0
        ring[t % (k + 1)] = vals
        ws = np.arange(max(1, t - n), min(t, n) + 1)  # work 0 is done: no action
        actions[:, t - ws, ws] = np.stack([a_nu, a_nd, a_su, a_ou, a_od], axis=2)[:, ws]
        three = np.sort(np.stack([n_up, land_spot, land_od_up]), axis=0)
        gaps = [three[1] - three[0], abs(land_od_dn - n_dn), abs(to_od - hold_spot), abs(to_spot - hold_od_up),
                abs(leave - hold_od_dn)]
        margins[:, t - ws, ws] = np.stack(gaps, axis=2)[:, ws]
    return actions, margins


@given(restart=st.integers(1, 6), loss=st.sampled_from([0.0, 0.5, 1.0, 2.5]), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=25, deadline=None)
def test_without_phases_the_compiled_induction_equals_the_memoryless_program(restart: int, loss: float,
                                                                           seed: int) -> None:
    # Young and old spells ending at the same rate: the four-state chain is the two-state one, and every
    # column of a phase must choose what the memoryless program chooses (ties aside: values agree to 1e-12).
    rng = np.random.default_rng(seed)
    nb, n, h = 3, 40, 1 / 12
    run, outage = 2.0 ** rng.uniform(-3, 6, nb), 2.0 ** rng.uniform(-3, 4, nb)
    switch, ratio = np.round(rng.uniform(0, 2, nb), 2), 2.0 ** rng.uniform(-1, 2, nb)
    want, margin = _vectorised_reference(run, outage, restart, np.full(nb, loss), switch, ratio, h, n)
    one = market_chain(run, outage, np.full(nb, h), 1.0, 1.0)
    after = np.stack([np.linalg.matrix_power(m, restart) for m in one])
    lo = np.full(nb, int(np.floor(loss)))
    args = (one, after, ratio, switch * h, np.full(nb, restart), lo, np.full(nb, loss) - lo, np.full(nb, h),
            np.zeros(nb, dtype=bool), np.zeros((nb, 2, 2)), np.zeros((nb, 2, 4)), np.zeros((nb, 2)))
    packed = np.zeros((nb, n + 1, n + 1, 5), dtype=np.int8)
    _compiled_induction()(*args, packed)
    got = np.stack([(packed[..., c // 2] >> (2 * (c % 2))) & 3 for c in range(10)], axis=-1)
    clear = margin > 1e-9
    for c5, cols in ((NONE_UP, (0, 1)), (NONE_DOWN, (2, 3)), (SPOT_UP, (4, 5)), (OD_UP, (6, 7)), (OD_DOWN, (8, 9))):
        for c in cols:
            np.testing.assert_array_equal(got[..., c][clear[..., c5]], want[..., c5][clear[..., c5]])
    assert clear.mean() > 0.5  # the comparison is not vacuous (the rest: done, infeasible on both sides, ties)
    interpreted = np.zeros_like(packed)
    _induction(*args, interpreted)  # the same function run by Python: what numba compiled is what is written
    np.testing.assert_array_equal(interpreted, packed)


def test_a_young_outage_is_waited_out_where_an_old_one_of_the_same_zone_is_bridged() -> None:
    # Same zone, same mean outage (2 h), 3 h of slack for 24 h of work: a young outage ends 3x as fast as an old one.
    kw = {"mean_outage_h": 2.0}
    assert act(NONE_DOWN, 24.0, 3.0, outage_age_h=0.0, **kw) == WAIT
    assert act(NONE_DOWN, 24.0, 3.0, outage_age_h=YOUNG_H, **kw) == ON_DEMAND


def test_phase_hazards_keep_the_mean() -> None:
    mean = np.array([0.1, 0.5, 2.0, 40.0])
    for ratio in (1.0, 3.0, 6.0):
        young, old = phase_hazards(mean, ratio)
        leave = young + 1.0 / YOUNG_H
        np.testing.assert_allclose(1.0 / leave + (1.0 / YOUNG_H) / leave / old, mean, rtol=1e-9)
        np.testing.assert_allclose(young, ratio * old)


def test_without_numba_the_program_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    _compiled_induction.cache_clear()
    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    try:
        with pytest.raises(ExecutionError, match=r"needs numba.*pip install 'numba>=0.60'"):
            _compiled_induction()
    finally:
        _compiled_induction.cache_clear()  # the next caller compiles (numba's disk cache makes it quick)


@given(run=st.floats(0.05, 50.0), outage=st.floats(0.05, 20.0), steps=st.integers(1, 12))
@settings(max_examples=40, deadline=None)
def test_a_boot_either_lasts_or_fails_and_is_billed_while_it_lives(run: float, outage: float, steps: int) -> None:
    one = market_chain(np.array([run]), np.array([outage]), np.array([1 / 12]))[0]
    ok, failed, billed = boot_odds(one, steps)
    np.testing.assert_allclose(ok.sum(axis=1) + failed.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(billed >= 1.0 - 1e-12) and np.all(billed <= steps + 1e-12)
    # Memoryless (young and old alike): capacity lasts each step with the same odds.
    flat = market_chain(np.array([run]), np.array([outage]), np.array([1 / 12]), 1.0, 1.0)[0]
    ok1, _, billed1 = boot_odds(flat, steps)
    stay = flat[1, 1]
    np.testing.assert_allclose(ok1.sum(axis=1), stay ** steps, rtol=1e-9)
    np.testing.assert_allclose(billed1, sum(stay ** j for j in range(steps)), rtol=1e-9)


def test_a_boot_beside_on_demand_is_how_a_tight_job_returns_to_spot_and_a_loose_one_breaks_first() -> None:
    # On on-demand with capacity back, 24 h of work, restart 0.4 h. With 0.8 h of slack a return that stops
    # on-demand first burns half the slack and leaves too little for the next preemption: hold on-demand.
    # Booting spot beside it costs no slack: boot. With 30 h of slack the slack is worth nothing, and a boot
    # (on-demand billed through it) costs more than the restart: break first.
    kw = {"restart_h": 0.4, "mean_run_h": 20.0}
    assert act(OD_UP, 24.0, 0.8, **kw) == ON_DEMAND
    assert act(OD_UP, 24.0, 0.8, make_before_break=True, **kw) == BOOT_SPOT
    assert act(OD_UP, 24.0, 30.0, make_before_break=True, **kw) == SPOT
    # Only on on-demand: nowhere else is there an instance to work through the boot.
    for column in (NONE_UP, NONE_DOWN, SPOT_UP, OD_DOWN):
        assert act(column, 24.0, 0.8, make_before_break=True, **kw) != BOOT_SPOT


@given(restart=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=10, deadline=None)
def test_with_boots_the_compiled_induction_is_the_python_one(restart: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    nb, n, h = 3, 40, 1 / 12
    run, outage = 2.0 ** rng.uniform(-3, 6, nb), 2.0 ** rng.uniform(-3, 4, nb)
    one = market_chain(run, outage, np.full(nb, h))
    odds = [boot_odds(m, restart) for m in one]
    args = (one, np.stack([np.linalg.matrix_power(m, restart) for m in one]), 2.0 ** rng.uniform(-1, 2, nb),
            np.round(rng.uniform(0, 2, nb), 2) * h, np.full(nb, restart), np.zeros(nb, dtype=np.int64),
            np.full(nb, 0.5), np.full(nb, h), np.array([True, False, True]), np.stack([o[0] for o in odds]),
            np.stack([o[1] for o in odds]), np.stack([o[2] for o in odds]))
    packed, interpreted = (np.zeros((nb, n + 1, n + 1, 5), dtype=np.int8) for _ in range(2))
    _compiled_induction()(*args, packed)
    _induction(*args, interpreted)
    np.testing.assert_array_equal(interpreted, packed)
    booted = ((packed[..., 3:5] >> 0) & 3 == BOOT_SPOT) | ((packed[..., 3:5] >> 2) & 3 == BOOT_SPOT)
    assert not booted[1].any()  # the bucket that may not boot never does
