"""Cost: Young/Daly, Poisson deadline probability, spot vs on-demand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.cost import on_demand_cost, poisson_cdf, spot_cost, young_daly_interval_h


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
