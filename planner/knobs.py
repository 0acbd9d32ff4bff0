"""The resolved training/inference knobs as a plain, cheap value.

The search evaluates thousands of configurations; building a validated pydantic ``Strategy`` for
each would dominate planning time, so estimators take ``Knobs`` (or anything with the same
attributes, such as a ``Strategy``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from planner.types import Strategy


class KnobsLike(Protocol):
    @property
    def precision(self) -> str: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def sharding(self) -> str: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def pipeline_parallel(self) -> int: ...
    @property
    def data_parallel(self) -> int: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def activation_checkpointing(self) -> bool: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def grad_accum(self) -> int: ...
    @property
    def finetune(self) -> str: ...
    @property
    def lora_rank(self) -> int: ...


class Knobs(NamedTuple):
    """A tuple, so that hashing it as a cache key (thousands of times per plan) runs in C."""

    precision: str = "bf16"
    optimizer: str = "adamw"
    sharding: str = "none"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    gpu_count: int = 1
    activation_checkpointing: bool = False
    micro_batch: int = 1
    grad_accum: int = 1
    finetune: str = "full"
    lora_rank: int = 16

    @property
    def data_parallel(self) -> int:
        return max(1, self.gpu_count // (self.tensor_parallel * self.pipeline_parallel))

    def with_micro_batch(self, micro_batch: int, grad_accum: int | None = None) -> Knobs:
        # positional construction: _replace is several times slower in the search loop
        return Knobs(self.precision, self.optimizer, self.sharding, self.tensor_parallel, self.pipeline_parallel,
                     self.gpu_count, self.activation_checkpointing, micro_batch,
                     self.grad_accum if grad_accum is None else grad_accum, self.finetune, self.lora_rank)

    @classmethod
    def of(cls, s: Strategy) -> Knobs:
        return cls(precision=s.precision, optimizer=s.optimizer, sharding=s.sharding, tensor_parallel=s.tensor_parallel,
                   pipeline_parallel=s.pipeline_parallel, gpu_count=s.gpu_count,
                   activation_checkpointing=s.activation_checkpointing, micro_batch=s.micro_batch,
                   grad_accum=s.grad_accum, finetune=s.finetune, lora_rank=s.lora_rank)
