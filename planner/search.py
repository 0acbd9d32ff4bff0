"""Enumerate placements x strategies x offers x markets, prune, rank, explain every rejection.

``plan`` works in three layers so it stays fast: (1) placements (GPU type x count x node shape)
are few, and memory/throughput depend only on them, so each strategy is estimated once per
placement (memory first, micro-batch by bisection); (2) each placement's best strategy is then
priced on every matching offer and market; (3) deadline and budget filter, then rank and mark
the cost/time Pareto front. Every option that was considered and dropped gets a Rejection.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal

from pydantic import TypeAdapter

from catalog.errors import InvalidInput, NoFeasiblePlan, UnknownName
from catalog.loader import Catalog
from catalog.params import count_params
from catalog.schema import GpuSpec, ModelConfig, Offer, StackSupport
from planner.calibration import GIB, Calibration, load_calibration
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
from planner.cost import on_demand_cost, spot_cost
from planner.knobs import Knobs
from planner.memory import PRECISION_BYTES, MemoryLines, infer_memory, max_micro_batch, memory_lines, train_memory
from planner.spec import JobSpec, TrainSpec, check_model
from planner.throughput import infer_throughput, train_step_parts, train_throughput
from planner.types import Candidate, CostEstimate, Estimate, MemoryEstimate, Plan, Rejection, Strategy

Objective = Literal["cheapest", "fastest"]
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
    """Per-plan caches: memory depends on the knobs, not on the GPU; per-token counts on the model."""

    lines: dict[tuple[Knobs, int], MemoryLines] = field(default_factory=dict)
    per_token: dict[tuple[object, ...], float] = field(default_factory=dict)


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


# ----------------------------------------------------------------------------- resolution


def resolve_spec_model(spec: JobSpec, catalog: Catalog, model: ModelConfig | None) -> ModelConfig:
    """The spec's model, refused if the spec asks more of it than it can do (a context too long)."""
    if model is None:
        model = _catalog_model(spec, catalog)
    check_model(spec, model)
    return model


def _catalog_model(spec: JobSpec, catalog: Catalog) -> ModelConfig:
    if not isinstance(spec.model, str):
        # Reading the config.json is I/O, which the planner leaves to its callers (the CLI, the service).
        raise InvalidInput(f"the model is given as a config file ({spec.model.config}), which is not read here",
                           path="model", hint="use a preset (gpuplan catalog models), or plan and run the spec file "
                           "on this machine: gpuplan plan SPEC, gpuplan run SPEC")
    try:
        return catalog.model(spec.model)
    except UnknownName as exc:
        raise UnknownName("model", spec.model, [m.id for m in catalog.models], path="model") from exc


def memory_headroom(spec: JobSpec, cal: Calibration) -> float:
    """The fraction of usable memory a plan of ``spec`` must leave free: the spec's, else the default."""
    chosen = spec.resources.memory_headroom
    return cal.memory.plan_headroom if chosen is None else chosen


def _allowed_gpus(spec: JobSpec, catalog: Catalog) -> tuple[list[GpuSpec], dict[str, int | None]]:
    pins = spec.resources.accelerator_pins()
    if not pins:
        return list(catalog.gpus), {}
    gpus: list[GpuSpec] = []
    counts: dict[str, int | None] = {}
    choices = [n for g in catalog.gpus for n in (g.id, *g.aliases)]
    for i, (name, count) in enumerate(pins.items()):
        try:
            gpu = catalog.gpu(name)
        except UnknownName:
            raise UnknownName("GPU", name, choices, path=f"resources.accelerators[{i}]") from None
        if gpu.id not in counts:
            gpus.append(gpu)
        counts[gpu.id] = count
    return gpus, counts


def _check_names(spec: JobSpec, catalog: Catalog) -> None:
    clouds = sorted({o.cloud for o in catalog.offers})
    for i, cloud in enumerate(spec.resources.clouds or []):
        if cloud.lower() not in {c.lower() for c in clouds}:
            raise UnknownName("cloud", cloud, clouds, path=f"resources.clouds[{i}]")
    regions = sorted({o.region for o in catalog.offers} | {o.zone for o in catalog.offers if o.zone})
    for i, region in enumerate(spec.resources.regions or []):
        if region not in regions:
            raise UnknownName("region", region, regions, path=f"resources.regions[{i}]")


