"""The training loop: one function that runs bare (in-process, CPU or one GPU) and as a Ray Train
``train_loop_per_worker`` (workers.ray_loop wraps it).

It builds the model from the JobSpec, applies the Strategy (precision, DDP/FSDP2, activation
checkpointing, micro-batch and gradient accumulation, LoRA), reads tokens by sample index, and
checkpoints the training state through the checkpoint store (workers.train_state) every
``train.checkpoint_interval_steps`` steps, else at the Young/Daly interval (workers.checkpoint_interval).
On start it resumes from the newest complete checkpoint, so a rerun after a crash or preemption
continues exactly where the checkpoint left off: the final weights equal, bit for bit, those of an
uninterrupted run (deterministic algorithms on CPU). Steps after the last checkpoint are simply
repeated, which is safe because every batch is a pure function of its index.

Nothing here imports Ray: the Ray glue passes hooks in.
"""

from __future__ import annotations

import contextlib
import gc
import math
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

import torch
import torch.distributed as dist

from catalog.errors import GpuplanError, InvalidInput
from planner.spec import JobSpec, TrainSpec
from planner.types import Strategy
from workers.capabilities import strategy_problem
from workers.checkpoint_interval import ON_DEMAND_MTTP_H, IntervalPlanner, default_write_gbps
from workers.cuda_env import configure_allocator
from workers.data import DataLayout, TokenSource, tokenizer_dir
from workers.hooks import OomBackoffEvent, TrainHooks
from workers.model import (
    ModelSource,
    apply_lora,
    build_model,
    decoder_layers,
    enable_activation_checkpointing,
    quantize_base_nf4,
    resolve_model_source,
)
from workers.train_state import CheckpointWriter, prepare_state, save_state
from workers.train_state_load import load_state

# Seeding the global RNG and building a model must not interleave between two in-process runs.
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class TrainJob:
    """Everything the loop needs; plain values so it travels to Ray workers unchanged."""

    job_id: str
    spec: JobSpec
    strategy: Strategy
    checkpoint_uri: str
    device: str = "auto"  # auto | cpu | cuda
    keep_checkpoints: int = 3
    log_every_s: float = 2.0
    cpu_threads: int | None = None  # torch threads on CPU; None leaves torch's default
    predicted: dict[str, float] = field(default_factory=dict)  # planner's peak memory and tokens/s

    @property
    def train(self) -> TrainSpec:
        if self.spec.train is None:
            raise InvalidInput("this job has no 'train' section", path="train")
        return self.spec.train


@dataclass
class TrainResult:
    status: Literal["succeeded", "preempted", "cancelled", "failed"]
    steps: int
    total_steps: int
    tokens: int
    final_loss: float | None
    checkpoints_written: int
    resumed_from_step: int | None
    tokens_per_s: float | None  # whole placement, wall time of this attempt incl. checkpoints
    steady_tokens_per_s: float | None  # whole placement, training steps only, first step excluded
    loop_tokens_per_s: float | None  # after the first step, wall clock: checkpoints and hooks included
    wall_s: float
    checkpoint_save_s: float  # writing checkpoints (in the background, except the last and just-in-time ones)
    checkpoint_blocking_s: float  # what checkpoints cost the training loop: snapshots and waits
    checkpoint_interval_steps: int  # the interval used last (pinned by the spec, or Young/Daly)
    checkpoint_interval_s: float | None  # Young/Daly's tau behind it; None when the spec pinned the steps
    checkpoint_stall_s: float | None  # loop stall of the last periodic checkpoint (snapshot into host memory)
    checkpoint_durable_s: float | None  # snapshot handed over -> committed, of the last checkpoint
    peak_allocated_bytes: int | None  # torch.cuda.max_memory_allocated on the most loaded rank
    peak_reserved_bytes: int | None
    peak_rss_bytes: int | None  # CPU runs: the process's peak resident set
    predicted: dict[str, float]
    device: str
    world_size: int
    micro_batch: int = 0  # what the loop ran at the end (the plan's, unless an OOM halved it)
    grad_accum: int = 0
    oom_backoffs: list[dict[str, int]] = field(default_factory=list)  # step, from/to micro_batch and grad_accum
    cuda_alloc_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF the run had
    error: str | None = None  # set on the measurements of a run that failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def total_steps(train: TrainSpec, strategy: Strategy) -> int:
    tokens_per_step = strategy.micro_batch * strategy.grad_accum * strategy.data_parallel * train.seq_len
    return max(1, math.ceil(train.tokens / tokens_per_step))


