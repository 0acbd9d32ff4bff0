"""The planner's estimate of one placement: whether the workers can run anything there, then the best training
or inference strategy on it (planner.placement, planner.placement_infer). ``estimate`` is the public entry for a
pinned placement; planner.search prices and ranks the placements ``plan`` enumerates."""

from __future__ import annotations

from catalog.loader import Catalog
from catalog.params import count_params
from catalog.schema import ModelConfig, StackSupport
from errors import InvalidInput
from planner.calibration import Calibration
from planner.capability import auto_precisions, auto_weights, gpu_support_problem, multi_gpu_problem
from planner.memory import infer_memory
from planner.memory_train import train_memory
from planner.placement import Memo, Placement, PlacementOutcome, train_estimate, train_start_s
from planner.placement_infer import infer_estimate, infer_estimate_of, stored_weights_ladder
from planner.resolve import memory_headroom, resolve_spec_model
from planner.spec import JobSpec
from planner.strategies import AUTO, NO_SHARDING, most_sharded
from planner.throughput import infer_throughput
from planner.throughput_train import train_throughput
from planner.types import Estimate, Strategy, construct


def estimate_placement(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration, support: StackSupport,
                        memo: Memo | None = None) -> PlacementOutcome:
    problem = multi_gpu_problem(p.gpu, p.count)
    if problem:
        return PlacementOutcome(None, problem, "count")
    problem = gpu_support_problem(support, p.gpu)
    if problem:
        return PlacementOutcome(None, problem, "support")
    cal = cal.for_vendor(p.gpu.vendor)
    memo = Memo() if memo is None else memo
    if spec.task == "train":
        return train_estimate(spec, model, p, cal, memo, support)
    return infer_estimate(spec, model, p, cal, support, memo)


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
        "(load_user_calibration(home) for a `gpuplan calibrate` refit)")


def _with_model_warnings(est: Estimate, model: ModelConfig) -> Estimate:
    """A model read from a config gpuplan does not model exactly carries its guesses into the answer."""
    return est.model_copy(update={"warnings": [*est.warnings, *model.assumptions]}) if model.assumptions else est


def _smallest_unfitting(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                        support: StackSupport) -> Estimate:
    """The estimate of the least memory-hungry strategy (it does not fit)."""
    cal = cal.for_vendor(p.gpu.vendor)
    if spec.task == "train":
        return _smallest_train(spec, model, p, cal)
    return _smallest_infer(spec, model, p, cal, support)


def _smallest_train(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration) -> Estimate:
    """The training strategy that needs the least memory: the lowest precision, the most sharded kind,
    checkpointing, the smallest micro-batch."""
    assert spec.train is not None
    t = spec.train
    gpu = p.gpu
    precision = t.precision if t.precision != AUTO else auto_precisions(gpu, t.finetune)[-1]
    tp = t.tensor_parallel if isinstance(t.tensor_parallel, int) else 1
    pp = t.pipeline_parallel if isinstance(t.pipeline_parallel, int) else 1
    dp = max(1, p.count // (tp * pp))
    sharding = NO_SHARDING if dp == 1 else (most_sharded() if t.sharding == AUTO else t.sharding)
    ckpt = True if t.activation_checkpointing == "auto" else bool(t.activation_checkpointing)
    s = construct(Strategy, gpu=gpu.id, gpu_count=p.count, nodes=p.nodes, precision=precision,
                  optimizer=t.optimizer, sharding=sharding, tensor_parallel=tp, pipeline_parallel=pp,
                  activation_checkpointing=ckpt, micro_batch=t.micro_batch or 1, finetune=t.finetune,
                  lora_rank=t.lora_rank)
    mem = train_memory(model, s, t.seq_len, gpu, cal.memory, headroom=memory_headroom(spec, cal))
    thr = train_throughput(model, s, t.seq_len, gpu, cal.throughput, gpus_per_node=p.gpus_per_node,
                           network_gbps=p.network_gbps)
    start = train_start_s(count_params(model), s, cal)
    return Estimate(strategy=s, memory=mem, throughput=thr, hours=(t.tokens / thr.tokens_per_s + start) / 3600,
                    start_s=start)


def _smallest_infer(spec: JobSpec, model: ModelConfig, p: Placement, cal: Calibration,
                    support: StackSupport) -> Estimate:
    """The inference strategy that needs the least memory: the lowest-precision weights, the widest tensor
    parallelism of one node."""
    assert spec.infer is not None
    inf = spec.infer
    gpu = p.gpu
    weights = inf.weights if inf.weights != "auto" else auto_weights(gpu)[-1]
    notes: list[str] = []
    if model.quantization is not None:
        stored = stored_weights_ladder(model, inf.weights, gpu, support)
        if not isinstance(stored, PlacementOutcome):  # a refusal was raised before (constraint support or dtype)
            weights, notes = stored[0][-1], [stored[1]] if stored[1] else []
    s = construct(Strategy, task="infer", gpu=gpu.id, gpu_count=p.count, nodes=p.nodes,
                  tensor_parallel=p.count if p.count <= 8 else 8, weights=weights, batch=inf.batch)
    mem = infer_memory(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.memory,
                       headroom=memory_headroom(spec, cal))
    thr = infer_throughput(model, s, inf.prompt_tokens, inf.output_tokens, gpu, cal.throughput)
    return infer_estimate_of(s, mem, thr, inf, cal, notes)
