"""Trace replay: exact costs on simple traces, invariants on random ones, the omniscient bound."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import InvalidInput, UnknownName
from planner.cost import just_in_time_reserve_s
from scheduler.sim.model import JIT_STEP_S
from scheduler.sim.replay import online_mean_outage
from scheduler.sim.simulate import (
    Jobs,
    PolicyOutcome,
    Prices,
    SimOptions,
    compare,
    omniscient,
    online_mean_run,
    run_policy,
    start_tick_for,
)
from scheduler.sim.traces import Zones, align, load_trace, load_zones, trace_from_dict
from scheduler.spot.market_codes import NONE, ON_DEMAND, SPOT
from scheduler.spot.policy import ZoneSeen, young_daly_interval

DATA = Path(__file__).resolve().parents[2] / "data" / "traces"
PRICES = Prices(on_demand=3.0, spot=1.0)
DEADLINE_POLICIES = ("greedy", "uniform-progress", "gpuplan")


def zones_of(*names: str) -> Zones:
    return load_zones([DATA / f"{n}.json" for n in names])


def zones_from(avail: list[int], gap_s: float = 360.0) -> Zones:
    return align([trace_from_dict({"metadata": {"gap_seconds": gap_s}, "data": avail}, "z")])


def test_on_demand_costs_work_times_price_plus_one_restart() -> None:
    z = zones_of("flaky-a")
    jobs = Jobs.make([0, 7, 100], [10.0, 12.5, 3.0], [20.0, 20.0, 5.0], [0.0, 0.3, 0.1])
    out = run_policy(z, jobs, "on-demand", PRICES)
    np.testing.assert_allclose(out.cost_usd, (jobs.work_h + jobs.restart_h) * 3.0)
    np.testing.assert_allclose(out.finish_h, jobs.work_h + jobs.restart_h)
    assert out.deadline_met.all() and out.preemptions.sum() == 0


def test_always_available_spot_is_one_restart_and_the_work_at_spot_price() -> None:
    z = zones_of("always")
    jobs = Jobs.make([0], 10.0, 15.0, 0.2)
    for policy in ("spot-only", *DEADLINE_POLICIES):
        out = run_policy(z, jobs, policy, PRICES)
        assert out.cost_usd[0] == pytest.approx(10.2 * 1.0)
        assert out.finish_h[0] == pytest.approx(10.2)
        assert out.preemptions[0] == 0
    assert omniscient(z, jobs, PRICES).cost_usd[0] == pytest.approx(10.2)


def test_never_available_deadline_policies_fall_back_just_in_time() -> None:
    z = zones_of("never")
    jobs = Jobs.make([0], 10.0, 20.0, 0.2)
    assert np.isnan(run_policy(z, jobs, "spot-only", PRICES).finish_h[0])
    greedy = run_policy(z, jobs, "greedy", PRICES)
    assert greedy.deadline_met[0] and greedy.cost_usd[0] == pytest.approx(10.2 * 3.0)
    # Greedy waits until the slack (10 h) can absorb only a restart and a tick.
    assert 19.5 < greedy.finish_h[0] <= 20.0


def test_preemption_with_periodic_checkpoints_loses_work_and_costs_more() -> None:
    z = zones_of("halves-a")  # available for 30 h, then gone
    jobs = Jobs.make([0], 40.0, 58.0, 0.1)
    free = run_policy(z, jobs, "gpuplan", PRICES)
    paid = run_policy(z, jobs, "gpuplan", PRICES, SimOptions(checkpoint_cost_h=0.2, mttp_h=(5.0,)))
    assert free.preemptions[0] == paid.preemptions[0] == 1
    assert free.work_lost_h[0] == 0.0
    assert 0.0 < paid.work_lost_h[0] < 5.0
    assert paid.cost_usd[0] > free.cost_usd[0]
    assert free.deadline_met[0] and paid.deadline_met[0]


def test_zones_fall_back_across_each_other() -> None:
    z = zones_of("halves-a", "halves-b")
    jobs = Jobs.make([0], 40.0, 58.0, 0.2)
    for policy in ("spot-only", "gpuplan"):
        out = run_policy(z, jobs, policy, PRICES)
        assert out.preemptions[0] == 1
        assert out.on_demand_h[0] == 0.0
        assert out.cost_usd[0] == pytest.approx((40.0 + 0.4) * 1.0)
    one_zone = run_policy(zones_of("halves-a"), jobs, "gpuplan", PRICES)
    assert one_zone.on_demand_h[0] > 0


def test_trace_prices_are_used_where_present() -> None:
    z = zones_of("priced")
    jobs = Jobs.make([0], 5.0, 100.0, 0.0)
    out = run_policy(z, jobs, "spot-only", PRICES)
    assert 0.9 * 5.0 <= out.cost_usd[0] <= 1.0 * 5.0 + 1e-9
    assert out.cost_usd[0] != pytest.approx(5.0)


def brute_force(avail: list[int], work: float, deadline: float, restart: float, gap: float) -> float:
    """Cheapest finish by trying every per-tick choice (idle / on-demand / spot) - exact delays."""
    best = np.inf
    horizon = int(np.ceil(deadline / gap - 1e-9))
    for plan in itertools.product((0, 1, 2), repeat=horizon):
        market, pending, done, cost = 0, 0.0, 0.0, 0.0
        for t, choice in enumerate(plan):
            if choice == 2 and not avail[t]:
                break
            if choice != market:
                pending = restart if choice else 0.0
                market = choice
            if not market:
                continue
            price = PRICES.spot if market == 2 else PRICES.on_demand
            delay = min(pending, gap)
            pending -= delay
            gain = min(gap - delay, work - done)
            cost += price * (delay + gain)
            done += gain
            if done >= work - 1e-9:
                best = min(best, cost)
                break
    return float(best)


@given(avail=st.lists(st.integers(0, 1), min_size=7, max_size=7), work_ticks=st.integers(2, 5),
       restart_ticks=st.integers(0, 2), extra=st.integers(0, 2))
@settings(max_examples=25, deadline=None)
def test_omniscient_equals_brute_force_on_small_instances(avail: list[int], work_ticks: int, restart_ticks: int,
                                                         extra: int) -> None:
    gap = 0.1
    work, restart = work_ticks * gap / 2, restart_ticks * gap / 2
    deadline = min(7 * gap, work + restart + extra * gap)
    z = zones_from(avail)
    bound = omniscient(z, Jobs.make([0], work, deadline, restart), PRICES, resolution=2).cost_usd[0]
    assert bound == pytest.approx(brute_force(avail, work, deadline, restart, gap), abs=1e-9)


runs = st.lists(st.integers(1, 40), min_size=2, max_size=30)


@given(runs=runs, first_up=st.booleans(), work=st.floats(2.0, 20.0), slack=st.floats(0.0, 1.0),
       restart=st.floats(0.0, 0.5), start=st.integers(0, 50), ckpt=st.sampled_from([0.0, 0.05]))
@settings(max_examples=30, deadline=None)
def test_invariants_on_random_traces(runs: list[int], first_up: bool, work: float, slack: float, restart: float,
                                     start: int, ckpt: float) -> None:
    avail: list[int] = []
    for i, length in enumerate(runs):
        avail += [int(first_up) if i % 2 == 0 else int(not first_up)] * length
    avail += [0] * 400  # room for any deadline
    z = zones_from(avail)
    deadline = work + restart + slack * work
    jobs = Jobs.make([start], work, deadline, restart)
    results = compare(z, jobs, PRICES, opts=SimOptions(checkpoint_cost_h=ckpt), resolution=2)
    bound = results["omniscient"].cost_usd[0]
    for name, out in results.items():
        if name in DEADLINE_POLICIES or name == "on-demand":
            assert out.deadline_met[0], f"{name} missed a feasible deadline"
        if out.deadline_met[0]:
            assert bound <= out.cost_usd[0] + 1e-9, f"omniscient above {name}"
        assert out.work_lost_h[0] >= 0.0
    if restart == 0.0:
        assert results["on-demand"].cost_usd[0] == pytest.approx(work * PRICES.on_demand)


HONEST = SimOptions(checkpoint_cost_h=0.01, checkpoint_write_h=0.02, notice_h=0.05, move_h=0.03)


@given(runs=runs, first_up=st.booleans(), runs_b=runs, work=st.floats(2.0, 20.0), slack=st.floats(0.0, 1.0),
       restart=st.floats(0.0, 0.5), start=st.integers(0, 50), notice=st.sampled_from([0.0, 0.05]),
       boots=st.booleans())
@settings(max_examples=16, deadline=None)
def test_honest_costs_keep_the_guarantees_in_one_zone_and_across_two(
        runs: list[int], first_up: bool, runs_b: list[int], work: float, slack: float, restart: float,
        start: int, notice: float, boots: bool) -> None:
    def trace(rs: list[int], up: bool) -> list[int]:
        out: list[int] = []
        for i, length in enumerate(rs):
            out += [int(up) if i % 2 == 0 else int(not up)] * length
        return (out + [0] * 470)[:470]  # room for the latest deadline (50 + 406 ticks)

    a, b = trace(runs, first_up), trace(runs_b, not first_up)
    one = zones_from(a)
    two = align([trace_from_dict({"metadata": {"gap_seconds": 360.0}, "data": x}, n) for x, n in ((a, "a"), (b, "b"))])
    opts = replace(HONEST, notice_h=notice, make_before_break=boots)
    # The slack must cover one changeover and the checkpoint it waits for.
    deadline = work + restart + opts.checkpoint_write_h + opts.move_h + slack * work
    jobs = Jobs.make([start], work, deadline, restart)
    for zones in (one, two):
        results = compare(zones, jobs, PRICES, ("on-demand", "greedy", "gpuplan", "omniscient"), opts, resolution=2)
        bound = results["omniscient"].cost_usd[0]
        od = results["on-demand"].cost_usd[0]
        for name in ("greedy", "gpuplan"):
            out = results[name]
            assert out.deadline_met[0], f"{name} missed a feasible deadline in {len(zones.names)} zone(s)"
            assert bound <= out.cost_usd[0] + 1e-9
            # Never more than on-demand by more than the restart budget (the slack it may spend).
            assert out.cost_usd[0] <= od + PRICES.on_demand * (deadline - work + restart) + 1e-9
            if notice > 0:  # just in time: a preemption loses at most the notice window
                assert out.work_lost_h[0] <= notice * out.preemptions[0] + 1e-9
    # Knowing two zones can only help the bound, and so can booting spot beside on-demand.
    assert omniscient(two, jobs, PRICES, 2).cost_usd[0] <= omniscient(one, jobs, PRICES, 2).cost_usd[0] + 1e-9
    assert (omniscient(one, jobs, PRICES, 2, make_before_break=True).cost_usd[0]
            <= omniscient(one, jobs, PRICES, 2).cost_usd[0] + 1e-9)


def test_a_voluntary_changeover_waits_for_its_checkpoint_on_the_old_instance() -> None:
    z = zones_from([0] * 20 + [1] * 400, gap_s=360.0)  # no spot for 2 h, then spot for good
    jobs = Jobs.make([0], 10.0, 12.0, 0.2)
    # A zone that runs 2 h between preemptions, 2 h of slack: the job bridges the outage on on-demand,
    # then goes back to spot once capacity is back (a voluntary changeover). When the bridge begins and
    # ends is the policy's call (the slack-value program's); the accounting of the changeover is the same.
    out = run_policy(z, jobs, "gpuplan", PRICES, SimOptions(mttp_h=(2.0,), checkpoint_write_h=0.05, timeline=True))
    assert out.preemptions[0] == 0 and out.timeline_market is not None
    market = out.timeline_market[:, 0]
    back_h = 0.1 * int(np.argmax(market == SPOT))  # the tick the job went back to spot
    assert back_h >= 2.0 and set(market[market != NONE]) == {SPOT, ON_DEMAND}
    # On-demand from the bridge's start until the return (0.2 h of it the restart), then 0.05 h more for the
    # checkpoint.
    bridge_h = out.on_demand_h[0] - 0.05
    assert 0.2 < bridge_h <= back_h and bridge_h * 10 == pytest.approx(round(bridge_h * 10))  # whole 6-min ticks
    work_on_od = bridge_h - 0.2
    # Spot boots meanwhile: restart 0.2 h, then the work left; no extra delay.
    assert out.spot_h[0] == pytest.approx(0.2 + 10.0 - work_on_od)
    assert out.finish_h[0] == pytest.approx(back_h + 0.2 + 10.0 - work_on_od)
    assert out.cost_usd[0] == pytest.approx((bridge_h + 0.05) * PRICES.on_demand + out.spot_h[0] * PRICES.spot)

BOOTS = SimOptions(mttp_h=(2.0,), checkpoint_write_h=0.05, timeline=True, make_before_break=True)


def booted(avail: list[int], boots: int, lost: int) -> tuple[PolicyOutcome, float, float]:
    """A 10 h job (deadline 12 h, restart 0.2 h) on 6-minute ticks under ``BOOTS``, after ``boots`` boots of which
    ``lost`` lost their capacity: (its outcome, when it went on-demand, when it moved to spot), in hours."""
    out = run_policy(zones_from(avail, gap_s=360.0), Jobs.make([0], 10.0, 12.0, 0.2), "gpuplan", PRICES, BOOTS)
    assert out.timeline_market is not None and out.boots is not None and out.boots_lost is not None
    assert (out.boots[0], out.boots_lost[0], out.preemptions[0]) == (boots, lost, 0)
    market = out.timeline_market[:, 0]
    return out, 0.1 * int(np.argmax(market == ON_DEMAND)), 0.1 * int(np.argmax(market == SPOT))


def test_a_boot_beside_on_demand_moves_the_job_to_spot_without_stopping_its_work() -> None:
    out, od_from, moved = booted([0] * 20 + [1] * 400, boots=1, lost=0)  # no spot for 2 h, then spot for good
    # Capacity came back at 2.0 h: spot booted beside on-demand for the restart (0.2 h, two 6-min ticks) and
    # took the job at the next tick; on-demand worked all the while, then waited 0.05 h for the checkpoint.
    assert moved == pytest.approx(2.2)
    assert out.on_demand_h[0] == pytest.approx(moved - od_from + 0.05)
    work_on_od = moved - od_from - 0.2
    # The only time not worked after the first start: that start's restart and the spot side's wait for the
    # checkpoint.
    assert out.finish_h[0] == pytest.approx(od_from + 0.2 + 0.05 + 10.0)
    assert out.spot_h[0] == pytest.approx(0.2 + 0.05 + 10.0 - work_on_od)
    assert out.cost_usd[0] == pytest.approx(out.on_demand_h[0] * PRICES.on_demand + out.spot_h[0] * PRICES.spot)
    plain = run_policy(zones_from([0] * 20 + [1] * 400, gap_s=360.0), Jobs.make([0], 10.0, 12.0, 0.2), "gpuplan",
                       PRICES, replace(BOOTS, make_before_break=False))
    assert plain.boots is not None and plain.boots[0] == 0  # only where the caller can boot ahead


def test_a_boot_whose_capacity_vanishes_costs_only_the_ticks_it_lived() -> None:
    # Capacity comes back at 2.0 h for two ticks only, then again at 3.2 h for good.
    out, od_from, moved = booted([0] * 20 + [1] * 2 + [0] * 10 + [1] * 400, boots=2, lost=1)
    assert moved == pytest.approx(3.4)  # the second boot took the job
    # The lost boot: billed the two ticks it lived; the job never stopped working on on-demand.
    assert out.finish_h[0] == pytest.approx(od_from + 0.2 + 0.05 + 10.0)
    assert out.spot_h[0] == pytest.approx(0.2 + 0.2 + 0.05 + 10.0 - (moved - od_from - 0.2))


def test_the_bound_boots_spot_only_where_the_zone_had_capacity_through_the_boot() -> None:
    from scheduler.spot.bound import boot_windows

    available = np.array([[1, 1, 1, 0, 1, 1, 1, 1]], dtype=bool)
    price = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]])
    # A 0.15 h restart on 0.1 h ticks boots for two whole ticks: a move at T needs capacity at T-2 .. T.
    ok, cost = boot_windows(available, price, 0.1, 0.15)
    assert ok[0].tolist() == [False, False, True, False, False, False, True, True]
    assert cost[0, 2] == pytest.approx((1.0 + 2.0) * 0.1) and cost[0, 7] == pytest.approx((6.0 + 7.0) * 0.1)


def test_a_preemption_loses_the_notice_window_with_a_just_in_time_checkpoint_else_the_interval() -> None:
    z = zones_of("halves-a")  # available for 30 h, then gone
    jobs = Jobs.make([0], 40.0, 58.0, 0.1)
    base = SimOptions(checkpoint_cost_h=0.05, mttp_h=(5.0,), checkpoint_write_h=0.02)
    jit = run_policy(z, jobs, "gpuplan", PRICES, replace(base, notice_h=0.1))
    blind = run_policy(z, jobs, "gpuplan", PRICES, base)
    assert replace(base, notice_h=0.1).just_in_time and not replace(base, notice_h=0.06).just_in_time
    assert jit.preemptions[0] == blind.preemptions[0] == 1
    assert 0.0 < jit.work_lost_h[0] <= 0.1 < blind.work_lost_h[0] <= young_daly_interval(0.05, 5.0)
    assert jit.deadline_met[0] and blind.deadline_met[0]


def test_training_through_the_notice_loses_only_the_reserve() -> None:
    """The workers train through a notice and start the just-in-time checkpoint jit_reserve_h before its deadline
    (planner.cost.just_in_time_reserve_s): a preemption loses that, not the whole window."""
    z = zones_of("halves-a")
    jobs = Jobs.make([0], 40.0, 58.0, 0.1)
    base = SimOptions(checkpoint_cost_h=0.05, mttp_h=(5.0,), checkpoint_write_h=0.02, notice_h=0.1)
    late = replace(base, jit_reserve_h=0.03)
    at_notice, trained_on = run_policy(z, jobs, "gpuplan", PRICES, base), run_policy(z, jobs, "gpuplan", PRICES, late)
    assert at_notice.preemptions[0] == trained_on.preemptions[0] == 1
    assert 0.03 < at_notice.work_lost_h[0] <= 0.1 and 0.0 < trained_on.work_lost_h[0] <= 0.03
    assert trained_on.cost_usd[0] <= at_notice.cost_usd[0]
    # a notice shorter than the reserve: checkpoint at once, lose at most the notice
    assert replace(base, notice_h=0.02, jit_reserve_h=0.03).notice_loss_h == 0.02
    assert base.notice_loss_h == 0.1 and late.notice_loss_h == 0.03
    # the measured options: AWS's two minutes, of which ~21 s are lost (2 x 4.4 s checkpoint, 2 x 1 s step, 10 s)
    measured = SimOptions.measured()
    assert measured.notice_loss_h * 3600 == pytest.approx(
        just_in_time_reserve_s(measured.checkpoint_cost_h * 3600, measured.checkpoint_write_h * 3600, JIT_STEP_S))
    assert 15 < measured.notice_loss_h * 3600 < 30


def test_a_move_to_another_zone_pays_the_checkpoint_transfer() -> None:
    z = zones_of("halves-a", "halves-b")
    jobs = Jobs.make([0], 40.0, 58.0, 0.2)
    out = run_policy(z, jobs, "gpuplan", PRICES, SimOptions(move_h=0.05))
    assert out.preemptions[0] == 1 and out.on_demand_h[0] == 0.0
    assert out.cost_usd[0] == pytest.approx((40.0 + 0.4 + 0.05) * 1.0)


@given(avail=st.lists(st.booleans(), min_size=4, max_size=60), cut=st.integers(1, 59))
@settings(max_examples=30, deadline=None)
def test_online_estimates_never_read_the_future(avail: list[bool], cut: int) -> None:
    cut = min(cut, len(avail) - 1)
    flipped = avail[:cut] + [not x for x in avail[cut:]]
    for half_life in (math.inf, 2.0):
        a = online_mean_run(zones_from([int(x) for x in avail]), 12.5, half_life)
        b = online_mean_run(zones_from([int(x) for x in flipped]), 12.5, half_life)
        np.testing.assert_array_equal(a[:, :cut], b[:, :cut])  # tick t may use what is seen at t


@given(avail=st.lists(st.booleans(), min_size=2, max_size=60), half_life=st.sampled_from([math.inf, 1.0, 96.0]))
@settings(max_examples=30, deadline=None)
def test_simulated_rates_are_what_the_live_zone_feed_counts(avail: list[bool], half_life: float) -> None:
    """The replay's per-tick estimate is ZoneSeen's (what the server keeps) after the ticks before,
    plus the preemption seen at this tick: the simulator measures the server's estimator."""
    z = zones_from([int(x) for x in avail])
    sim = online_mean_run(z, 12.5, half_life)[0]
    sim_outage = online_mean_outage(z, 1.5, half_life)[0]
    seen = ZoneSeen(half_life_h=half_life)
    for t, now in enumerate(avail):
        # At tick t the caller sees the capacity of tick t: a preemption (or a recovery) if it just changed.
        look = seen.step(now, 0.0) if seen.watched_h > 0 else seen
        rates = look.rates(prior_mean_run_h=12.5, prior_mean_outage_h=1.5)
        assert sim[t] == pytest.approx(rates.mean_run_h, rel=1e-9)
        assert sim_outage[t] == pytest.approx(rates.mean_outage_h, rel=1e-9)
        seen = seen.step(now, z.gap_h)


