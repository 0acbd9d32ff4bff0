"""What each sharding, precision and fine-tuning kind means: one registry that the spec, the planner's memory and
speed models, the capability table and the workers read, so none of them tests a kind's name.

Each kind is a typed value whose predicates answer what the code asks of it (does it shard the parameters,
gather them again for backward, keep an fp32 master copy...). Adding a kind is one entry here; whether the
reference workers run it is the catalog's support record (catalog/data/support.yaml), which the planner offers
from and the workers refuse by, so a kind the workers have no code path for is planned nowhere and refused with
the record's reason.

These are definitions the code interprets, not measurements, so they are typed values in this module rather
than a data file: a kind's predicates mean something only to the branches that read them. Validated at import
(``_check``).

The registries are ordered: sharding kinds from the least to the most memory they save (the search tries lighter
options first, and a heavier one only where it buys a larger micro-batch), the others in the order a spec lists
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, WithJsonSchema

from errors import InvalidInput

AUTO = "auto"  # a spec's "let the planner choose", for every kind below
NO_SHARDING = "none"  # the sharding of a run with one data-parallel rank (a plan's, never a spec's)

# ----------------------------------------------------------------------------- sharding


@dataclass(frozen=True)
class ShardingKind:
    """How the data-parallel ranks split the training state. Every predicate holds only with more than one
    data-parallel rank; with one there is nothing to split."""

    name: str
    data_parallel: bool  # runs over data-parallel ranks ('none': one replica, nothing to shard or reduce)
    shards_parameters: bool  # FSDP2: each rank keeps its share of the weights between steps, gathered to compute
    shards_gradients: bool  # each rank keeps its share of the gradients (reduce-scattered, not all-reduced)
    shards_optimizer_state: bool  # each rank keeps and steps its share of the optimizer states
    reshards_after_forward: bool  # the gathered weights are freed after forward: gathered again for backward
    gradient_buckets: bool  # DDP's all-reduce of a flat bucket copy of every gradient, overlapped with backward
    allocator_row: str  # the calibration's reserved-overhead row its allocator behaves like (with >1 rank)

    def gathers_per_step(self) -> int:
        """All-gathers of each layer's weights in one micro-step's forward and backward (recompute aside)."""
        if not self.shards_parameters:
            return 0
        return 2 if self.reshards_after_forward else 1

    def regathers_for_recompute(self, checkpointing: bool) -> bool:
        """Whether activation checkpointing's recompute gathers the freed weights once more."""
        return checkpointing and self.shards_parameters and self.reshards_after_forward

    def collectives_per_layer(self, checkpointing: bool) -> int:
        """Collectives per layer of one micro-step: the gathers and one reduce-scatter of the gradients."""
        if not self.shards_parameters:
            return 0
        return self.gathers_per_step() + int(self.regathers_for_recompute(checkpointing)) + 1


SHARDINGS: dict[str, ShardingKind] = {k.name: k for k in (
    ShardingKind("none", data_parallel=False, shards_parameters=False, shards_gradients=False,
                 shards_optimizer_state=False, reshards_after_forward=False, gradient_buckets=False,
                 allocator_row="single"),
    ShardingKind("ddp", data_parallel=True, shards_parameters=False, shards_gradients=False,
                 shards_optimizer_state=False, reshards_after_forward=False, gradient_buckets=True,
                 allocator_row="ddp"),
    # ZeRO-1: DDP whose ranks each step a share of the optimizer states
    ShardingKind("zero1", data_parallel=True, shards_parameters=False, shards_gradients=False,
                 shards_optimizer_state=True, reshards_after_forward=False, gradient_buckets=True,
                 allocator_row="ddp"),
    # FSDP2 with reshard_after_forward=False (ZeRO-2 like): every layer stays gathered from forward to backward
    ShardingKind("fsdp-grad-op", data_parallel=True, shards_parameters=True, shards_gradients=True,
                 shards_optimizer_state=True, reshards_after_forward=False, gradient_buckets=False,
                 allocator_row="fsdp-grad-op"),
    ShardingKind("fsdp", data_parallel=True, shards_parameters=True, shards_gradients=True,
                 shards_optimizer_state=True, reshards_after_forward=True, gradient_buckets=False,
                 allocator_row="fsdp"),
)}

