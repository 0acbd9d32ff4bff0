"""One placement (GPU type x count x node shape): the best strategy on it, with its memory, throughput and
hours, or why none fits. ``estimate`` is the public entry for a pinned placement; planner.search prices
and ranks the placements ``plan`` enumerates.

Memory and throughput depend only on the placement, so each strategy is estimated once per placement
(memory first, micro-batch by bisection)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from catalog.loader import Catalog
from catalog.params import ParamCount, count_params
from catalog.schema import GpuSpec, ModelConfig, StackSupport
from errors import InvalidInput
from planner.calibration import GIB, Calibration
from planner.capability import (
    auto_precisions,
    auto_weights,
    degree_problem,
    gpu_support_problem,
    knob_problem,
    multi_gpu_problem,
    precision_problem,
    weights_problem,
)
from planner.host_memory import node_state_bytes
from planner.knobs import Knobs
from planner.memory import Moment, finish_estimate, infer_memory
from planner.memory_train import MemoryLines, max_micro_batch, memory_lines, train_memory, train_moments
from planner.resolve import memory_headroom, resolve_spec_model
from planner.spec import InferSpec, JobSpec, TrainSpec
from planner.throughput import StepParts, infer_throughput, train_step_parts, train_throughput
from planner.types import Estimate, MemoryEstimate, Strategy, ThroughputEstimate, construct

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
    precisions: dict[str, list[str] | Outcome] = field(default_factory=dict)
    shardings: list[str] | None = None
    params: ParamCount | None = None

    def count(self, model: ModelConfig) -> ParamCount:
        if self.params is None:
            self.params = count_params(model)
        return self.params


@dataclass
class Outcome:
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
    if t.precision != "auto" and (problem := knob_problem(support, gpu, "train", "precision", t.precision)):
        return problem
    if t.sharding != "auto" and (problem := knob_problem(support, gpu, "train", "sharding", t.sharding)):
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


def _train_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    memo: Memo, support: StackSupport) -> Outcome:
    assert spec.train is not None
    t = spec.train
    space = _train_space(t, p, support, memo)
    if isinstance(space, Outcome):
        return space
    pc = memo.count(model)
    headroom = memory_headroom(spec, cal)
    found = _search_train_knobs(t, model, p, space, cal, memo, pc, headroom)
    gpu, mem_cal = p.gpu, cal.memory
    if found.best is None:
        assert found.smallest is not None
        s0 = _to_strategy(found.smallest[1], gpu, p)
        m0 = train_memory(model, s0, t.seq_len, gpu, mem_cal, pc, headroom)
        return Outcome(None, _memory_reason(m0, gpu, s0), "memory", found.tried)
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
    return Outcome(construct(Estimate, strategy=strategy, memory=memory, throughput=thr, hours=hours,
                             start_s=start, warnings=[]),
                   tried=found.tried)


def train_start_s(pc: ParamCount, strategy: Strategy, cal: Calibration) -> float:
    """A training job's one-time seconds: the measured fixed start, the checkpoint buffer pinned once and the last
    checkpoint's write, each at its measured speed per node (its ranks' share of the state, as the snapshot in
    planner.host_memory)."""
    state = node_state_bytes(pc, strategy, strategy.gpu_count // strategy.nodes)
    return (cal.cost.train_start_s + state / (cal.cost.checkpoint_pin_gbps * 1e9)
            + state / (cal.cost.checkpoint_write_gbps * 1e9))


def infer_start_s(thr: ThroughputEstimate, cal: Calibration) -> float:
    """An inference job's one-time seconds: the measured fixed start (process, load) and the decoder's capture."""
    return cal.cost.infer_start_s + thr.warmup_s


def _train_space(t: TrainSpec, p: Placement, support: StackSupport, memo: Memo) -> _TrainSpace | Outcome:
    """The knob values to try on this placement, or the Outcome saying why none can run."""
    precisions = memo.precisions.get(p.gpu.id)
    if precisions is None:
        precisions = memo.precisions[p.gpu.id] = _gpu_precisions(t, p.gpu, support)
    if isinstance(precisions, Outcome):
        return replace(precisions)  # each placement's Outcome is its own (search.py labels it)
    if memo.shardings is None:
        memo.shardings = [x for x in ("ddp", "fsdp-grad-op", "fsdp")
                          if knob_problem(support, p.gpu, "train", "sharding", x) is None]
    return _placement_space(t, p, precisions, memo.shardings)


def _gpu_precisions(t: TrainSpec, gpu: GpuSpec, support: StackSupport) -> list[str] | Outcome:
    """The precisions the spec lets ``gpu`` train in (whatever the count), or why it cannot train at all."""
    if t.precision == "auto":
        precisions = auto_precisions(gpu, t.finetune)
    else:
        problem = precision_problem(gpu, t.precision)
        if problem:
            return Outcome(None, problem, "dtype")
        precisions = [t.precision]
    problem = _train_support_problem(t, gpu, support)
    if problem:
        return Outcome(None, problem, "support")
    runnable = [x for x in precisions if knob_problem(support, gpu, "train", "precision", x) is None]
    if not runnable:
        return Outcome(None, knob_problem(support, gpu, "train", "precision", precisions[0]) or "", "support")
    precisions = runnable
    if t.finetune == "qlora" and not any(x in ("bf16", "amp-bf16", "amp-fp16") for x in precisions):
        return Outcome(None, f"qlora needs 16-bit compute; {gpu.id} has neither bf16 nor fp16", "dtype")
    return list(precisions)


def _placement_space(t: TrainSpec, p: Placement, precisions: list[str], auto_shardings: list[str],
                     ) -> _TrainSpace | Outcome:
    """The knob space of ``p`` given the precisions its GPU trains in and the shardings the workers run
    (sharding does not depend on the GPU)."""
    tp = t.tensor_parallel if isinstance(t.tensor_parallel, int) else 1
    pp = t.pipeline_parallel if isinstance(t.pipeline_parallel, int) else 1
    if p.count % (tp * pp):
        return Outcome(None, f"{p.count} GPUs cannot be split into tensor_parallel={tp} x pipeline_parallel={pp}",
                       "count")
    if tp > p.gpus_per_node:
        return Outcome(None, f"tensor_parallel={tp} needs {tp} GPUs on one node; this node has {p.gpus_per_node}",
                       "count")
    dp = p.count // (tp * pp)
    if dp == 1:
        shardings = ["none"]
    elif t.sharding == "auto":
        shardings = list(auto_shardings)
    else:
        shardings = [t.sharding]
    ckpts = [False, True] if t.activation_checkpointing == "auto" else [bool(t.activation_checkpointing)]
    mbs = _micro_batches(t, dp)
    if isinstance(mbs, str):
        return Outcome(None, mbs, "count")
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
                if precision.startswith("amp") and (found.best_amp is None or tps > found.best_amp[0]):
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


def _memory_reason(m: MemoryEstimate, gpu: GpuSpec, s: Strategy) -> str:
    if gpu.vendor == "cpu":
        return f"needs {gib(m.required_bytes)} > {gib(m.limit_bytes)} RAM ({headroom_note(m)}) (smallest: {s.label()})"
    return (f"needs {gib(m.required_bytes)} > {gib(m.limit_bytes)} ({headroom_note(m)}) on {gpu.id} "
            f"(smallest: {s.label()})")


def _infer_estimate_of(s: Strategy, m: MemoryEstimate, thr: ThroughputEstimate, inf: InferSpec, cal: Calibration,
                       warnings: list[str]) -> Estimate:
    """An inference estimate whose hours are its requests at the estimated rate plus its start (``infer_start_s``),
    one formula for the searched and the pinned estimate."""
    assert thr.requests_per_s is not None
    start = infer_start_s(thr, cal)
    return construct(Estimate, strategy=s, memory=m, throughput=thr, hours=(inf.requests / thr.requests_per_s + start)
                     / 3600, start_s=start, warnings=warnings)


def _infer_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    support: StackSupport, memo: Memo) -> Outcome:
    assert spec.infer is not None
    inf = spec.infer
    gpu = p.gpu
    problem = degree_problem(support, "infer", "gpus", p.count)
    if problem:
        return Outcome(None, problem, "support")
    note: str | None = None
    if model.quantization is not None:
        stored = stored_weights_ladder(model, inf.weights, gpu, support)
        if isinstance(stored, Outcome):
            return stored
        ladder, note = stored
    elif inf.weights == "auto":
        ladder = auto_weights(gpu)
    else:
        problem = weights_problem(gpu, inf.weights)
        if problem:
            return Outcome(None, problem, "dtype")
        ladder = [inf.weights]
    runnable = [w for w in ladder if knob_problem(support, gpu, "infer", "weights", w) is None]
    if not runnable:
        return Outcome(None, knob_problem(support, gpu, "infer", "weights", ladder[0]) or "", "support")
    ladder = runnable
    tps: list[int]
    t = spec.train
    pinned_tp = t.tensor_parallel if t is not None and isinstance(t.tensor_parallel, int) else None
    if pinned_tp is not None and pinned_tp > 1:
        problem = degree_problem(support, "infer", "tensor_parallel", pinned_tp)
        if problem:
            return Outcome(None, problem, "support")
        tps = [pinned_tp]
    else:
        tps = sorted({x for x in (1, 2, 4, 8, p.count) if x <= min(p.count, p.gpus_per_node)
                      and p.count % x == 0 and model.num_attention_heads % x == 0
                      and degree_problem(support, "infer", "tensor_parallel", x) is None})
    best: Estimate | None = None
    smallest: tuple[MemoryEstimate, Strategy] | None = None
    tried = 0
    pc = memo.count(model)
    headroom = memory_headroom(spec, cal)
    warnings = [note] if note else []
    base = Strategy(task="infer", gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision="bf16", batch=inf.batch)
    for weights in ladder:
        for tp in tps:
            s = base.model_copy(update={"tensor_parallel": tp, "weights": weights})
            m = infer_memory(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.memory, pc, headroom)
            tried += 1
            if not m.fits:
                if smallest is None or m.required_bytes < smallest[0].required_bytes:
                    smallest = (m, s)
                continue
            thr = infer_throughput(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.throughput, pc)
            est = _infer_estimate_of(s, m, thr, inf, cal, list(warnings))
            if best is None or thr.tokens_per_s > best.throughput.tokens_per_s * 1.02:
                best = est
        if best is not None:
            break  # the most accurate weights that fit win; lower precision only when needed
    if best is None:
        assert smallest is not None
        return Outcome(None, _memory_reason(smallest[0], gpu, smallest[1]), "memory", tried)
    return Outcome(best, tried=tried)


def stored_weights_ladder(model: ModelConfig, weights: str, gpu: GpuSpec,
                          support: StackSupport) -> tuple[list[str], str | None] | Outcome:
    """The weights to plan a checkpoint stored quantized (ModelConfig.quantization) with on ``gpu``, and the
    warning when they are not its own format: its format where the workers' transformers keeps it (auto or
    pinned), else the 16-bit dtype transformers dequantizes it to on load (auto, or bf16/fp16 pinned). A pinned
    format the GPU cannot keep is refused with the platform's reason."""
    q = model.quantization
    assert q is not None
    method = q.method
    native = knob_problem(support, gpu, "infer", "weights", method)
    if weights == method:
        return Outcome(None, f"{model.id}: {native}", "support") if native else ([method], None)
    if weights == "auto" and native is None:
        return [method], None
    if weights == "auto":
        dequantized = auto_weights(gpu)[0]
        return [dequantized], (f"{model.id} on {gpu.id}: its {method.upper()} experts are planned dequantized to "
                               f"{dequantized} ({native})")
    problem = weights_problem(gpu, weights)
    if problem:
        return Outcome(None, problem, "dtype")
    return [weights], (f"{model.id}: weights {weights} pinned, so transformers dequantizes its {method.upper()} "
                       f"experts on load (Mxfp4Config(dequantize=True)) and the plan counts them at {weights}")


