"""The simulator's inputs and outputs: prices, a stream of jobs, per-job outcomes, and how
checkpoints and changeovers cost (:class:`SimOptions`). Replayed by :mod:`scheduler.sim.replay`, bounded
by :mod:`scheduler.spot.bound`; :mod:`scheduler.sim.simulate` is the entry point."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from errors import InvalidInput
from planner.cost import just_in_time_loss
from scheduler.sim.traces import Zones
from scheduler.spot.policy import PRIOR_MEAN_RUN_H, RATE_HALF_LIFE_H

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Prices:
    on_demand: float
    spot: float  # used where a trace has no price of its own

    def __post_init__(self) -> None:
        if not (self.on_demand > 0 and self.spot > 0):
            raise InvalidInput("prices must be positive $/h", hint="e.g. --on-demand-price 3.06 --spot-price 0.92")


@dataclass(frozen=True)
class Jobs:
    """A stream of jobs: arrival tick, work, deadline (hours after arrival; inf: none), restart."""

    start_tick: IntArray
    work_h: FloatArray
    deadline_h: FloatArray
    restart_h: FloatArray

    @staticmethod
    def make(
        start_tick: Sequence[int] | IntArray,
        work_h: float | Sequence[float] | FloatArray,
        deadline_h: float | Sequence[float] | FloatArray,
        restart_h: float | Sequence[float] | FloatArray,
    ) -> Jobs:
        starts = np.asarray(start_tick, dtype=np.int64)
        n = starts.shape[0]

        def arr(x: float | Sequence[float] | FloatArray) -> FloatArray:
            return np.broadcast_to(np.asarray(x, dtype=np.float64), (n,)).copy()

        jobs = Jobs(starts, arr(work_h), arr(deadline_h), arr(restart_h))
        if n == 0:
            raise InvalidInput("no jobs to simulate")
        if np.any(starts < 0):
            raise InvalidInput("job arrival ticks must be >= 0")
        if np.any(~(jobs.work_h > 0)) or np.any(~np.isfinite(jobs.work_h)):
            raise InvalidInput("job hours must be a positive number")
        if np.any(~(jobs.restart_h >= 0)) or np.any(~np.isfinite(jobs.restart_h)):
            raise InvalidInput("restart hours must be >= 0")
        if np.any(~(jobs.deadline_h >= jobs.work_h)):
            raise InvalidInput(
                "a deadline is shorter than the job's work; no market can finish it",
                hint="give --deadline-hours >= --job-hours (plus the restart delay)",
            )
        return jobs

    def __len__(self) -> int:
        return int(self.start_tick.shape[0])


@dataclass
class PolicyOutcome:
    """Per-job results of one policy (arrays over jobs). ``finish_h`` is hours after arrival."""

    policy: str
    cost_usd: FloatArray
    finish_h: FloatArray  # nan: not finished by the end of the trace
    preemptions: IntArray
    work_lost_h: FloatArray
    spot_h: FloatArray
    on_demand_h: FloatArray
    deadline_h: FloatArray
    # Per-tick record for plots (only when asked for): market code and progress, shape (ticks, jobs).
    timeline_market: npt.NDArray[np.int8] | None = None
    timeline_done: FloatArray | None = None
    timeline_zone: IntArray | None = None
    # Spot boots begun beside on-demand (make-before-break) and those whose capacity vanished first.
    boots: IntArray | None = None
    boots_lost: IntArray | None = None

    @property
    def deadline_met(self) -> npt.NDArray[np.bool_]:
        return np.isfinite(self.finish_h) & (self.finish_h <= self.deadline_h + 1e-6)

    def row(self, i: int = 0) -> dict[str, object]:
        """One job's result; numbers that do not exist (a bound has no schedule) are None."""

        def num(x: float) -> float | None:
            return None if not math.isfinite(x) else round(x, 4)

        return {
            "policy": self.policy,
            "cost_usd": num(float(self.cost_usd[i])),
            "finish_hours": num(float(self.finish_h[i])),
            "deadline_met": bool(self.deadline_met[i]),
            "preemptions": int(self.preemptions[i]),
            "work_lost_hours": num(float(self.work_lost_h[i])),
            "spot_hours": num(float(self.spot_h[i])),
            "on_demand_hours": num(float(self.on_demand_h[i])),
            # spot instances booted beside on-demand (make-before-break), and those lost before the move
            "spot_boots": None if self.boots is None else int(self.boots[i]),
            "spot_boots_lost": None if self.boots_lost is None else int(self.boots_lost[i]),
        }


JIT_STEP_S = 1.0  # SimOptions.measured(): the training step the just-in-time reserve counts twice


