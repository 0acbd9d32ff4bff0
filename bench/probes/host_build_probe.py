"""GPU check of workers.train.setup's host build: a model built in host memory (as is a model whose whole
weights exceed planner.host_memory.GPU_BUILD_SHARE of the GPU) reaches the GPU as NF4 for QLoRA (``model.to``)
or a shard at a time through FSDP2's ``fully_shard`` (here one rank, NCCL), then trains a step there.

    python3 bench/probes/host_build_probe.py --out $OUT/host_build.json      # on a GPU machine

Cases 3 and 4 (QLoRA under FSDP2) cannot pass on one rank: FSDP2's one-rank shortcut hands NF4's
fsdp_post_all_gather one of its three inputs (bench/results/workers/host_build_2026-12-02.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def one(case: str, finetune: str, shard: bool, host: bool = True) -> dict[str, Any]:
    import torch

    import workers.train.setup as ts
    from catalog.loader import load_catalog, resolve_model
    from planner.types import Strategy
    from workers.model.build import ModelSource

    src = ModelSource(config=resolve_model(load_catalog(), "llama-3.2-1b"), weights_dir=None)
    st = Strategy.model_validate({"task": "train", "gpu": "H200", "gpu_count": 2 if shard else 1, "precision": "bf16",
                                  "sharding": "fsdp", "finetune": finetune, "micro_batch": 2})
    device = torch.device("cuda", 0)
    torch.cuda.reset_peak_memory_stats()
    real = ts.build_device
    if host:  # as for a model bigger than the GPU's build share
        ts.build_device = lambda *a, **k: torch.device("cpu")
    try:
        if shard:  # prepare_model shards only with world > 1: wrap the host-built model as it would
            model = ts.prepare_model(st, 0, src, device, 1).model
            ts._shard(model, st)
        else:
            model = ts.prepare_model(st, 0, src, device, 1).model
    finally:
        ts.build_device = real
    devices = sorted({str(p.device) for p in model.parameters()} | {str(b.device) for b in model.buffers()})
    params = [p for p in model.parameters() if p.requires_grad]
    opt = ts.make_optimizer("adamw", params, 1e-4)
    x = torch.randint(0, 1000, (2, 256), device=device)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    out = {"case": case, "devices": devices, "loss": float(loss),
           "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30}
    del model, opt
    torch.cuda.empty_cache()
    return out


def main() -> int:
    import torch
    import torch.distributed as dist

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cases", default="1,2,3", help="which cases, by number (4: case 3 built on the GPU)")
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    rows = []
    cases = (("qlora, one GPU, host-built then .to()", "qlora", False, True),
             ("full, FSDP2 wrap of a host-built model", "full", True, True),
             ("qlora, FSDP2 wrap of a host-built model", "qlora", True, True),
             ("qlora, FSDP2 wrap of a GPU-built model", "qlora", True, False))
    for number in (int(n) for n in args.cases.split(",")):
        case, finetune, shard, host = cases[number - 1]
        try:
            rows.append(one(case, finetune, shard, host))
        except Exception as exc:
            rows.append({"case": case, "error": repr(exc)[:600], "traceback": traceback.format_exc()[-4000:]})
        print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
