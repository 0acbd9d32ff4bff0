"""How the GPUs of one host are linked, as NCCL sees it: all-reduce bus bandwidth by message size.

Standalone (device python3 with torch only). One process per GPU:

    NCCL_DEBUG=INFO python3 -m torch.distributed.run --standalone --nproc_per_node=2 \\
        bench/probes/allreduce_probe.py --out $OUT/allreduce.json

Bus bandwidth is NCCL's definition: 2 (n-1)/n x message bytes / time, the per-GPU link rate a ring
all-reduce achieves. ``peer_access`` says whether CUDA allows direct GPU-to-GPU copies (P2P); NCCL's
INFO log (stdout) names the transport it picked (P2P/IPC, SHM through host memory, or NET).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def main() -> int:
    import torch
    import torch.distributed as dist

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes-mib", default="16,256,1024,4096")
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    rows: list[dict[str, Any]] = []
    for mib in (int(v) for v in args.sizes_mib.split(",")):
        x = torch.ones(mib * 2**20 // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(3):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / args.iters
        nbytes = x.numel() * x.element_size()
        rows.append(
            {
                "mib": mib,
                "seconds": dt,
                "algbw_gbps": nbytes / dt / 1e9,
                "busbw_gbps": 2 * (world - 1) / world * nbytes / dt / 1e9,
            }
        )
        del x
    if rank == 0:
        peers = {
            f"{a}->{b}": bool(torch.cuda.can_device_access_peer(a, b))
            for a in range(torch.cuda.device_count())
            for b in range(torch.cuda.device_count())
            if a != b
        }
        doc = {
            "world_size": world,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),  # type: ignore[no-untyped-call]
            "peer_access": peers,
            "visible_devices": torch.cuda.device_count(),
            "results": rows,
        }
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps(doc, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
