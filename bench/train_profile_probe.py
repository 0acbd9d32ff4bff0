"""Where a training step's GPU time goes, kernel by kernel (for one GPU).

Runs cases of a cases file the way bench/measure_h200.py does (same model build, optimizer and step),
profiles one steady-state step with torch.profiler and prints the kernels with the most GPU time, grouped by
name, with the step's wall time. Used to see which of the planner's time terms a model misses.

    python3 bench/train_profile_probe.py --cases bench/cases_eager_ckpt.yaml \
        --only oss20l4-bf16-adamw-ckpt-s8192-b1 --out $OUT/profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure_h200 as mh


def probe(case: dict[str, Any], models: dict[str, Any], top: int) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    prec = case["precision"]
    weight_dtype = torch.float32 if prec in ("fp32", "amp-bf16") else torch.bfloat16
    cfg = mh.hf_config(models, case, tiny=False)
    model = mh.build_model(cfg, weight_dtype, "cuda", train=True)
    if case["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case["finetune"] in ("lora", "qlora"):
        if case["activation_checkpointing"]:
            model.enable_input_require_grads()
        model = mh.apply_lora(model, int(case["lora_rank"]))
    opt = mh.make_optimizer(case["optimizer"], [p for p in model.parameters() if p.requires_grad])
    mb, seq = int(case["micro_batch"]), int(case["seq_len"])
    x = torch.randint(0, int(cfg.vocab_size), (mb, seq), device="cuda")

    def step() -> None:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

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
    return {"step_wall_s": round(wall, 3), "gpu_ms_total": round(total / 1e3, 1), "tokens": mb * seq,
            "top": rows[:top]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="bench/cases_models.yaml")
    p.add_argument("--only", required=True, help="comma-separated case ids")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    models, cases = mh.load_cases(Path(args.cases))
    wanted = args.only.split(",")
    out: dict[str, Any] = {"versions": mh.library_versions(), "results": {}}
    for case in cases:
        if case["id"] not in wanted:
            continue
        print("profiling", case["id"], flush=True)
        try:
            out["results"][case["id"]] = probe(case, models, args.top)
        except Exception as exc:
            out["results"][case["id"]] = {"error": repr(exc)}
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
        r = out["results"][case["id"]]
        print(json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
        for row in r.get("top", [])[:12]:
            print(f"  {row['ms']:9.1f} ms  x{row['count']:<5} {row['kernel'][:110]}", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