@dataclass(frozen=True)
class SimOptions:
    """How checkpoints and changeovers cost (hours), and what the policy may know.

    checkpoint_cost_h: what the training loop stops for at each periodic checkpoint (the snapshot;
        0: free continuous checkpoints, nothing is ever lost). Checkpoints come every Young/Daly
        interval from the zone's mean time to preemption (``mttp_h``; None: estimated online).
    checkpoint_write_h: time until a checkpoint is durable. A voluntary changeover waits for it (the
        old instance is billed meanwhile; the new one boots in parallel) and loses nothing: the
        scheduler loop's checkpoint-and-stop (scheduler.loop.changeover), which starts the new attempt only
        after the write (docs/SPOT.md, "In the scheduler loop").
    notice_h: preemption notice (AWS 2 min, GCP 30 s; 0: none). When it covers the snapshot and the
        write, the job checkpoints just in time and loses at most the notice window (``jit_reserve_h``
        0), or at most ``jit_reserve_h`` of it; otherwise it loses the work since its last periodic checkpoint.
    jit_reserve_h: the workers train through a notice and start the just-in-time checkpoint this long before
        its deadline (planner.cost.just_in_time_reserve_s); 0: at the notice (the workers before 2026-12-04).
    move_h: checkpoint transfer when the job starts in another zone than the one its checkpoint is in.
    prior_mean_run_h: the policy's prior mean run of capacity for a zone it has not watched yet.
    rate_half_life_h: half-life of what was watched in the online rates (inf: no decay).
    make_before_break: a job on on-demand may boot spot beside it and move once the boot is done
        (``gpuplan``'s returns to spot; the bound may do the same); what the scheduler loop does when its
        executor can hold a node of the new type up before the move (docs/SPOT.md).
    mean_outage_h: per zone, the mean outage the policy is told (None: estimated online), like
        ``mttp_h`` for runs: what knowing the rates in hindsight is worth (bench/spot/spot.py --hindsight-rates).
    """

    checkpoint_cost_h: float = 0.0
    mttp_h: tuple[float, ...] | None = None  # per zone; None: estimated online from the trace so far
    mean_outage_h: tuple[float, ...] | None = None  # per zone; None: estimated online from the trace so far
    timeline: bool = False
    checkpoint_write_h: float = 0.0
    notice_h: float = 0.0
    move_h: float = 0.0
    prior_mean_run_h: float = PRIOR_MEAN_RUN_H
    rate_half_life_h: float = RATE_HALF_LIFE_H
    make_before_break: bool = False
    jit_reserve_h: float = 0.0

    @property
    def _jit_loss_h(self) -> float | None:
        return just_in_time_loss(self.notice_h, self.checkpoint_cost_h, self.checkpoint_write_h, self.jit_reserve_h)

    @property
    def just_in_time(self) -> bool:
        """Whether the notice covers a checkpoint's stall and write (planner.cost.just_in_time_loss)."""
        return self._jit_loss_h is not None

    @property
    def notice_loss_h(self) -> float:
        """The most a preemption with a just-in-time checkpoint loses: the notice window, or the reserve the
        workers keep before its deadline when the window is longer (planner.cost.just_in_time_loss, the rule the
        planner prices a spot plan's preemptions with)."""
        loss = self._jit_loss_h
        return self.notice_h if loss is None else loss

    def preemption_loss_h(self, uncommitted_h: FloatArray) -> FloatArray:
        """What a preemption loses of ``uncommitted_h`` hours not yet checkpointed: all of it, or at most
        ``notice_loss_h`` where a just-in-time checkpoint fits in the notice."""
        return np.minimum(uncommitted_h, self.notice_loss_h) if self.just_in_time else uncommitted_h

    @staticmethod
    def measured(state_gb: float = 14.8, write_gbps: float | None = None, snapshot_gbps: float | None = None,
                 notice_s: float = 120.0, transfer_gbps: float | None = None) -> SimOptions:
        """Honest costs from the checkpoint issue's measured speeds (planner/calibration.py
        CostCalibration: ``checkpoint_write_gbps``, ``checkpoint_snapshot_gbps``, ``min_checkpoint_h``;
        docs/lab-notes/2026-12-01-checkpoints-of-a-training-state.md: 14.8 GB of state durable in ~3.3 s, the loop
        stalls 0.29 s). A zone move copies the checkpoint at ``transfer_gbps`` (default: the write speed). Returns to
        spot may boot spot beside on-demand (``make_before_break``), as both executors let the scheduler loop do."""
        from planner.calibration import CostCalibration
        from planner.cost import just_in_time_reserve_s

        cal = CostCalibration()
        write = write_gbps or cal.checkpoint_write_gbps
        snap = snapshot_gbps or cal.checkpoint_snapshot_gbps
        stall_h, durable_h = state_gb / snap / 3600.0 + cal.min_checkpoint_h, state_gb / write / 3600.0
        return SimOptions(
            make_before_break=True,  # what the scheduler loop does with an executor that boots ahead
            checkpoint_cost_h=stall_h,
            checkpoint_write_h=durable_h,
            notice_h=notice_s / 3600.0,
            # the workers train through the notice; a step of JIT_STEP_S (the 1-8B runs on one H200: 0.7-0.9 s)
            jit_reserve_h=just_in_time_reserve_s(stall_h * 3600.0, durable_h * 3600.0, JIT_STEP_S) / 3600.0,
            move_h=state_gb / (transfer_gbps or write) / 3600.0,
        )


def spot_prices(zones: Zones, prices: Prices) -> FloatArray:
    return np.where(np.isnan(zones.prices), prices.spot, zones.prices)