# ----------------------------------------------------------------------------- strategies


def _strategy(**kw: Any) -> Strategy:
    # model_construct: the search builds thousands of these from already-valid values
    return Strategy.model_construct(**kw)


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


def _train_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    memo: Memo, support: StackSupport) -> Outcome:
    assert spec.train is not None
    t = spec.train
    gpu = p.gpu
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
        shardings = [x for x in ("ddp", "fsdp-grad-op", "fsdp")
                     if knob_problem(support, gpu, "train", "sharding", x) is None]
    else:
        shardings = [t.sharding]
    ckpts = [False, True] if t.activation_checkpointing == "auto" else [bool(t.activation_checkpointing)]
    mbs = _micro_batches(t, dp)
    if isinstance(mbs, str):
        return Outcome(None, mbs, "count")

    pc = count_params(model)
    mem_cal, thr_cal = cal.memory, cal.throughput
    headroom = memory_headroom(spec, cal)
    best: tuple[float, Knobs] | None = None
    best_amp: tuple[float, Knobs] | None = None
    smallest: tuple[float, Knobs] | None = None
    tried = 0
    for precision in precisions:
        lighter_mb: dict[bool, int] = {}  # best micro-batch of a lighter sharding, per checkpointing
        for sharding in shardings:
            reached_top = False
            mb_without_ckpt = 0
            for ckpt in ckpts:
                accum1 = 1 if t.global_batch is None else max(1, math.ceil(t.global_batch / (mbs[0] * dp)))
                knobs = Knobs(precision=precision, optimizer=t.optimizer, sharding=sharding, tensor_parallel=tp,
                              pipeline_parallel=pp, gpu_count=p.count, activation_checkpointing=ckpt,
                              micro_batch=mbs[0], grad_accum=accum1, finetune=t.finetune, lora_rank=t.lora_rank)
                tried += 1
                key = (knobs, t.seq_len)
                lines = memo.lines.get(key)
                if lines is None:
                    lines = memo.lines[key] = memory_lines(model, knobs, t.seq_len, mem_cal, pc)
                mb = max_micro_batch(lines, p.count, gpu, mem_cal, mbs, headroom)
                if mb is None:
                    need = max(c for c, _ in lines)
                    if smallest is None or need < smallest[0]:
                        smallest = (need, knobs)
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
                tps = train_step_parts(model, knobs, t.seq_len, gpu, thr_cal, gpus_per_node=p.gpus_per_node,
                                       network_gbps=p.network_gbps, pc=pc, memo=memo.per_token)[0]
                if best is None or tps > best[0]:
                    best = (tps, knobs)
                if precision.startswith("amp") and (best_amp is None or tps > best_amp[0]):
                    best_amp = (tps, knobs)
                if not ckpt and mb == mbs[-1]:
                    reached_top = True
                    break  # checkpointing cannot beat a configuration that already runs the largest micro-batch
            if reached_top:
                break  # heavier sharding only adds communication once replicas already run the largest micro-batch
    if best is None:
        assert smallest is not None
        s0 = _to_strategy(smallest[1], gpu, p)
        m0 = train_memory(model, s0, t.seq_len, gpu, mem_cal, pc, headroom)
        return Outcome(None, _memory_reason(m0, gpu, s0), "memory", tried)
    if best_amp is not None and best_amp[0] >= AMP_PREFERENCE * best[0]:
        best = best_amp
    strategy = _to_strategy(best[1], gpu, p)
    memory = train_memory(model, strategy, t.seq_len, gpu, mem_cal, pc, headroom)
    thr = train_throughput(model, strategy, t.seq_len, gpu, thr_cal, gpus_per_node=p.gpus_per_node,
                           network_gbps=p.network_gbps, pc=pc, memo=memo.per_token)
    hours = t.tokens / thr.tokens_per_s / 3600
    return Outcome(Estimate.model_construct(strategy=strategy, memory=memory, throughput=thr, hours=hours),
                   tried=tried)


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
    return Strategy(gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision=k.precision,
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


def _infer_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    support: StackSupport) -> Outcome:
    assert spec.infer is not None
    inf = spec.infer
    gpu = p.gpu
    problem = degree_problem(support, "infer", "gpus", p.count)
    if problem:
        return Outcome(None, problem, "support")
    if inf.weights == "auto":
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
    pc = count_params(model)
    headroom = memory_headroom(spec, cal)
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
            assert thr.requests_per_s is not None
            hours = inf.requests / thr.requests_per_s / 3600
            est = Estimate.model_construct(strategy=s, memory=m, throughput=thr, hours=hours)
            if best is None or thr.tokens_per_s > best.throughput.tokens_per_s * 1.02:
                best = est
        if best is not None:
            break  # the most accurate weights that fit win; lower precision only when needed
    if best is None:
        assert smallest is not None
        return Outcome(None, _memory_reason(smallest[0], gpu, smallest[1]), "memory", tried)
    return Outcome(best, tried=tried)


