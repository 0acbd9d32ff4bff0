"""Host memory and time of a sharded build: every rank building the whole model (before 2026-12-04) against rank 0
building it once and the ranks receiving their FSDP2 shards (workers.train.setup, planner.host_memory.builds_once),
and against a restart that skips the weights (a checkpoint follows: prepare_model's checkpoint_follows).

Two ranks over gloo on this host, the model's weights random (llama-3.2-1b in fp32: ~4.9 GB). Each mode runs in
fresh processes; a rank reports its peak resident memory (ru_maxrss) after the build, the build's seconds, and
what the planner's rule says a node of those ranks needs for the build.

    .venv/bin/python bench/probes/build_once_probe.py                      # CPU ranks
    python3 bench/probes/build_once_probe.py --device cuda --out $OUT/b.json  # both ranks on cuda:0 (gloo)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
GB = 1e9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, mode: str, model: str, device: str, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from catalog.loader import load_catalog, resolve_model
    from planner.types import Strategy
    from workers.model.build import ModelSource, build_model
    from workers.train.setup import _adapt, _shard, _sharded_from_rank0, weights_dtype

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    strategy = Strategy(gpu="H200" if device == "cuda" else "cpu", gpu_count=2, precision="amp-bf16",
                        sharding="fsdp", micro_batch=1)
    source = ModelSource(config=resolve_model(load_catalog(), model), weights_dir=None)
    target = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    dist.barrier()
    began = time.perf_counter()
    if mode == "once":
        net, _ = _sharded_from_rank0(strategy, 0, source, target)
    elif mode == "resume":  # a checkpoint follows: the weights' build is skipped, the buffers computed
        net, pending = _sharded_from_rank0(strategy, 0, source, target, draw_weights=False)
        assert pending
    else:  # what every rank did before: the whole model in its own host memory, then its shard kept
        net = _adapt(build_model(source, seed=0, weights_dtype=weights_dtype(strategy), device=torch.device("cpu")),
                     strategy)
        _shard(net, strategy)
        net.to(target)
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    seconds = time.perf_counter() - began
    shard = sum(p.to_local().numel() * p.element_size() for p in net.parameters())  # type: ignore[attr-defined]
    queue.put({"mode": mode, "rank": rank, "build_s": round(seconds, 2), "rss_before_gb": round(before / GB, 2),
               "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB, 2),
               "shard_gb": round(shard / GB, 2)})
    dist.destroy_process_group()
    queue.close()
    queue.join_thread()  # flushed before the exit that skips teardown (tests/workers/ranks.py says why)
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from catalog.loader import load_catalog, resolve_model
    from catalog.params import count_params
    from planner.host_memory import build_bytes

    whole = build_bytes(count_params(resolve_model(load_catalog(), args.model)).total, "amp-bf16")
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for mode in ("per-rank", "once", "resume"):
        queue = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(r, port, mode, args.model, args.device, queue)) for r in (0, 1)]
        for p in procs:
            p.start()
        got = sorted((queue.get(timeout=900) for _ in procs), key=lambda row: row["rank"])
        for p in procs:
            p.join(timeout=60)
        rows.extend(got)
        print(json.dumps(got), flush=True)
    node = {mode: round(sum(r["peak_rss_gb"] for r in rows if r["mode"] == mode), 2)
            for mode in ("per-rank", "once", "resume")}
    summary = {"model": args.model, "device": args.device, "whole_model_gb": round(whole / GB, 2), "ranks": rows,
               "node_peak_rss_gb": node}
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
