"""Values the planner returns. Workers run a :class:`Strategy`; the scheduler stores a :class:`Plan`.

All are frozen pydantic models so they serialise to the ``--json`` and REST contracts unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from catalog.schema import Offer
from planner.strategies import FINETUNES, SHARDINGS, FinetuneName, PrecisionName, ShardingName

ResolvedPrecision = PrecisionName  # a kind of planner.strategies
ResolvedSharding = ShardingName
WeightDtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4"]
Market = Literal["spot", "on-demand", "local"]


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


V = TypeVar("V", bound=_Value)
_IMMUTABLE = (type(None), bool, int, float, str, tuple, frozenset)


@dataclass(frozen=True)
class _Fields:
    """A _Value class's fields for construct(): every field in order with its default (None where required or
    made by a factory), the required names, and the factories."""

    template: dict[str, object]
    required: frozenset[str]
    factories: tuple[tuple[str, Callable[[], object]], ...]


_FIELDS: dict[type[_Value], _Fields] = {}


def _fields_of(cls: type[_Value]) -> _Fields:
    template: dict[str, object] = {}
    required: set[str] = set()
    factories: list[tuple[str, Callable[[], object]]] = []
    for name, f in cls.model_fields.items():
        if f.alias not in (None, name) or f.validation_alias is not None:
            raise TypeError(f"{cls.__name__}.{name} has an alias; construct() does not resolve aliases")
        template[name] = None
        if f.is_required():
            required.add(name)
        elif f.default_factory is not None:
            factories.append((name, f.default_factory))  # type: ignore[arg-type]  # no factory takes data here
        elif isinstance(f.default, _IMMUTABLE):
            template[name] = f.default
        else:
            raise TypeError(f"{cls.__name__}.{name}: a mutable default would be shared; use a default_factory")
    _FIELDS[cls] = out = _Fields(template, frozenset(required), tuple(factories))
    return out


def construct(cls: type[V], **values: Any) -> V:
    """The object ``cls.model_construct(**values)`` builds (same fields in the same order, defaults and fields-set;
    no validation) at a fraction of its cost: the search builds thousands of planner values per plan() from values
    already computed from validated inputs, and pydantic's model_construct resolves aliases and inspects every
    field's default on each call. Every required field must be given; unknown names are refused."""
    spec = _FIELDS.get(cls) or _fields_of(cls)
    if not spec.required <= values.keys() or not values.keys() <= spec.template.keys():
        missing = sorted(spec.required - values.keys())
        unknown = sorted(values.keys() - spec.template.keys())
        raise TypeError(f"{cls.__name__}: missing {missing}, unknown {unknown}")
    fields = dict(spec.template)
    fields.update(values)
    for name, factory in spec.factories:
        if name not in values:
            fields[name] = factory()
    obj = cls.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)
    object.__setattr__(obj, "__pydantic_fields_set__", set(values))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