def _estimate_placement(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration, support: StackSupport,
                        memo: Memo | None = None) -> Outcome:
    problem = multi_gpu_problem(p.gpu, p.count)
    if problem:
        return Outcome(None, problem, "count")
    problem = gpu_support_problem(support, p.gpu)
    if problem:
        return Outcome(None, problem, "support")
    cal = cal.for_vendor(p.gpu.vendor)
    if spec.task == "train":
        return _train_estimate(spec, model, p, cal, Memo() if memo is None else memo, support)
    return _infer_estimate(spec, model, p, cal, support)


# ----------------------------------------------------------------------------- public API


def estimate(spec: JobSpec, catalog: Catalog, gpu: str, count: int, *, model: ModelConfig | None = None,
             calibration: Calibration | None = None, gpus_per_node: int | None = None,
             network_gbps: float = 100.0) -> Estimate:
    """The estimate for a pinned placement; 'auto' fields resolved as ``plan`` does.

    When nothing fits, the smallest configuration is returned with ``memory.fits = False`` so the
    user sees by how much; a dtype the part lacks raises InvalidInput.
    """
    if count < 1:
        raise InvalidInput(f"count must be at least 1, got {count}", path="count")
    cal = calibration or load_calibration()  # the packaged fitted constants, read at call time
    mdl = resolve_spec_model(spec, catalog, model)
    g = catalog.gpu(gpu)
    p = Placement(g, count, gpus_per_node or min(count, 8), network_gbps)
    out = _estimate_placement(spec, mdl, p, cal, catalog.support)
    if out.estimate is not None:
        return _with_model_warnings(out.estimate, mdl)
    if out.constraint == "dtype":
        raise InvalidInput(out.reason, hint="pin a precision/weights the GPU supports or pick another GPU")
    if out.constraint != "memory":
        raise InvalidInput(out.reason)  # the reason says what to change (the count, the batch...)
    return _with_model_warnings(_smallest_unfitting(spec, mdl, p, cal), mdl)


def _with_model_warnings(est: Estimate, model: ModelConfig) -> Estimate:
    """A model read from a config gpuplan does not model exactly carries its guesses into the answer."""
    return est.model_copy(update={"warnings": [*est.warnings, *model.assumptions]}) if model.assumptions else est


def _smallest_unfitting(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration) -> Estimate:
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
        return Estimate(strategy=s, memory=mem, throughput=thr, hours=t.tokens / thr.tokens_per_s / 3600)
    assert spec.infer is not None
    inf = spec.infer
    weights = inf.weights if inf.weights != "auto" else auto_weights(gpu)[-1]
    s = _strategy(task="infer", gpu=gpu.id, gpu_count=p.count, nodes=p.nodes,
                  tensor_parallel=p.count if p.count <= 8 else 8, weights=weights, batch=inf.batch)
    mem = infer_memory(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.memory,
                       headroom=memory_headroom(spec, cal))
    thr = infer_throughput(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.throughput)
    assert thr.requests_per_s is not None
    return Estimate(strategy=s, memory=mem, throughput=thr, hours=inf.requests / thr.requests_per_s / 3600)


