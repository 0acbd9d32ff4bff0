"""The checkpoint interval: Young/Daly from the state's size, the measured cost and the mean time to
preemption; a spec's checkpoint_interval_steps pins it."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tests.workers.tiny import cpu_strategy, tiny_spec, write_config
from workers.checkpoint.interval import MIN_INTERVAL_S, ON_DEMAND_MTTP_H, IntervalPlanner, young_daly_s
from workers.train.loop import TrainJob, run_training


def test_estimate_before_the_first_checkpoint_then_the_measured_stall() -> None:
    planner = IntervalPlanner(override_steps=None, mttp_h=1.0, state_bytes=int(14.8e9), write_gbps=6.0)
    assert math.isclose(planner.cost_s, 14.8 / 6.0)
    assert planner.steps(1.0) == round(math.sqrt(2 * 14.8 / 6.0 * 3600))
    planner.observe(stall_s=0.3, durable_s=2.5)
    assert planner.steps(1.0) == round(math.sqrt(2 * 0.3 * 3600))
    assert planner.interval_s is not None and math.isclose(planner.interval_s, young_daly_s(0.3, 3600))


def test_a_slow_write_stretches_the_interval_so_snapshots_never_wait() -> None:
    planner = IntervalPlanner(override_steps=None, mttp_h=0.01, state_bytes=10**9, write_gbps=1.0)
    planner.observe(stall_s=0.1, durable_s=200.0)
    assert planner.steps(2.0) == 200  # 2 x 200 s of write / 2 s per step


def test_the_spec_pins_the_interval() -> None:
    planner = IntervalPlanner(override_steps=7, mttp_h=0.5, state_bytes=10**9, write_gbps=1.0)
    assert planner.pinned and planner.steps(0.01) == 7


@given(st.floats(1e-3, 100), st.floats(0.01, 1000), st.floats(1e-4, 100))
def test_interval_is_at_least_the_floor_and_grows_with_cost(stall: float, mttp_h: float, step_s: float) -> None:
    planner = IntervalPlanner(override_steps=None, mttp_h=mttp_h, state_bytes=1, write_gbps=1.0)
    planner.observe(stall_s=stall)
    low = planner.steps(step_s)
    assert planner.interval_s is not None and planner.interval_s >= MIN_INTERVAL_S and low >= 1
    planner.observe(stall_s=stall * 4)
    assert planner.steps(step_s) >= low


def test_a_run_without_a_pinned_interval_reports_the_one_it_used(tmp_path: Path) -> None:
    spec = tiny_spec(write_config(tmp_path / "m"), steps=6, interval=None)
    job = TrainJob(job_id="yd", spec=spec, strategy=cpu_strategy(), checkpoint_uri=str(tmp_path / "ck"),
                   device="cpu", cpu_threads=1, log_every_s=60.0)
    result = run_training(job)
    # Steps of milliseconds against a 24 h on-demand mean time to preemption: only the final checkpoint.
    assert result.checkpoints_written == 1 and result.checkpoint_interval_steps > 6
    assert result.checkpoint_interval_s is not None
    assert result.checkpoint_interval_s >= young_daly_s(1e-3, ON_DEMAND_MTTP_H * 3600)
    assert result.checkpoint_durable_s is not None and result.checkpoint_durable_s > 0


def test_spot_attempts_get_a_mean_time_to_preemption() -> None:
    from planner.calibration import load_calibration
    from workers.checkpoint.interval import preemption_inputs

    cost = load_calibration().cost
    hazard = cost.spot_hazard_per_h["default"]
    assert preemption_inputs("spot", {"tokens_per_s": 5.0}, None, cost) == {"tokens_per_s": 5.0,
                                                                           "mean_time_to_preemption_h": 1 / hazard}
    assert preemption_inputs("spot", {"mean_time_to_preemption_h": 3.0}, None, cost) == {
        "mean_time_to_preemption_h": 3.0}
    assert preemption_inputs("on-demand", {}, None, cost) == {}
    # the scheduler's (the plan's) mean time to preemption wins over a prediction's and the default
    assert preemption_inputs("spot", {"mean_time_to_preemption_h": 3.0}, 7.5, cost) == {
        "mean_time_to_preemption_h": 7.5}
    assert preemption_inputs("on-demand", {}, 7.5, cost) == {}


def test_the_calibration_passed_in_is_the_one_used(tmp_path: Path) -> None:
    """A user's refit (the calibration the edge loaded) sets the default hazard and the write speed; the
    workers read no calibration file of their own."""
    import torch

    from planner.calibration import CostCalibration
    from workers.checkpoint.interval import preemption_inputs
    from workers.train.start import interval_planner

    refit = CostCalibration(spot_hazard_per_h={"default": 0.25}, checkpoint_write_gbps=2.0)
    assert preemption_inputs("spot", {}, None, refit) == {"mean_time_to_preemption_h": 4.0}
    job = TrainJob(job_id="w", spec=tiny_spec(write_config(tmp_path / "m"), steps=1, interval=None),
                   strategy=cpu_strategy(), checkpoint_uri=str(tmp_path / "ck"), checkpoint_write_gbps=2.0)
    model = torch.nn.Linear(8, 8)
    planner = interval_planner(job, model, torch.optim.AdamW(model.parameters()))
    state_bytes = 3 * (8 * 8 + 8) * 4  # fp32 weights and AdamW's two moments, before the first step
    assert planner.write_gbps == 2.0 and math.isclose(planner.cost_s, state_bytes / 2e9)


@given(stall_s=st.floats(1e-3, 60), durable_s=st.floats(0.0, 3600), mttp_h=st.floats(0.05, 500))
def test_the_plan_prices_the_interval_the_workers_use(stall_s: float, durable_s: float, mttp_h: float) -> None:
    from planner.cost import spot_cost

    planner = IntervalPlanner(override_steps=None, mttp_h=mttp_h, state_bytes=1, write_gbps=1.0)
    planner.observe(stall_s=stall_s, durable_s=durable_s)
    planner.steps(1.0)
    hours = 1e4  # long enough that the job's length does not cap the interval
    cost = spot_cost(hours, 1.0, hazard_per_h=1 / mttp_h, checkpoint_h=stall_s / 3600, durable_h=durable_s / 3600,
                     restart_h=0.1, deadline_h=None)
    assert cost.checkpoint_interval_h is not None and planner.interval_s is not None
    assert math.isclose(cost.checkpoint_interval_h * 3600, planner.interval_s, rel_tol=1e-9)
    assert cost.mean_time_to_preemption_h is not None and math.isclose(cost.mean_time_to_preemption_h, mttp_h)


def test_a_slow_store_stretches_the_planned_interval_and_its_lost_work() -> None:
    from planner.cost import spot_cost

    fast = spot_cost(100.0, 1.0, hazard_per_h=2.0, checkpoint_h=0.5 / 3600, durable_h=2 / 3600, restart_h=0.1,
                     deadline_h=None)
    slow = spot_cost(100.0, 1.0, hazard_per_h=2.0, checkpoint_h=0.5 / 3600, durable_h=150 / 3600, restart_h=0.1,
                     deadline_h=None)
    assert fast.checkpoint_interval_h is not None and slow.checkpoint_interval_h is not None
    assert math.isclose(fast.checkpoint_interval_h * 3600, math.sqrt(2 * 0.5 * 1800))  # Young/Daly: 42 s
    assert math.isclose(slow.checkpoint_interval_h * 3600, 300.0)  # twice the 150 s write
    assert slow.preemption_overhead_h > fast.preemption_overhead_h  # half an interval lost per preemption
