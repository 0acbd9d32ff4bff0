"""How often a run checkpoints: Young/Daly, tau = sqrt(2 C M), from the checkpoint's cost C and the
mean time to preemption M, unless ``train.checkpoint_interval_steps`` pins it.

C is what a checkpoint costs the loop. Before the first one it is estimated from the bytes of the
state and the calibrated write speed (as if the loop waited for the whole write); from the first
checkpoint on it is the measured stall. The write itself runs in the background, so the interval
never drops below twice the last measured time to durable: a snapshot that had to wait for the
previous write would stall the loop for the rest of it.

M: for spot, the placement's (its zone's history or the calibration's default hazard), passed in by the
scheduler; for on-demand, ON_DEMAND_MTTP_H. The calibration (the user's refit over the shipped one) is
loaded at the edge and reaches these functions as a value.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.calibration import CostCalibration
from planner.cost import MIN_CHECKPOINT_INTERVAL_H, checkpoint_interval_h, young_daly_interval_h

# On-demand machines are not reclaimed, but runs still end early: host, GPU or driver faults, OOM,
# maintenance, a cancel. Large fleets see roughly one such interruption per GPU host per few weeks of
# uptime; a day is a deliberately pessimistic mean (it also covers software crashes), and at the
# measured costs it gives intervals of minutes (0.3 s stall: ~4 min; 3 s: ~12 min), which cost the
# loop < 0.5% and bound the work a crash throws away.
ON_DEMAND_MTTP_H = 24.0
MIN_INTERVAL_S = MIN_CHECKPOINT_INTERVAL_H * 3600.0


def young_daly_s(cost_s: float, mttp_s: float) -> float:
    return young_daly_interval_h(cost_s / 3600.0, mttp_s / 3600.0) * 3600.0


@dataclass
class IntervalPlanner:
    """The interval in steps, re-derived as step time and checkpoint cost are measured."""

    override_steps: int | None
    mttp_h: float
    state_bytes: int
    write_gbps: float
    cost_s: float = 0.0  # C used now
    measured_stall_s: float | None = None
    measured_durable_s: float | None = None
    interval_s: float | None = None

    def __post_init__(self) -> None:
        self.cost_s = self.state_bytes / (self.write_gbps * 1e9)

    @property
    def pinned(self) -> bool:
        return self.override_steps is not None

    def observe(self, *, stall_s: float | None = None, durable_s: float | None = None) -> None:
        if stall_s is not None:
            self.measured_stall_s = stall_s
            self.cost_s = stall_s
        if durable_s is not None:
            self.measured_durable_s = durable_s

    def steps(self, step_s: float) -> int:
        """Steps between checkpoints for steps of ``step_s`` seconds."""
        if self.override_steps is not None:
            return self.override_steps
        # the planner prices spot with this same rule (planner.cost.checkpoint_interval_h)
        tau = checkpoint_interval_h(max(self.cost_s, 1e-3) / 3600.0, (self.measured_durable_s or 0.0) / 3600.0,
                                    self.mttp_h) * 3600.0
        self.interval_s = tau
        return max(1, round(tau / max(step_s, 1e-6)))


def preemption_inputs(market: str, predicted: dict[str, float], mttp_h: float | None,
                      cost: CostCalibration) -> dict[str, float]:
    """``predicted`` with the mean time to preemption a spot attempt checkpoints for: the scheduler's
    (``mttp_h``: the placement's, which its plan was priced at) when it passed one, else one already in
    ``predicted``, else ``cost``'s default spot hazard. On-demand: unchanged (the worker uses
    ON_DEMAND_MTTP_H)."""
    if market != "spot":
        return predicted
    if mttp_h is not None and mttp_h > 0:
        return {**predicted, "mean_time_to_preemption_h": mttp_h}
    if predicted.get("mean_time_to_preemption_h"):
        return predicted
    hazard = cost.spot_hazard_per_h.get("default", 0.0)
    return {**predicted, "mean_time_to_preemption_h": 1.0 / hazard} if hazard > 0 else predicted
