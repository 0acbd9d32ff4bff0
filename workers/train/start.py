"""How a training attempt starts: the job it runs (:class:`TrainJob`), and its parts built from it (data,
checkpoint store, model, optimizer and schedule, checkpoint interval), resumed from the newest complete
checkpoint in the store (:class:`RunStart`). The loop that carries on from there is workers.train.loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from errors import InvalidInput
from planner.calibration import CostCalibration
from planner.spec import JobSpec, TrainSpec
from planner.strategies import precision_kind
from planner.types import Strategy
from workers.checkpoint.interval import ON_DEMAND_MTTP_H, IntervalPlanner
from workers.executors.cuda_env import configure_allocator
from workers.model.build import resolve_model_source
from workers.model.isolation import load_libraries
from workers.train.batches import DataLayout, TokenSource, tokenizer_dir
from workers.train.hooks import TrainHooks
from workers.train.recovery import resume_split
from workers.train.setup import (
    agree_flag,
    autocast_dtype,
    build_device,
    check_supported,
    configure_torch,
    fill_weights,
    lr_lambda,
    make_optimizer,
    pick_device,
    prepare_model,
    world,
)
from workers.train.state_load import load_state
from workers.train.state_save import CheckpointWriter


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
    # the calibrated write speed to the checkpoint store (GB/s), which the plans use too: the executor passes its
    # calibration's (the user's refit over the shipped one); the calibration type's default otherwise
    checkpoint_write_gbps: float = field(default_factory=lambda: CostCalibration().checkpoint_write_gbps)

    @property
    def train(self) -> TrainSpec:
        if self.spec.train is None:
            raise InvalidInput("this job has no 'train' section", path="train")
        return self.spec.train


def total_steps(train: TrainSpec, strategy: Strategy) -> int:
    tokens_per_step = strategy.micro_batch * strategy.grad_accum * strategy.data_parallel * train.seq_len
    return max(1, math.ceil(train.tokens / tokens_per_step))


def checkpoint_interval(train: TrainSpec, steps: int) -> int:
    """The spec's interval; else none before the step time is known (Young/Daly needs it)."""
    return train.checkpoint_interval_steps or steps