@dataclass
class _Funnel:
    """How many options each constraint removed, in order, for the 'what to relax' message."""

    removed: dict[str, int] = field(default_factory=dict)
    rows: list[dict[str, str]] = field(default_factory=list)

    def reject(self, option: str, reason: str, constraint: str, weight: int = 1) -> None:
        self.rows.append({"option": option, "reason": reason, "constraint": constraint})
        self.removed[constraint] = self.removed.get(constraint, 0) + weight

    @property
    def rejections(self) -> list[Rejection]:
        # one validation call for thousands of rows is much cheaper than one model per row
        return _REJECTIONS.validate_python(self.rows)


_REJECTIONS = TypeAdapter(list[Rejection])


MIN_GPUS_PER_NODE_FOR_MULTI_NODE = 4  # many 1-2 GPU boxes over a 10-25 Gbit/s network: pin the count to get it


def _counts_for(g_per_node: int, pinned: int | None, max_gpus: int) -> list[int]:
    if pinned is not None:
        return [pinned] if pinned <= max_gpus else []
    if g_per_node < MIN_GPUS_PER_NODE_FOR_MULTI_NODE:
        return [g_per_node] if g_per_node <= max_gpus else []
    out = []
    nodes = 1
    while g_per_node * nodes <= max_gpus:
        out.append(g_per_node * nodes)
        nodes *= 2
    return out


def _checkpoint_hours(model: ModelConfig, s: Strategy, cal: Calibration) -> tuple[float, float]:
    """(what one checkpoint stops the loop for, snapshot to durable), in hours."""
    pc = count_params(model)  # cheap; called once per priced candidate
    pb = PRECISION_BYTES.get(s.precision, PRECISION_BYTES["bf16"])
    state = pc.total * (pb.param + 2 * pb.state) if s.finetune == "full" else pc.total * 0.02
    # Checkpoints are written in the background: the loop pays only the snapshot into host memory
    # (the workers keep the interval above twice the write time, so no snapshot waits for a write).
    snapshot_h = state / (cal.cost.checkpoint_snapshot_gbps * 1e9) / 3600
    durable_h = state / (cal.cost.checkpoint_write_gbps * 1e9) / 3600
    return max(cal.cost.min_checkpoint_h, snapshot_h), durable_h


def _markets(offer: Offer, spot_mode: str) -> list[tuple[str, float | None]]:
    if offer.cloud == "local":
        return [("local", 0.0)]
    out: list[tuple[str, float | None]] = []
    if spot_mode != "never":
        out.append(("spot", offer.spot_usd_per_h))
    if spot_mode != "always":
        out.append(("on-demand", offer.on_demand_usd_per_h))
    return out


