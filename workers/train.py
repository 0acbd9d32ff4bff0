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
import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
import torch.distributed as dist

from catalog.errors import GpuplanError, InvalidInput
from planner.cost import just_in_time_reserve_s
from planner.spec import JobSpec, TrainSpec
from planner.types import Strategy
from workers import nccl_net
from workers.checkpoint_interval import ON_DEMAND_MTTP_H, IntervalPlanner, default_write_gbps
from workers.cuda_env import configure_allocator
from workers.data import DataLayout, TokenSource, tokenizer_dir
from workers.hooks import OomBackoffEvent, Signal, TrainHooks
from workers.imds import AWS_NOTICE_LEAD_S
from workers.isolation import load_libraries
from workers.model import resolve_model_source
from workers.train_recovery import back_off, free_memory, resume_split, wait_for_teardown
from workers.train_result import TrainResult, peak_memory
from workers.train_setup import (
    autocast_dtype,
    build_device,
    check_supported,
    configure_torch,
    fill_weights,
    lr_lambda,
    make_optimizer,
    pick_device,
    prepare_model,
    set_grad_sync,
    world,
)
from workers.train_state import CheckpointWriter, prepare_state, save_state
from workers.train_state_load import load_state

Status = Literal["succeeded", "preempted", "cancelled", "stopped"]


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


def total_steps(train: TrainSpec, strategy: Strategy) -> int:
    tokens_per_step = strategy.micro_batch * strategy.grad_accum * strategy.data_parallel * train.seq_len
    return max(1, math.ceil(train.tokens / tokens_per_step))


def checkpoint_interval(train: TrainSpec, steps: int) -> int:
    """The spec's interval; else none before the step time is known (Young/Daly needs it)."""
    return train.checkpoint_interval_steps or steps


def run_training(job: TrainJob, hooks: TrainHooks | None = None) -> TrainResult:
    """Train ``job`` to its token count, resuming from the newest checkpoint in its store."""
    run = _Run(job, hooks or TrainHooks())
    try:
        status = run.train()
        run.writer.wait()  # the last checkpoints are durable before the run reports success
    except BaseException as exc:
        run.report_failure(exc)
        raise
    result = run.measure(status)
    if run.rank == 0:
        run.hooks.on_progress({"event": "finished", "result": result.to_dict()})
    return result