def estimate_placement(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration, support: StackSupport,
                        memo: Memo | None = None) -> Outcome:
    problem = multi_gpu_problem(p.gpu, p.count)
    if problem:
        return Outcome(None, problem, "count")
    problem = gpu_support_problem(support, p.gpu)
    if problem:
        return Outcome(None, problem, "support")
    cal = cal.for_vendor(p.gpu.vendor)
    memo = Memo() if memo is None else memo
    if spec.task == "train":
        return _train_estimate(spec, model, p, cal, memo, support)
    return _infer_estimate(spec, model, p, cal, support, memo)


# ----------------------------------------------------------------------------- public API


def estimate(spec: JobSpec, catalog: Catalog, gpu: str, count: int, *, calibration: Calibration,
             model: ModelConfig | None = None, gpus_per_node: int | None = None,
             network_gbps: float = 100.0) -> Estimate:
    """The estimate for a pinned placement; 'auto' fields resolved as ``plan`` does.

    ``calibration``: the constants to estimate with; the caller reads them (the planner reads no files).
    When nothing fits, the smallest configuration is returned with ``memory.fits = False`` so the
    user sees by how much; a dtype the part lacks raises InvalidInput.
    """
    cal = require_calibration(calibration, "estimate")
    if count < 1:
        raise InvalidInput(f"count must be at least 1, got {count}", path="count")
    mdl = resolve_spec_model(spec, catalog, model)
    g = catalog.gpu(gpu)
    p = Placement(g, count, gpus_per_node or min(count, 8), network_gbps)
    out = estimate_placement(spec, mdl, p, cal, catalog.support)
    if out.estimate is not None:
        return _with_model_warnings(out.estimate, mdl)
    if out.constraint == "dtype":
        raise InvalidInput(out.reason, hint="pin a precision/weights the GPU supports or pick another GPU")
    if out.constraint != "memory":
        raise InvalidInput(out.reason)  # the reason says what to change (the count, the batch...)
    return _with_model_warnings(_smallest_unfitting(spec, mdl, p, cal, catalog.support), mdl)