def plan(spec: JobSpec, catalog: Catalog, *, objective: Objective = "cheapest", calibration: Calibration | None = None,
         model: ModelConfig | None = None, today: date | None = None,
         hazard_per_h: dict[str, float] | None = None) -> Plan:
    """Every way to run ``spec`` on ``catalog``, ranked by ``objective``; raises NoFeasiblePlan if none.

    ``hazard_per_h`` overrides the calibration's spot preemption rates per cloud (e.g. from traces).
    ``calibration`` defaults to the packaged fitted constants (planner/calibration.json).
    """
    if objective not in ("cheapest", "fastest"):
        raise InvalidInput(f"objective must be 'cheapest' or 'fastest', got {objective!r}", path="objective")
    cal = calibration or load_calibration()  # the packaged fitted constants, read at call time
    mdl = resolve_spec_model(spec, catalog, model)
    _check_names(spec, catalog)
    gpus, pinned_counts = _allowed_gpus(spec, catalog)
    res = spec.resources
    clouds = {c.lower() for c in res.clouds} if res.clouds else None
    regions = set(res.regions) if res.regions else None
    hazards = {**cal.cost.spot_hazard_per_h, **(hazard_per_h or {})}
    funnel = _Funnel()
    allowed_ids = {g.id for g in gpus}
    for g in catalog.gpus:
        if g.id not in allowed_ids and catalog.offers_for(g.id):
            funnel.reject(f"{g.id} (any count)", f"{g.id} is not in resources.accelerators", "allow-list", 0)

    outcomes: dict[tuple[str, int, int, float], Outcome] = {}
    memo = Memo()
    candidates: list[Candidate] = []
    priced: list[Candidate] = []  # fit in memory, before deadline/budget
    for gpu in gpus:
        offers = catalog.offers_for(gpu.id)
        kept: list[Offer] = []
        for o in offers:
            if clouds is not None and o.cloud.lower() not in clouds:
                continue
            if regions is not None and o.region not in regions and (o.zone or "") not in regions:
                continue
            kept.append(o)
        if not kept:
            why = "no offer in the catalog" if not offers else "no offer in the allowed clouds/regions"
            funnel.reject(f"{gpu.id} (any count)", f"{why} for {gpu.id}", "offers")
            continue
        for o in kept:
            for count in _counts_for(o.gpu_count, pinned_counts.get(gpu.id), res.max_gpus):
                multi = count > o.gpu_count
                key = (gpu.id, count, o.gpu_count if multi else 0, o.network_gbps if multi else 0.0)
                p = Placement(gpu, count, o.gpu_count if multi else max(count, o.gpu_count), o.network_gbps)
                if key not in outcomes:
                    outcomes[key] = _estimate_placement(spec, mdl, p, cal, catalog.support, memo)
                    if outcomes[key].estimate is None:
                        funnel.reject(p.label(), outcomes[key].reason, outcomes[key].constraint)
                out = outcomes[key]
                if out.estimate is None:
                    continue
                if not out.label:
                    out.label = out.estimate.strategy.label()
                    out.checkpoint_h, out.durable_h = _checkpoint_hours(mdl, out.estimate.strategy, cal)
                nodes = math.ceil(count / o.gpu_count)
                for market, price in _markets(o, res.spot):
                    if price is None:
                        if res.spot == "always" and market == "spot":
                            funnel.reject(f"{out.label} on {o.cloud} {o.instance_type} {o.region} {market}",
                                          f"{o.cloud} {o.instance_type} has no spot price", "price")
                        continue
                    cost = _cost(out.estimate, (out.checkpoint_h, out.durable_h), market, price * nodes, nodes,
                                 o.cloud, hazards, res.deadline, cal)
                    cand = Candidate.model_construct(estimate=out.estimate, offer=o, cost=cost, nodes=nodes,
                                                     pareto=False)
                    priced.append(cand)
                    problem = _deadline_problem(cost, res.deadline, cal)
                    if problem:
                        funnel.reject(f"{out.label} on {o.cloud} {o.instance_type} {o.region} {market}", problem,
                                      "deadline")
                        continue
                    if res.budget_usd is not None and cost.usd > res.budget_usd:
                        funnel.reject(f"{out.label} on {o.cloud} {o.instance_type} {o.region} {market}",
                                      f"costs ${cost.usd:,.0f} > budget ${res.budget_usd:,.0f}", "budget")
                        continue
                    candidates.append(cand)
    if not candidates:
        message, hint = _explain(spec, funnel, priced, mdl, cal)
        raise NoFeasiblePlan(message, hint=hint)
    ranked = _rank(candidates, objective)
    warnings: list[str] = list(mdl.assumptions)
    if today is not None:
        stale = [o for o in catalog.stale_offers(today) if o in {c.offer for c in ranked[:10]}]
        if stale:
            oldest = min(o.source.as_of for o in stale)
            warnings.append(f"{len(stale)} offer price(s) used here are older than 30 days (oldest {oldest}); "
                            "refresh with `gpuplan catalog refresh aws`")
    return Plan(job=spec.name, objective=objective, chosen=ranked[0], candidates=ranked,
                rejections=funnel.rejections, warnings=warnings)


def _cost(est: Estimate, checkpoint_h: tuple[float, float], market: str, usd_per_h: float, nodes: int, cloud: str,
          hazards: dict[str, float], deadline: float | None, cal: Calibration) -> CostEstimate:
    if market == "spot":
        hazard = hazards.get(cloud, hazards.get("default", 0.1)) * nodes
        return spot_cost(est.hours, usd_per_h, hazard_per_h=hazard, checkpoint_h=checkpoint_h[0],
                         durable_h=checkpoint_h[1], restart_h=cal.cost.restart_h, deadline_h=deadline)
    return on_demand_cost(est.hours, usd_per_h, deadline, market="local" if market == "local" else "on-demand")