class Strategy(_Value):
    """How to run the job on a placement: every 'auto' of the JobSpec resolved."""

    task: Literal["train", "infer"] = "train"
    gpu: str = Field(description="GpuSpec.id (or 'cpu' for the local CPU)")
    gpu_count: int = Field(ge=1)
    nodes: int = Field(default=1, ge=1)
    # training
    precision: ResolvedPrecision = "bf16"
    optimizer: str = "adamw"
    sharding: ResolvedSharding = "none"
    tensor_parallel: int = Field(default=1, ge=1)
    pipeline_parallel: int = Field(default=1, ge=1)
    activation_checkpointing: bool = False
    micro_batch: int = Field(default=1, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    finetune: FinetuneName = "full"
    lora_rank: int = 16
    # inference
    weights: WeightDtype = "bf16"
    batch: int = Field(default=1, ge=1)

    @property
    def data_parallel(self) -> int:
        return max(1, self.gpu_count // (self.tensor_parallel * self.pipeline_parallel))

    def label(self) -> str:
        """Short human description, e.g. '8xH100-SXM fsdp bf16 ckpt mb=2'."""
        parts = [f"{self.gpu_count}x{self.gpu}"]
        if self.task == "infer":
            parts += [f"tp={self.tensor_parallel}", f"w={self.weights}", f"batch={self.batch}"]
            return " ".join(parts)
        sharding = SHARDINGS.get(self.sharding)
        if sharding is None or sharding.data_parallel:
            parts.append(self.sharding)
        if self.tensor_parallel > 1:
            parts.append(f"tp={self.tensor_parallel}")
        if self.pipeline_parallel > 1:
            parts.append(f"pp={self.pipeline_parallel}")
        parts.append(self.precision if self.weights in ("bf16", "fp32") else f"w={self.weights}")
        if self.activation_checkpointing:
            parts.append("ckpt")
        finetune = FINETUNES.get(self.finetune)
        if finetune is None or finetune.adapters:
            parts.append(self.finetune)
        parts.append(f"mb={self.micro_batch}")
        return " ".join(parts)


class MemoryEstimate(_Value):
    """Per GPU, for the most loaded rank; each field's description says what it counts."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    total_bytes: int = Field(description="reserved + CUDA context and anything outside the allocator")
    usable_bytes: int = Field(description="what the GPU offers the job")
    fits: bool
    breakdown: dict[str, int] = Field(description="component -> bytes at the peak")
    required_bytes: int = Field(
        default=0, description="need under memory pressure (allocated + slack + context); fits compares it"
    )
    peak_moment: str = Field(default="", description="when the peak happens, e.g. 'backward start', 'optimizer step'")
    headroom: float = Field(default=0.0, description="fraction of usable memory the plan must leave free")
    limit_bytes: int = Field(default=0, description="usable x (1 - headroom): fits is required_bytes <= this")


class ThroughputEstimate(_Value):
    tokens_per_s: float = Field(description="whole placement, steady state")
    step_time_s: float = 0.0
    mfu: float = 0.0
    # inference
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    decoder: str | None = Field(default=None, description="inference: the workers' decoder, graph or generate")
    moe_kernel: str | None = Field(
        default=None, description="inference of a mixture of experts: its decode kernel, batched_mm or grouped_mm")
    warmup_s: float = Field(
        default=0.0, ge=0.0, description="inference: one-time seconds per worker before the first batch runs at "
        "speed (the compiled decoder's capture; in the job's hours)")
    breakdown_s: dict[str, float] = Field(default_factory=dict, description="compute/comm/other per step")


class Estimate(_Value):
    strategy: Strategy
    memory: MemoryEstimate
    throughput: ThroughputEstimate
    hours: float = Field(description="wall-clock hours to finish the job's tokens or requests, its start included")
    start_s: float = Field(default=0.0, ge=0.0, description="of hours, the one-time seconds beyond the steady work: "
                           "process, model build or load, first step, checkpoint buffer and last write (training); "
                           "process, load and the compiled decoder's capture (inference)")
    warnings: list[str] = Field(default_factory=list, description="what the estimate had to assume")


class CostEstimate(_Value):
    market: Market
    usd_per_h: float
    hours: float = Field(description="expected wall-clock hours including preemption overhead")
    usd: float = Field(description="expected total cost")
    preemption_overhead_h: float = 0.0
    checkpoint_interval_h: float | None = None
    deadline_probability: float | None = Field(default=None, ge=0, le=1)
    mean_time_to_preemption_h: float | None = Field(
        default=None, description="spot: the MTTP this cost was priced at (the workers' interval uses the same)")


class Candidate(_Value):
    estimate: Estimate
    offer: Offer
    cost: CostEstimate
    nodes: int = 1
    pareto: bool = False

    @property
    def key(self) -> str:
        return f"{self.offer.cloud}/{self.offer.region}/{self.offer.instance_type}/{self.cost.market}"


class Rejection(_Value):
    """An option that was considered and why it was not chosen."""

    option: str = Field(description="what was considered, e.g. '1xH100-SXM ddp bf16 on aws p5.48xlarge'")
    reason: str = Field(description="e.g. 'needs 97.1 GiB > 79.1 GiB usable on H100-80GB'")
    constraint: str = Field(description="memory | deadline | budget | dtype | allow-list | count | price | ...")


class Plan(_Value):
    job: str
    objective: Literal["cheapest", "fastest"]
    chosen: Candidate | None
    candidates: list[Candidate] = Field(description="ranked, best first")
    rejections: list[Rejection]
    warnings: list[str] = Field(default_factory=list)
