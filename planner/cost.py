"""What a placement costs: price x time, with spot preemptions priced in.

Spot: preemptions arrive as a Poisson process with a per-instance-hour hazard (per cloud, from the
calibration file; the scheduler may pass trace statistics instead). The job checkpoints at the
interval the workers use (``checkpoint_interval_h``): Young/Daly's sqrt(2 C MTBF) on what a
checkpoint stops the loop for, never below twice the time to make one durable, nor below
MIN_CHECKPOINT_INTERVAL_H. Each preemption costs a restart plus, on average, half an interval of lost work, or,
where the cloud's notice covers a checkpoint, the just-in-time checkpoint's reserve (just_in_time_reserve_s).
"""

from __future__ import annotations

import math

from planner.types import CostEstimate, Market, construct

MIN_CHECKPOINT_INTERVAL_H = 30 / 3600  # never checkpoint more often than this, whatever the arithmetic says


JIT_MARGIN_S = 10.0  # a just-in-time checkpoint's fixed margin before a notice's deadline (clocks, the teardown)


def just_in_time_reserve_s(stall_s: float, durable_s: float, step_s: float) -> float:
    """Seconds before a spot notice's deadline at which the just-in-time checkpoint starts (the workers' rule,
    workers/train/loop.py; the simulator prices a preemption's loss with it, scheduler.sim.model.SimOptions).

    The checkpoint must be durable before the node goes: twice its stall and time to durable (a store slower
    than last time, a periodic write still in flight), two steps (the one in flight and the one whose poll
    decides) and JIT_MARGIN_S. The work of those seconds is lost; the rest of the notice trains. (Until
    2026-12-04 the workers checkpointed at the notice and idled through the rest of it: AWS gives two minutes.)"""
    return 2.0 * (max(stall_s, 0.0) + max(durable_s, 0.0)) + 2.0 * max(step_s, 0.0) + JIT_MARGIN_S


def young_daly_interval_h(checkpoint_h: float, mtbf_h: float) -> float:
    """Optimal checkpoint interval sqrt(2 C MTBF), in hours."""
    return math.sqrt(2 * checkpoint_h * mtbf_h)


def checkpoint_interval_h(stall_h: float, durable_h: float, mtbf_h: float) -> float:
    """The interval a run checkpoints at (the workers use this same rule, workers.checkpoint.interval):
    Young/Daly on the loop's stall, but at least twice the time to durable (the write runs in the
    background; a snapshot that had to wait for the previous write would stall for the rest of it)
    and at least MIN_CHECKPOINT_INTERVAL_H."""
    return max(young_daly_interval_h(max(stall_h, 0.0), mtbf_h), 2.0 * max(durable_h, 0.0),
               MIN_CHECKPOINT_INTERVAL_H)


def poisson_cdf(k: int, mean: float) -> float:
    if k < 0:
        return 0.0
    if mean <= 0:
        return 1.0
    term = math.exp(-mean)
    total = term
    for i in range(1, k + 1):
        term *= mean / i
        total += term
        if term < 1e-15 and i > mean:
            break
    return min(1.0, total)


def on_demand_cost(
    hours: float, usd_per_h: float, deadline_h: float | None, market: Market = "on-demand"
) -> CostEstimate:
    prob = None if deadline_h is None else (1.0 if hours <= deadline_h else 0.0)
    # construct (no validation): every field is computed here from validated inputs, and validating
    # thousands of these per plan() was a third of the planner's time
    return construct(CostEstimate, market=market, usd_per_h=usd_per_h, hours=hours, usd=hours * usd_per_h,
                        deadline_probability=prob)


def just_in_time_loss(notice: float, stall: float, durable: float, reserve: float) -> float | None:
    """The work a preemption loses when the cloud warns ``notice`` ahead (any one unit of time): the just-in-time
    checkpoint's ``reserve`` before the deadline (the whole notice when shorter, or when ``reserve`` is 0: a loop
    that checkpoints at the notice), or None when the notice cannot cover a checkpoint's stall and write (the work
    since the last periodic checkpoint is lost). The planner and the simulator's replay both price it here."""
    if notice <= 0 or notice < stall + durable:
        return None
    return min(notice, reserve) if reserve > 0 else notice


def notice_loss_h(notice_s: float, stall_s: float, durable_s: float, step_s: float) -> float | None:
    """:func:`just_in_time_loss` in hours, for the workers' reserve at steps of ``step_s``."""
    loss = just_in_time_loss(notice_s, stall_s, durable_s, just_in_time_reserve_s(stall_s, durable_s, step_s))
    return None if loss is None else loss / 3600.0


def spot_cost(hours: float, usd_per_h: float, *, hazard_per_h: float, checkpoint_h: float, restart_h: float,
              deadline_h: float | None, durable_h: float = 0.0, lost_h: float | None = None) -> CostEstimate:
    """Expected hours and dollars on spot, and the chance to finish by the deadline. ``checkpoint_h``:
    what one checkpoint stops the loop for; ``durable_h``: snapshot to durable (the interval's floor); ``lost_h``:
    what a preemption loses with a just-in-time checkpoint (:func:`notice_loss_h`; None: half an interval)."""
    if hazard_per_h <= 0:
        return on_demand_cost(hours, usd_per_h, deadline_h, market="spot")
    mtbf = 1 / hazard_per_h
    tau = min(checkpoint_interval_h(checkpoint_h, durable_h, mtbf), max(hours, checkpoint_h))
    writing = hours * checkpoint_h / tau
    base = hours + writing
    per_preemption = restart_h + (tau / 2 if lost_h is None else min(tau / 2, lost_h))
    expected = base + hazard_per_h * base * per_preemption
    prob = None
    if deadline_h is not None:
        slack = deadline_h - base
        prob = 0.0 if slack < 0 else poisson_cdf(int(slack // per_preemption), hazard_per_h * base)
    return construct(CostEstimate, market="spot", usd_per_h=usd_per_h, hours=expected, usd=expected * usd_per_h,
                        preemption_overhead_h=expected - hours, checkpoint_interval_h=tau, deadline_probability=prob,
                        mean_time_to_preemption_h=mtbf)
