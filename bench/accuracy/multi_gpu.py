"""Multi-GPU truth (issue 16): N local GPUs against the planner, in one command.

    python3 bench/accuracy/multi_gpu.py --gpus N --out $OUT/multi_N.json [--parts collectives,train,checkpoint,kill]
    python3 bench/accuracy/multi_gpu.py --gpus 2 --device cpu --out /tmp/multi_2.json      # a gloo dry run, tiny model

One process per rank (spawned, NCCL or gloo; no Ray, no torchrun), a fresh process group per run:

  collectives  all-gather, reduce-scatter and all-reduce of S bytes (the full buffer, as nccl-tests count it),
               time and bus bandwidth against the planner's communication model for the same bytes:
               an FSDP all-gather / reduce-scatter takes S (n-1)/n / (link x comm_efficiency) +
               fsdp_collective_s, a DDP all-reduce 2 S (n-1)/n / (link x ddp_comm_efficiency), with the
               link of planner.throughput.link_gbytes_per_s and the shipped calibration
  train        the planner's strategy for llama-3-8b on N x H200 (bench/accuracy/fsdp_run.planned), the other FSDP
               mode and DDP (LoRA, so it fits) forced, and on 8 a 70B preset when the planner and the
               worker's build both fit; each through workers.train.loop.run_training: peak allocated and
               reserved memory of every rank and steady tokens/s against the estimate
  checkpoint   the planner's FSDP state of --ckpt-model saved (workers.train.state_save.save_state, every rank
               its own shards, committed once all wrote) and loaded (load_state); GB/s per rank and total
  kill         a run checkpointing every 2 steps: (a) SIGKILL of the last rank once a checkpoint is
               committed, then resume; (b) SIGKILL of the last rank in the middle of writing its shards,
               then resume; each resume must start from the last committed step on every rank, never a
               partial one; (c) resume (b)'s checkpoint on another world size (N/2 ranks)

Progress goes to stdout; the JSON is rewritten after every part (a timeout keeps what finished). A markdown
table per part and a summary line against the issue's goals close the output.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp_run import planned, predicted

# NVLink multicast stays off on the lent machines (see the device notes)
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
GOALS = {"alloc_median": 5.0, "alloc_max": 12.0, "tok_median": 15.0, "tok_max": 35.0}
MIB, GIB = 2**20, 2**30
PARTS = ("collectives", "train", "checkpoint", "kill")


# ---------------------------------------------------------------------------------------- launching ranks


def _rank_entry(target: Callable[..., Any], rank: int, world: int, port: int, device: str, queue: Any,
                kwargs: dict[str, Any]) -> None:
    """One rank: a process group, ``target(rank, world, device, **kwargs)``, its answer on the queue, then an
    immediate exit (interpreter teardown can abort in torch's gloo destructors: tests/workers/ranks.py)."""
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    code = 0
    try:
        # the parent holds the rendezvous store (Ranks): a port picked free and bound later could be taken between
        store = dist.TCPStore("127.0.0.1", port, world_size=world, is_master=False)
        if device == "cuda":
            torch.cuda.set_device(rank)
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world,
                                    device_id=torch.device("cuda", rank))
        else:
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        answer = target(rank, world, device, **kwargs)
        queue.put((rank, answer))
        dist.destroy_process_group()
    except BaseException:
        code = 1
        queue.put((rank, {"error": traceback.format_exc(limit=6)}))
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Ranks:
    """``world`` spawned rank processes running ``target``; ``wait`` collects their answers by rank."""

    def __init__(self, target: Callable[..., Any], world: int, device: str, **kwargs: Any) -> None:
        import torch.distributed as dist

        ctx = multiprocessing.get_context("spawn")
        self.queue = ctx.Queue()
        # the rendezvous store's server, bound here on a port the OS picks and held for the ranks' lifetime
        self.store = dist.TCPStore("127.0.0.1", 0, world_size=world, is_master=True, wait_for_workers=False)
        port = self.store.port
        self.procs = [ctx.Process(target=_rank_entry, args=(target, r, world, port, device, self.queue, kwargs))
                      for r in range(world)]
        for proc in self.procs:
            proc.start()
        self.answers: dict[int, Any] = {}

    def _drain(self) -> None:
        while True:
            try:
                rank, answer = self.queue.get_nowait()
            except Exception:  # queue.Empty
                return
            self.answers[rank] = answer

    def kill(self, rank: int) -> None:
        pid = self.procs[rank].pid
        if pid is not None and self.procs[rank].exitcode is None:
            os.kill(pid, signal.SIGKILL)

    def kill_all(self) -> None:
        """What a launcher (torchrun) does once one rank of the job is gone: end the rest."""
        for rank in range(len(self.procs)):
            self.kill(rank)
        for proc in self.procs:
            proc.join()

    def wait(self, timeout_s: float, until: Callable[[], bool] | None = None) -> bool:
        """Until every rank exited (True), ``until()`` holds (True), or a rank failed (the rest are then
        ended, as a launcher does; False), or ``timeout_s`` passed (everything ended; False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._drain()
            if until is not None and until():
                return True
            live = [p for p in self.procs if p.exitcode is None]
            if not live:
                self._drain()
                return all(p.exitcode == 0 for p in self.procs)
            if any(p.exitcode not in (None, 0) for p in self.procs):
                self.kill_all()
                self._drain()
                return False
            multiprocessing.connection.wait([p.sentinel for p in live], timeout=0.05)
        self.kill_all()
        self._drain()
        return False

    def exitcodes(self) -> list[int | None]:
        return [p.exitcode for p in self.procs]


def run_ranks(target: Callable[..., Any], world: int, device: str, timeout_s: float, **kwargs: Any) -> list[Any]:
    ranks = Ranks(target, world, device, **kwargs)
    ok = ranks.wait(timeout_s)
    answers = [ranks.answers.get(r) for r in range(world)]
    if not ok or any(a is None or "error" in a for a in answers):
        errors = [a["error"] for a in answers if isinstance(a, dict) and "error" in a]
        raise RuntimeError(f"ranks failed (exit codes {ranks.exitcodes()}): " + (errors[0] if errors else "no answer"))
    return answers


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------------- 1. collectives


def link_and_calibration(world: int, gpu: str = "H200") -> tuple[float, Any]:
    """(per-GPU unidirectional link GB/s the planner assumes for ``world`` GPUs of one node, its
    throughput calibration)."""
    from catalog.loader import load_catalog
    from planner.calibration import load_calibration
    from planner.throughput_train import link_gbytes_per_s

    spec = load_catalog().gpu(gpu)
    cal = load_calibration().for_vendor(spec.vendor).throughput
    return link_gbytes_per_s(spec, world, min(world, 8), 100.0), cal


def predicted_collective(op: str, nbytes: int, world: int, link_gbps: float, cal: Any) -> float:
    """Seconds the planner's communication model (planner.throughput.train_step_parts) gives ``op`` of a
    ``nbytes`` buffer over ``world`` ranks: FSDP's all-gather / reduce-scatter at comm_efficiency of the
    link plus the fixed fsdp_collective_s each; DDP's ring all-reduce at ddp_comm_efficiency."""
    frac = (world - 1) / world
    if op == "all_reduce":
        return float(2 * frac * nbytes / (link_gbps * 1e9 * cal.ddp_comm_efficiency))
    return float(frac * nbytes / (link_gbps * 1e9 * cal.comm_efficiency) + cal.fsdp_collective_s)


