"""One placement (GPU type x count x node shape): the best strategy on it, with its memory, throughput and
hours, or why none fits. Here the placement's values and the training search; planner.placement_infer
searches inference, planner.estimate dispatches and is the public entry for a pinned placement;
planner.search prices and ranks the placements ``plan`` enumerates.

Memory and throughput depend only on the placement, so each strategy is estimated once per placement
(memory first, micro-batch by bisection)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig, StackSupport
from planner.calibration import GIB, Calibration
from planner.capability import auto_precisions, degree_problem, knob_problem, precision_problem
from planner.host_memory import node_state_bytes
from planner.knobs import Knobs
from planner.memory import Moment, finish_estimate
from planner.memory_train import MemoryLines, max_micro_batch, memory_lines, train_memory, train_moments
from planner.resolve import memory_headroom
from planner.spec import JobSpec, TrainSpec
from planner.strategies import (
    AUTO,
    NO_SHARDING,
    data_parallel_shardings,
    finetune_kind,
    precision_kind,
)
from planner.throughput_train import StepParts, train_step_parts, train_throughput
from planner.types import Estimate, MemoryEstimate, Strategy, construct

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
AMP_PREFERENCE = 0.9  # keep fp32 master weights unless pure bf16 is >10% faster


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


@dataclass(frozen=True)
class Placement:
    gpu: GpuSpec
    count: int
    gpus_per_node: int
    network_gbps: float

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.count / self.gpus_per_node))

    def label(self) -> str:
        return f"{self.count}x{self.gpu.id}" + (f" ({self.nodes} nodes)" if self.nodes > 1 else "")


@dataclass
class Memo:
    """Per-plan caches (one spec, one model): memory depends on the knobs, not on the GPU; per-token counts on
    the model; the largest micro-batch on the knobs and the GPU type, not on the node shape; the precisions a
    GPU type trains in on that type alone, and the shardings the workers run on nothing."""

    lines: dict[tuple[Knobs, int, bool], MemoryLines] = field(default_factory=dict)  # bool: the CPU's constants
    per_token: dict[tuple[object, ...], float] = field(default_factory=dict)
    micro_batch: dict[tuple[Knobs, int, str], int | None] = field(default_factory=dict)
    moments: dict[tuple[Knobs, int, bool], tuple[list[Moment], str]] = field(default_factory=dict)
    precisions: dict[str, list[str] | PlacementOutcome] = field(default_factory=dict)
    shardings: list[str] | None = None
    params: ParamCount | None = None

    def count(self, model: ModelConfig) -> ParamCount:
        if self.params is None:
            self.params = count_params(model)
        return self.params


@dataclass
class PlacementOutcome:
    """The best strategy for one placement, or why none works."""

    estimate: Estimate | None
    reason: str = ""
    constraint: str = ""
    tried: int = 0
    label: str = ""  # filled once the placement is priced
    checkpoint_h: float = 0.0
    durable_h: float = 0.0


# ----------------------------------------------------------------------------- strategies


def _strategy(**kw: Any) -> Strategy:
    # construct (no validation): the search builds thousands of these from already-valid values
    return construct(Strategy, **kw)


def _train_support_problem(t: TrainSpec, gpu: GpuSpec, support: StackSupport) -> str | None:
    """Why the workers cannot run the spec's pinned training knobs on ``gpu`` (None when they can)."""
    for knob, value in (("optimizer", t.optimizer), ("finetune", t.finetune)):
        problem = knob_problem(support, gpu, "train", knob, value)
        if problem:
            return problem
    if t.precision != AUTO and (problem := knob_problem(support, gpu, "train", "precision", t.precision)):
        return problem
    if t.sharding != AUTO and (problem := knob_problem(support, gpu, "train", "sharding", t.sharding)):
        return problem
    for knob in ("tensor_parallel", "pipeline_parallel"):
        value = getattr(t, knob)
        if isinstance(value, int) and (problem := degree_problem(support, "train", knob, value)):
            return problem
    return None


@dataclass(frozen=True)
class _TrainSpace:
    """What a training placement may try: knob values the spec, the GPU and the stack allow."""

    precisions: list[str]
    shardings: list[str]
    ckpts: list[bool]
    micro_batches: list[int]
    tp: int
    pp: int
    dp: int


