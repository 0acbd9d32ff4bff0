"""Where a compiled decode step's time goes on one GPU: the workers' own decoder (workers/decode.py, the
static-cache step captured as a CUDA graph) replayed under torch.profiler, its kernels grouped by what they do.

Why: the plan prices a compiled MoE step as the bytes it reads plus a fitted host-free cost per sparse layer
(``graph_moe_layer_s``, fitted on gpt-oss-20b). Qwen3-30B-A3B, held out, measured ~255 us per sparse layer
against gpt-oss's ~150 (docs/MEASUREMENTS.md, "A mixture of experts in a CUDA graph"). This shows the kernels
of one step of each, so the difference has a name before the model gets a term for it.

    python3 bench/moe_step_profile.py --cases gpt-oss-20b:32x512,qwen3-30b-a3b:32x512 --out $OUT/profile.json

Per case: the wall time of a replayed step (CUDA events around 16 steps), the GPU-busy time of one step's kernels
and their count, and the kernels by group (attention, grouped GEMM, other GEMM, routing: sort/topk/histc/scan,
norm/elementwise, copies) with time and count per step, plus the 25 costliest kernel names.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.loader import load_catalog, resolve_model
from workers.decode import GraphDecoder
from workers.infer import load_model

GROUPS = (
    ("grouped_gemm", r"grouped|_scaled_grouped|cutlass.*group|GroupProblem|group_gemm"),
    ("attention", r"flash|fmha|attention|sdpa|softmax"),
    ("gemm", r"gemm|sm90_xmma|cutlass|cublas|nvjet|matmul|mm_"),
    ("routing", r"sort|topk|histc|histogram|scan|cumsum|radix|index|scatter|gather|bincount"),
    ("copy", r"copy|Memcpy|Memset|fill"),
)


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if re.search(pattern, name, re.IGNORECASE):
            return group
    return "elementwise/norm/other"


def profile_case(spec: str, steps: int) -> dict[str, Any]:
    model_id, shape = spec.split(":")
    batch, prompt = (int(x) for x in shape.split("x"))
    cfg = resolve_model(load_catalog(), model_id)
    model = load_model(cfg, weights="bf16", seed=0, device="cuda")
    decoder = GraphDecoder(model, compile=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size, (batch, prompt), generator=gen).cuda()
    mask = torch.ones_like(ids)
    # two runs capture the graph (reduce-overhead records on its second call) at the measured run's cache length:
    # another max_new_tokens is another static cache shape, hence another compile
    for _ in range(2):
        decoder.decode(ids, mask, max_new_tokens=steps + 1, eos=set())
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    decoder.decode(ids, mask, max_new_tokens=steps + 1, eos=set())
    end.record()
    torch.cuda.synchronize()
    with_prefill_ms = start.elapsed_time(end)
    start.record()
    decoder.decode(ids, mask, max_new_tokens=1, eos=set())
    end.record()
    torch.cuda.synchronize()
    prefill_ms = start.elapsed_time(end)
    step_ms = (with_prefill_ms - prefill_ms) / steps

    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        decoder.decode(ids, mask, max_new_tokens=steps + 1, eos=set())
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            kernels[ev.name].append(ev.device_time_total)
    # the prefill's kernels are in the trace too: subtract one prefill's profile, taken alone
    with torch.profiler.profile(activities=activities) as prof1:
        decoder.decode(ids, mask, max_new_tokens=1, eos=set())
        torch.cuda.synchronize()
    for ev in prof1.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            kernels[ev.name].append(-ev.device_time_total)
    groups: dict[str, dict[str, float]] = defaultdict(lambda: {"us": 0.0, "count": 0.0})
    names: list[dict[str, Any]] = []
    for name, times in kernels.items():
        count = sum(1 if t > 0 else -1 for t in times) / steps
        us = sum(times) / steps
        groups[group_of(name)]["us"] += us
        groups[group_of(name)]["count"] += count
        names.append({"name": name[:160], "us_per_step": round(us, 2), "count_per_step": round(count, 2),
                      "group": group_of(name)})
    names.sort(key=lambda r: -float(r["us_per_step"]))
    busy_us = sum(g["us"] for g in groups.values())
    sparse = cfg.num_layers - (cfg.moe.dense_layers if cfg.moe is not None else 0) if cfg.num_experts > 1 else 0
    rec = {"case": spec, "model": model_id, "batch": batch, "prompt": prompt, "steps": steps,
           "step_ms": round(step_ms, 4), "prefill_ms": round(prefill_ms, 3),
           "kernel_busy_us_per_step": round(busy_us, 1),
           "kernels_per_step": round(sum(g["count"] for g in groups.values()), 1), "layers": cfg.num_layers,
           "sparse_layers": sparse,
           "groups": {k: {"us": round(v["us"], 1), "count": round(v["count"], 1)} for k, v in sorted(groups.items())},
           "top": names[:25], "device": torch.cuda.get_device_name(0)}
    print(json.dumps({k: v for k, v in rec.items() if k != "top"}), flush=True)
    for r in names[:25]:
        print(f"  {r['us_per_step']:9.1f} us  x{r['count_per_step']:6.1f}  {r['group']:<22} {r['name'][:100]}",
              flush=True)
    del decoder, model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="gpt-oss-20b:32x512,qwen3-30b-a3b:32x512",
                        help="model:BATCHxPROMPT, comma-separated")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = [profile_case(spec, args.steps) for spec in args.cases.split(",")]
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
