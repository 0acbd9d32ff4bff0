"""Checkpoint speed of a real training state, against plain PyTorch on the same host and the same bytes.

Builds the model of ``--model`` (a catalog preset) with ``--precision`` weights and AdamW moments
on ``--device``, then measures, in one run:

  prepare    the host buffer (pinned on CUDA) allocated in the background after the first step, as
             the training loop does, with the loop's step time while it runs next to the step time after
  stall      what a periodic checkpoint stops the loop for: the snapshot into the reused host buffer
             (the first one included: the buffer was prepared in the background)
  durable    snapshot start -> committed (shards written by a thread pool, hashed while written,
             fsynced, marker, rename)
  baseline   plain ``torch.save`` of the same state as --shards files from 8 threads, from host memory
             (the device-to-host copy not counted: the floor for any host-side writer)
  load       ``load_state`` into the model: every shard read in parallel through pinned staging, verified,
             copied to the device (workers.checkpoint.read), then into the model and optimizer
  read       plain parallel read of the same checkpoint files (no hashing, the same thread count, into
             fresh host memory, nothing copied to the device): the floor for a load

GB/s next to each. On the H200 (issue 11: 1.24B llama-3.2-1b, amp-bf16, AdamW = 14.8 GB):

    python bench/workers/checkpoint_io.py --device cuda --model llama-3.2-1b --precision amp-bf16 \\
        --dir /dev/shm/ckbench --out $OUT/checkpoint_io.json

On CPU with a small model (numbers for the CPU path only):

    python bench/workers/checkpoint_io.py --device cpu --model tiny-llama --dir /tmp/ckbench --out /tmp/ck.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from planner.spec import spec_from_dict
from workers.checkpoint.local import LocalStore
from workers.checkpoint.threads import SHARD_THREADS
from workers.model.build import build_model, resolve_model_source
from workers.train.state_load import load_state
from workers.train.state_save import CheckpointWriter, flatten, plan_layout, prepare_state, save_state

GB = 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _parts(model_id: str, precision: str, device: torch.device) -> tuple[torch.nn.Module, Any, Any]:
    spec = spec_from_dict({"name": "ckbench", "task": "train", "model": model_id,
                           "train": {"tokens": 1024, "seq_len": 128, "precision": precision}})
    weights = torch.bfloat16 if precision == "bf16" else torch.float32
    model = build_model(resolve_model_source(spec), seed=0, weights_dtype=weights, device=device).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, optimizer, scheduler


def _step(model: torch.nn.Module, optimizer: Any, device: torch.device) -> None:
    """An optimizer step with random gradients: the moments exist and hold non-trivial bytes."""
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)


def _save(writer: CheckpointWriter, step: int, model: torch.nn.Module, optimizer: Any, scheduler: Any,
          device: torch.device, blocking: bool) -> None:
    save_state(writer, step=step, data_position=step, tokens=step, loss=None, model=model, optimizer=optimizer,
               scheduler=scheduler, sharded=False, extra_metadata={}, blocking=blocking,
               on_cpu=device.type == "cpu")


def _baseline_save(writer: CheckpointWriter, folder: Path, shards: int) -> float:
    """torch.save of the same tensors (from the host snapshot) as ``shards`` files from 8 threads."""
    assert writer.buffer.layout is not None
    layout = writer.buffer.layout
    tensors = [writer.buffer.buffers[s.shard][s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape)
               for s in layout.slots]
    plan = plan_layout(tensors, shards)
    groups: list[dict[str, torch.Tensor]] = [{} for _ in plan.shard_bytes]
    for index, (slot, tensor) in enumerate(zip(plan.slots, tensors, strict=True)):
        groups[slot.shard][str(index)] = tensor
    folder.mkdir(parents=True)

    def write(index: int) -> None:
        path = folder / f"shard-{index:02d}.pt"
        torch.save(groups[index], path)
        with path.open("rb+") as fh:
            os.fsync(fh.fileno())

    began = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(len(groups))))
    return time.perf_counter() - began


def _plain_read(folder: Path) -> float:
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    began = time.perf_counter()
    with ThreadPoolExecutor(SHARD_THREADS) as pool:
        list(pool.map(lambda f: len(f.read_bytes()), files))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--precision", default="amp-bf16", choices=["fp32", "amp-bf16", "bf16"])
    parser.add_argument("--repeats", type=int, default=3, help="periodic checkpoints measured")
    parser.add_argument("--shards", type=int, default=16, help="files of the plain torch.save baseline")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: 1 on CPU, where OpenMP spinning fights the writer threads)")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.threads or device.type == "cpu":
        torch.set_num_threads(args.threads or 1)
    shutil.rmtree(args.dir, ignore_errors=True)
    model, optimizer, scheduler = _parts(args.model, args.precision, device)
    _step(model, optimizer, device)
    state_bytes = sum(t.numel() * t.element_size() for t in _live_tensors(model, optimizer))
    print(f"state: {state_bytes / GB:.2f} GB in {len(_live_tensors(model, optimizer))} tensors", flush=True)

    store = LocalStore(args.dir / "store", keep=1)
    writer = CheckpointWriter(store)
    # As the loop does after its first step: the buffer is pinned in the background while steps run.
    began = time.perf_counter()
    prepare_state(writer, model=model, optimizer=optimizer, sharded=False)
    during: list[float] = []
    while not writer.buffer.ready:
        step_began = time.perf_counter()
        _step(model, optimizer, device)
        during.append(time.perf_counter() - step_began)
    writer.buffer.wait_prepared()
    prepare_wall = time.perf_counter() - began
    after: list[float] = []
    for _ in range(max(3, min(len(during), 10))):
        step_began = time.perf_counter()
        _step(model, optimizer, device)
        after.append(time.perf_counter() - step_began)
    print(f"buffer prepared in the background: {writer.buffer.prepare_s or 0:.3f} s; {len(during)} steps ran"
          f" meanwhile ({_mean(during):.3f} s each; {_mean(after):.3f} s after)", flush=True)
    stalls: list[float] = []
    durables: list[float] = []
    for step in range(1, args.repeats + 2):
        began = time.perf_counter()
        _save(writer, step, model, optimizer, scheduler, device, blocking=False)
        stalls.append(time.perf_counter() - began)
        writer.wait()  # nothing else runs meanwhile: the write's own time, as the baseline's
        durables.append(stalls[-1] + (writer.last_write_s or 0.0))
        saved_print = _fingerprint(model, optimizer)  # what a load must give back, bit for bit
        _step(model, optimizer, device)
        print(f"checkpoint {step}: stall {stalls[-1]:.3f} s, durable {durables[-1]:.3f} s", flush=True)

    baseline = []
    for rep in range(2):
        baseline.append(_baseline_save(writer, args.dir / f"baseline-{rep}", args.shards))
        shutil.rmtree(args.dir / f"baseline-{rep}")
        print(f"baseline torch.save x{args.shards}: {baseline[-1]:.3f} s", flush=True)

    latest = store.latest()
    assert latest is not None
    ckpt_dir = Path(latest.uri)
    reads = [_plain_read(ckpt_dir) for _ in range(2)]
    loads = []
    exact = True
    for _ in range(2):
        began = time.perf_counter()
        loaded = load_state(store, model=model, optimizer=optimizer, scheduler=scheduler, sharded=False)
        _sync(device)
        loads.append(time.perf_counter() - began)
        assert loaded is not None
        exact = exact and _fingerprint(model, optimizer) == saved_print
        print(f"load {loads[-1]:.3f} s (plain parallel read {min(reads):.3f} s)", flush=True)

    periodic = stalls[1:]
    durable = sorted(durables[1:])[len(durables[1:]) // 2]
    base = min(baseline)
    result = {
        "model": args.model, "precision": args.precision, "device": torch.cuda.get_device_name()
        if device.type == "cuda" else "cpu", "cpu_count": os.cpu_count(), "state_bytes": state_bytes,
        "files": len(latest.sha256), "dir": str(args.dir),
        "prepare": {"background_alloc_s": round(writer.buffer.prepare_s or 0.0, 3),
                    "wall_s": round(prepare_wall, 3), "steps_meanwhile": len(during),
                    "step_s_meanwhile": round(_mean(during), 4), "step_s_after": round(_mean(after), 4)},
        "stall_s": {"first": round(stalls[0], 3), "periodic_max": round(max(periodic), 3),
                    "periodic": [round(s, 3) for s in periodic]},
        "read_threads": SHARD_THREADS,
        "durable_s_median": round(durable, 3),
        "baseline_torch_save_s": round(base, 3),
        "durable_over_baseline": round(durable / base, 2),
        "load_s": round(min(loads), 3), "plain_read_s": round(min(reads), 3),
        "load_over_read": round(min(loads) / min(reads), 2), "load_bit_exact": exact,
        "gb_per_s": {"snapshot": round(state_bytes / GB / max(periodic), 2),
                     "durable": round(state_bytes / GB / durable, 2),
                     "baseline_torch_save": round(state_bytes / GB / base, 2),
                     "load": round(state_bytes / GB / min(loads), 2),
                     "plain_read": round(state_bytes / GB / min(reads), 2)},
    }
    shutil.rmtree(args.dir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def _fingerprint(model: torch.nn.Module, optimizer: Any) -> list[float]:
    """A float64 sum per tensor of the weights and optimizer state: a misplaced byte changes it."""
    return [float(t.double().sum()) for t in _live_tensors(model, optimizer)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _live_tensors(model: torch.nn.Module, optimizer: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    flatten({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out)
    return out


if __name__ == "__main__":
    main()
