"""A planned multi-GPU FSDP2 run, predicted vs measured: the planner's strategy run by the worker loop.

The planner's estimate for the pinned placement gives the strategy and its predictions; the same
strategy then runs through ``workers.train.loop.run_training`` on N local GPUs (NCCL, one process per
GPU, no Ray), and the measured peak memory (most loaded rank) and tokens/s are set beside them.

    python bench/accuracy/fsdp_run.py --gpus 2 --gpu H200 --model llama-3.2-1b --seq-len 2048 --micro-batch 4 --steps 20
    python bench/accuracy/fsdp_run.py --gpus 4 --gpu H200 --model llama-3-8b --sharding fsdp-grad-op --micro-batch 2
    python bench/accuracy/fsdp_run.py --gpus 2 --gpu H200 --model llama-3-8b --finetune qlora --precision bf16 \
        --sharding ddp
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def planned(model: str, gpus: int, gpu: str, *, seq_len: int, steps: int, micro_batch: int | None = None,
            precision: str | None = None, sharding: str | None = None, finetune: str = "full",
            activation_checkpointing: bool | None = None, interval: int | None = None) -> tuple[Any, Any]:
    """(spec, estimate) of ``steps`` steps of ``model`` on ``gpus`` x ``gpu``: what is None is the
    planner's pick (as `gpuplan estimate` resolves it); the token count is sized to ``steps`` steps of
    the chosen micro-batch, accumulation and data parallelism. ``interval``: checkpoint every so many
    steps (default: once, at the end)."""
    from catalog.loader import load_catalog
    from planner.calibration import load_calibration
    from planner.search import estimate
    from planner.spec import spec_from_dict

    train: dict[str, Any] = {"seq_len": seq_len, "finetune": finetune,
                             "checkpoint_interval_steps": interval or steps}
    pins = {"micro_batch": micro_batch, "precision": precision, "sharding": sharding,
            "activation_checkpointing": activation_checkpointing}
    train.update({k: v for k, v in pins.items() if v is not None})
    catalog, calibration = load_catalog(), load_calibration()

    def spec_for(tokens: int) -> Any:
        return spec_from_dict({"name": "fsdp-bench", "task": "train", "model": model,
                               "train": {"tokens": tokens, **train}})

    first = estimate(spec_for(seq_len * gpus), catalog, gpu, gpus, calibration=calibration).strategy
    tokens = steps * first.micro_batch * first.grad_accum * first.data_parallel * seq_len
    spec = spec_for(tokens)
    return spec, estimate(spec, catalog, gpu, gpus, calibration=calibration)


def predicted(est: Any) -> dict[str, float]:
    """The estimate's numbers a TrainJob carries (``TrainJob.predicted``)."""
    return {"peak_allocated_bytes": float(est.memory.peak_allocated_bytes),
            "peak_reserved_bytes": float(est.memory.peak_reserved_bytes),
            "tokens_per_s": est.throughput.tokens_per_s}


def _rank(rank: int, world: int, port: int, job: Any, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from workers.train.loop import run_training

    if job.device == "cuda":
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
    else:  # a CPU dry run of the same path, over gloo
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        result = run_training(job)
        if rank == 0:
            queue.put(result.to_dict())
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--gpu", default="H200")
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--precision", default="amp-bf16")
    parser.add_argument("--sharding", default="fsdp", choices=["ddp", "fsdp", "fsdp-grad-op"])
    parser.add_argument("--finetune", default="full", choices=["full", "lora", "qlora"])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--checkpoint-dir", default=None, help="default: a temp dir (use /dev/shm to spare disk)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a gloo dry run")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()

    import torch.multiprocessing as mp

    from workers.train.loop import TrainJob

    spec, est = planned(args.model, args.gpus, args.gpu, seq_len=args.seq_len, steps=args.steps,
                        micro_batch=args.micro_batch, precision=args.precision, sharding=args.sharding,
                        finetune=args.finetune, activation_checkpointing=False)
    strategy = est.strategy
    with tempfile.TemporaryDirectory(prefix="gpuplan-fsdp-", dir=args.checkpoint_dir) as tmp:
        job = TrainJob(job_id="fsdp-bench", spec=spec, strategy=strategy, checkpoint_uri=str(Path(tmp) / "ck"),
                       device=args.device, log_every_s=60.0, cpu_threads=1 if args.device == "cpu" else None,
                       predicted=predicted(est))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        procs = [ctx.Process(target=_rank, args=(r, args.gpus, port, job, queue)) for r in range(args.gpus)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        if any(p.exitcode != 0 for p in procs):
            print(f"a rank failed: exit codes {[p.exitcode for p in procs]}", file=sys.stderr)
            return 1
        result = queue.get()
    measured_alloc = result["peak_allocated_bytes"]
    report = {
        "placement": f"{args.gpus}x{args.gpu}", "model": args.model, "strategy": strategy.label(),
        "steps": result["steps"],
        "predicted_peak_allocated_gib": round(est.memory.peak_allocated_bytes / 2**30, 2),
        "measured_peak_allocated_gib": round(measured_alloc / 2**30, 2) if measured_alloc else None,
        "predicted_peak_reserved_gib": round(est.memory.peak_reserved_bytes / 2**30, 2),
        "measured_peak_reserved_gib": round(result["peak_reserved_bytes"] / 2**30, 2)
        if result["peak_reserved_bytes"] else None,
        "predicted_tokens_per_s": round(est.throughput.tokens_per_s, 1),
        "measured_tokens_per_s": round(result["steady_tokens_per_s"] or 0, 1),
        "checkpoint_save_s": round(result["checkpoint_save_s"], 2),
        "world_size": result["world_size"], "pid": os.getpid(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
