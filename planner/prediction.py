"""What a plan predicts of a run, in the units the run measures them: the predicted half of every
predicted-vs-measured record (an attempt's metrics, a local run's ``result.json``, ``gpuplan report accuracy``,
``gpuplan calibrate``), built here and nowhere else."""

from __future__ import annotations

from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from planner.types import Estimate, MemoryEstimate, Strategy, ThroughputEstimate

# the predictions a run measures too, as numbers (what the workers are handed and report back, floats only)
PREDICTED_NUMBERS = ("peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s", "prefill_s", "decode_step_s",
                     "wall_s", "hours")


class InferenceSplit(NamedTuple):
    """One batch on one replica, as one worker times it (workers/decode.DecodeTiming); None for training plans."""

    prefill_s: float | None
    decode_step_s: float | None


def inference_split(throughput: ThroughputEstimate, strategy: Strategy) -> InferenceSplit:
    """A plan's prompt pass and decode step of one batch on one replica, from its throughput and strategy."""
    decode_rate = throughput.decode_tokens_per_s
    prefill = throughput.breakdown_s.get("prefill")
    if decode_rate is None or decode_rate <= 0 or prefill is None:
        return InferenceSplit(None, None)
    replicas = max(1, strategy.gpu_count // strategy.tensor_parallel)
    return InferenceSplit(float(prefill), strategy.batch * replicas / float(decode_rate))


class Prediction(BaseModel):
    """A plan's numbers for one run (None: not predicted) and the strategy they are for. Read back from stored
    records too, so keys a later version adds are ignored rather than refused."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    tokens_per_s: float | None = None
    prefill_s: float | None = None  # inference: a batch's prompt pass (InferenceSplit)
    decode_step_s: float | None = None  # inference: one decode step
    wall_s: float | None = None  # the plan's hours in seconds, its start included (timed on GPUs only)
    hours: float | None = None  # the plan's hours of the job
    micro_batch: int | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    label: str | None = None  # Strategy.label() of the planned strategy

    @property
    def predicts_anything(self) -> bool:
        """Whether the planner made any prediction a run can measure (none for inference on a CPU)."""
        return any(getattr(self, key) is not None for key in PREDICTED_NUMBERS)

    def record(self) -> dict[str, object]:
        """The ``predicted`` block of a predicted-vs-measured record (JSON)."""
        return self.model_dump(mode="json")

    def numbers(self) -> dict[str, float]:
        """The predictions as floats, for the workers (``TrainJob.predicted``), which report them back."""
        out: dict[str, float] = {}
        for key in PREDICTED_NUMBERS:
            value = getattr(self, key)
            if value is not None:
                out[key] = float(value)
        return out


def predict(strategy: Strategy, memory: MemoryEstimate, throughput: ThroughputEstimate, hours: float, *,
            timed_start: bool = True) -> Prediction:
    """The prediction of one planned run. ``timed_start``: whether ``hours`` holds the run's measured start
    (process, model build, first step), so that the run's wall clock compares with it (not for CPU plans)."""
    split = inference_split(throughput, strategy)
    return Prediction(peak_allocated_bytes=memory.peak_allocated_bytes, peak_reserved_bytes=memory.peak_reserved_bytes,
                      tokens_per_s=throughput.tokens_per_s, prefill_s=split.prefill_s,
                      decode_step_s=split.decode_step_s, wall_s=hours * 3600 if timed_start else None, hours=hours,
                      micro_batch=strategy.micro_batch, gpu=strategy.gpu, gpu_count=strategy.gpu_count,
                      label=strategy.label())


def prediction_of(estimate: Estimate) -> Prediction:
    """The prediction of a planned estimate (a plan's chosen candidate, ``gpuplan estimate``'s answer)."""
    return predict(estimate.strategy, estimate.memory, estimate.throughput, estimate.hours)