def bus_gbps(op: str, nbytes: int, world: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth: the per-rank link rate the algorithm achieved."""
    return (2 if op == "all_reduce" else 1) * (world - 1) / world * nbytes / seconds / 1e9


def _collectives_rank(rank: int, world: int, device: str, sizes: list[int], iters: int) -> list[dict[str, Any]]:
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    rows: list[dict[str, Any]] = []
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        # FSDP gathers bf16 parameters and reduce-scatters fp32 gradients (MixedPrecisionPolicy); DDP fp32
        dtype = torch.bfloat16 if op == "all_gather" and device == "cuda" else torch.float32
        for nbytes in sizes:
            n = nbytes // (torch.finfo(dtype).bits // 8)
            full = torch.ones(n, dtype=dtype, device=dev)
            part = torch.ones(n // world, dtype=dtype, device=dev)
            for _ in range(2):
                _collective(op, full, part)
            _sync(device)
            dist.barrier()
            began = time.perf_counter()
            for _ in range(iters):
                _collective(op, full, part)
            _sync(device)
            took = torch.tensor([(time.perf_counter() - began) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's time is the collective's
            rows.append({"op": op, "bytes": nbytes, "seconds": float(took.item())})
    return rows


def _collective(op: str, full: Any, part: Any) -> None:
    import torch.distributed as dist

    if op == "all_gather":
        dist.all_gather_into_tensor(full, part)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(part, full)
    else:
        dist.all_reduce(full)


def part_collectives(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(float(v) * MIB) for v in args.sizes_mib.split(",")]
    align = args.gpus * 4
    sizes = [max(align, s // align * align) for s in sizes]
    link, cal = link_and_calibration(args.gpus)
    answers = run_ranks(_collectives_rank, args.gpus, args.device, args.part_timeout_s, sizes=sizes,
                        iters=args.iters)
    rows = []
    for row in answers[0]:
        pred = predicted_collective(row["op"], row["bytes"], args.gpus, link, cal)
        rows.append({**row, "mib": round(row["bytes"] / MIB, 3), "busbw_gbps": round(bus_gbps(
            row["op"], row["bytes"], args.gpus, row["seconds"]), 2), "predicted_s": pred,
            "predicted_busbw_gbps": round(bus_gbps(row["op"], row["bytes"], args.gpus, pred), 2),
            "error_pct": round(100 * (pred - row["seconds"]) / row["seconds"], 1)})
    return {"link_gbps": link, "comm_efficiency": cal.comm_efficiency,
            "ddp_comm_efficiency": cal.ddp_comm_efficiency, "fsdp_collective_s": cal.fsdp_collective_s,
            "model": "all-gather / reduce-scatter: S(n-1)/n / (link x comm_efficiency) + fsdp_collective_s; "
                     "all-reduce: 2S(n-1)/n / (link x ddp_comm_efficiency)", "rows": rows}


# ---------------------------------------------------------------------------------------- 2. train


def _train_rank(rank: int, world: int, device: str, job: Any, host_build: bool = False) -> dict[str, Any]:
    import resource

    import torch

    import workers.train.setup
    from workers.train.loop import run_training

    if host_build:  # as for a model bigger than one GPU: sharded full fine-tunes build it once, on rank 0's host
        workers.train.setup.build_device = lambda *_a, **_k: torch.device("cpu")
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = run_training(job)
    out = {k: result.to_dict()[k] for k in ("steps", "steady_tokens_per_s", "checkpoint_save_s", "world_size",
                                            "resumed_from_step", "checkpoint_step")}
    if device == "cuda":  # this rank's own peaks (the result's are the most loaded rank's)
        out["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    else:
        out["peak_allocated_bytes"] = out["peak_reserved_bytes"] = None
    out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def train_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """(name, model, pins) of the runs: the planner's pick, the other FSDP mode, DDP+LoRA and (on GPUs)
    FSDP+QLoRA forced, and a 70B preset on 8 GPUs."""
    first = {"name": "planner", "model": args.model, "pins": {}}
    pick = planned(args.model, args.gpus, args.gpu, seq_len=args.seq_len, steps=args.steps,
                   **_cpu_pins(args))[1].strategy.sharding
    cases = [first]
    for sharding in ("fsdp-grad-op", "fsdp"):
        if sharding != pick:
            cases.append({"name": f"forced {sharding}", "model": args.model, "pins": {"sharding": sharding}})
    if pick != "ddp":
        cases.append({"name": "forced ddp lora", "model": args.model,
                      "pins": {"sharding": "ddp", "finetune": "lora"}})
    if args.device == "cuda":  # NF4 under FSDP2 needs two ranks or more (torch's one-rank shortcut gathers
        # only the first of NF4's three all-gather inputs), so one GPU cannot check it: bench/results/workers/
        # host_build_2026-12-02.txt
        cases.append({"name": "forced fsdp qlora", "model": args.model,
                      "pins": {"sharding": "fsdp", "finetune": "qlora"}})
        # the path of models bigger than one GPU (workers.train.setup._sharded_from_rank0) over NCCL: rank 0
        # builds the weights on the host and broadcasts them; each rank's peak host memory is in the row
        cases.append({"name": "forced fsdp host build", "model": args.model, "pins": {"sharding": "fsdp"},
                      "host_build": True})
    if args.gpus >= 8 and args.big_model:
        cases.append({"name": "planner 70B-class", "model": args.big_model, "pins": {}})
    return cases


def _cpu_pins(args: argparse.Namespace) -> dict[str, Any]:
    """A CPU dry run pins what the H200's plan would make too slow here (fp32, a small micro-batch)."""
    return {"precision": "fp32", "micro_batch": 2} if args.device == "cpu" else {}


def _build_problem(model_id: str, strategy: Any, gpu: str, ckpt_root: str | None) -> str | None:
    """Why this run cannot go here: this host's RAM short of what the plan's own rule says a node needs (the
    model's host build, by rank 0 alone or by every rank, or the checkpoint snapshot: planner.host_memory),
    or of the end-of-run checkpoint's files."""
    from catalog.loader import load_catalog
    from catalog.params import count_params
    from planner.host_memory import HOST_RAM_SHARE, host_bytes_per_node

    catalog = load_catalog()
    counted = count_params(catalog.model(model_id))
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = host_bytes_per_node(counted, strategy, catalog.gpu(gpu), strategy.gpu_count)
    if need > HOST_RAM_SHARE * ram:
        return (f"the plan's host side needs {need / GIB:,.0f} GiB (planner.host_memory) > {HOST_RAM_SHARE:.0%} "
                f"of this host's {ram / GIB:,.0f} GiB")
    nbytes = counted.total * (2 if strategy.precision in ("bf16", "fp8") else 4)
    return _host_problem(counted.total, nbytes // counted.total, strategy, ckpt_root)


def _host_problem(params: int, weight_bytes: int, strategy: Any, ckpt_root: str | None) -> str | None:
    """Why the host cannot hold the run's end-of-run checkpoint (run_training always writes one): every
    rank pins a host buffer of its share of the state, and the files go to ``ckpt_root`` (RAM too when
    that is /dev/shm). The state: weights plus two AdamW moments of the trainable part (fp32, 8 bytes)."""
    trainable = params if strategy.finetune == "full" else params // 100
    state = params * weight_bytes + trainable * 8
    root = ckpt_root or tempfile.gettempdir()
    in_ram = root.startswith("/dev/shm")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = state * (2 if in_ram else 1)
    if need > 0.75 * ram:
        where = " + files in /dev/shm" if in_ram else ""
        return (f"its checkpoint of ~{state / 1e9:.0f} GB (pinned host buffers{where}) needs {need / 1e9:.0f} GB "
                f"of host RAM > 75% of {ram / 1e9:.0f} GB")
    if shutil.disk_usage(root).free < state * 1.05:
        return f"its checkpoint of ~{state / 1e9:.0f} GB does not fit the free space of {root}"
    return None


def part_train(args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    from workers.train.loop import TrainJob

    rows: list[dict[str, Any]] = []
    for case in train_cases(args):
        pins = {**_cpu_pins(args), **case["pins"]}
        finetune = pins.pop("finetune", "full")
        spec, est = planned(case["model"], args.gpus, args.gpu, seq_len=args.seq_len, steps=args.steps,
                            finetune=finetune, **pins)
        strategy = est.strategy
        if args.device == "cpu":
            strategy = strategy.model_copy(update={"activation_checkpointing": False})
        row: dict[str, Any] = {"case": case["name"], "model": case["model"], "strategy": strategy.label(),
                               "finetune": strategy.finetune, "micro_batch": strategy.micro_batch,
                               "grad_accum": strategy.grad_accum, "fits": est.memory.fits,
                               "predicted_peak_allocated_gib": est.memory.peak_allocated_bytes / GIB,
                               "predicted_peak_reserved_gib": est.memory.peak_reserved_bytes / GIB,
                               "predicted_tokens_per_s": est.throughput.tokens_per_s}
        problem = None if est.memory.fits else "the planner says it does not fit"
        root = args.ckpt_root
        if problem is None and args.device == "cuda":
            problem = _build_problem(case["model"], strategy, args.gpu, root)
            if problem and "host RAM" in problem and root and root.startswith("/dev/shm") \
                    and _build_problem(case["model"], strategy, args.gpu, None) is None:
                root, problem = None, None  # too big for /dev/shm next to the pinned buffers: the disk
        if problem is None and time.monotonic() + args.train_case_s > deadline:
            problem = f"skipped: less than {args.train_case_s:.0f} s of the time budget left"
        if problem:
            rows.append({**row, "skipped": problem})
            print(f"train {case['name']}: {problem}", flush=True)
            continue
        began = time.monotonic()
        row["checkpoint_root"] = root or tempfile.gettempdir()
        with tempfile.TemporaryDirectory(prefix="gpuplan-multi-", dir=root) as tmp:
            job = TrainJob(job_id="multi-gpu", spec=spec, strategy=strategy, checkpoint_uri=str(Path(tmp) / "ck"),
                           device=args.device, log_every_s=60.0, keep_checkpoints=1,
                           cpu_threads=1 if args.device == "cpu" else None, predicted=predicted(est))
            try:
                ranks = run_ranks(_train_rank, args.gpus, args.device, args.part_timeout_s, job=job,
                                  host_build=bool(case.get("host_build")))
            except RuntimeError as exc:
                rows.append({**row, "failed": str(exc)[-800:]})
                print(f"train {case['name']}: FAILED {str(exc)[-300:]}", flush=True)
                continue
        row.update(_train_measured(row, ranks), wall_s=round(time.monotonic() - began, 1))
        rows.append(row)
        print(f"train {case['name']}: {json.dumps(row)}", flush=True)
    return {"rows": rows}


def _train_measured(row: dict[str, Any], ranks: list[dict[str, Any]]) -> dict[str, Any]:
    alloc = [r["peak_allocated_bytes"] for r in ranks]
    reserved = [r["peak_reserved_bytes"] for r in ranks]
    out: dict[str, Any] = {"steps": ranks[0]["steps"], "world_size": ranks[0]["world_size"],
                           "checkpoint_save_s": ranks[0]["checkpoint_save_s"],
                           "measured_tokens_per_s": ranks[0]["steady_tokens_per_s"]}
    if all(a is not None for a in alloc):
        out["rank_peak_allocated_gib"] = [round(a / GIB, 2) for a in alloc]
        out["rank_peak_reserved_gib"] = [round(r / GIB, 2) for r in reserved]
        out["measured_peak_allocated_gib"] = max(alloc) / GIB
        out["measured_peak_reserved_gib"] = max(reserved) / GIB
        out["alloc_error_pct"] = _err(row["predicted_peak_allocated_gib"], out["measured_peak_allocated_gib"])
        out["reserved_error_pct"] = _err(row["predicted_peak_reserved_gib"], out["measured_peak_reserved_gib"])
    out["rank_peak_rss_gib"] = [round(r["peak_rss_bytes"] / GIB, 3) for r in ranks]
    if out["measured_tokens_per_s"]:
        out["tokens_error_pct"] = _err(row["predicted_tokens_per_s"], out["measured_tokens_per_s"])
    return out


def _err(predicted_value: float, measured: float) -> float:
    return round(100 * (predicted_value - measured) / measured, 1)


# ---------------------------------------------------------------------------------------- 3. checkpoint


def _checkpoint_rank(rank: int, world: int, device: str, spec: Any, strategy: Any, folder: str,
                     repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from workers.checkpoint.local import open_store
    from workers.model.build import resolve_model_source
    from workers.train.setup import configure_torch, make_optimizer, pick_device, prepare_model
    from workers.train.state_load import load_state
    from workers.train.state_save import CheckpointWriter, prepare_state, save_state

    dev = pick_device(device)
    configure_torch(dev, 1 if device == "cpu" else None)
    model, sharded, _ = prepare_model(strategy, 0, resolve_model_source(spec), dev, world)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(strategy.optimizer, params, 1e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    for p in params:  # one optimizer step: the moments exist, as in a real checkpoint
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    store = open_store(folder, keep=1)
    writer = CheckpointWriter(store)
    prepare_state(writer, model=model, optimizer=optimizer, sharded=sharded)
    writer.buffer.wait_prepared()
    saves, writes = [], []
    for step in range(1, repeats + 1):
        _sync(device)
        dist.barrier()
        began = time.perf_counter()
        save_state(writer, step=step, data_position=0, tokens=0, loss=None, model=model, optimizer=optimizer,
                   scheduler=scheduler, sharded=sharded, extra_metadata={}, blocking=True, on_cpu=device == "cpu")
        saves.append(time.perf_counter() - began)
        writes.append(writer.last_write_s or 0.0)
    dist.barrier()
    info = store.latest()
    assert info is not None
    prefix = f"rank-{rank:04d}/"
    mine = sum(size for rel, size in info.sizes.items() if rel.startswith(prefix))
    loads = []
    for _ in range(repeats):
        _sync(device)
        dist.barrier()
        began = time.perf_counter()
        loaded = load_state(store, model=model, optimizer=optimizer, scheduler=scheduler, sharded=sharded)
        _sync(device)
        loads.append(time.perf_counter() - began)
        assert loaded is not None and loaded.step == repeats
    return {"sharded": sharded, "bytes": mine, "total_bytes": sum(info.sizes.values()), "files": len(info.sizes),
            "save_s": min(saves), "write_s": min(writes), "load_s": min(loads)}


def part_checkpoint(args: argparse.Namespace) -> dict[str, Any]:
    pins = {**_cpu_pins(args), "sharding": "fsdp"}
    spec, est = planned(args.ckpt_model, args.gpus, args.gpu, seq_len=args.seq_len, steps=1, **pins)
    strategy = est.strategy.model_copy(update={"activation_checkpointing": False})
    with tempfile.TemporaryDirectory(prefix="gpuplan-multi-ck-", dir=args.ckpt_root) as tmp:
        ranks = run_ranks(_checkpoint_rank, args.gpus, args.device, args.part_timeout_s, spec=spec,
                          strategy=strategy, folder=str(Path(tmp) / "ck"), repeats=args.ckpt_repeats)
    total = ranks[0]["total_bytes"]
    save_wall, load_wall = max(r["save_s"] for r in ranks), max(r["load_s"] for r in ranks)
    per_rank = [{"rank": i, "gb": round(r["bytes"] / 1e9, 3), "save_s": round(r["save_s"], 3),
                 "load_s": round(r["load_s"], 3), "save_gbps": round(r["bytes"] / 1e9 / r["save_s"], 2),
                 "load_gbps": round(r["bytes"] / 1e9 / r["load_s"], 2)} for i, r in enumerate(ranks)]
    return {"model": args.ckpt_model, "strategy": strategy.label(), "dir": args.ckpt_root or tempfile.gettempdir(),
            "files": ranks[0]["files"], "total_gb": round(total / 1e9, 3), "per_rank": per_rank,
            "save_s": round(save_wall, 3), "load_s": round(load_wall, 3),
            "total_save_gbps": round(total / 1e9 / save_wall, 2), "total_load_gbps": round(total / 1e9 / load_wall, 2)}


# ---------------------------------------------------------------------------------------- 4. kill


class _KillHooks:
    """Training hooks of the kill runs: record the step this attempt started at; park every rank after
    ``hold`` steps (the parent kills them there); SIGKILL this process once it has written half of its
    shards of the checkpoint of ``die_in_save`` (the store's write patched in this rank's process only)."""

    def __init__(self, rank: int, marks: str, hold: int | None, die_in_save: int | None) -> None:
        from workers.train.hooks import TrainHooks

        class Hooks(TrainHooks):
            started = False

            def fault(self, step: int, where: str) -> None:
                if not self.started:
                    self.started = True
                    _mark(marks, f"started-{rank}", step)
                if hold is not None and (step, where) == (hold, "backward"):
                    _mark(marks, f"held-{rank}", step)
                    while True:
                        time.sleep(0.05)

        self.hooks = Hooks()
        if die_in_save is not None:
            import workers.checkpoint.local as ck

            original = ck._LocalStaged.write

            def write(staged: Any, shards: Any) -> Any:
                if staged._step == die_in_save:
                    half = max(1, len(shards) // 2)
                    original(staged, shards[:half])  # some of this rank's files are on disk, not all
                    _mark(marks, f"dying-{rank}", half)
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(staged, shards)

            ck._LocalStaged.write = write  # type: ignore[method-assign,assignment]


def _mark(folder: str, name: str, value: int) -> None:
    path = Path(folder) / name
    path.with_suffix(".tmp").write_text(str(value))
    os.replace(path.with_suffix(".tmp"), path)


def _read_marks(folder: str, prefix: str) -> dict[int, int]:
    return {int(p.name.rsplit("-", 1)[1]): int(p.read_text()) for p in Path(folder).glob(f"{prefix}-*")
            if not p.name.endswith(".tmp")}


def _kill_rank(rank: int, world: int, device: str, job: Any, marks: str, hold: int | None,
               die_in_save: int | None) -> dict[str, Any]:
    from workers.train.loop import run_training

    hooks = _KillHooks(rank, marks, hold, die_in_save if rank == world - 1 else None).hooks
    result = run_training(job, hooks)
    return {"resumed_from_step": result.resumed_from_step, "steps": result.steps, "world_size": result.world_size}


def on_disk(folder: Path) -> dict[str, Any]:
    """Committed step directories (with their COMMIT marker) and partial saves (temp directories)."""
    from workers.checkpoint.format import MARKER, parse_step_dirname

    committed, partial = [], []
    for entry in sorted(folder.iterdir()) if folder.exists() else []:
        step = parse_step_dirname(entry.name)
        if step is not None and (entry / MARKER).exists():
            committed.append(step)
        elif entry.name.startswith(".tmp-step-"):
            files = sorted(str(f.relative_to(entry)) for f in entry.rglob("*") if f.is_file())
            partial.append({"step": int(entry.name.split("-")[2]), "files": len(files),
                            "ranks": sorted({f.split("/")[0] for f in files if "/" in f})})
    return {"committed": sorted(committed), "partial": partial}


def part_kill(args: argparse.Namespace) -> dict[str, Any]:
    from workers.train.loop import TrainJob

    world, victim, interval, steps = args.gpus, args.gpus - 1, 2, args.kill_steps
    hold, die_at = 2 * interval, 3 * interval  # park after step 4 (committed); die while saving step 6
    pins = {**_cpu_pins(args), "sharding": "fsdp"}
    spec, est = planned(args.kill_model, world, args.gpu, seq_len=args.seq_len, steps=steps, interval=interval,
                        **pins)
    strategy = est.strategy.model_copy(update={"activation_checkpointing": False})
    out: dict[str, Any] = {"model": args.kill_model, "strategy": strategy.label(), "interval_steps": interval,
                           "total_steps": steps, "victim_rank": victim}
    with tempfile.TemporaryDirectory(prefix="gpuplan-multi-kill-", dir=args.ckpt_root) as tmp:
        root, ck = Path(tmp), Path(tmp) / "ck"

        def job(strat: Any) -> Any:
            return TrainJob(job_id="multi-kill", spec=spec, strategy=strat, checkpoint_uri=str(ck),
                            device=args.device, log_every_s=60.0, keep_checkpoints=3,
                            cpu_threads=1 if args.device == "cpu" else None)

        def marks(name: str) -> str:
            folder = root / name
            folder.mkdir()
            return str(folder)

        # (a) every rank parks after step `hold`; once that checkpoint is committed, SIGKILL the victim
        m_a = marks("a")
        ranks = Ranks(_kill_rank, world, args.device, job=job(strategy), marks=m_a, hold=hold, die_in_save=None)
        ready = ranks.wait(args.part_timeout_s, until=lambda: len(_read_marks(m_a, "held")) == world
                           and hold in on_disk(ck)["committed"])
        assert ready, f"the run never reached a committed step {hold}: exit codes {ranks.exitcodes()}, {ranks.answers}"
        ranks.kill(victim)
        ranks.procs[victim].join()
        victim_code = ranks.procs[victim].exitcode
        ranks.kill_all()
        after_a = on_disk(ck)
        print(f"kill (a): rank {victim} SIGKILLed (exit {victim_code}) after step {hold} was committed; "
              f"on disk {after_a}", flush=True)

        # (b) resume; the victim SIGKILLs itself half-way through writing its shards of step `die_at`
        m_b = marks("b")
        ranks = Ranks(_kill_rank, world, args.device, job=job(strategy), marks=m_b, hold=None, die_in_save=die_at)
        ranks.wait(args.part_timeout_s)  # the victim dies; the launcher ends the rest
        after_b = on_disk(ck)
        started_b = _read_marks(m_b, "started")
        dying = _read_marks(m_b, "dying")
        print(f"kill (b): resumed at {started_b} (by rank); rank {victim} died writing step {die_at} "
              f"({dying.get(victim)} files written); exit codes {ranks.exitcodes()}; on disk {after_b}", flush=True)
        reshard_src = root / "reshard"
        shutil.copytree(ck, reshard_src, ignore=shutil.ignore_patterns(".tmp-*"))

        # (c) resume on the same world size: must start from the last committed step, never the partial one
        m_c = marks("c")
        resumed = run_ranks(_kill_rank, world, args.device, args.part_timeout_s, job=job(strategy), marks=m_c,
                            hold=None, die_in_save=None)
        started_c = _read_marks(m_c, "started")
        last_b = max(after_b["committed"]) if after_b["committed"] else None
        out["after_commit"] = {"killed_after_step": hold, "victim_exit": victim_code, "on_disk": after_a,
                               "last_complete_step": max(after_a["committed"]),
                               "resumed_from_step_by_rank": [started_b.get(r) for r in range(world)]}
        out["during_save"] = {"killed_in_save_of_step": die_at, "victim_files_written": dying.get(victim),
                              "exit_codes": ranks.exitcodes(), "on_disk": after_b, "last_complete_step": last_b,
                              "partial_steps": [p["step"] for p in after_b["partial"]],
                              "resumed_from_step_by_rank": [r["resumed_from_step"] for r in resumed],
                              "started_at_by_rank": [started_c.get(r) for r in range(world)],
                              "finished_steps": resumed[0]["steps"]}
        a_ok = all(s == out["after_commit"]["last_complete_step"] for s in out["after_commit"]
                   ["resumed_from_step_by_rank"])
        b = out["during_save"]
        b_ok = (die_at not in after_b["committed"] and all(s == last_b for s in b["resumed_from_step_by_rank"])
                and all(s == last_b for s in b["started_at_by_rank"]) and b["finished_steps"] == steps)
        out["resume_ok"] = {"after_commit": a_ok, "during_save": b_ok}

        # (d) the checkpoint of (b) on another world size, the same global batch
        other = max(1, world // 2)
        reshard = strategy.model_copy(update={"gpu_count": other, "grad_accum": strategy.grad_accum * world // other,
                                              "sharding": strategy.sharding if other > 1 else "none"})
        d_job = TrainJob(job_id="multi-kill", spec=spec, strategy=reshard, checkpoint_uri=str(reshard_src),
                         device=args.device, log_every_s=60.0, cpu_threads=1 if args.device == "cpu" else None)
        try:
            grown = run_ranks(_kill_rank, other, args.device, args.part_timeout_s, job=d_job, marks=marks("d"),
                              hold=None, die_in_save=None)
            out["other_world_size"] = {"world_size": other, "strategy": reshard.label(),
                                       "resumed_from_step": grown[0]["resumed_from_step"],
                                       "finished_steps": grown[0]["steps"],
                                       "ok": grown[0]["resumed_from_step"] == last_b and grown[0]["steps"] == steps}
        except RuntimeError as exc:
            out["other_world_size"] = {"world_size": other, "ok": False, "error": str(exc)[-800:]}
    out["passed"] = a_ok and b_ok and bool(out["other_world_size"]["ok"])
    return out


# ---------------------------------------------------------------------------------------- tables


def _f(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def tables(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    n = doc["gpus"]
    if "collectives" in doc and "rows" in doc["collectives"]:
        c = doc["collectives"]
        lines += [f"Collectives on {n} x {doc['device_name']} (model: link {c['link_gbps']:.0f} GB/s, "
                  f"comm_efficiency {c['comm_efficiency']}, ddp_comm_efficiency {c['ddp_comm_efficiency']:.3f}, "
                  f"fsdp_collective_s {c['fsdp_collective_s'] * 1e3:.2f} ms)", "",
                  "| op | MiB | measured ms | bus GB/s | model ms | model bus GB/s | model error |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in c["rows"]:
            lines.append(f"| {r['op']} | {_f(r['mib'], 2)} | {_f(r['seconds'] * 1e3, 3)} | "
                         f"{_f(r['busbw_gbps'])} | {_f(r['predicted_s'] * 1e3, 3)} | {_f(r['predicted_busbw_gbps'])} | "
                         f"{r['error_pct']:+.1f}% |")
        lines.append("")
    if "train" in doc and "rows" in doc["train"]:
        lines += [f"Training on {n} x {doc['device_name']} (most loaded rank; per-rank peaks in the JSON)", "",
                  "| case | model | strategy | steps | alloc GiB pred / meas (err) | reserved GiB pred / meas (err) "
                  "| tokens/s pred / meas (err) |", "|---|---|---|---:|---|---|---|"]
        for r in doc["train"]["rows"]:
            if "skipped" in r or "failed" in r:
                lines.append(f"| {r['case']} | {r['model']} | {r['strategy']} | - | "
                             f"{r.get('skipped') or 'FAILED: ' + r['failed'].splitlines()[-1][:120]} | | |")
                continue
            tune = "" if r["finetune"] == "full" else " " + r["finetune"]
            lines.append(
                f"| {r['case']} | {r['model']} | {r['strategy']}{tune} | "
                f"{r['steps']} | "
                f"{_f(r['predicted_peak_allocated_gib'])} / {_f(r.get('measured_peak_allocated_gib'))} "
                f"({_pct(r.get('alloc_error_pct'))}) | {_f(r['predicted_peak_reserved_gib'])} / "
                f"{_f(r.get('measured_peak_reserved_gib'))} ({_pct(r.get('reserved_error_pct'))}) | "
                f"{_f(r['predicted_tokens_per_s'], 0)} / {_f(r.get('measured_tokens_per_s'), 0)} "
                f"({_pct(r.get('tokens_error_pct'))}) |")
        lines.append("")
    if "checkpoint" in doc and "per_rank" in doc["checkpoint"]:
        ck = doc["checkpoint"]
        lines += [f"Sharded checkpoint on {n} ranks: {ck['model']} {ck['strategy']}, {ck['total_gb']} GB in "
                  f"{ck['files']} files under {ck['dir']}", "",
                  "| rank | GB | save s | save GB/s | load s | load GB/s |", "|---|---:|---:|---:|---:|---:|"]
        for r in ck["per_rank"]:
            lines.append(f"| {r['rank']} | {r['gb']} | {r['save_s']} | {r['save_gbps']} | {r['load_s']} | "
                         f"{r['load_gbps']} |")
        lines += [f"| total | {ck['total_gb']} | {ck['save_s']} | {ck['total_save_gbps']} | {ck['load_s']} | "
                  f"{ck['total_load_gbps']} |", ""]
    if "kill" in doc and "passed" in doc["kill"]:
        k = doc["kill"]
        a, b, d = k["after_commit"], k["during_save"], k["other_world_size"]
        lines += [f"Kill and resume on {n} ranks: {k['model']} {k['strategy']}, a checkpoint every "
                  f"{k['interval_steps']} steps, SIGKILL of rank {k['victim_rank']}", "",
                  "| scenario | committed on disk | partial saves | last complete | resumed from (by rank) | ok |",
                  "|---|---|---|---:|---|---|",
                  f"| killed after step {a['killed_after_step']} committed | {a['on_disk']['committed']} | "
                  f"{[p['step'] for p in a['on_disk']['partial']]} | {a['last_complete_step']} | "
                  f"{a['resumed_from_step_by_rank']} | {k['resume_ok']['after_commit']} |",
                  f"| killed writing step {b['killed_in_save_of_step']} | {b['on_disk']['committed']} | "
                  f"{b['partial_steps']} | {b['last_complete_step']} | {b['resumed_from_step_by_rank']} | "
                  f"{k['resume_ok']['during_save']} |",
                  f"| resumed on {d['world_size']} rank(s) | | | {b['last_complete_step']} | "
                  f"{[d.get('resumed_from_step')]} | {d['ok']} |", ""]
    lines.append(summary(doc))
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def summary(doc: dict[str, Any]) -> str:
    parts = [f"Summary ({doc['gpus']} x {doc['device_name']}):"]
    rows = [r for r in doc.get("train", {}).get("rows", []) if "steps" in r]
    alloc = [abs(r["alloc_error_pct"]) for r in rows if r.get("alloc_error_pct") is not None]
    tok = [abs(r["tokens_error_pct"]) for r in rows if r.get("tokens_error_pct") is not None]
    if alloc:
        ok = statistics.median(alloc) <= GOALS["alloc_median"] and max(alloc) <= GOALS["alloc_max"]
        parts.append(f"allocated |err| median {statistics.median(alloc):.1f}% max {max(alloc):.1f}% "
                     f"(goal 5%/12%: {'MET' if ok else 'MISSED'});")
    if tok:
        ok = statistics.median(tok) <= GOALS["tok_median"] and max(tok) <= GOALS["tok_max"]
        parts.append(f"tokens/s |err| median {statistics.median(tok):.1f}% max {max(tok):.1f}% "
                     f"(goal 15%/35%: {'MET' if ok else 'MISSED'});")
    if doc["device"] == "cpu":
        parts.append("(CPU dry run: the predictions are the H200's, not comparable);")
    coll = doc.get("collectives", {}).get("rows", [])
    big = [r for r in coll if r["bytes"] == max(x["bytes"] for x in coll)]
    if big:
        parts.append("largest collectives model error " + ", ".join(f"{r['op']} {r['error_pct']:+.0f}%" for r in big)
                     + ";")
    if "checkpoint" in doc and "total_save_gbps" in doc["checkpoint"]:
        ck = doc["checkpoint"]
        parts.append(f"checkpoint {ck['total_save_gbps']} GB/s save, {ck['total_load_gbps']} GB/s load in total;")
    if "kill" in doc and "passed" in doc["kill"]:
        parts.append(f"kill/resume {'PASS' if doc['kill']['passed'] else 'FAIL'}.")
    failed = [p for p in PARTS if isinstance(doc.get(p), dict) and "error" in doc[p]]
    if failed:
        parts.append(f"parts that failed: {', '.join(failed)}.")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------- main


def _default_ckpt_root() -> str | None:
    """/dev/shm when it has room for an 8B FSDP state (~100 GB) and then some, else the temp dir."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return "/dev/shm" if free > 110e9 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a gloo dry run, tiny models")
    ap.add_argument("--gpu", default="H200", help="the catalog GPU the predictions are for")
    ap.add_argument("--model", default=None, help="train model (default llama-3-8b; tiny-llama on cpu)")
    ap.add_argument("--big-model", default="llama-3-70b", help="70B-class preset on 8 GPUs ('' for none)")
    ap.add_argument("--ckpt-model", default=None, help="checkpoint part (default llama-3.2-1b; tiny-llama on cpu)")
    ap.add_argument("--kill-model", default=None, help="kill part (default llama-3.2-1b; tiny-llama on cpu)")
    ap.add_argument("--seq-len", type=int, default=None, help="default 2048 (64 on cpu)")
    ap.add_argument("--steps", type=int, default=None, help="train steps per case (default 8; 4 on cpu)")
    ap.add_argument("--kill-steps", type=int, default=10)
    ap.add_argument("--sizes-mib", default=None, help="collective sizes (default 1,16,128,1024; 0.0625,1,4 on cpu)")
    ap.add_argument("--iters", type=int, default=None, help="timed iterations per collective (20; 3 on cpu)")
    ap.add_argument("--ckpt-repeats", type=int, default=2)
    ap.add_argument("--ckpt-root", default=None, help="where checkpoints go (default /dev/shm when roomy)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="no train case starts after this")
    ap.add_argument("--train-case-s", type=float, default=100.0, help="time a train case is assumed to need")
    ap.add_argument("--part-timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    args.model = args.model or ("tiny-llama" if cpu else "llama-3-8b")
    args.ckpt_model = args.ckpt_model or ("tiny-llama" if cpu else "llama-3.2-1b")
    args.kill_model = args.kill_model or ("tiny-llama" if cpu else "llama-3.2-1b")
    args.big_model = "" if cpu else args.big_model
    args.seq_len = args.seq_len or (64 if cpu else 2048)
    args.steps = args.steps or (4 if cpu else 8)
    args.sizes_mib = args.sizes_mib or ("0.0625,1,4" if cpu else "1,16,128,1024")
    args.iters = args.iters or (3 if cpu else 20)
    args.ckpt_root = args.ckpt_root or (None if cpu else _default_ckpt_root())
    for key, value in NO_MULTICAST.items():
        os.environ.setdefault(key, value)
    warnings.filterwarnings("ignore", category=FutureWarning)
    started = time.monotonic()
    deadline = started + args.budget_s
    doc: dict[str, Any] = {"gpus": args.gpus, "device": args.device, "device_name": _device_name(args.device),
                           "gpu_for_predictions": args.gpu, "env": {k: os.environ[k] for k in NO_MULTICAST},
                           "torch": _torch_version(), "args": {k: v for k, v in vars(args).items() if k != "out"}}
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "collectives": lambda: part_collectives(args), "train": lambda: part_train(args, deadline),
        "checkpoint": lambda: part_checkpoint(args), "kill": lambda: part_kill(args)}
    for part in args.parts.split(","):
        began = time.monotonic()
        print(f"== {part} ({began - started:.0f} s in)", flush=True)
        try:
            doc[part] = runners[part]()
        except Exception as exc:  # the other parts still run; the error is in the JSON
            doc[part] = {"error": f"{type(exc).__name__}: {exc}"[-1500:]}
            print(f"{part} FAILED: {doc[part]['error']}", flush=True)
        doc[part]["wall_s"] = round(time.monotonic() - began, 1)
        _write(args.out, doc)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["summary"] = summary(doc)
    _write(args.out, doc)
    print(tables(doc), flush=True)
    return 0 if all("error" not in doc[p] for p in args.parts.split(",")) else 1


def _write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else "cpu"


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


if __name__ == "__main__":
    raise SystemExit(main())