class RunStart:
    """One attempt of a training run as it starts: its parts, and where it stands (the newest checkpoint's
    step); the loop (workers.train.loop) carries on from here."""

    loss_value: float | None
    resumed_from: int | None  # the step of the checkpoint this attempt started from
    last_saved: int | None
    loop_began: float | None  # end of the first step of this attempt

    def __init__(self, job: TrainJob, hooks: TrainHooks) -> None:
        self.job, self.hooks, self.train_spec, self.strategy = job, hooks, job.train, job.strategy
        self.started = time.perf_counter()
        self.alloc_conf = configure_allocator()  # before the first CUDA call: the allocator reads it at init
        load_libraries("transformers")  # once per process, under a lock: attempts may start side by side
        self.rank, self.world = world()
        self.device = pick_device(job.device)
        check_supported(self.strategy, self.device)
        configure_torch(self.device, job.cpu_threads)
        self._build()
        self._resume()
        self._announce()

    def _build(self) -> None:
        """The data, the store, the model, the optimizer and schedule, and the checkpoint interval."""
        from workers.checkpoint.local import open_store

        job, train, strategy = self.job, self.train_spec, self.strategy
        self.source = resolve_model_source(job.spec)
        self.data = TokenSource(seq_len=train.seq_len, vocab_size=self.source.config.vocab_size, seed=train.seed,
                                path=train.data, tokenizer=tokenizer_dir(train, self.source) if train.data else None)
        self.store = open_store(job.checkpoint_uri, keep=job.keep_checkpoints, on_file=self.hooks.checkpoint_file)
        # a complete checkpoint in rank 0's listing of the store (not yet verified: load_state does that, and
        # draws the weights after all when none verifies): every rank skips drawing weights it would replace
        follows = agree_flag(self.rank == 0 and bool(self.store.list()), self.device, self.world)
        self.model, self.sharded, self.weights_pending = prepare_model(
            strategy, train.seed, self.source, self.device, self.world, checkpoint_follows=follows)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(strategy.optimizer, self.params, train.learning_rate,
                                        precision=strategy.precision, finetune=strategy.finetune, seed=train.seed,
                                        rank=self.rank)
        self.steps = total_steps(train, strategy)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.steps))
        self.interval = checkpoint_interval(train, self.steps)
        self.planner = interval_planner(job, self.model, self.optimizer)  # before the state is loaded
        self.layout = DataLayout(micro_batch=strategy.micro_batch, grad_accum=strategy.grad_accum,
                                 world_size=self.world)
        self.per_step_tokens = self.layout.sequences_per_step * train.seq_len
        self.autocast = autocast_dtype(strategy, self.sharded)
        self.scaler = torch.amp.GradScaler(self.device.type) if precision_kind(strategy.precision).loss_scaling \
            else None
        # The spec and strategy travel with every checkpoint, so `gpuplan export` can rebuild the model from it.
        self.meta: dict[str, Any] = {
            "job_id": job.job_id, "model": self.source.config.id, "world_size": self.world,
            "spec": job.spec.model_dump(mode="json"), "strategy": strategy.model_dump(mode="json"),
            "model_config": self.source.config.model_dump(mode="json"),
            # a random-init base is drawn there (prepare_model): the same seed draws other weights elsewhere
            "base_drawn_on": build_device(strategy, self.source, self.device).type}

    def _resume(self) -> None:
        """Where this attempt starts: the newest checkpoint's step, data position, tokens and loss."""
        loaded = load_state(self.store, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                            sharded=self.sharded)
        self.step, self.position, self.tokens, self.loss_value = 0, 0, 0, None
        self.resumed_from = None
        if loaded is None and self.weights_pending:  # no checkpoint verified after all: draw them as a start does
            fill_weights(self.model, self.strategy, self.train_spec.seed, self.source)
        if loaded is not None:
            self.step, self.position, self.tokens, self.loss_value = (loaded.step, loaded.data_position,
                                                                      loaded.tokens, loaded.loss)
            self.resumed_from = loaded.step
        self.saved_split = loaded.split if loaded is not None else None
        self.checkpoints, self.last_saved, self.save_s = 0, self.resumed_from, 0.0
        self.steady_tokens, self.steady_s = 0, 0.0
        self.loop_began = None
        self.loop_tokens, self.attempt_tokens = 0, 0
        self.last_report = time.perf_counter()
        self.noticed, self.notice_logged, self.early_saved = False, False, False
        self.backoffs: list[dict[str, int]] = []
        self.network: tuple[str | None, float | None] | None = None  # NCCL's choice, read after the first step

    def log(self, line: str) -> None:
        if self.rank == 0:
            self.hooks.on_log(line)

    def _announce(self) -> None:
        """Say what runs where; start the checkpoint writer at the micro-batch split this attempt runs."""
        job, strategy = self.job, self.strategy
        self.log(f"job {job.job_id}: {self.source.config.id} on {self.world} x {self.device.type}, "
                 f"{strategy.label()}, {self.steps} steps of {self.per_step_tokens} tokens, "
                 f"data: {self.data.description}, PYTORCH_CUDA_ALLOC_CONF={self.alloc_conf}"
                 + (f"; resumed from the checkpoint of step {self.resumed_from}"
                    if self.resumed_from is not None else ""))
        if self.rank == 0:
            self.hooks.on_progress({"event": "started", "step": self.step, "total_steps": self.steps,
                                    "tokens": self.tokens, "resumed_from_step": self.resumed_from,
                                    "world_size": self.world})
        self.model.train()
        self.writer = CheckpointWriter(self.store, on_saved=self._saved)
        self.micro, self.accum = resume_split(strategy, self.saved_split)
        if (self.micro, self.accum) != (strategy.micro_batch, strategy.grad_accum):
            self.log(f"resuming at micro-batch {self.micro} x {self.accum} accumulation steps, where an earlier "
                     f"attempt backed off after a CUDA OOM (the plan's {strategy.micro_batch} x "
                     f"{strategy.grad_accum} would run out of memory again; same global batch)")
        self.meta["run_split"] = [self.micro, self.accum]  # saved with every checkpoint: a resume starts here

    def _saved(self, at: int, took: float) -> None:
        """In the writer thread, once the checkpoint is durable."""
        self.checkpoints += 1
        self.log(f"step {at}: checkpoint saved to {self.job.checkpoint_uri} ({took:.2f} s)")
        if self.rank == 0:
            self.hooks.on_progress({"event": "checkpoint", "step": at, "checkpoints": self.checkpoints})


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
                           state_bytes=state_bytes, write_gbps=job.checkpoint_write_gbps)
