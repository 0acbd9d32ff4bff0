"""Spot vs on-demand under a deadline: which market a job should be on right now.

Pure functions, no I/O, no clock: the caller says where the job stands and whether spot capacity is
available; the policy answers SPOT, ON_DEMAND or WAIT. The scheduler loop calls :func:`decide` for
one job; the simulator calls :func:`decide_arrays` for a thousand jobs at once. Both run the same
rule (``decide`` is a one-element call of ``decide_arrays``), so what the simulator measures is what
the server does.

API (stable)::

    progress = JobProgress(work_done_h=10, work_total_h=48, now_h=12, deadline_h=70, restart_h=0.2,
                           current="spot", start_h=0.0, uncommitted_h=0.0)
    decide("gpuplan", progress, spot_available=True, tick_h=195/3600) -> Decision.SPOT
    choose_zone(available=[False, True, True], current_zone=None, run_length_h=[0, 3.0, 9.5]) -> 2
    young_daly_interval(checkpoint_cost_h=0.05, mtbf_h=6.0) -> hours of work between checkpoints
    mean_time_to_preemption(availability, gap_h) -> observed mean length of a spot run, in hours

Policies (``POLICIES``): ``on-demand``, ``spot-only``, ``greedy`` (spot while available, idle
while not, on-demand for good once the slack is gone), ``uniform-progress`` (Can't Be Late, Wu et
al., NSDI'24: keep progress on or above the straight line from start to deadline; on-demand when
behind; back to spot only when ahead by a hysteresis margin) and ``gpuplan`` (the default; see
:class:`PolicyParams`).

Every deadline-aware policy shares one safety net. Let ``slack`` be the time left to the deadline
minus the work left. Not being on on-demand for the next tick is safe only if, after the worst
case (no progress this tick, the uncommitted work lost to a preemption), on-demand can still finish:
``slack >= restart + tick + uncommitted``. When that fails the job goes on-demand and, because
on-demand does not burn slack, it stays feasible. Leaving on-demand for spot pays one more
changeover, so it needs ``restart`` more slack on top. Hence: any job whose initial slack is at
least ``restart`` meets its deadline under these policies, whatever the spot trace does.

A job without a deadline (``deadline_h=None``) takes the cheapest expected cost: spot when
available, otherwise wait for it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from catalog.errors import InvalidInput, UnknownName

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int8]
BoolArray = npt.NDArray[np.bool_]

# Integer codes used by the vectorised core (markets a job is on, and decisions).
NONE, SPOT, ON_DEMAND = 0, 1, 2
WAIT = 0

Current = Literal["spot", "on-demand", "none"]
_CURRENT_CODE: dict[str, int] = {"none": NONE, "spot": SPOT, "on-demand": ON_DEMAND}

POLICIES: tuple[str, ...] = ("gpuplan", "uniform-progress", "greedy", "spot-only", "on-demand")


class Decision(enum.StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"
    WAIT = "wait"


_DECISION_BY_CODE = {WAIT: Decision.WAIT, SPOT: Decision.SPOT, ON_DEMAND: Decision.ON_DEMAND}


@dataclass(frozen=True)
class JobProgress:
    """Where one job stands. Hours are on one clock (any origin); ``deadline_h`` is absolute."""

    work_done_h: float  # progress so far, including work not yet checkpointed
    work_total_h: float
    now_h: float
    deadline_h: float | None
    restart_h: float  # delay of every (re)start or changeover before work resumes
    current: Current  # the market the job holds now ("none" after a preemption or while waiting)
    start_h: float = 0.0  # when the job was submitted (origin of the uniform-progress line)
    uncommitted_h: float = 0.0  # work since the last checkpoint: lost if spot is preempted


@dataclass(frozen=True)
class PolicyParams:
    """Knobs of the ``gpuplan`` policy (tuned on part of the traces; see docs/SPOT.md).

    reserve_fraction: share of the initial slack kept in reserve, shrinking linearly to 0 at the
        deadline. While spot is unavailable the job idles only while its slack stays above the reserve
        (0 = greedy's "idle until the slack is gone", 1 = uniform progress).
    return_margin_h: extra slack, beyond the two changeovers it costs, that on-demand must have
        before the job goes back to spot (inf = never go back, like greedy).
    min_return_work_h: go back from on-demand to spot only if at least this much work is left.
    safety_margin_h: added to the safety net's threshold.
    reserve_cap_h: the reserve never exceeds this many hours (long slacks need no more than a few
        changeovers' worth).
    return_restarts: extra slack, in restart delays, before going back to spot (a return that a
        preemption soon undoes costs two changeovers).
    return_min_run_h: go back from on-demand only to spot capacity that has already lasted this long
        (runs of availability are heavy-tailed: a run that just started is the likeliest to end soon).
    """

    reserve_fraction: float = 0.5
    return_margin_h: float = 0.0
    min_return_work_h: float = 0.0
    safety_margin_h: float = 0.0
    reserve_cap_h: float = 4.0
    return_restarts: float = 0.0
    return_min_run_h: float = 0.0


DEFAULT_PARAMS = PolicyParams()
GREEDY_PARAMS = PolicyParams(reserve_fraction=0.0, return_margin_h=math.inf, min_return_work_h=math.inf)


def check_policy(name: str) -> str:
    if name not in POLICIES:
        raise UnknownName("policy", name, POLICIES)
    return name


def decide_arrays(
    policy: str,
    *,
    work_done_h: FloatArray,
    work_total_h: FloatArray,
    now_h: FloatArray | float,
    deadline_h: FloatArray,
    start_h: FloatArray,
    restart_h: FloatArray | float,
    current: IntArray,
    spot_available: BoolArray,
    uncommitted_h: FloatArray | float = 0.0,
    tick_h: float = 0.0,
    params: PolicyParams = DEFAULT_PARAMS,
    spot_run_h: FloatArray | float = math.inf,
) -> IntArray:
    """Vectorised :func:`decide`: one decision code (WAIT/SPOT/ON_DEMAND) per job.

    ``deadline_h`` may hold ``inf`` for jobs without a deadline. ``current`` holds NONE/SPOT/ON_DEMAND
    codes; a job whose spot instance was just preempted must be passed as NONE. ``spot_run_h``: how
    long the spot capacity on offer has been available without a break (inf: unknown).
    """
    check_policy(policy)
    n = work_done_h.shape[0]
    if policy == "on-demand":
        return np.full(n, ON_DEMAND, dtype=np.int8)
    spot_or_wait = np.where(spot_available, SPOT, WAIT).astype(np.int8)
    if policy == "spot-only":
        return spot_or_wait

    has_deadline = np.isfinite(deadline_h)
    time_left = np.where(has_deadline, deadline_h - now_h, 0.0)
    slack = time_left - (work_total_h - work_done_h)
    need = restart_h + tick_h + uncommitted_h
    if policy == "greedy":
        p = GREEDY_PARAMS
    elif policy == "uniform-progress":
        # Can't Be Late: the reserve is the whole uniform-progress line; hysteresis of 2 restarts.
        p = PolicyParams(reserve_fraction=1.0, return_margin_h=0.0, min_return_work_h=0.0, reserve_cap_h=math.inf)
    else:
        p = params
    need = need + p.safety_margin_h
    span = np.where(has_deadline, deadline_h - start_h, 1.0)
    initial_slack = np.maximum(span - work_total_h, 0.0)
    frac_left = np.clip(time_left / np.maximum(span, 1e-12), 0.0, 1.0)
    reserve = need + np.minimum(p.reserve_fraction * initial_slack, p.reserve_cap_h) * frac_left

    on_od = current == ON_DEMAND
    safe = slack >= need
    if policy == "uniform-progress":
        # Return to spot only when ahead of the line by a hysteresis of two changeovers.
        may_return = slack >= reserve + 2.0 * restart_h
    else:
        may_return = (
            (slack >= need + (1.0 + p.return_restarts) * restart_h + p.return_margin_h)
            & (work_total_h - work_done_h >= p.min_return_work_h)
            & (spot_run_h >= p.return_min_run_h)
        )
    # With spot available: take it, unless on on-demand without room to come back.
    with_spot = np.where(on_od & ~may_return, ON_DEMAND, SPOT)
    # Without spot: wait while above the reserve line; on-demand stays put a changeover longer.
    keep_reserve = reserve + np.where(on_od, restart_h, 0.0)
    without_spot = np.where(slack >= keep_reserve, WAIT, ON_DEMAND)
    if policy == "greedy":
        without_spot = np.where(on_od, ON_DEMAND, without_spot)
    deadline_rule = np.where(~safe, ON_DEMAND, np.where(spot_available, with_spot, without_spot))
    return np.where(has_deadline, deadline_rule, spot_or_wait).astype(np.int8)


def decide(
    policy_name: str,
    progress: JobProgress,
    spot_available: bool,
    *,
    tick_h: float = 0.0,
    params: PolicyParams = DEFAULT_PARAMS,
    spot_run_h: float = math.inf,
) -> Decision:
    """What one job should do now. ``tick_h``: how long until the caller asks again; ``spot_run_h``:
    how long the offered spot capacity has lasted so far (inf if unknown)."""
    if progress.current not in _CURRENT_CODE:
        raise InvalidInput(f"current market {progress.current!r} is not one of spot, on-demand, none")
    if progress.work_total_h <= 0 or progress.restart_h < 0:
        raise InvalidInput("work_total_h must be > 0 and restart_h >= 0")

    def one(x: float) -> FloatArray:
        return np.array([x], dtype=np.float64)

    code = decide_arrays(
        policy_name,
        work_done_h=one(progress.work_done_h),
        work_total_h=one(progress.work_total_h),
        now_h=progress.now_h,
        deadline_h=one(math.inf if progress.deadline_h is None else progress.deadline_h),
        start_h=one(progress.start_h),
        restart_h=progress.restart_h,
        current=np.array([_CURRENT_CODE[progress.current]], dtype=np.int8),
        spot_available=np.array([spot_available]),
        uncommitted_h=progress.uncommitted_h,
        tick_h=tick_h,
        params=params,
        spot_run_h=spot_run_h,
    )
    return _DECISION_BY_CODE[int(code[0])]


def choose_zone(
    available: Sequence[bool], current_zone: int | None, run_length_h: Sequence[float]
) -> int | None:
    """Which zone to run spot in: stay where we are if it still has capacity (a move costs a
    changeover); otherwise the available zone whose capacity has lasted longest so far (runs of spot
    availability are heavy-tailed, so an old run is likelier to last). None if no zone has capacity."""
    if current_zone is not None and 0 <= current_zone < len(available) and available[current_zone]:
        return current_zone
    best: int | None = None
    for zone, ok in enumerate(available):
        if ok and (best is None or run_length_h[zone] > run_length_h[best]):
            best = zone
    return best


def mean_time_to_preemption(availability: Sequence[float] | FloatArray, gap_h: float) -> float:
    """Observed mean length (hours) of a spot run that ended in a preemption.

    Runs cut by the end of the trace count toward the time but not as preemptions (censored), so the
    estimate is total available time / preemptions observed; ``inf`` if none was observed.
    """
    avail = np.asarray(availability, dtype=np.float64) > 0
    if avail.size == 0:
        raise InvalidInput("an availability trace needs at least one tick")
    ends = int(np.count_nonzero(avail[:-1] & ~avail[1:]))
    up_h = float(np.count_nonzero(avail)) * gap_h
    return math.inf if ends == 0 else up_h / ends


def young_daly_interval(checkpoint_cost_h: float, mtbf_h: float) -> float:
    """Hours of work between checkpoints minimising expected overhead (Daly 2006's higher-order
    form of Young 1974's sqrt(2 C M)). 0 for a free checkpoint, inf when nothing fails."""
    if checkpoint_cost_h < 0 or mtbf_h <= 0:
        raise InvalidInput("checkpoint cost must be >= 0 and mean time between failures > 0")
    if checkpoint_cost_h == 0:
        return 0.0
    if math.isinf(mtbf_h):
        return math.inf
    if checkpoint_cost_h >= 2 * mtbf_h:
        return mtbf_h
    ratio = checkpoint_cost_h / (2 * mtbf_h)
    return math.sqrt(2 * checkpoint_cost_h * mtbf_h) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - checkpoint_cost_h