# ----------------------------------------------------------------------------- precision

Dtype = Literal["fp32", "bf16", "fp16", "fp8"]


@dataclass(frozen=True)
class PrecisionBytes:
    param: int  # stored parameters
    grad: int
    state: int  # optimizer state element (AdamW/SGD follow the param dtype)
    compute: int  # matmul outputs (and FSDP2's gathered parameters)
    residual: int  # residual stream / norm inputs
    autocast: bool  # autocast keeps a low-precision copy of every linear weight


@dataclass(frozen=True)
class PrecisionKind:
    """A training precision: the bytes the memory model counts, the dtypes the workers build and the part
    needs, and what its weights' updates go through."""

    name: str
    bytes: PrecisionBytes
    compute_dtype: Dtype  # what its matmuls run in: the units the part needs, the peak it runs at
    weights_dtype: Literal["fp32", "bf16"]  # what the trained weights are kept in
    numerics: str  # for the plan's table and --json: what the weights' updates go through
    autocast_dtype: Dtype | None = None  # torch.autocast's dtype (mixed precision over fp32 master weights)
    fsdp_casts: bool = False  # under FSDP2 its MixedPrecisionPolicy casts the weights (and reduces in fp32)
    loss_scaling: bool = False  # fp16's narrow range: the loss is scaled (torch.amp.GradScaler)
    float8_matmuls: bool = False  # torchao converts the linear layers to fp8 training (the whole model per rank)
    stochastic_rounding: bool = False  # its AdamW step rounds updates into bf16 weights stochastically
    prices_as: str = ""  # the precision whose dtypes, kernels and calibration it shares ('': its own)
    fsdp_activations: str = ""  # the precision the planner counts activations at under FSDP2 ('': its own)

    @property
    def mixed(self) -> bool:
        """Low-precision matmuls over fp32 master weights (autocast, or FSDP2's policy in its place)."""
        return self.autocast_dtype is not None

    @property
    def sixteen_bit_compute(self) -> bool:
        """Matmuls in bf16 or fp16: what QLoRA's 4-bit base dequantizes into."""
        return self.compute_dtype in ("bf16", "fp16")

    @property
    def storage(self) -> str:
        """The precision this one prices its memory and compute as (``bf16-plain`` is ``bf16``)."""
        return self.prices_as or self.name

    @property
    def sharded_activations(self) -> str:
        """The precision activations run at when FSDP2 shards the parameters: its policy casts the weights to
        bf16 instead of autocast, so mixed precision's fp32 residual stream is bf16 there."""
        return self.fsdp_activations or self.name


_FP32 = PrecisionBytes(4, 4, 4, 4, 4, False)
_AMP = PrecisionBytes(4, 4, 4, 2, 4, True)
_BF16 = PrecisionBytes(2, 2, 2, 2, 2, False)  # stochastic rounding keeps no state (planner/numerics.py)

PRECISIONS: dict[str, PrecisionKind] = {k.name: k for k in (
    PrecisionKind("fp32", _FP32, "fp32", "fp32", "fp32"),
    PrecisionKind("amp-bf16", _AMP, "bf16", "fp32", "fp32 master", autocast_dtype="bf16", fsdp_casts=True,
                  fsdp_activations="bf16"),
    PrecisionKind("amp-fp16", _AMP, "fp16", "fp32", "fp32 master", autocast_dtype="fp16", loss_scaling=True,
                  fsdp_activations="bf16"),
    PrecisionKind("bf16", _BF16, "bf16", "bf16", "bf16 + stochastic rounding", stochastic_rounding=True),
    PrecisionKind("bf16-plain", _BF16, "bf16", "bf16", "pure bf16 (drops small updates)", prices_as="bf16"),
    PrecisionKind("fp8", _BF16, "fp8", "bf16", "pure bf16 master, fp8 matmuls", float8_matmuls=True),
)}

# ----------------------------------------------------------------------------- fine-tuning


@dataclass(frozen=True)
class FinetuneKind:
    name: str
    adapters: bool  # trains LoRA adapters (fp32, peft) on a frozen base; False: every weight trains
    quantized_base: bool  # the frozen base's linear weights are NF4 (QLoRA)


