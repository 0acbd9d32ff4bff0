"""Where a training step's GPU time goes, kernel by kernel (for one GPU).

Runs cases of a cases file the way bench/accuracy/measure_h200.py does (same model build, optimizer and step),
profiles one steady-state step with torch.profiler and prints the kernels with the most GPU time, grouped by
name, with the step's wall time. Used to see which of the planner's time terms a model misses.

    python3 bench/probes/train_profile_probe.py --cases bench/accuracy/cases_eager_ckpt.yaml \
        --only oss20l4-bf16-adamw-ckpt-s8192-b1 --out $OUT/profile.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_cases


def probe(case: dict[str, Any], models: dict[str, Any], top: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = probe_cases.training_step(case, models)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    began = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - began
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    rows = []
    total = 0.0
    for ev in prof.key_averages():
        cuda_us = float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0))
        if cuda_us <= 0:
            continue
        total += cuda_us
        rows.append({"kernel": ev.key[:160], "count": ev.count, "ms": round(cuda_us / 1e3, 2)})
    rows.sort(key=lambda r: -r["ms"])
    for row in rows[:12]:
        print(f"  {row['ms']:9.1f} ms  x{row['count']:<5} {row['kernel'][:110]}", flush=True)
    return {"step_wall_s": round(wall, 3), "gpu_ms_total": round(total / 1e3, 1),
            "tokens": int(case["micro_batch"]) * int(case["seq_len"]), "top": rows[:top]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="bench/accuracy/cases_models.yaml")
    p.add_argument("--only", required=True, help="comma-separated case ids")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    probe_cases.run_cases(args.cases, args.only, args.out, lambda case, models: probe(case, models, args.top), "top")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
