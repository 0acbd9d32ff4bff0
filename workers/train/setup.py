"""What a training run is built from: the device, the checks it needs, the model with its precision,
sharding, LoRA and activation checkpointing applied, the optimizer and the learning-rate schedule.

workers.train.loop runs the loop over these; bench/workers/worker_overhead.py builds the same parts to time a load.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from catalog.params import count_params
from errors import InvalidInput
from planner.host_memory import build_bytes, builds_on_host, builds_once
from planner.numerics import stochastic_rounding
from planner.strategies import finetune_kind, precision_kind, sharding_kind
from planner.types import Strategy
from workers.capabilities import strategy_problem
from workers.model.build import (
    ModelSource,
    apply_lora,
    build_model,
    decoder_layers,
    enable_activation_checkpointing,
    quantize_base_nf4,
)
from workers.model.isolation import seed_global, seeded_build
from workers.train.sr_adamw import StochasticRoundAdamW


def pick_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("device 'cuda' was requested but no CUDA GPU is visible", hint="use --device cpu")
    if torch.cuda.is_available() and requested in ("auto", "cuda"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def check_supported(strategy: Strategy, device: torch.device) -> None:
    """Refuse a strategy the workers do not run, or one this device cannot (fp8 units, 8-bit AdamW)."""
    refused = strategy_problem(strategy)
    if refused is not None:
        path, why = refused
        raise InvalidInput(why, path=path,
                           hint="plan the job again with `gpuplan plan`; see README 'What the workers run'")
    if precision_kind(strategy.precision).float8_matmuls:
        ok = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        if not ok:
            where = "the CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)
            raise InvalidInput(f"fp8 training needs an NVIDIA GPU with compute capability 8.9 or newer "
                               f"(H100, H200, L40S, B200...); this run is on {where}", path="train.precision",
                               hint="use precision fp32, amp-bf16 or bf16 here")
    if strategy.optimizer == "adamw-8bit" and device.type != "cuda":
        raise InvalidInput("adamw-8bit needs a CUDA GPU", path="train.optimizer", hint="use adamw on CPU")


def configure_torch(device: torch.device, cpu_threads: int | None) -> None:
    """Process-wide torch settings of a run on ``device``."""
    if device.type == "cpu" and cpu_threads:
        # On a shared small box, OpenMP spin-waiting across busy cores costs 10x; callers pick the count.
        torch.set_num_threads(cpu_threads)
    if device.type == "cpu":
        # Bit-exact resume needs reproducible kernels; on CUDA that would cost speed, so only CPU.
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def weights_dtype(strategy: Strategy) -> torch.dtype:
    return TORCH_DTYPES[precision_kind(strategy.precision).weights_dtype]


def autocast_dtype(strategy: Strategy, sharded: bool) -> torch.dtype | None:
    kind = precision_kind(strategy.precision)
    if kind.autocast_dtype is None or (sharded and kind.fsdp_casts):  # FSDP2's MixedPrecisionPolicy casts instead
        return None
    return TORCH_DTYPES[kind.autocast_dtype]


def make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float, *, precision: str = "fp32",
                   finetune: str = "full", seed: int = 0, rank: int = 0) -> torch.optim.Optimizer:
    """``name``'s optimizer. Whether its steps round stochastically into bf16 weights is the planner's call
    (planner.numerics.stochastic_rounding, which also prices it): ``bf16`` full fine-tunes do, seeded by the
    job's ``seed`` and ``rank``; ``bf16-plain`` and LoRA's fp32 adapters do not."""
    stochastic = stochastic_rounding(precision, finetune, name)
    if name == "adamw" and stochastic:
        return StochasticRoundAdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, seed=seed, rank=rank)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name == "adamw-8bit":
        from torchao.optim import AdamW8bit

        optimizer: torch.optim.Optimizer = AdamW8bit(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1,
                                                     bf16_stochastic_round=stochastic)
        return optimizer
    raise InvalidInput(f"unknown optimizer {name!r}", path="train.optimizer", hint="use adamw, sgd or adafactor")


def lr_lambda(steps: int) -> Callable[[int], float]:
    warmup = max(1, min(100, steps // 10))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) outside torch.distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def build_device(strategy: Strategy, source: ModelSource, device: torch.device,
                 gpu_bytes: int | None = None) -> torch.device:
    """Where to build the model before it is quantized or sharded: ``device`` unless the whole model in its
    build dtype would not fit the GPU (``gpu_bytes``: its total memory; planner.host_memory.GPU_BUILD_SHARE
    of it), then the host (the plan checks the node's RAM with the same rule).

    Why: the plan prices what a rank holds while training (NF4 weights for QLoRA, a 1/N shard under FSDP), not
    the whole bf16/fp32 model, so building that on the GPU first ran out of memory on plans that fit, e.g.
    Mixtral-8x7B QLoRA (93 GB in bf16) over 8 x H100-80GB (examples/mixtral-qlora.yaml). The rule is fixed
    by the model and the GPU, not by free memory, so every rank and every resume decides the same."""
    if device.type != "cuda":
        return device
    total = gpu_bytes if gpu_bytes is not None else torch.cuda.get_device_properties(device).total_memory
    model = build_bytes(count_params(source.config).total, strategy.precision)
    return torch.device("cpu") if builds_on_host(model, total) else device


class PreparedModel(NamedTuple):
    model: torch.nn.Module
    sharded: bool  # FSDP2 shards it
    # its parameters are not drawn yet (prepare_model's checkpoint_follows): the caller loads a checkpoint into
    # every one of them, or calls fill_weights
    weights_pending: bool = False


def prepare_model(strategy: Strategy, seed: int, source: ModelSource, device: torch.device,
                  world: int, *, checkpoint_follows: bool = False) -> PreparedModel:
    """The model on ``device`` as ``strategy`` trains it.

    ``checkpoint_follows``: the caller is about to load a checkpoint. A sharded full fine-tune built once on the
    host then skips drawing (or reading) its weights, which the checkpoint replaces anyway: on one CPU thread
    of rank 0 that build takes ~23 s per billion fp32 parameters (llama-3.2-1b: 28 s on the H200 host), so
    ~27 minutes of every spot restart of a 70B job (bench/probes/build_once_probe.py).

    The build leaves torch's global generator as it found it (workers.model.isolation.seeded_build), then seeds it with
    ``seed``: the run's own draws (dropout, where a config has any) start there on every rank, not wherever this
    process's generator happened to be."""
    prepared = _prepare_model(strategy, seed, source, device, world, checkpoint_follows)
    seed_global(seed)
    return prepared


def _prepare_model(strategy: Strategy, seed: int, source: ModelSource, device: torch.device, world: int,
                   checkpoint_follows: bool) -> PreparedModel:
    built_on = build_device(strategy, source, device)
    shards_parameters = sharding_kind(strategy.sharding).shards_parameters
    sharded = shards_parameters and world > 1
    if sharded and built_on.type == "cpu" and builds_once(strategy):
        skip = checkpoint_follows and not finetune_kind(strategy.finetune).adapters
        model, pending = _sharded_from_rank0(strategy, seed, source, device, draw_weights=not skip)
        return PreparedModel(model, True, pending)
    # the weights and the LoRA adapters drawn from the job's seed alone, whatever runs beside it
    with seeded_build(seed, built_on, libraries=build_libraries(strategy)):
        model = build_model(source, seed=seed, weights_dtype=weights_dtype(strategy), device=built_on)
        if finetune_kind(strategy.finetune).quantized_base:
            quantize_base_nf4(model, shards=world if shards_parameters else 1)
        model = _adapt(model, strategy)
    if not (sharded and built_on != device):
        model.to(device)  # a host-built model FSDP2 will shard moves one unit at a time, as fully_shard wraps it
    if precision_kind(strategy.precision).float8_matmuls:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda _m, fqn: "lm_head" not in fqn)
    if sharded:
        _shard(model, strategy)
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return PreparedModel(model, sharded)