def checkpoint_interval(train: TrainSpec, steps: int) -> int:
    """The spec's interval; else none before the step time is known (Young/Daly needs it)."""
    return train.checkpoint_interval_steps or steps


def pick_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("device 'cuda' was requested but no CUDA GPU is visible", hint="use --device cpu")
    if torch.cuda.is_available() and requested in ("auto", "cuda"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_supported(strategy: Strategy, device: torch.device) -> None:
    refused = strategy_problem(strategy)
    if refused is not None:
        path, why = refused
        raise InvalidInput(why, path=path,
                           hint="plan the job again with `gpuplan plan`; see README 'What the workers run'")
    if strategy.precision == "fp8":
        ok = device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)
        if not ok:
            where = "the CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)
            raise InvalidInput(f"fp8 training needs an NVIDIA GPU with compute capability 8.9 or newer "
                               f"(H100, H200, L40S, B200...); this run is on {where}", path="train.precision",
                               hint="use precision fp32, amp-bf16 or bf16 here")
    if strategy.optimizer == "adamw-8bit" and device.type != "cuda":
        raise InvalidInput("adamw-8bit needs a CUDA GPU", path="train.optimizer", hint="use adamw on CPU")


def _weights_dtype(strategy: Strategy) -> torch.dtype:
    return torch.bfloat16 if strategy.precision in ("bf16", "fp8") else torch.float32


def _autocast_dtype(strategy: Strategy, sharded: bool) -> torch.dtype | None:
    if strategy.precision == "amp-bf16" and not sharded:  # FSDP2 does it with MixedPrecisionPolicy
        return torch.bfloat16
    if strategy.precision == "amp-fp16":
        return torch.float16
    return None


