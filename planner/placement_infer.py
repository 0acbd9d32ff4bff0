"""One inference placement: the most accurate weights that fit and the fastest tensor-parallel degree for them,
with its memory, throughput and hours, or why none fits (planner.placement holds the placement's values and
the training search)."""

from __future__ import annotations

from catalog.schema import GpuSpec, ModelConfig, StackSupport
from planner.calibration import Calibration
from planner.capability import auto_weights, degree_problem, knob_problem, weights_problem
from planner.memory import infer_memory
from planner.placement import Memo, Placement, PlacementOutcome, memory_reason
from planner.resolve import memory_headroom
from planner.spec import InferSpec, JobSpec
from planner.throughput import infer_throughput
from planner.types import Estimate, MemoryEstimate, Strategy, ThroughputEstimate, construct


def infer_start_s(thr: ThroughputEstimate, cal: Calibration) -> float:
    """An inference job's one-time seconds: the measured fixed start (process, load) and the decoder's capture."""
    return cal.cost.infer_start_s + thr.warmup_s


def infer_estimate_of(s: Strategy, m: MemoryEstimate, thr: ThroughputEstimate, inf: InferSpec, cal: Calibration,
                      warnings: list[str]) -> Estimate:
    """An inference estimate whose hours are its requests at the estimated rate plus its start (``infer_start_s``),
    one formula for the searched and the pinned estimate."""
    assert thr.requests_per_s is not None
    start = infer_start_s(thr, cal)
    return construct(Estimate, strategy=s, memory=m, throughput=thr, hours=(inf.requests / thr.requests_per_s + start)
                     / 3600, start_s=start, warnings=warnings)


def infer_estimate(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                   support: StackSupport, memo: Memo) -> PlacementOutcome:
    assert spec.infer is not None
    inf = spec.infer
    gpu = p.gpu
    problem = degree_problem(support, "infer", "gpus", p.count)
    if problem:
        return PlacementOutcome(None, problem, "support")
    weights = _weights_ladder(model, inf.weights, gpu, support)
    if isinstance(weights, PlacementOutcome):
        return weights
    ladder, note = weights
    tps = _tensor_parallel_degrees(spec, model, p, support)
    if isinstance(tps, PlacementOutcome):
        return tps
    best: Estimate | None = None
    smallest: tuple[MemoryEstimate, Strategy] | None = None
    tried = 0
    pc = memo.count(model)
    headroom = memory_headroom(spec, cal)
    warnings = [note] if note else []
    base = Strategy(task="infer", gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision="bf16", batch=inf.batch)
    for weights_dtype in ladder:
        for tp in tps:
            s = base.model_copy(update={"tensor_parallel": tp, "weights": weights_dtype})
            m = infer_memory(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.memory, pc, headroom)
            tried += 1
            if not m.fits:
                if smallest is None or m.required_bytes < smallest[0].required_bytes:
                    smallest = (m, s)
                continue
            thr = infer_throughput(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.throughput, pc)
            est = infer_estimate_of(s, m, thr, inf, cal, list(warnings))
            if best is None or thr.tokens_per_s > best.throughput.tokens_per_s * 1.02:
                best = est
        if best is not None:
            break  # the most accurate weights that fit win; lower precision only when needed
    if best is None:
        assert smallest is not None
        return PlacementOutcome(None, memory_reason(smallest[0], gpu, smallest[1]), "memory", tried)
    return PlacementOutcome(best, tried=tried)


def _weights_ladder(model: ModelConfig, weights: str, gpu: GpuSpec,
                    support: StackSupport) -> tuple[list[str], str | None] | PlacementOutcome:
    """The weights to try on ``gpu``, most accurate first, that the workers run there, and the warning a checkpoint
    stored quantized carries; or why none can run."""
    note: str | None = None
    if model.quantization is not None:
        stored = stored_weights_ladder(model, weights, gpu, support)
        if isinstance(stored, PlacementOutcome):
            return stored
        ladder, note = stored
    elif weights == "auto":
        ladder = auto_weights(gpu)
    else:
        problem = weights_problem(gpu, weights)
        if problem:
            return PlacementOutcome(None, problem, "dtype")
        ladder = [weights]
    runnable = [w for w in ladder if knob_problem(support, gpu, "infer", "weights", w) is None]
    if not runnable:
        return PlacementOutcome(None, knob_problem(support, gpu, "infer", "weights", ladder[0]) or "", "support")
    return runnable, note


def _tensor_parallel_degrees(spec: JobSpec, model: ModelConfig, p: Placement,
                             support: StackSupport) -> list[int] | PlacementOutcome:
    """The tensor-parallel degrees to try: the spec's pinned one, else those of one node that split the heads and
    the workers run; or why the pinned one cannot run."""
    t = spec.train
    pinned_tp = t.tensor_parallel if t is not None and isinstance(t.tensor_parallel, int) else None
    if pinned_tp is not None and pinned_tp > 1:
        problem = degree_problem(support, "infer", "tensor_parallel", pinned_tp)
        if problem:
            return PlacementOutcome(None, problem, "support")
        return [pinned_tp]
    return sorted({x for x in (1, 2, 4, 8, p.count) if x <= min(p.count, p.gpus_per_node)
                   and p.count % x == 0 and model.num_attention_heads % x == 0
                   and degree_problem(support, "infer", "tensor_parallel", x) is None})


def stored_weights_ladder(model: ModelConfig, weights: str, gpu: GpuSpec,
                          support: StackSupport) -> tuple[list[str], str | None] | PlacementOutcome:
    """The weights to plan a checkpoint stored quantized (ModelConfig.quantization) with on ``gpu``, and the
    warning when they are not its own format: its format where the workers' transformers keeps it (auto or
    pinned), else the 16-bit dtype transformers dequantizes it to on load (auto, or bf16/fp16 pinned). A pinned
    format the GPU cannot keep is refused with the platform's reason."""
    q = model.quantization
    assert q is not None
    method = q.method
    native = knob_problem(support, gpu, "infer", "weights", method)
    if weights == method:
        return PlacementOutcome(None, f"{model.id}: {native}", "support") if native else ([method], None)
    if weights == "auto" and native is None:
        return [method], None
    if weights == "auto":
        dequantized = auto_weights(gpu)[0]
        return [dequantized], (f"{model.id} on {gpu.id}: its {method.upper()} experts are planned dequantized to "
                               f"{dequantized} ({native})")
    problem = weights_problem(gpu, weights)
    if problem:
        return PlacementOutcome(None, problem, "dtype")
    return [weights], (f"{model.id}: weights {weights} pinned, so transformers dequantizes its {method.upper()} "
                       f"experts on load (Mxfp4Config(dequantize=True)) and the plan counts them at {weights}")