def test_recent_preemptions_weigh_more_than_old_ones() -> None:
    calm_then_flaky = [1] * 200 + [1, 0] * 20 + [1] * 5
    flaky_then_calm = [1, 0] * 20 + [1] * 205
    late = online_mean_run(zones_from(calm_then_flaky), 12.5, 2.0)[0, -1]
    early = online_mean_run(zones_from(flaky_then_calm), 12.5, 2.0)[0, -1]
    assert late < early  # the same counts, but the recent flapping dominates
    # Without decay both have seen the same hours up and preemptions.
    assert online_mean_run(zones_from(calm_then_flaky), 12.5, math.inf)[0, -1] == pytest.approx(
        online_mean_run(zones_from(flaky_then_calm), 12.5, math.inf)[0, -1], rel=0.05)


def test_the_policy_reads_the_spot_price_now_not_the_future_prices() -> None:
    """Fair comparison: what gpuplan decides up to tick t depends on prices up to t only."""
    avail = ([1] * 30 + [0] * 20) * 4 + [1] * 100
    cut = 120
    def priced(later: float) -> Zones:
        prices = [0.3] * cut + [later] * (len(avail) - cut)
        return align([trace_from_dict({"metadata": {"gap_seconds": 360.0}, "data": avail, "prices": prices}, "z")])
    jobs = Jobs.make([0], 12.0, 16.0, 0.2)
    opts = SimOptions(timeline=True)
    a = run_policy(priced(0.3), jobs, "gpuplan", PRICES, opts)
    b = run_policy(priced(2.9), jobs, "gpuplan", PRICES, opts)
    assert a.timeline_market is not None and b.timeline_market is not None
    np.testing.assert_array_equal(a.timeline_market[:cut], b.timeline_market[:cut])