def _make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name == "adamw-8bit":
        from torchao.optim import AdamW8bit

        optimizer: torch.optim.Optimizer = AdamW8bit(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        return optimizer
    raise InvalidInput(f"unknown optimizer {name!r}", path="train.optimizer", hint="use adamw, sgd or adafactor")


def _lr_lambda(steps: int) -> Callable[[int], float]:
    warmup = max(1, min(100, steps // 10))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _prepare_model(job: TrainJob, source: ModelSource, device: torch.device,
                   world: int) -> tuple[torch.nn.Module, bool]:
    strategy = job.strategy
    with _BUILD_LOCK:
        model = build_model(source, seed=job.train.seed, weights_dtype=_weights_dtype(strategy), device=device)
    if strategy.finetune == "qlora":
        quantize_base_nf4(model, shards=world if strategy.sharding in ("fsdp", "fsdp-grad-op") else 1)
    if strategy.finetune in ("lora", "qlora"):
        model = apply_lora(model, strategy.lora_rank)
    if strategy.activation_checkpointing:
        enable_activation_checkpointing(model)
    model.to(device)
    if strategy.precision == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda _m, fqn: "lm_head" not in fqn)
    sharded = strategy.sharding in ("fsdp", "fsdp-grad-op") and world > 1
    if sharded:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if strategy.precision == "amp-bf16" else MixedPrecisionPolicy()
        # fsdp-grad-op (ZeRO-2): parameters stay gathered from forward to backward, so only gradients
        # and optimizer states are sharded; it saves the backward all-gather at the cost of memory.
        reshard = strategy.sharding == "fsdp"
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model, sharded


def _set_grad_sync(model: torch.nn.Module, sharded: bool, enabled: bool) -> Any:
    """Context for one micro-batch: skip the gradient all-reduce on all but the last."""
    import contextlib

    if sharded:
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if not enabled and no_sync is not None:
        return no_sync()
    return contextlib.nullcontext()


def run_training(job: TrainJob, hooks: TrainHooks | None = None) -> TrainResult:
    """Train ``job`` to its token count, resuming from the newest checkpoint in its store."""
    from workers.checkpoint import open_store

    hooks = hooks or TrainHooks()
    started = time.perf_counter()
    alloc_conf = configure_allocator()  # before the first CUDA call: the allocator reads it at init
    train, strategy = job.train, job.strategy
    rank, world = _world()
    device = pick_device(job.device)
    _check_supported(strategy, device)
    if device.type == "cpu" and job.cpu_threads:
        # On a shared small box, OpenMP spin-waiting across busy cores costs 10x; callers pick the count.
        torch.set_num_threads(job.cpu_threads)
    if device.type == "cpu":
        # Bit-exact resume needs reproducible kernels; on CUDA that would cost speed, so only CPU.
        torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    source = resolve_model_source(job.spec)
    data = TokenSource(seq_len=train.seq_len, vocab_size=source.config.vocab_size, seed=train.seed, path=train.data,
                       tokenizer=tokenizer_dir(train, source) if train.data else None)
    store = open_store(job.checkpoint_uri, keep=job.keep_checkpoints, on_file=hooks.checkpoint_file)
    model, sharded = _prepare_model(job, source, device, world)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _make_optimizer(strategy.optimizer, params, train.learning_rate)
    steps = total_steps(train, strategy)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(steps))
    interval = checkpoint_interval(train, steps)
    planner = interval_planner(job, model, optimizer)
    layout = DataLayout(micro_batch=strategy.micro_batch, grad_accum=strategy.grad_accum, world_size=world)
    autocast_dtype = _autocast_dtype(strategy, sharded)
    scaler = torch.amp.GradScaler(device.type) if strategy.precision == "amp-fp16" else None
    # The spec and strategy travel with every checkpoint, so `gpuplan export` can rebuild the model from it.
    meta = {"job_id": job.job_id, "model": source.config.id, "world_size": world,
            "spec": job.spec.model_dump(mode="json"), "strategy": strategy.model_dump(mode="json"),
            "model_config": source.config.model_dump(mode="json")}

    loaded = load_state(store, model=model, optimizer=optimizer, scheduler=scheduler, sharded=sharded)
    step, position, tokens, loss_value = 0, 0, 0, None
    resumed_from = None
    if loaded is not None:
        step, position, tokens, loss_value = loaded.step, loaded.data_position, loaded.tokens, loaded.loss
        resumed_from = loaded.step
    log = hooks.on_log if rank == 0 else (lambda _line: None)
    log(f"job {job.job_id}: {source.config.id} on {world} x {device.type}, {strategy.label()}, "
        f"{steps} steps of {layout.sequences_per_step * train.seq_len} tokens, data: {data.description}, "
        f"PYTORCH_CUDA_ALLOC_CONF={alloc_conf}"
        + (f"; resumed from the checkpoint of step {resumed_from}" if resumed_from is not None else ""))
    if rank == 0:
        hooks.on_progress({"event": "started", "step": step, "total_steps": steps, "tokens": tokens,
                           "resumed_from_step": resumed_from, "world_size": world})

    model.train()
    checkpoints = 0
    last_saved = resumed_from
    save_s = 0.0

    def saved(at: int, took: float) -> None:  # in the writer thread, once the checkpoint is durable
        nonlocal checkpoints
        checkpoints += 1
        log(f"step {at}: checkpoint saved to {job.checkpoint_uri} ({took:.2f} s)")
        if rank == 0:
            hooks.on_progress({"event": "checkpoint", "step": at, "checkpoints": checkpoints})

    writer = CheckpointWriter(store, on_saved=saved)
    steady_tokens, steady_s = 0, 0.0
    loop_began: float | None = None  # end of the first step of this attempt
    loop_tokens = 0
    attempt_tokens = 0
    last_report = time.perf_counter()
    status: Literal["succeeded", "preempted", "cancelled"] = "succeeded"
    per_step_tokens = layout.sequences_per_step * train.seq_len

    def checkpoint(at: int, blocking: bool = False) -> None:
        nonlocal save_s, last_saved, interval
        if last_saved == at:
            if blocking:
                writer.wait()
            return
        began = time.perf_counter()
        hooks.fault(at, "checkpoint")
        durable_before = writer.last_write_s
        save_state(writer, step=at, data_position=position, tokens=tokens, loss=loss_value, model=model,
                   optimizer=optimizer, scheduler=scheduler, sharded=sharded, extra_metadata=meta,
                   blocking=blocking, on_cpu=device.type == "cpu")
        took = time.perf_counter() - began
        save_s += took
        last_saved = at
        if not blocking:
            planner.observe(stall_s=took, durable_s=durable_before)
            if not planner.pinned and steady_s > 0:
                interval = agree_interval(planner.steps(steady_s / max(1, steady_tokens // per_step_tokens)),
                                          device, world)

    noticed = False
    micro, accum = resume_split(strategy, loaded.split if loaded is not None else None)
    if (micro, accum) != (strategy.micro_batch, strategy.grad_accum):
        log(f"resuming at micro-batch {micro} x {accum} accumulation steps, where an earlier attempt backed off "
            f"after a CUDA OOM (the plan's {strategy.micro_batch} x {strategy.grad_accum} would run out of "
            "memory again; same global batch)")
    meta["run_split"] = [micro, accum]  # saved with every checkpoint, so a resume starts where this run is
    backoffs: list[dict[str, int]] = []

    def accumulate() -> torch.Tensor:
        """Forward and backward of the step's ``accum`` micro-batches; the gradients add up in .grad."""
        total_loss = torch.zeros((), device=device)
        for a in range(accum):
            first = position + (a * world + rank) * micro
            batch = data.batch(first, micro).to(device, non_blocking=True)
            last = a == accum - 1
            hooks.before_forward(step, micro)
            with _set_grad_sync(model, sharded, last or world == 1):
                with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                    enabled=autocast_dtype is not None):
                    # the mean over this micro-batch's tokens / accum: with equal-length sequences the sum
                    # over micro-batches is the step's mean, whatever the split (what makes a back-off exact)
                    loss = model(input_ids=batch, labels=batch).loss / accum
                hooks.fault(step, "forward")
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
            total_loss += loss.detach().float()
        return total_loss

    def measure(status: Literal["succeeded", "preempted", "cancelled", "failed"],
                error: str | None = None) -> TrainResult:
        wall = time.perf_counter() - started
        loop_s = time.perf_counter() - loop_began if loop_began is not None else 0.0
        peak_alloc = peak_reserved = peak_rss = None
        if device.type == "cuda":
            peak_alloc = torch.cuda.max_memory_allocated(device)
            peak_reserved = torch.cuda.max_memory_reserved(device)
            if world > 1 and error is None:  # a failing rank cannot count on the others joining a collective
                peaks = torch.tensor([peak_alloc, peak_reserved], device=device)
                dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
                peak_alloc, peak_reserved = int(peaks[0]), int(peaks[1])
        else:
            peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return TrainResult(
            status=status, steps=step, total_steps=steps, tokens=tokens, final_loss=loss_value,
            checkpoints_written=checkpoints, resumed_from_step=resumed_from,
            tokens_per_s=attempt_tokens / wall if attempt_tokens else None,
            steady_tokens_per_s=steady_tokens / steady_s if steady_s > 0 else None,
            loop_tokens_per_s=loop_tokens / loop_s if loop_tokens and loop_s > 0 else None,
            wall_s=wall, checkpoint_save_s=writer.write_s, checkpoint_blocking_s=save_s,
            checkpoint_interval_steps=interval, checkpoint_interval_s=planner.interval_s,
            checkpoint_stall_s=planner.measured_stall_s, checkpoint_durable_s=writer.last_write_s,
            peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_reserved,
            peak_rss_bytes=peak_rss, predicted=dict(job.predicted), device=str(device.type), world_size=world,
            micro_batch=micro, grad_accum=accum, oom_backoffs=list(backoffs), cuda_alloc_conf=alloc_conf,
            error=error,
        )

    try:
        while step < steps:
            step_began = time.perf_counter()
            out_of_memory = ""
            try:
                total_loss = accumulate()
            except torch.OutOfMemoryError as exc:
                out_of_memory = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
            if out_of_memory:  # outside the handler: the exception's frames (and their tensors) are gone
                before = (micro, accum)
                micro, accum = _back_off(step, micro, accum, world, out_of_memory)
                optimizer.zero_grad(set_to_none=True)  # the partial step's gradients; the step is redone
                _free_memory(device)
                backoffs.append({"step": step + 1, "from_micro_batch": before[0], "to_micro_batch": micro,
                                 "from_grad_accum": before[1], "to_grad_accum": accum})
                meta["run_split"] = [micro, accum]
                log(f"step {step + 1}: CUDA out of memory at micro-batch {before[0]}; retrying the step at "
                    f"micro-batch {micro} x {accum} accumulation steps (same global batch: "
                    f"{micro * accum * world} sequences)")
                if rank == 0:
                    hooks.on_progress(cast(OomBackoffEvent, {"event": "oom_backoff", **backoffs[-1]}))
                continue
            hooks.fault(step, "backward")
            try:
                if scaler is not None:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
            except torch.OutOfMemoryError as exc:
                raise GpuplanError(
                    f"CUDA ran out of memory in the optimizer step of step {step + 1} ({exc}); a smaller "
                    "micro-batch does not shrink the optimizer's memory",
                    hint="raise resources.memory_headroom, or use a lighter optimizer (adamw-8bit, adafactor), "
                    "lora, or more GPUs with fsdp sharding") from None
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            hooks.fault(step, "optimizer")
            if world > 1:
                dist.all_reduce(total_loss, op=dist.ReduceOp.SUM)
                total_loss /= world
            loss_value = float(total_loss.item())
            if not math.isfinite(loss_value):
                raise GpuplanError(f"the loss became {loss_value} at step {step + 1}",
                                   hint="lower train.learning_rate or use a wider precision (fp32 or amp-bf16)")
            step += 1
            position += layout.sequences_per_step
            tokens += per_step_tokens
            attempt_tokens += per_step_tokens
            elapsed = time.perf_counter() - step_began
            if step > (resumed_from or 0) + 1:  # the first step pays for allocation and warm-up
                steady_tokens += per_step_tokens
                steady_s += elapsed
                loop_tokens += per_step_tokens
            else:
                # The optimizer state exists now: pin the checkpoint buffer once, here, outside the timed
                # loop. Pinning holds up the GPU's work for its whole ~0.5 s/GB (H200: 14.8 GB took 7.2 s,
                # and a step running beside it took as long), so in the background it only moved the
                # stall into a training step; here it is start-up, and every checkpoint stalls ~0.3 s.
                prepare_state(writer, model=model, optimizer=optimizer, sharded=sharded)
                writer.buffer.wait_prepared()
                loop_began = time.perf_counter()
            if not planner.pinned and step == (resumed_from or 0) + 3:  # two steady steps: their time is known
                interval = agree_interval(planner.steps(steady_s / 2), device, world)
            now = time.perf_counter()
            if rank == 0 and (now - last_report >= job.log_every_s or step == steps):
                last_report = now
                rate = steady_tokens / steady_s if steady_s > 0 else None
                hooks.on_progress({"event": "step", "step": step, "total_steps": steps, "tokens": tokens,
                                   "loss": loss_value, "tokens_per_s": rate})
                log(f"step {step}/{steps} loss {loss_value:.4f}" + (f" {rate:,.0f} tokens/s" if rate else ""))
            due = step % interval == 0 if planner.pinned else step - (last_saved or 0) >= interval
            if due or step == steps:
                checkpoint(step, blocking=step == steps)
            signal = hooks.poll()
            if signal is None or step >= steps:
                continue
            if signal.kind == "cancel":
                status = "cancelled"
                log(f"step {step}: cancelled")
                break
            if noticed:  # a notice stays up until the node goes; act on it once
                continue
            noticed = True
            checkpoint(step, blocking=True)
            if signal.deadline is None:
                status = "preempted"
                log(f"step {step}: preempted; just-in-time checkpoint saved, a resubmission resumes here")
                break
            when = time.strftime("%H:%M:%S", time.gmtime(signal.deadline))
            log(f"step {step}: spot notice (node taken at {when} UTC); just-in-time checkpoint saved, waiting to move")
            _wait_for_teardown(signal.deadline)
        writer.wait()  # the last checkpoints are durable before the run reports success
    except BaseException as exc:
        with contextlib.suppress(BaseException):  # keep the original error; a real crash loses the write
            writer.wait()
        if rank == 0 and isinstance(exc, Exception):
            with contextlib.suppress(Exception):  # what it measured up to the failure, next to the prediction
                failed = measure("failed", str(exc) or type(exc).__name__)
                hooks.on_progress({"event": "failed", "result": failed.to_dict()})
        raise

    result = measure(status)
    if rank == 0:
        hooks.on_progress({"event": "finished", "result": result.to_dict()})
    return result


def resume_split(strategy: Strategy, saved: tuple[int, int] | None) -> tuple[int, int]:
    """The (micro_batch, grad_accum) a run starts at: the plan's, or the smaller one its checkpoint
    was saved at after an OOM back-off, when that split keeps the plan's global batch."""
    planned = (strategy.micro_batch, strategy.grad_accum)
    if saved is None or saved == planned:
        return planned
    micro, accum = saved
    if 1 <= micro < planned[0] and micro * accum == planned[0] * planned[1]:
        return micro, accum
    return planned  # another plan (a pinned micro-batch changed): the new plan's split


def _back_off(step: int, micro: int, accum: int, world: int, why: str) -> tuple[int, int]:
    """The next (micro_batch, grad_accum) after an OOM: half the micro-batch, twice the accumulation,
    so every optimizer step still sees the same sequences with the same loss scaling."""
    if world > 1:
        raise GpuplanError(
            f"CUDA ran out of memory at step {step + 1} on a {world}-GPU run ({why}); the micro-batch is halved "
            "automatically only on one GPU, where no other rank waits in a collective",
            hint="lower train.micro_batch or raise resources.memory_headroom and resubmit")
    if micro <= 1:
        raise GpuplanError(
            f"CUDA ran out of memory at step {step + 1} at micro-batch 1 ({why}): the job does not fit this GPU "
            "even at the smallest micro-batch",
            hint="use activation_checkpointing, lora, a smaller seq_len, or a bigger GPU (see gpuplan plan)")
    # the largest divisor of the micro-batch up to its half, so accumulation keeps the global batch exactly
    half = max(d for d in range(1, micro // 2 + 1) if micro % d == 0)
    return half, accum * (micro // half)


def _free_memory(device: torch.device) -> None:
    """Give the failed step's blocks back so the retry starts from the weights and optimizer state alone."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def interval_planner(job: TrainJob, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> IntervalPlanner:
    """Young/Daly inputs of this run: its state's bytes, the calibrated write speed, and the mean time
    to preemption the scheduler passed for a spot placement (else the on-demand default)."""
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    state_bytes += sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                       if isinstance(t, torch.Tensor))
    if not optimizer.state:  # moments appear at the first step: AdamW keeps two per parameter
        state_bytes *= 3 if job.strategy.optimizer.startswith("adamw") else 2
    return IntervalPlanner(override_steps=job.train.checkpoint_interval_steps,
                           mttp_h=job.predicted.get("mean_time_to_preemption_h") or ON_DEMAND_MTTP_H,
                           state_bytes=state_bytes, write_gbps=default_write_gbps())


def agree_interval(steps: int, device: torch.device, world: int) -> int:
    """Every rank must checkpoint at the same steps: the longest interval any rank computed."""
    if world == 1:
        return steps
    value = torch.tensor([steps], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value.item())


def _wait_for_teardown(deadline: float) -> None:
    """After a just-in-time checkpoint, idle until the node goes: steps taken now would be lost anyway.

    If the node is still here well after the deadline (the drain was cancelled), carry on training.
    """
    give_up = max(deadline, time.time()) + 30.0
    while time.time() < give_up:
        time.sleep(0.2)