class _Run:
    """One attempt of a training run: its parts, where it stands, and what it measured so far."""

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

    # ------------------------------------------------------------------ setting up

    def _build(self) -> None:
        """The data, the store, the model, the optimizer and schedule, and the checkpoint interval."""
        from workers.checkpoint import open_store

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
        self.optimizer = make_optimizer(strategy.optimizer, self.params, train.learning_rate, seed=train.seed,
                                        precision=strategy.precision, finetune=strategy.finetune, rank=self.rank)
        self.steps = total_steps(train, strategy)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(self.steps))
        self.interval = checkpoint_interval(train, self.steps)
        self.planner = interval_planner(job, self.model, self.optimizer)  # before the state is loaded
        self.layout = DataLayout(micro_batch=strategy.micro_batch, grad_accum=strategy.grad_accum,
                                 world_size=self.world)
        self.per_step_tokens = self.layout.sequences_per_step * train.seq_len
        self.autocast = autocast_dtype(strategy, self.sharded)
        self.scaler = torch.amp.GradScaler(self.device.type) if strategy.precision == "amp-fp16" else None
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

    # ------------------------------------------------------------------ the loop

    def train(self) -> Status:
        """Steps until the token count is reached, a cancel, or a preemption."""
        while self.step < self.steps:
            began = time.perf_counter()
            total_loss = self._forward_backward()
            if total_loss is None:  # out of memory: backed off; the step is redone
                continue
            self.hooks.fault(self.step, "backward")
            self._optimizer_step()
            self._take_loss(total_loss)
            self._count_step(time.perf_counter() - began)
            if self.network is None:
                self._note_network()
            self._report_step()
            self._checkpoint_if_due()
            signal = self.hooks.poll()
            if signal is None or self.step >= self.steps:
                continue
            stopped = self._obey(signal)
            if stopped is not None:
                return stopped
        return "succeeded"

    def _forward_backward(self) -> torch.Tensor | None:
        """The step's summed loss, or None after a CUDA OOM (then the split was halved)."""
        out_of_memory = ""
        try:
            return self._accumulate()
        except torch.OutOfMemoryError as exc:
            out_of_memory = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        # outside the handler: the exception's frames (and their tensors) are gone
        self._back_off(out_of_memory)
        return None

    def _accumulate(self) -> torch.Tensor:
        """Forward and backward of the step's ``accum`` micro-batches; the gradients add up in .grad."""
        micro, accum, device = self.micro, self.accum, self.device
        total_loss = torch.zeros((), device=device)
        for a in range(accum):
            first = self.position + (a * self.world + self.rank) * micro
            batch = self.data.batch(first, micro).to(device, non_blocking=True)
            last = a == accum - 1
            self.hooks.before_forward(self.step, micro)
            with set_grad_sync(self.model, self.sharded, last or self.world == 1):
                with torch.autocast(device.type, dtype=self.autocast or torch.float32,
                                    enabled=self.autocast is not None):
                    # the mean over this micro-batch's tokens / accum: with equal-length sequences the sum
                    # over micro-batches is the step's mean, whatever the split (what makes a back-off exact)
                    loss = self.model(input_ids=batch, labels=batch).loss / accum
                self.hooks.fault(self.step, "forward")
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            total_loss += loss.detach().float()
        return total_loss

    def _back_off(self, why: str) -> None:
        """Halve the micro-batch after an OOM (same global batch), drop the partial step, and say so."""
        before = (self.micro, self.accum)
        self.micro, self.accum = back_off(self.step, self.micro, self.accum, self.world, why)
        self.optimizer.zero_grad(set_to_none=True)  # the partial step's gradients; the step is redone
        free_memory(self.device)
        self.backoffs.append({"step": self.step + 1, "from_micro_batch": before[0], "to_micro_batch": self.micro,
                              "from_grad_accum": before[1], "to_grad_accum": self.accum})
        self.meta["run_split"] = [self.micro, self.accum]
        self.log(f"step {self.step + 1}: CUDA out of memory at micro-batch {before[0]}; retrying the step at "
                 f"micro-batch {self.micro} x {self.accum} accumulation steps (same global batch: "
                 f"{self.micro * self.accum * self.world} sequences)")
        if self.rank == 0:
            self.hooks.on_progress(cast(OomBackoffEvent, {"event": "oom_backoff", **self.backoffs[-1]}))

    def _optimizer_step(self) -> None:
        try:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        except torch.OutOfMemoryError as exc:
            raise GpuplanError(
                f"CUDA ran out of memory in the optimizer step of step {self.step + 1} ({exc}); a smaller "
                "micro-batch does not shrink the optimizer's memory",
                hint="raise resources.memory_headroom, or use a lighter optimizer (adamw-8bit, adafactor), "
                "lora, or more GPUs with fsdp sharding") from None
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.hooks.fault(self.step, "optimizer")

    def _take_loss(self, total_loss: torch.Tensor) -> None:
        """The step's loss, averaged over the ranks; a loss that is not finite ends the run."""
        if self.world > 1:
            dist.all_reduce(total_loss, op=dist.ReduceOp.SUM)
            total_loss /= self.world
        self.loss_value = float(total_loss.item())
        if not math.isfinite(self.loss_value):
            raise GpuplanError(f"the loss became {self.loss_value} at step {self.step + 1}",
                               hint="lower train.learning_rate or use a wider precision (fp32 or amp-bf16)")

    def _count_step(self, elapsed: float) -> None:
        """Advance past a finished step; time it (the first step of an attempt apart) and re-derive the
        checkpoint interval once two steady steps are timed."""
        self.step += 1
        self.position += self.layout.sequences_per_step
        self.tokens += self.per_step_tokens
        self.attempt_tokens += self.per_step_tokens
        first = self.resumed_from or 0
        if self.step > first + 1:  # the first step pays for allocation and warm-up
            self.steady_tokens += self.per_step_tokens
            self.steady_s += elapsed
            self.loop_tokens += self.per_step_tokens
        else:
            self._pin_checkpoint_buffer()
        if not self.planner.pinned and self.step == first + 3:  # two steady steps: their time is known
            self.interval = agree_interval(self.planner.steps(self.steady_s / 2), self.device, self.world)

    def _pin_checkpoint_buffer(self) -> None:
        # The optimizer state exists now: pin the checkpoint buffer once, here, outside the timed
        # loop. Pinning holds up the GPU's work for its whole ~0.5 s/GB (H200: 14.8 GB took 7.2 s,
        # and a step running beside it took as long), so in the background it only moved the
        # stall into a training step; here it is start-up, and every checkpoint stalls ~0.3 s.
        prepare_state(self.writer, model=self.model, optimizer=self.optimizer, sharded=self.sharded)
        self.writer.buffer.wait_prepared()
        self.loop_began = time.perf_counter()

    def _note_network(self) -> None:
        """After the first step (NCCL has connected): which network each rank's NCCL chose, from its own INFO
        log (workers.nccl_net); the run keeps the slowest rank's, and says it."""
        mine = nccl_net.observed()
        every = [mine]
        # only where the cluster YAML asked NCCL for its log (the same node types for every rank of a run)
        if nccl_net.own_log() is not None and self.world > 1 and dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * self.world
            dist.all_gather_object(gathered, mine)  # every rank reaches its first step: a barrier all call
            every = [tuple(g) for g in gathered]
        known = [(net, gbps) for net, gbps in every if net is not None]
        self.network = min(known, key=lambda n: n[1] if n[1] is not None else float("inf")) if known else (None, None)
        if known:
            nets = sorted({net for net, _ in known if net})
            self.log(nccl_net.network_line(nets, self.network[1]))

    def _report_step(self) -> None:
        now = time.perf_counter()
        if self.rank != 0 or (now - self.last_report < self.job.log_every_s and self.step != self.steps):
            return
        self.last_report = now
        rate = self.steady_tokens / self.steady_s if self.steady_s > 0 else None
        self.hooks.on_progress({"event": "step", "step": self.step, "total_steps": self.steps,
                                "tokens": self.tokens, "loss": self.loss_value, "tokens_per_s": rate})
        self.hooks.on_log(f"step {self.step}/{self.steps} loss {self.loss_value:.4f}"
                          + (f" {rate:,.0f} tokens/s" if rate else ""))

    def _obey(self, signal: Signal) -> Status | None:
        """Act on a cancel, a changeover or a spot notice; the status that ends the loop, or None to carry on.

        A changeover and a spot notice take the same just-in-time checkpoint of this step (durable before
        the loop goes on); a changeover then ends the attempt, for the scheduler to start the next one
        elsewhere from exactly this step."""
        if signal.kind == "cancel":
            self.log(f"step {self.step}: cancelled")
            return "cancelled"
        if signal.kind == "changeover":
            self._checkpoint(self.step, blocking=True)
            self.log(f"step {self.step}: checkpoint saved; stopped for a changeover, the next attempt resumes here")
            return "stopped"
        if self.noticed:  # a notice stays up until the node goes; act on it once
            return None
        if signal.deadline is not None:
            when = time.strftime("%H:%M:%S", time.gmtime(signal.deadline))
            reserve = self._jit_reserve_s()
            if not agree_flag(signal.deadline - time.time() <= reserve, self.device, self.world):
                if not self.notice_logged:  # the notice leaves time to train: checkpoint when it runs out
                    self.notice_logged = True
                    self.log(f"step {self.step}: spot notice (node taken at {when} UTC); training on, the "
                             f"just-in-time checkpoint {reserve:.0f} s before")
                self._checkpoint_early(signal.deadline, reserve)
                return None
        self.noticed = True
        self._checkpoint(self.step, blocking=True)
        if signal.deadline is None:
            self.log(f"step {self.step}: preempted; just-in-time checkpoint saved, a resubmission resumes here")
            return "preempted"
        self.log(f"step {self.step}: spot notice (node taken at {when} UTC); just-in-time checkpoint saved, "
                 "waiting to move")
        wait_for_teardown(signal.deadline)
        return None

    def _checkpoint_early(self, deadline: float, reserve: float) -> None:
        """An early notice (AWS's rebalance recommendation: a deadline further off than any interruption
        notice gives) raises the odds of losing the node: checkpoint now, in the background, and train on."""
        if self.early_saved:
            return
        early = deadline - time.time() > AWS_NOTICE_LEAD_S + reserve
        if agree_flag(early, self.device, self.world):
            self.early_saved = True
            self._checkpoint(self.step)
            self.log(f"step {self.step}: early notice; checkpoint now, training on")

    def _jit_reserve_s(self) -> float:
        """How long before a notice's deadline the just-in-time checkpoint starts (planner.cost's rule), from
        this run's measured checkpoint and step times; the whole notice (checkpoint at once) before a step is
        timed."""
        step_s = self._steady_step_s()
        if step_s is None:
            return math.inf
        planner = self.planner
        stall = planner.measured_stall_s if planner.measured_stall_s is not None else planner.cost_s
        durable = planner.measured_durable_s if planner.measured_durable_s is not None else planner.cost_s
        return just_in_time_reserve_s(stall, durable, step_s)

    def _steady_step_s(self) -> float | None:
        """Seconds per optimizer step over the steady steps timed so far (None before one is)."""
        steps = self.steady_tokens // self.per_step_tokens
        return self.steady_s / steps if self.steady_s > 0 and steps > 0 else None

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_if_due(self) -> None:
        step, interval = self.step, self.interval
        due = step % interval == 0 if self.planner.pinned else step - (self.last_saved or 0) >= interval
        if due or step == self.steps:
            self._checkpoint(step, blocking=step == self.steps)

    def _checkpoint(self, at: int, blocking: bool = False) -> None:
        if self.last_saved == at:
            if blocking:
                self.writer.wait()
            return
        began = time.perf_counter()
        self.hooks.fault(at, "checkpoint")
        durable_before = self.writer.last_write_s
        save_state(self.writer, step=at, data_position=self.position, tokens=self.tokens, loss=self.loss_value,
                   model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, sharded=self.sharded,
                   extra_metadata=self.meta, blocking=blocking, on_cpu=self.device.type == "cpu")
        took = time.perf_counter() - began
        self.save_s += took
        self.last_saved = at
        if not blocking:
            self.planner.observe(stall_s=took, durable_s=durable_before)
            step_s = self._steady_step_s()
            if not self.planner.pinned and step_s is not None:
                self.interval = agree_interval(self.planner.steps(step_s), self.device, self.world)

    def _saved(self, at: int, took: float) -> None:
        """In the writer thread, once the checkpoint is durable."""
        self.checkpoints += 1
        self.log(f"step {at}: checkpoint saved to {self.job.checkpoint_uri} ({took:.2f} s)")
        if self.rank == 0:
            self.hooks.on_progress({"event": "checkpoint", "step": at, "checkpoints": self.checkpoints})

    # ------------------------------------------------------------------ the result

    def report_failure(self, exc: BaseException) -> None:
        """After an error: the checkpoints in flight finish, and rank 0 reports what it measured."""
        with contextlib.suppress(BaseException):  # keep the original error; a real crash loses the write
            self.writer.wait()
        if self.rank == 0 and isinstance(exc, Exception):
            with contextlib.suppress(Exception):  # what it measured up to the failure, next to the prediction
                failed = self.measure("failed", str(exc) or type(exc).__name__)
                self.hooks.on_progress({"event": "failed", "result": failed.to_dict()})

    def measure(self, status: Literal["succeeded", "preempted", "cancelled", "stopped", "failed"],
                error: str | None = None) -> TrainResult:
        wall = time.perf_counter() - self.started
        loop_s = time.perf_counter() - self.loop_began if self.loop_began is not None else 0.0
        peak_alloc, peak_reserved, peak_rss = peak_memory(self.device, self.world, error)
        steady_s, loop_tokens, attempt_tokens = self.steady_s, self.loop_tokens, self.attempt_tokens
        return TrainResult(
            status=status, steps=self.step, total_steps=self.steps, tokens=self.tokens,
            final_loss=self.loss_value, checkpoints_written=self.checkpoints, resumed_from_step=self.resumed_from,
            tokens_per_s=attempt_tokens / wall if attempt_tokens else None,
            steady_tokens_per_s=self.steady_tokens / steady_s if steady_s > 0 else None,
            loop_tokens_per_s=loop_tokens / loop_s if loop_tokens and loop_s > 0 else None,
            wall_s=wall, checkpoint_save_s=self.writer.write_s, checkpoint_blocking_s=self.save_s,
            checkpoint_interval_steps=self.interval, checkpoint_interval_s=self.planner.interval_s,
            checkpoint_stall_s=self.planner.measured_stall_s, checkpoint_durable_s=self.writer.last_write_s,
            peak_allocated_bytes=peak_alloc, peak_reserved_bytes=peak_reserved, peak_rss_bytes=peak_rss,
            predicted=dict(self.job.predicted), device=str(self.device.type), world_size=self.world,
            micro_batch=self.micro, grad_accum=self.accum, oom_backoffs=list(self.backoffs),
            cuda_alloc_conf=self.alloc_conf, error=error,
            nccl_network=(self.network or (None, None))[0], nccl_link_gbps=(self.network or (None, None))[1],
            checkpoint_step=self.last_saved,
        )


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