@dataclass
class _TrainBest:
    """The fastest knobs found (and the fastest mixed-precision ones), or the least memory-hungry miss."""

    best: tuple[float, Knobs, StepParts] | None = None
    best_amp: tuple[float, Knobs, StepParts] | None = None
    smallest: tuple[float, Knobs] | None = None
    tried: int = 0


def train_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    memo: Memo, support: StackSupport) -> PlacementOutcome:
    assert spec.train is not None
    t = spec.train
    space = _train_space(t, p, support, memo)
    if isinstance(space, PlacementOutcome):
        return space
    pc = memo.count(model)
    headroom = memory_headroom(spec, cal)
    found = _search_train_knobs(t, model, p, space, cal, memo, pc, headroom)
    gpu, mem_cal = p.gpu, cal.memory
    if found.best is None:
        assert found.smallest is not None
        s0 = _to_strategy(found.smallest[1], gpu, p)
        m0 = train_memory(model, s0, t.seq_len, gpu, mem_cal, pc, headroom)
        return PlacementOutcome(None, memory_reason(m0, gpu, s0), "memory", found.tried)
    best = found.best
    if found.best_amp is not None and found.best_amp[0] >= AMP_PREFERENCE * best[0]:
        best = found.best_amp
    strategy = _to_strategy(best[1], gpu, p)
    # train_memory, with the moments (which depend on the knobs, not the GPU) shared across placements
    mkey = (best[1], t.seq_len, gpu.vendor == "cpu")
    moments = memo.moments.get(mkey)
    if moments is None:
        moments = memo.moments[mkey] = train_moments(model, strategy, t.seq_len, mem_cal, pc, memo.per_token)
    memory = finish_estimate(moments[0], moments[1], gpu, strategy.gpu_count, mem_cal, headroom=headroom)
    thr = train_throughput(model, strategy, t.seq_len, gpu, cal.throughput, gpus_per_node=p.gpus_per_node,
                           network_gbps=p.network_gbps, pc=pc, memo=memo.per_token, parts=best[2])
    start = train_start_s(pc, strategy, cal)
    hours = (t.tokens / thr.tokens_per_s + start) / 3600
    return PlacementOutcome(construct(Estimate, strategy=strategy, memory=memory, throughput=thr, hours=hours,
                             start_s=start, warnings=[]),
                   tried=found.tried)


