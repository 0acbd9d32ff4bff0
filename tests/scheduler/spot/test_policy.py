"""The spot/on-demand policy: safety net, no flapping, no-deadline jobs, Young/Daly, zone choice, online rates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from errors import InvalidInput, UnknownName
from scheduler.spot.policy import (
    POLICIES,
    PRIOR_MEAN_OUTAGE_H,
    PRIOR_MEAN_RUN_H,
    RATE_HALF_LIFE_H,
    Decision,
    JobStanding,
    PriceRatio,
    ZoneRates,
    ZoneSeen,
    choose_zone,
    decide,
    mean_time_to_preemption,
    young_daly_interval,
)

TICK = 0.1


def progress(done: float, now: float, *, current: str = "none", deadline: float | None = 70.0,
             restart: float = 0.2, unc: float = 0.0) -> JobStanding:
    return JobStanding(work_done_h=done, work_total_h=48.0, now_h=now, deadline_h=deadline, restart_h=restart,
                       current=current, uncommitted_h=unc)  # type: ignore[arg-type]


def test_on_demand_and_spot_only_ignore_the_clock() -> None:
    late = progress(0.0, 21.9)
    assert decide("on-demand", late, True) is Decision.ON_DEMAND
    assert decide("spot-only", late, True) is Decision.SPOT
    assert decide("spot-only", late, False) is Decision.WAIT


@pytest.mark.parametrize("policy", ["greedy", "uniform-progress", "gpuplan"])
def test_safety_net_switches_when_slack_cannot_absorb_another_restart(policy: str) -> None:
    # slack = (70 - now) - (48 - done); the net needs restart + tick (+ uncommitted).
    assert decide(policy, progress(10.0, 31.0, current="spot"), True, tick_h=TICK) is Decision.SPOT  # slack 1.0
    assert decide(policy, progress(10.0, 31.75, current="spot"), True, tick_h=TICK) is Decision.ON_DEMAND  # 0.25
    # Uncommitted work that a preemption would lose counts against the slack.
    assert decide(policy, progress(10.0, 31.0, current="spot", unc=0.8), True, tick_h=TICK) is Decision.ON_DEMAND
    # A bigger restart delay needs more slack.
    assert decide(policy, progress(10.0, 31.0, current="spot", restart=1.0), True, tick_h=TICK) is Decision.ON_DEMAND


def test_greedy_idles_until_the_slack_is_gone_then_never_leaves_on_demand() -> None:
    assert decide("greedy", progress(10.0, 20.0), False, tick_h=TICK) is Decision.WAIT
    assert decide("greedy", progress(10.0, 31.8), False, tick_h=TICK) is Decision.ON_DEMAND
    # Plenty of slack again (e.g. after on-demand progress) and spot is back: greedy still stays.
    assert decide("greedy", progress(40.0, 40.0, current="on-demand"), True, tick_h=TICK) is Decision.ON_DEMAND


def test_uniform_progress_goes_on_demand_when_behind_the_line_and_back_only_when_ahead() -> None:
    # Line at t=35: 48*35/70 = 24 h done.
    assert decide("uniform-progress", progress(20.0, 35.0), False, tick_h=TICK) is Decision.ON_DEMAND
    assert decide("uniform-progress", progress(30.0, 35.0), False, tick_h=TICK) is Decision.WAIT
    # Spot returns while on on-demand: barely ahead -> stay (no flapping); well ahead -> spot.
    assert decide("uniform-progress", progress(24.1, 35.0, current="on-demand"), True, tick_h=TICK) \
        is Decision.ON_DEMAND
    assert decide("uniform-progress", progress(30.0, 35.0, current="on-demand"), True, tick_h=TICK) is Decision.SPOT


def test_gpuplan_prefers_staying_on_spot_and_waits_when_ahead() -> None:
    assert decide("gpuplan", progress(20.0, 30.0, current="spot"), True, tick_h=TICK) is Decision.SPOT
    assert decide("gpuplan", progress(20.0, 25.0), False, tick_h=TICK) is Decision.WAIT
    # Below the safety net (0.25 h of slack, 0.2 h restarts, 0.1 h ticks) there is no choice: on-demand.
    for age in (0.0, 5.0):
        assert decide("gpuplan", progress(10.0, 31.75), False, tick_h=TICK,
                      rates=ZoneRates(outage_age_h=age)) is Decision.ON_DEMAND
    # 3 h of slack for 24 h of work in a zone whose outages last 2 h: an outage that has lasted 30 min is
    # bridged on on-demand; a fresh one is waited out (young outages end several times as fast).
    zone = {"mean_run_h": 5.0, "mean_outage_h": 2.0, "loss_h": 0.03, "switch_h": 0.001}
    for now in (42.8, 43.0, 43.2):
        assert decide("gpuplan", progress(24.0, now), False, tick_h=TICK,
                      rates=ZoneRates(outage_age_h=0.0, **zone)) is Decision.WAIT
        assert decide("gpuplan", progress(24.0, now), False, tick_h=TICK,
                      rates=ZoneRates(outage_age_h=1.0, **zone)) is Decision.ON_DEMAND
    # With 20 h of slack the old outage is waited out too.
    assert decide("gpuplan", progress(10.0, 12.0), False, tick_h=TICK,
                  rates=ZoneRates(outage_age_h=1.0, **zone)) is Decision.WAIT


@pytest.mark.parametrize("policy", POLICIES)
def test_jobs_without_deadline_take_spot_or_wait(policy: str) -> None:
    free = progress(0.0, 500.0, deadline=None)
    if policy == "on-demand":
        assert decide(policy, free, True) is Decision.ON_DEMAND
    else:
        assert decide(policy, free, True) is Decision.SPOT
        assert decide(policy, free, False) is Decision.WAIT


@given(done=st.floats(0, 47.9), now=st.floats(0, 69.9), restart=st.floats(0, 2),
       current=st.sampled_from(["none", "spot", "on-demand"]), avail=st.booleans(),
       policy=st.sampled_from(["greedy", "uniform-progress", "gpuplan"]))
@settings(max_examples=200, deadline=None)
def test_deadline_policies_never_leave_on_demand_without_room_for_two_changeovers(
        done: float, now: float, restart: float, current: str, avail: bool, policy: str) -> None:
    p = progress(done, now, current=current, restart=restart)
    slack = (70.0 - now) - (48.0 - done)
    decision = decide(policy, p, avail, tick_h=TICK)
    if slack < restart + TICK:
        assert decision is Decision.ON_DEMAND
    if current == "on-demand" and decision is not Decision.ON_DEMAND:
        assert slack >= 2 * restart + TICK


def test_bad_policy_and_progress_are_refused() -> None:
    with pytest.raises(UnknownName, match="did you mean greedy"):
        decide("gredy", progress(0, 0), True)
    with pytest.raises(InvalidInput):
        decide("gpuplan", JobStanding(0, 0, 0, 10, 0.1, "spot"), True)
    with pytest.raises(InvalidInput):
        decide("gpuplan", progress(0, 0, current="preempted"), True)


def test_young_daly_interval() -> None:
    assert young_daly_interval(0.0, 5.0) == 0.0
    assert young_daly_interval(0.1, math.inf) == math.inf
    # Small C/M: close to Young's sqrt(2 C M); grows with both C and M.
    assert young_daly_interval(0.001, 10.0) == pytest.approx(math.sqrt(2 * 0.001 * 10.0), rel=0.02)
    assert young_daly_interval(0.05, 6.0) < young_daly_interval(0.1, 6.0) < young_daly_interval(0.1, 12.0)
    assert young_daly_interval(5.0, 1.0) == 1.0
    with pytest.raises(InvalidInput):
        young_daly_interval(-1.0, 1.0)


def test_mean_time_to_preemption_counts_only_observed_preemptions() -> None:
    # Runs of 3 and 2 ticks end in preemptions; the last run (2 ticks) is censored by the trace end.
    trace = [1, 1, 1, 0, 1, 1, 0, 0, 1, 1]
    assert mean_time_to_preemption(trace, 0.5) == pytest.approx((7 * 0.5) / 2)
    assert mean_time_to_preemption([1, 1, 1], 1.0) == math.inf
    with pytest.raises(InvalidInput):
        mean_time_to_preemption([], 1.0)


def test_choose_zone_stays_put_then_picks_the_longest_running_zone() -> None:
    assert choose_zone([True, True, True], 0, [1.0, 5.0, 9.0]) == 0
    assert choose_zone([False, True, True], 0, [0.0, 5.0, 9.0]) == 2
    assert choose_zone([False, False], None, [0.0, 0.0]) is None


def test_gpuplan_returns_to_spot_only_when_the_expected_run_pays_for_two_changeovers() -> None:
    on_od = progress(30.0, 35.0, current="on-demand")  # slack 17 h, 18 h of work left
    # Capacity just came back (a run of age 0): in a zone whose runs last 0.3 h it will not pay for the
    # changeovers there and back; where they last 5 h it will.
    short, long = ZoneRates(mean_run_h=0.3, run_age_h=0.0), ZoneRates(mean_run_h=5.0, run_age_h=0.0)
    assert decide("gpuplan", on_od, True, tick_h=TICK, rates=short) is Decision.ON_DEMAND
    assert decide("gpuplan", on_od, True, tick_h=TICK, rates=long) is Decision.SPOT
    # A run of the short zone that has lasted 36 min is old: old runs end several times as slowly.
    assert decide("gpuplan", on_od, True, tick_h=TICK, rates=replace(short, run_age_h=0.6)) is Decision.SPOT
    # Cheaper on-demand makes a fresh run not worth the changeovers.
    near = PriceRatio(on_demand=1.1, spot=1.0)
    assert decide("gpuplan", on_od, True, tick_h=TICK, rates=ZoneRates(mean_run_h=1.0, run_age_h=0.0),
                  prices=near) is Decision.ON_DEMAND


def test_gpuplan_leaves_on_demand_in_an_outage_only_when_outages_are_short_and_slack_plentiful() -> None:
    # On on-demand through an outage, 38 h of work left. Short outages (0.3 h) in a zone that runs 5 h:
    # with 20 h of slack waiting for spot is worth a changeover; with 2 h the slack is worth more kept.
    short_outages = ZoneRates(mean_run_h=5.0, mean_outage_h=0.3, outage_age_h=0.8)
    assert decide("gpuplan", progress(10.0, 12.0, current="on-demand"), False, tick_h=TICK,
                  rates=short_outages) is Decision.WAIT
    assert decide("gpuplan", progress(10.0, 30.0, current="on-demand"), False, tick_h=TICK,
                  rates=short_outages) is Decision.ON_DEMAND
    # Outages of 10 h in a zone that runs 1.5 h: stay on on-demand even with 20 h of slack.
    long_outages = ZoneRates(mean_run_h=1.5, mean_outage_h=10.0, outage_age_h=0.8)
    assert decide("gpuplan", progress(10.0, 12.0, current="on-demand"), False, tick_h=TICK,
                  rates=long_outages) is Decision.ON_DEMAND


def test_zone_seen_counts_what_was_watched_and_estimates_with_the_planner_prior() -> None:
    seen = ZoneSeen(half_life_h=math.inf)
    for avail in [True, True, False, False, True, True, True, False]:
        seen = seen.step(avail, 0.5)
    assert (seen.watched_h, seen.up_h, seen.preemptions, seen.available) == (4.0, 2.5, 2, False)
    assert seen.outage_age_h == 0.5 and seen.run_h == 0.0
    # (hours up + prior) / (preemptions + 1): the prior is one preemption after 1/0.08 h.
    assert seen.rates().mean_run_h == pytest.approx((2.5 + PRIOR_MEAN_RUN_H) / 3)
    # Outages likewise: 1.5 h without capacity, one outage seen to end (the last is still going).
    assert (seen.down_h, seen.recoveries) == (1.5, 1)
    assert seen.rates().mean_outage_h == pytest.approx((1.5 + PRIOR_MEAN_OUTAGE_H) / 2)
    assert ZoneSeen().rates().mean_run_h == pytest.approx(PRIOR_MEAN_RUN_H)
    assert choose_zone([True, True], None, [0.1, 3.0], mean_run_h=[9.0, 2.0]) == 0
    # The program reads the age of the current run: watched up for 1.5 h; a zone never watched: unknown.
    up = seen.step(True, 0.5).step(True, 0.5).step(True, 0.5)
    assert up.rates().run_age_h == pytest.approx(1.5) and up.rates().outage_age_h == 0.0
    assert ZoneSeen().rates().run_age_h == math.inf


def test_zone_seen_weighs_recent_hours_more_with_its_half_life() -> None:
    seen = ZoneSeen(half_life_h=1.0)
    for avail in [True, False] + [True] * 4:
        seen = seen.step(avail, 0.5)
    # The preemption seen 2 h ago counts half... of a half: 0.5 ** 2; hours up likewise by age.
    assert seen.preemptions == pytest.approx(0.25)
    assert seen.up_h == pytest.approx(0.5 * 0.5 ** 2.5 + sum(0.5 * 0.5 ** (0.5 * k) for k in range(4)))
    assert ZoneSeen().half_life_h == RATE_HALF_LIFE_H


@given(done=st.floats(0, 47.9), now=st.floats(0, 69.9), restart=st.floats(0, 2), run=st.floats(0.01, 100),
       age=st.floats(0, 10), switch=st.floats(0, 0.1), loss=st.floats(0, 0.5), unc=st.floats(0, 0.5),
       current=st.sampled_from(["none", "spot", "on-demand"]), avail=st.booleans(), boots=st.booleans())
@settings(max_examples=200, deadline=None)
def test_gpuplan_safety_net_holds_whatever_it_has_seen(done: float, now: float, restart: float, run: float,
                                                       age: float, switch: float, loss: float, unc: float,
                                                       current: str, avail: bool, boots: bool) -> None:
    p = progress(done, now, current=current, restart=restart, unc=unc)
    slack = (70.0 - now) - (48.0 - done)
    rates = ZoneRates(mean_run_h=run, outage_age_h=age, loss_h=loss, switch_h=switch)
    decision = decide("gpuplan", p, avail, tick_h=TICK, rates=rates, make_before_break=boots)
    if slack < restart + TICK + unc + (0.0 if current == "on-demand" else switch):
        assert decision is Decision.ON_DEMAND
    if decision is Decision.BOOT_SPOT:
        # On-demand works through the boot; the move waits for the checkpoint at a tick's end, and spot then
        # needs the safety net's slack.
        assert boots and current == "on-demand" and avail
        assert slack >= restart + 2 * TICK + switch
    elif current == "on-demand" and decision is not Decision.ON_DEMAND:
        assert slack >= 2 * restart + TICK + unc + switch
    if not avail:
        assert decision is not Decision.SPOT