def build_libraries(strategy: Strategy) -> tuple[str, ...]:
    """The libraries a build of ``strategy`` uses (workers.model.isolation.load_libraries loads them first)."""
    finetune = finetune_kind(strategy.finetune)
    torchao = finetune.quantized_base or precision_kind(strategy.precision).float8_matmuls
    return ("transformers",) + (("peft",) if finetune.adapters else ()) + (("torchao",) if torchao else ())


def _adapt(model: torch.nn.Module, strategy: Strategy) -> torch.nn.Module:
    """LoRA adapters and activation checkpointing, as the strategy asks (the parameter names FSDP2 shards)."""
    if finetune_kind(strategy.finetune).adapters:
        model = apply_lora(model, strategy.lora_rank)
    if strategy.activation_checkpointing:
        enable_activation_checkpointing(model)
    return model


def _sharded_from_rank0(strategy: Strategy, seed: int, source: ModelSource, device: torch.device, *,
                        draw_weights: bool = True) -> tuple[torch.nn.Module, bool]:
    """A sharded model whose whole weights are built once, in rank 0's host memory, instead of once per rank
    (planner.host_memory.builds_once prices the same); True with it when its weights are still to come.

    Every rank builds the structure on the meta device (no memory), shards it with FSDP2 and allocates only its
    shard on ``device``; rank 0 then builds the weights exactly as a per-rank build would (the same seed, init
    order and LoRA draws, or the local weights) and broadcasts them, each rank keeping its shard (``fill_weights``).
    Without ``draw_weights`` that build is skipped where the module buffers no state dict holds (rotary
    frequencies) can be computed from their modules' configs on every rank; otherwise it runs anyway."""
    with seeded_build(seed, libraries=build_libraries(strategy)):
        model = _adapt(build_model(ModelSource(config=source.config, weights_dir=None), seed=seed,
                                   weights_dtype=weights_dtype(strategy), device=torch.device("meta")), strategy)
    _shard(model, strategy)
    model.to_empty(device=device)
    buffers = None if draw_weights else _buffers_from_configs(model)
    if buffers is None:
        fill_weights(model, strategy, seed, source)
        return model, False
    for name, buffer in model.named_buffers():
        if name in buffers:
            buffer.copy_(buffers[name])
    return model, True