def test_replay_is_deterministic() -> None:
    z = zones_of("flaky-a")
    jobs = Jobs.make([0, 7, 100], [10.0, 12.5, 3.0], [20.0, 20.0, 5.0], [0.0, 0.3, 0.1])
    opts = SimOptions(checkpoint_cost_h=0.01, checkpoint_write_h=0.02, notice_h=0.05)
    a, b = (run_policy(z, jobs, "gpuplan", PRICES, opts) for _ in range(2))
    np.testing.assert_array_equal(a.cost_usd, b.cost_usd)
    np.testing.assert_array_equal(a.finish_h, b.finish_h)


def test_measured_costs_come_from_the_calibration() -> None:
    m = SimOptions.measured(state_gb=14.8, write_gbps=14.8 / 3.3, snapshot_gbps=14.8 / 0.29)
    assert m.checkpoint_write_h * 3600 == pytest.approx(3.3)
    assert m.checkpoint_cost_h * 3600 == pytest.approx(0.29 + 1.0)  # + the loop's fixed cost per checkpoint
    assert m.notice_h == pytest.approx(120 / 3600) and m.just_in_time


def test_trace_validation_errors_say_what_to_fix(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        load_trace(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match="not valid JSON"):
        load_trace(bad)
    cases = [
        ({"data": [1]}, "gap_seconds"),
        ({"metadata": {"gap_seconds": -5}, "data": [1]}, "positive"),
        ({"metadata": {"gap_seconds": 60}, "data": []}, "non-empty"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, "x"]}, "only numbers"),
        ({"metadata": {"gap_seconds": 60}, "data": [1, 0], "prices": [1.0]}, "as long as"),
    ]
    for doc, message in cases:
        path = tmp_path / "t.json"
        path.write_text(json.dumps(doc))
        with pytest.raises(InvalidInput, match=message):
            load_trace(path)
    other = trace_from_dict({"metadata": {"gap_seconds": 60}, "data": [1]}, "x")
    with pytest.raises(InvalidInput, match="different tick lengths"):
        align([load_trace(DATA / "always.json"), other])