def train_start_s(pc: ParamCount, strategy: Strategy, cal: Calibration) -> float:
    """A training job's one-time seconds: the measured fixed start, the checkpoint buffer pinned once and the last
    checkpoint's write, each at its measured speed per node (its ranks' share of the state, as the snapshot in
    planner.host_memory)."""
    state = node_state_bytes(pc, strategy, strategy.gpu_count // strategy.nodes)
    return (cal.cost.train_start_s + state / (cal.cost.checkpoint_pin_gbps * 1e9)
            + state / (cal.cost.checkpoint_write_gbps * 1e9))


def _train_space(t: TrainSpec, p: Placement, support: StackSupport, memo: Memo) -> _TrainSpace | PlacementOutcome:
    """The knob values to try on this placement, or the PlacementOutcome saying why none can run."""
    precisions = memo.precisions.get(p.gpu.id)
    if precisions is None:
        precisions = memo.precisions[p.gpu.id] = _gpu_precisions(t, p.gpu, support)
    if isinstance(precisions, PlacementOutcome):
        return replace(precisions)  # each placement's PlacementOutcome is its own (search.py labels it)
    if memo.shardings is None:
        memo.shardings = searched_shardings(support, p.gpu)
    return _placement_space(t, p, precisions, memo.shardings)


def searched_shardings(support: StackSupport, gpu: GpuSpec) -> list[str]:
    """The sharding kinds ``sharding: auto`` tries over data-parallel ranks: those of the registry the workers run,
    lightest first."""
    return [x for x in data_parallel_shardings() if knob_problem(support, gpu, "train", "sharding", x) is None]


def _gpu_precisions(t: TrainSpec, gpu: GpuSpec, support: StackSupport) -> list[str] | PlacementOutcome:
    """The precisions the spec lets ``gpu`` train in (whatever the count), or why it cannot train at all."""
    if t.precision == AUTO:
        precisions = auto_precisions(gpu, t.finetune)
    else:
        problem = precision_problem(gpu, t.precision)
        if problem:
            return PlacementOutcome(None, problem, "dtype")
        precisions = [t.precision]
    problem = _train_support_problem(t, gpu, support)
    if problem:
        return PlacementOutcome(None, problem, "support")
    runnable = [x for x in precisions if knob_problem(support, gpu, "train", "precision", x) is None]
    if not runnable:
        return PlacementOutcome(None, knob_problem(support, gpu, "train", "precision", precisions[0]) or "", "support")
    precisions = runnable
    if (finetune_kind(t.finetune).quantized_base
            and not any(precision_kind(x).sixteen_bit_compute for x in precisions)):
        return PlacementOutcome(None, f"qlora needs 16-bit compute; {gpu.id} has neither bf16 nor fp16", "dtype")
    return list(precisions)


def _placement_space(t: TrainSpec, p: Placement, precisions: list[str], auto_shardings: list[str],
                     ) -> _TrainSpace | PlacementOutcome:
    """The knob space of ``p`` given the precisions its GPU trains in and the shardings the workers run
    (sharding does not depend on the GPU)."""
    tp = t.tensor_parallel if isinstance(t.tensor_parallel, int) else 1
    pp = t.pipeline_parallel if isinstance(t.pipeline_parallel, int) else 1
    if p.count % (tp * pp):
        return PlacementOutcome(
            None, f"{p.count} GPUs cannot be split into tensor_parallel={tp} x pipeline_parallel={pp}", "count")
    if tp > p.gpus_per_node:
        return PlacementOutcome(
            None, f"tensor_parallel={tp} needs {tp} GPUs on one node; this node has {p.gpus_per_node}", "count")
    dp = p.count // (tp * pp)
    if dp == 1:
        shardings = [NO_SHARDING]
    elif t.sharding == AUTO:
        shardings = list(auto_shardings)
    else:
        shardings = [t.sharding]
    ckpts = [False, True] if t.activation_checkpointing == "auto" else [bool(t.activation_checkpointing)]
    mbs = _micro_batches(t, dp)
    if isinstance(mbs, str):
        return PlacementOutcome(None, mbs, "count")
    return _TrainSpace(list(precisions), shardings, ckpts, mbs, tp, pp, dp)


def _search_train_knobs(t: TrainSpec, model: ModelConfig, p: Placement, space: _TrainSpace, cal: Calibration,
                        memo: Memo, pc: ParamCount, headroom: float) -> _TrainBest:
    """Precision x sharding x checkpointing, each at the largest micro-batch that fits; lighter options first,
    and a heavier one only where it buys a larger micro-batch."""
    gpu, mem_cal, thr_cal = p.gpu, cal.memory, cal.throughput
    cpu = gpu.vendor == "cpu"  # the CPU has memory constants of its own (Calibration.for_vendor)
    mbs, dp = space.micro_batches, space.dp
    found = _TrainBest()
    for precision in space.precisions:
        lighter_mb: dict[bool, int] = {}  # best micro-batch of a lighter sharding, per checkpointing
        for sharding in space.shardings:
            reached_top = False
            mb_without_ckpt = 0
            for ckpt in space.ckpts:
                accum1 = 1 if t.global_batch is None else max(1, math.ceil(t.global_batch / (mbs[0] * dp)))
                knobs = Knobs(precision=precision, optimizer=t.optimizer, sharding=sharding,
                              tensor_parallel=space.tp, pipeline_parallel=space.pp, gpu_count=p.count,
                              activation_checkpointing=ckpt, micro_batch=mbs[0], grad_accum=accum1,
                              finetune=t.finetune, lora_rank=t.lora_rank)
                found.tried += 1
                key = (knobs, t.seq_len, cpu)
                lines = memo.lines.get(key)
                if lines is None:
                    lines = memo.lines[key] = memory_lines(model, knobs, t.seq_len, mem_cal, pc,
                                                                  memo.per_token)
                mkey = (knobs, t.seq_len, gpu.id)
                if mkey in memo.micro_batch:
                    mb = memo.micro_batch[mkey]
                else:
                    mb = memo.micro_batch[mkey] = max_micro_batch(lines, p.count, gpu, mem_cal, mbs, headroom)
                if mb is None:
                    need = max(c for c, _ in lines)
                    if found.smallest is None or need < found.smallest[0]:
                        found.smallest = (need, knobs)
                    continue
                if ckpt and mb <= mb_without_ckpt:
                    continue  # recomputation at no larger a micro-batch is only slower
                if mb <= lighter_mb.get(ckpt, 0):
                    continue  # heavier sharding only adds communication unless it buys a larger micro-batch
                lighter_mb[ckpt] = mb
                if not ckpt:
                    mb_without_ckpt = mb
                accum = 1 if t.global_batch is None else max(1, math.ceil(t.global_batch / (mb * dp)))
                knobs = knobs.with_micro_batch(mb, accum)
                parts = train_step_parts(model, knobs, t.seq_len, gpu, thr_cal, gpus_per_node=p.gpus_per_node,
                                         network_gbps=p.network_gbps, pc=pc, memo=memo.per_token)
                tps = parts[0]
                if found.best is None or tps > found.best[0]:
                    found.best = (tps, knobs, parts)
                if precision_kind(precision).mixed and (found.best_amp is None or tps > found.best_amp[0]):
                    found.best_amp = (tps, knobs, parts)
                if not ckpt and mb == mbs[-1]:
                    reached_top = True
                    break  # checkpointing cannot beat a configuration that already runs the largest micro-batch
            if reached_top:
                break  # heavier sharding only adds communication once replicas already run the largest micro-batch
    return found


def _micro_batches(t: TrainSpec, dp: int) -> list[int] | str:
    """Micro-batches that run exactly ``global_batch`` sequences per step on ``dp`` ranks (whole
    accumulation steps), or why none can: the batch is the user's, never rounded."""
    gb = t.global_batch
    if gb is None:
        return [t.micro_batch] if t.micro_batch else list(MICRO_BATCHES)
    if gb < dp:
        return (f"global_batch {gb} is smaller than the {dp} data-parallel ranks (each needs at least one "
                f"sequence per step); use at most {gb} GPUs or a global_batch of at least {dp}")
    if gb % dp:
        below = max(n for n in range(1, dp) if gb % n == 0)
        above = next((n for n in range(dp + 1, gb + 1) if gb % n == 0), gb)
        return (f"global_batch {gb} does not split evenly over {dp} data-parallel ranks (it would run "
                f"{math.ceil(gb / dp) * dp}); use {below} or {above} data-parallel ranks (divisors of {gb}) or a "
                f"global_batch that is a multiple of {dp}, e.g. {gb - gb % dp} or {gb - gb % dp + dp}")
    per_rank = gb // dp
    if t.micro_batch:
        if per_rank % t.micro_batch:
            return (f"micro_batch {t.micro_batch} does not divide the {per_rank} sequences each of the {dp} "
                    f"data-parallel ranks gets per step (global_batch {gb}); pin a micro_batch that divides "
                    f"{per_rank} or leave it to the planner")
        return [t.micro_batch]
    return [m for m in MICRO_BATCHES if per_rank % m == 0]


def _to_strategy(k: Knobs, gpu: GpuSpec, p: Placement) -> Strategy:
    return _strategy(gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision=k.precision,
                    optimizer=k.optimizer, sharding=k.sharding, tensor_parallel=k.tensor_parallel,
                    pipeline_parallel=k.pipeline_parallel, activation_checkpointing=k.activation_checkpointing,
                    micro_batch=k.micro_batch, grad_accum=k.grad_accum, finetune=k.finetune, lora_rank=k.lora_rank)


def headroom_note(m: MemoryEstimate) -> str:
    """'136.0 GiB usable less 5% headroom': the limit a fit verdict was judged against."""
    return f"{gib(m.usable_bytes)} usable less {m.headroom:.0%} headroom"


def memory_reason(m: MemoryEstimate, gpu: GpuSpec, s: Strategy) -> str:
    """Why the least memory-hungry strategy ``s`` does not fit ``gpu``."""
    if gpu.vendor == "cpu":
        return f"needs {gib(m.required_bytes)} > {gib(m.limit_bytes)} RAM ({headroom_note(m)}) (smallest: {s.label()})"
    return (f"needs {gib(m.required_bytes)} > {gib(m.limit_bytes)} ({headroom_note(m)}) on {gpu.id} "
            f"(smallest: {s.label()})")