def fill_weights(model: torch.nn.Module, strategy: Strategy, seed: int, source: ModelSource) -> None:
    """Collective: rank 0 builds the whole weights on the host as a per-rank build would, and every rank of the
    sharded ``model`` takes its shard of them, buffers included. The other ranks' global RNG is not advanced by
    a build they do not do; rank 0's is restored after it, so every rank leaves with the same generator state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    whole: torch.nn.Module | None = None
    if dist.get_rank() == 0:
        with seeded_build(seed, libraries=build_libraries(strategy)):
            whole = _adapt(build_model(source, seed=seed, weights_dtype=weights_dtype(strategy),
                                       device=torch.device("cpu")), strategy)
    set_model_state_dict(model, whole.state_dict() if whole is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for name, buffer in model.named_buffers():
        if whole is not None:
            buffer.copy_(whole.get_buffer(name))
        dist.broadcast(buffer, src=0)


def _buffers_from_configs(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The buffers a state dict does not hold, each computed by a fresh copy of its module from that module's
    config (transformers' rotary embeddings: ``inv_freq``, ``original_inv_freq``); None when one of them has no
    config, or weights of its own (Gemma's scaled embedding), so the caller builds the whole model instead."""
    persistent = set(model.state_dict())
    owners: dict[str, list[str]] = {}
    for name, _ in model.named_buffers():
        if name not in persistent:
            owner_name, _, attr = name.rpartition(".")
            owners.setdefault(owner_name, []).append(attr)
    found: dict[str, torch.Tensor] = {}
    for owner_name, attrs in owners.items():
        owner = model.get_submodule(owner_name)
        config = getattr(owner, "config", None)
        if config is None or next(owner.parameters(), None) is not None:
            return None
        try:
            with torch.device("cpu"):
                fresh = type(owner)(config)
        except Exception:  # any constructor that wants more than its config: the caller builds the model
            return None
        for attr in attrs:
            found[f"{owner_name}.{attr}" if owner_name else attr] = getattr(fresh, attr)
    return found


def _shard(model: torch.nn.Module, strategy: Strategy) -> None:
    """FSDP2 over every decoder layer, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kind = precision_kind(strategy.precision)
    policy = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[kind.autocast_dtype], reduce_dtype=torch.float32) \
        if kind.fsdp_casts and kind.autocast_dtype is not None else MixedPrecisionPolicy()
    # a kind that keeps each layer's parameters gathered from forward to backward (fsdp-grad-op, ZeRO-2 like)
    # saves the backward all-gather at the cost of memory
    reshard = sharding_kind(strategy.sharding).reshards_after_forward
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)


def set_grad_sync(model: torch.nn.Module, sharded: bool, enabled: bool) -> Any:
    """Context for one micro-batch: skip the gradient all-reduce on all but the last."""
    if sharded:
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if not enabled and no_sync is not None:
        return no_sync()
    return contextlib.nullcontext()


def _largest_on_any_rank(value: int, device: torch.device, world: int) -> int:
    if world == 1:
        return value
    tensor = torch.tensor([value], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def agree_flag(flag: bool, device: torch.device, world: int) -> bool:
    """True on every rank when it is True on any (ranks on different nodes read different clocks; a collective
    checkpoint must start at the same step everywhere)."""
    return _largest_on_any_rank(int(flag), device, world) > 0


def agree_interval(steps: int, device: torch.device, world: int) -> int:
    """Every rank must checkpoint at the same steps: the longest interval any rank computed."""
    return _largest_on_any_rank(steps, device, world)
