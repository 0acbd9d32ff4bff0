"""Cost: Young/Daly, Poisson deadline probability, spot vs on-demand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.calibration import CostCalibration
from planner.cost import (
    just_in_time_reserve_s,
    notice_loss_h,
    on_demand_cost,
    poisson_cdf,
    spot_cost,
    young_daly_interval_h,
)


def test_young_daly_interval() -> None:
    assert young_daly_interval_h(0.02, 10.0) == pytest.approx(math.sqrt(2 * 0.02 * 10))


def test_poisson_cdf_matches_closed_form() -> None:
    assert poisson_cdf(0, 2.0) == pytest.approx(math.exp(-2))
    assert poisson_cdf(2, 2.0) == pytest.approx(math.exp(-2) * (1 + 2 + 2))
    assert poisson_cdf(-1, 1.0) == 0.0


def test_on_demand_is_price_times_time() -> None:
    c = on_demand_cost(10.0, 3.0, deadline_h=12.0)
    assert c.usd == 30.0 and c.deadline_probability == 1.0 and c.market == "on-demand"
    assert on_demand_cost(10.0, 3.0, deadline_h=9.0).deadline_probability == 0.0


def test_spot_costs_more_hours_and_fewer_dollars_at_a_big_discount() -> None:
    od = on_demand_cost(20.0, 10.0, None)
    sp = spot_cost(20.0, 3.0, hazard_per_h=0.1, checkpoint_h=0.02, restart_h=0.15, deadline_h=30.0)
    assert sp.hours > od.hours and sp.usd < od.usd
    assert sp.checkpoint_interval_h == pytest.approx(math.sqrt(2 * 0.02 * 10))
    assert sp.deadline_probability is not None and 0.9 < sp.deadline_probability <= 1.0


@given(hours=st.floats(0.1, 500), hazard=st.floats(0.001, 2.0), ckpt=st.floats(0.001, 0.5),
       slack=st.floats(1.0, 3.0))
def test_spot_invariants(hours: float, hazard: float, ckpt: float, slack: float) -> None:
    sp = spot_cost(hours, 1.0, hazard_per_h=hazard, checkpoint_h=ckpt, restart_h=0.1, deadline_h=hours * slack)
    assert sp.hours >= hours
    assert sp.preemption_overhead_h >= 0
    assert sp.deadline_probability is not None and 0.0 <= sp.deadline_probability <= 1.0
    tight = spot_cost(hours, 1.0, hazard_per_h=hazard, checkpoint_h=ckpt, restart_h=0.1, deadline_h=hours * 1.0001)
    assert (tight.deadline_probability or 0) <= sp.deadline_probability + 1e-12


def test_a_notice_that_covers_a_checkpoint_loses_only_the_just_in_time_reserve() -> None:
    """The workers train through a notice and checkpoint just_in_time_reserve_s before it ends; the plan prices
    a preemption's lost work that way where the cloud warns long enough, else half an interval."""
    reserve = just_in_time_reserve_s(1.3, 3.1, 1.0)
    assert notice_loss_h(120.0, 1.3, 3.1, 1.0) == pytest.approx(reserve / 3600)  # AWS: ~21 s of two minutes
    assert notice_loss_h(15.0, 1.3, 3.1, 1.0) == pytest.approx(15.0 / 3600)  # shorter than the reserve: all of it
    assert notice_loss_h(3.0, 1.3, 3.1, 1.0) is None  # too short to make a checkpoint durable
    assert notice_loss_h(0.0, 0.0, 0.0, 1.0) is None  # no notice at all
    assert CostCalibration().spot_notice_s["aws"] == 120.0

    common = {"hazard_per_h": 0.08, "checkpoint_h": 1.3 / 3600, "durable_h": 3.1 / 3600, "restart_h": 0.15,
              "deadline_h": 60.0}
    half_interval = spot_cost(48.0, 1.0, **common)
    warned = spot_cost(48.0, 1.0, lost_h=reserve / 3600, **common)
    assert warned.preemption_overhead_h < half_interval.preemption_overhead_h
    assert warned.usd < half_interval.usd
    assert (warned.deadline_probability or 0.0) >= (half_interval.deadline_probability or 1.0) > 0.0
    # a loss above half an interval changes nothing: the periodic checkpoint came first
    assert spot_cost(48.0, 1.0, lost_h=10.0, **common).usd == pytest.approx(half_interval.usd)