FINETUNES: dict[str, FinetuneKind] = {k.name: k for k in (
    FinetuneKind("full", adapters=False, quantized_base=False),
    FinetuneKind("lora", adapters=True, quantized_base=False),
    FinetuneKind("qlora", adapters=True, quantized_base=True),
)}

# ----------------------------------------------------------------------------- lookups


K = TypeVar("K")


def _kind(kinds: Mapping[str, K], knob: str, name: str) -> K:
    found = kinds.get(name)
    if found is None:
        raise InvalidInput(f"{knob} {name!r} is not a {knob} kind gpuplan knows", path=f"train.{knob}",
                           hint=f"use one of {', '.join(kinds)}")
    return found


def sharding_kind(name: str) -> ShardingKind:
    return _kind(SHARDINGS, "sharding", name)


def precision_kind(name: str) -> PrecisionKind:
    return _kind(PRECISIONS, "precision", name)


def finetune_kind(name: str) -> FinetuneKind:
    return _kind(FINETUNES, "finetune", name)


def data_parallel_shardings() -> list[str]:
    """The kinds ``sharding: auto`` chooses among on more than one data-parallel rank, lightest first."""
    return [k.name for k in SHARDINGS.values() if k.data_parallel]


def most_sharded() -> str:
    """The data-parallel kind that saves the most memory (the last of the registry's order)."""
    return data_parallel_shardings()[-1]


def stochastic_twin(precision: str) -> str | None:
    """The precision of the same memory whose updates round stochastically, where ``precision`` rounds them to
    nearest instead (``bf16-plain``: ``bf16``); None for the others."""
    kind = precision_kind(precision)
    twin = precision_kind(kind.storage)
    return twin.name if twin.stochastic_rounding and not kind.stochastic_rounding else None


# ----------------------------------------------------------------------------- spec and plan fields


def _quoted(names: list[str]) -> str:
    quoted = [repr(n) for n in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _member_of(names: Callable[[], list[str]]) -> Callable[[str], str]:
    """A validator of a kind's name against ``names()``, the registry as it is when a value is validated."""

    def check(value: str) -> str:
        allowed = names()
        if value in allowed:
            return value
        raise ValueError(f"Input should be {_quoted(allowed)}, got {value!r}")

    return check


def _spec_precisions() -> list[str]:
    return [AUTO, *PRECISIONS]


def _spec_shardings() -> list[str]:
    return [AUTO, *data_parallel_shardings()]


def _finetunes() -> list[str]:
    return list(FINETUNES)


def _precisions() -> list[str]:
    return list(PRECISIONS)


def _shardings() -> list[str]:
    return list(SHARDINGS)


def _enum(names: Callable[[], list[str]]) -> WithJsonSchema:
    """The field's JSON schema: the names of the registry at import (what a Literal of them would give)."""
    return WithJsonSchema({"enum": names(), "type": "string"})


# A spec's knob ('auto' or a kind; sharding: one that runs over data-parallel ranks) and a plan's (a kind)
SpecPrecision = Annotated[str, AfterValidator(_member_of(_spec_precisions)), _enum(_spec_precisions)]
SpecSharding = Annotated[str, AfterValidator(_member_of(_spec_shardings)), _enum(_spec_shardings)]
FinetuneName = Annotated[str, AfterValidator(_member_of(_finetunes)), _enum(_finetunes)]
PrecisionName = Annotated[str, AfterValidator(_member_of(_precisions)), _enum(_precisions)]
ShardingName = Annotated[str, AfterValidator(_member_of(_shardings)), _enum(_shardings)]


def _check() -> None:
    """The registry's own rules, so an entry cannot contradict itself."""
    assert not SHARDINGS[NO_SHARDING].data_parallel
    for s in SHARDINGS.values():
        assert s.data_parallel or not (s.shards_parameters or s.shards_optimizer_state or s.gradient_buckets), s
        assert not s.shards_parameters or (s.shards_gradients and s.shards_optimizer_state), s
        assert not s.reshards_after_forward or s.shards_parameters, s
    for p in PRECISIONS.values():
        assert p.bytes.autocast == p.mixed, p
        assert p.storage in PRECISIONS and p.sharded_activations in PRECISIONS, p
        assert p.weights_dtype == ("bf16" if p.bytes.param == 2 else "fp32"), p
    for f in FINETUNES.values():
        assert f.adapters or not f.quantized_base, f


_check()