def require_calibration(calibration: object, caller: str) -> Calibration:
    """``calibration``, when it is one: a caller that forgot it is told where to read one."""
    if isinstance(calibration, Calibration):
        return calibration
    raise InvalidInput(
        f"{caller}() needs the planner's calibration, got {calibration!r}", path="calibration",
        hint="read it at the edge and pass it in: calibration=planner.calibration.load_calibration() "
        "(with overlay=user_calibration_path(home) for a `gpuplan calibrate` refit)")


def _with_model_warnings(est: Estimate, model: ModelConfig) -> Estimate:
    """A model read from a config gpuplan does not model exactly carries its guesses into the answer."""
    return est.model_copy(update={"warnings": [*est.warnings, *model.assumptions]}) if model.assumptions else est


def _smallest_unfitting(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                        support: StackSupport) -> Estimate:
    """The estimate of the least memory-hungry strategy (it does not fit)."""
    gpu = p.gpu
    cal = cal.for_vendor(gpu.vendor)
    if spec.task == "train":
        assert spec.train is not None
        t = spec.train
        precision = t.precision if t.precision != "auto" else auto_precisions(gpu, t.finetune)[-1]
        tp = t.tensor_parallel if isinstance(t.tensor_parallel, int) else 1
        pp = t.pipeline_parallel if isinstance(t.pipeline_parallel, int) else 1
        dp = max(1, p.count // (tp * pp))
        sharding = "none" if dp == 1 else ("fsdp" if t.sharding == "auto" else t.sharding)
        ckpt = True if t.activation_checkpointing == "auto" else bool(t.activation_checkpointing)
        s = _strategy(gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision=precision, optimizer=t.optimizer,
                      sharding=sharding, tensor_parallel=tp, pipeline_parallel=pp, activation_checkpointing=ckpt,
                      micro_batch=t.micro_batch or 1, finetune=t.finetune, lora_rank=t.lora_rank)
        mem = train_memory(model, s, t.seq_len, gpu, cal.memory, headroom=memory_headroom(spec, cal))
        thr = train_throughput(model, s, t.seq_len, gpu, cal.throughput, gpus_per_node=p.gpus_per_node,
                               network_gbps=p.network_gbps)
        start = train_start_s(count_params(model), s, cal)
        return Estimate(strategy=s, memory=mem, throughput=thr, hours=(t.tokens / thr.tokens_per_s + start) / 3600,
                        start_s=start)
    assert spec.infer is not None
    inf = spec.infer
    weights = inf.weights if inf.weights != "auto" else auto_weights(gpu)[-1]
    notes: list[str] = []
    if model.quantization is not None:
        stored = stored_weights_ladder(model, inf.weights, gpu, support)
        if not isinstance(stored, Outcome):  # a refusal was raised before (constraint support or dtype)
            weights, notes = stored[0][-1], [stored[1]] if stored[1] else []
    s = _strategy(task="infer", gpu=gpu.id, gpu_count=p.count, nodes=p.nodes,
                  tensor_parallel=p.count if p.count <= 8 else 8, weights=weights, batch=inf.batch)
    mem = infer_memory(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.memory,
                       headroom=memory_headroom(spec, cal))
    thr = infer_throughput(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.throughput)
    return _infer_estimate_of(s, mem, thr, inf, cal, notes)