def test_job_validation() -> None:
    z = zones_of("always")
    with pytest.raises(InvalidInput, match="deadline is shorter"):
        Jobs.make([0], 10.0, 5.0, 0.1)
    with pytest.raises(InvalidInput):
        Jobs.make([0], -1.0, 5.0, 0.1)
    with pytest.raises(InvalidInput, match="past the end"):
        start_tick_for(z, 1000.0)
    with pytest.raises(UnknownName):
        compare(z, Jobs.make([0], 1.0, 2.0, 0.0), PRICES, policies=["omnicsient"])
    with pytest.raises(InvalidInput):
        Prices(on_demand=0.0, spot=1.0)


def test_the_policy_can_be_told_each_zones_mean_outage_instead_of_estimating_it() -> None:
    # Up 2 h, an outage of 3 h, then up for good; 10 h of work with 3 h of slack. Told that outages last
    # 0.2 h the job waits for spot; told 20 h it bridges the outage on on-demand and stays there.
    z = zones_from([1] * 20 + [0] * 30 + [1] * 200)
    jobs = Jobs.make([0], 10.0, 13.0, 0.2)
    short, long = (run_policy(z, jobs, "gpuplan", PRICES, SimOptions(mttp_h=(20.0,), mean_outage_h=(m,)))
                   for m in (0.2, 20.0))
    assert short.deadline_met[0] and long.deadline_met[0]
    assert short.on_demand_h[0] < 3.0 < long.on_demand_h[0]
    with pytest.raises(InvalidInput, match="one positive mean outage per zone"):
        run_policy(z, jobs, "gpuplan", PRICES, SimOptions(mean_outage_h=(1.0, 2.0)))