def _deadline_problem(cost: CostEstimate, deadline: float | None, cal: Calibration) -> str | None:
    if deadline is None:
        return None
    if cost.market == "spot":
        prob = cost.deadline_probability or 0.0
        if prob < cal.cost.deadline_confidence:
            return (f"spot: {prob:.0%} chance to finish within the {deadline:g} h deadline "
                    f"(< {cal.cost.deadline_confidence:.0%}; expected {cost.hours:.1f} h)")
        return None
    if cost.hours > deadline:
        return f"takes {cost.hours:,.1f} h > deadline {deadline:g} h"
    return None


def _rank(cands: list[Candidate], objective: Objective) -> list[Candidate]:
    def key(c: Candidate) -> tuple[float, float]:
        return (c.cost.usd, c.cost.hours) if objective == "cheapest" else (c.cost.hours, c.cost.usd)

    ordered = sorted(cands, key=key)
    # Pareto front on (usd, hours): walking by cost, a candidate is on it if faster than all cheaper ones
    front: set[int] = set()
    best_hours = math.inf
    for j in sorted(range(len(ordered)), key=lambda j: (ordered[j].cost.usd, ordered[j].cost.hours)):
        if ordered[j].cost.hours < best_hours - 1e-12:
            front.add(j)
            best_hours = ordered[j].cost.hours
    return [c.model_copy(update={"pareto": True}) if i in front else c for i, c in enumerate(ordered)]


def _explain(spec: JobSpec, funnel: _Funnel, priced: list[Candidate], model: ModelConfig,
             cal: Calibration) -> tuple[str, str]:
    """(message, hint) naming the constraint that removed the last candidates and what to relax."""
    res = spec.resources
    if priced:
        on_time = [c for c in priced if _deadline_problem(c.cost, res.deadline, cal) is None]
        if on_time and res.budget_usd is not None:
            cheapest = min(on_time, key=lambda c: c.cost.usd)
            n = funnel.removed.get("budget", 0)
            return (f"budget ${res.budget_usd:,.0f} removed the last {n} candidates; the cheapest that meets the "
                    f"deadline costs ${cheapest.cost.usd:,.0f} ({cheapest.estimate.strategy.label()} on "
                    f"{cheapest.offer.cloud} {cheapest.offer.instance_type} {cheapest.cost.market})",
                    f"raise budget_usd to at least ${math.ceil(cheapest.cost.usd):,} or relax the deadline")
        fastest = min(priced, key=lambda c: c.cost.hours)
        n = funnel.removed.get("deadline", 0)
        return (f"deadline {res.deadline:g} h removed the last {n} candidates; the fastest takes "
                f"{fastest.cost.hours:.1f} h ({fastest.estimate.strategy.label()} on {fastest.offer.cloud} "
                f"{fastest.offer.instance_type}, ${fastest.cost.usd:,.0f})",
                f"relax resources.deadline to at least {math.ceil(fastest.cost.hours)}h, allow more GPUs "
                f"(resources.max_gpus={res.max_gpus}) or more accelerator types")
    mem = [r for r in funnel.rejections if r.constraint == "memory"]
    if mem:
        hint = ("allow bigger or more GPUs (resources.accelerators / max_gpus), or reduce memory: "
                + ("lora/qlora, activation_checkpointing, fsdp sharding, a smaller micro_batch or seq_len"
                   if spec.task == "train" else "int8/int4 weights, a smaller batch or context"))
        return (f"memory removed the last {len(mem)} placements of {model.id}; e.g. {mem[0].option}: {mem[0].reason}",
                hint)
    if funnel.rejections:
        # a GPU with no offer says little about why the offered ones were refused
        telling = [r for r in funnel.rejections if r.constraint not in ("offers", "allow-list")]
        last = (telling or funnel.rejections)[-1]
        return (f"{last.constraint} removed the last candidates: {last.option}: {last.reason}",
                "relax resources.accelerators / clouds / regions / spot or the pinned train/infer fields")
    return ("no offer in the catalog matches the job's resources",
            "check resources.accelerators, clouds and regions against `gpuplan catalog offers`")


def summarize_rejections(rejections: Iterable[Rejection]) -> list[tuple[str, int, str]]:
    """(constraint, count, one example 'option: reason') for a short table."""
    groups: dict[str, list[Rejection]] = {}
    for r in rejections:
        groups.setdefault(r.constraint, []).append(r)
    return [(k, len(v), f"{v[0].option}: {v[0].reason}") for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
