"""The slack-value program (scheduler.slack_value): what it decides where the answer is known, and its inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import InvalidInput
from scheduler.slack_value import (
    GRID,
    NONE_DOWN,
    NONE_UP,
    OD_DOWN,
    OD_UP,
    ON_DEMAND,
    SPOT,
    SPOT_UP,
    WAIT,
    best_actions,
    step_for,
    table_for,
)


def act(column: int, work_left: float, slack: float, **kw: float) -> int:
    rates = {"mean_run_h": 5.0, "mean_outage_h": 1.0, "restart_h": 0.2, "loss_h": 0.03, "switch_h": 0.001,
             "price_ratio": 3.3, **kw}
    table = table_for(rates["mean_run_h"], rates["mean_outage_h"], rates["restart_h"], rates["loss_h"],
                      rates["switch_h"], rates["price_ratio"], float(step_for(48.0)))
    return int(table.lookup(np.array([work_left + slack]), np.array([work_left]), np.array([column]))[0])


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
