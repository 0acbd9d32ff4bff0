"""Worker overhead: the worker's training loop against the same model and loop written bare in PyTorch.

Both runs build the same model (same seed), read the same batches, use AdamW, gradient clipping,
the same autocast, and read the loss every step. The bare loop has nothing else; the worker loop
adds its hooks, progress and checkpoints through the checkpoint store. Reported:

- loop ratio: worker tokens/s over training steps / bare tokens/s (first step excluded in both);
- measured ratio with checkpoints every ``--interval`` steps (save time in the window);
- checkpoint save and load time and size;
- projected ratio at the planned interval: Young/Daly, sqrt(2 x save time x MTBF), with --mtbf-h;
- from per-step host timestamps (rank 0's progress events, one per step): what each periodic
  (background) checkpoint cost the loop: the stop for the snapshot, and the steps slowed while the
  write ran, so the projection rests on measured periodic checkpoints, not on the blocking last one.

Runs without Ray (so it runs where Ray is not installed):

    python bench/workers/worker_overhead.py --device cpu --model tiny-llama --seq-len 128 --micro-batch 4 --steps 30
    python bench/workers/worker_overhead.py --device cuda --model llama-3.2-1b --precision amp-bf16 --seq-len 2048 \\
        --micro-batch 4 --steps 40 --interval 20
    # periodic checkpoints written in the background while training goes on (interval > write time):
    python bench/workers/worker_overhead.py --device cuda --model llama-3.2-1b --precision bf16 --seq-len 2048 \\
        --micro-batch 4 --steps 440 --interval 200 --bare-steps 60
    # issue 11's LoRA goals: the 8B LoRA r16 checkpoint's size (<= 1 GB: adapters and their optimizer
    # state only) and a one-hour on-demand run's wall efficiency at the default interval (>= 97%):
    python bench/workers/worker_overhead.py --device cuda --model llama-3-8b --precision bf16 --finetune lora \\
        --lora-rank 16 --seq-len 2048 --micro-batch 4 --steps 60 --interval 20 --bare-steps 30

``one_hour``: a one-hour run at the interval the workers choose by default (Young/Daly for the
on-demand mean time to preemption, workers.checkpoint.interval, from the measured stall and write
time), paying every periodic checkpoint's measured cost plus the final checkpoint's wait, as a
fraction of the loop's clean tokens/s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from planner.spec import spec_from_dict
from planner.types import Strategy
from workers.model.build import build_model, resolve_model_source
from workers.train.batches import DataLayout, TokenSource
from workers.train.hooks import TrainHooks
from workers.train.loop import TrainJob, run_training
from workers.train.setup import pick_device


def bare_loop(job: TrainJob, steps: int) -> float:
    """Tokens/s of a plain PyTorch loop over steps 2..N (same model, data, optimizer, precision)."""
    train, strategy = job.train, job.strategy
    device = pick_device(job.device)
    source = resolve_model_source(job.spec)
    weights = torch.bfloat16 if strategy.precision == "bf16" else torch.float32
    model = build_model(source, seed=train.seed, weights_dtype=weights, device=device)
    if strategy.finetune == "lora":
        from workers.model.build import apply_lora

        model = apply_lora(model, strategy.lora_rank).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=train.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    data = TokenSource(seq_len=train.seq_len, vocab_size=source.config.vocab_size, seed=train.seed)
    layout = DataLayout(micro_batch=strategy.micro_batch, grad_accum=strategy.grad_accum, world_size=1)
    autocast = strategy.precision == "amp-bf16"
    began = 0.0
    for step in range(steps):
        if step == 1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
        for accum in range(strategy.grad_accum):
            batch = data.batch(layout.first_index(step, accum, 0), strategy.micro_batch).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=batch, labels=batch).loss / strategy.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        float(loss.item())
    if device.type == "cuda":
        torch.cuda.synchronize()
    tokens = (steps - 1) * layout.sequences_per_step * train.seq_len
    return tokens / (time.perf_counter() - began)


class StepClock(TrainHooks):
    """Host clock at the end of every step (the loss is read, so the GPU is done), at the start of
    every checkpoint, and when each checkpoint became durable (from the writer thread)."""

    def __init__(self) -> None:
        self.step_end: dict[int, float] = {}
        self.ckpt_start: dict[int, float] = {}
        self.durable: dict[int, float] = {}

    def on_progress(self, progress: dict[str, Any]) -> None:
        now = time.perf_counter()
        if progress.get("event") == "step":
            self.step_end[int(progress["step"])] = now
        elif progress.get("event") == "checkpoint":
            self.durable[int(progress["step"])] = now

    def fault(self, step: int, where: str) -> None:
        if where == "checkpoint":
            self.ckpt_start[step] = time.perf_counter()


def periodic_checkpoint_costs(clock: StepClock, steps: int, tokens_per_step: int) -> dict[str, Any]:
    """What each periodic (non-final) checkpoint cost the loop, read off the step timestamps.

    Step k's time is end(k) - end(k-1); the step after checkpoint c carries its stop (snapshot into
    host memory, or a wait for an earlier write). Steps that ran while c's write was in flight show
    the write's interference (GIL, host memory bandwidth, PCIe). Step 1 (warm-up) is left out.
    """
    ends = clock.step_end
    dur = {k: ends[k] - ends[k - 1] for k in range(2, steps + 1) if k in ends and k - 1 in ends}
    periodic = sorted(c for c in clock.ckpt_start if c < steps and c in clock.durable)
    after = {c + 1 for c in periodic}
    during: set[int] = set()
    for c in periodic:
        during |= {k for k in dur if k not in after and ends[k - 1] >= clock.ckpt_start[c]
                   and ends[k] <= clock.durable[c]}
    clean = [v for k, v in dur.items() if k not in after and k not in during]
    if not clean:
        return {"periodic_checkpoints": len(periodic)}
    clean_mean = sum(clean) / len(clean)
    per: list[dict[str, float]] = []
    for c in periodic:
        slowed = [dur[k] for k in dur if k not in after and ends[k - 1] >= clock.ckpt_start[c]
                  and ends[k] <= clock.durable[c]]
        stop = dur.get(c + 1, clean_mean) - clean_mean
        interference = sum(v - clean_mean for v in slowed)
        per.append({"step": c, "stop_s": round(stop, 3), "write_s": round(clock.durable[c] - clock.ckpt_start[c], 2),
                    "steps_during_write": len(slowed),
                    "step_s_during_write": round(sum(slowed) / len(slowed), 4) if slowed else 0.0,
                    "interference_s": round(interference, 3), "cost_s": round(stop + interference, 3)})
    return {"periodic_checkpoints": len(periodic), "clean_steps": len(clean), "clean_step_s": round(clean_mean, 4),
            "clean_tokens_per_s": round(tokens_per_step / clean_mean, 1), "per_checkpoint": per}


def load_time(job: TrainJob) -> float:
    """Seconds to restore the newest checkpoint into a fresh model and optimizer."""
    from workers.checkpoint.local import open_store
    from workers.train.setup import lr_lambda, make_optimizer, prepare_model
    from workers.train.state_load import load_state

    device = pick_device(job.device)
    model, sharded, _ = prepare_model(job.strategy, job.train.seed, resolve_model_source(job.spec), device, 1)
    optimizer = make_optimizer(job.strategy.optimizer, [p for p in model.parameters() if p.requires_grad],
                                job.train.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(10))
    began = time.perf_counter()
    load_state(open_store(job.checkpoint_uri), model=model, optimizer=optimizer, scheduler=scheduler,
               sharded=sharded)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def one_hour(periodic: dict[str, Any], final_wait_s: float) -> dict[str, Any]:
    """Wall efficiency of a one-hour on-demand run at the workers' default interval, from the measured
    periodic checkpoints (their stall, write time and cost to the loop) and the final checkpoint's wait."""
    from planner.cost import checkpoint_interval_h
    from workers.checkpoint.interval import ON_DEMAND_MTTP_H

    per = periodic.get("per_checkpoint") or []
    if not per:
        return {"note": "no periodic checkpoint was measured: raise --steps or lower --interval"}
    stall = max(c["stop_s"] for c in per)
    write = max(c["write_s"] for c in per)
    cost = max(c["cost_s"] for c in per)
    interval_s = checkpoint_interval_h(max(stall, 1e-3) / 3600, write / 3600, ON_DEMAND_MTTP_H) * 3600
    hour = 3600.0
    checkpoints = math.floor(hour / interval_s)
    return {"default_interval_s": round(interval_s, 1), "periodic_checkpoints": checkpoints,
            "periodic_cost_s": round(cost, 3), "final_wait_s": round(final_wait_s, 3),
            "wall_efficiency": round(hour / (hour + checkpoints * max(cost, 0.0) + final_wait_s), 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "amp-bf16", "bf16"])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bare-steps", type=int, default=None, help="steps of each bare loop (default: --steps)")
    parser.add_argument("--interval", type=int, default=10, help="checkpoint every N steps in the worker run")
    parser.add_argument("--finetune", default="full", choices=["full", "lora"])
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--mtbf-h", type=float, default=4.0, help="mean time between preemptions for Young/Daly")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--json", dest="json_out", default=None, help="write the results here too")
    args = parser.parse_args()

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    tokens = args.steps * args.micro_batch * args.seq_len
    spec = spec_from_dict({"name": "overhead", "task": "train", "model": args.model,
                           "train": {"tokens": tokens, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
                                     "precision": args.precision, "checkpoint_interval_steps": args.interval}})
    strategy = Strategy(gpu="cpu" if args.device == "cpu" else "H200", gpu_count=1, precision=args.precision,
                        micro_batch=args.micro_batch, finetune=args.finetune, lora_rank=args.lora_rank)
    with tempfile.TemporaryDirectory(prefix="gpuplan-overhead-") as tmp:
        job = TrainJob(job_id="overhead", spec=spec, strategy=strategy, checkpoint_uri=str(Path(tmp) / "ck"),
                       device=args.device, cpu_threads=args.threads if args.device == "cpu" else None,
                       log_every_s=0.0)  # a progress event every step: the step clock below
        bare_steps = args.bare_steps or args.steps
        bare = bare_loop(job, bare_steps)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        clock = StepClock()
        result = run_training(job, clock)
        bare_again = bare_loop(job, bare_steps)  # bracket the worker run: drift shows as a spread
        if args.device == "cuda":
            torch.cuda.empty_cache()
        load_s = load_time(job)
        from workers.checkpoint.local import open_store

        latest = open_store(job.checkpoint_uri).latest()
        size = latest.size_bytes if latest else 0
    bare_mean = (bare + bare_again) / 2
    save_s = result.checkpoint_save_s / max(1, result.checkpoints_written)  # until durable
    blocking_s = result.checkpoint_blocking_s / max(1, result.checkpoints_written)  # training stopped
    step_s = args.micro_batch * args.seq_len / (result.steady_tokens_per_s or math.inf)
    planned_s = math.sqrt(2 * save_s * args.mtbf_h * 3600)  # Young/Daly
    planned_steps = max(1, round(planned_s / step_s)) if step_s > 0 else None
    loop_ratio = (result.steady_tokens_per_s or 0) / bare_mean
    # Periodic saves write in the background: the loop only stops for the snapshot (and for a
    # previous write still running). The last save of a run blocks, which this average includes.
    projected = loop_ratio * planned_s / (planned_s + blocking_s)
    periodic = periodic_checkpoint_costs(clock, result.steps, args.micro_batch * args.seq_len)
    measured_cost = [c["cost_s"] for c in periodic.get("per_checkpoint", [])]
    if measured_cost and periodic.get("clean_tokens_per_s"):
        # Every planned interval pays one periodic checkpoint's measured cost (stop + interference).
        cost = max(measured_cost)
        clean_ratio = float(periodic["clean_tokens_per_s"]) / bare_mean
        periodic["clean_loop_ratio"] = round(clean_ratio, 4)
        periodic["projected_ratio_at_planned_interval"] = round(clean_ratio * planned_s / (planned_s + cost), 4)
    final = result.steps
    final_wait_s = clock.durable[final] - clock.ckpt_start[final] if final in clock.durable and \
        final in clock.ckpt_start else blocking_s
    report_one_hour = one_hour(periodic, final_wait_s)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": args.model, "finetune": args.finetune, "lora_rank": args.lora_rank if args.finetune == "lora"
        else None, "precision": args.precision, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
        "steps": args.steps, "interval": args.interval, "bare_steps": bare_steps,
        "bare_tokens_per_s": [round(bare, 1), round(bare_again, 1)],
        "worker_step_tokens_per_s": round(result.steady_tokens_per_s or 0, 1),
        "worker_loop_tokens_per_s_with_checkpoints": round(result.loop_tokens_per_s or 0, 1),
        "loop_ratio": round(loop_ratio, 4),
        "measured_ratio_with_checkpoints": round((result.loop_tokens_per_s or 0) / bare_mean, 4),
        "checkpoints_written": result.checkpoints_written,
        "checkpoint_save_s": round(save_s, 3),
        "checkpoint_blocking_s": round(blocking_s, 3),
        "checkpoint_load_s": round(load_s, 3),
        "checkpoint_bytes": size,
        "planned_interval_s": round(planned_s, 1), "planned_interval_steps": planned_steps, "mtbf_h": args.mtbf_h,
        "projected_ratio_at_planned_interval": round(projected, 4),
        "peak_allocated_bytes": result.peak_allocated_bytes, "peak_reserved_bytes": result.peak_reserved_bytes,
        "periodic": periodic,
        "one_hour": report_one_hour,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
