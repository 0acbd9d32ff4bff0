"""Where a compiled decode step's time goes on one GPU: the workers' own decoder (workers/infer/decode.py, the
static-cache step captured as a CUDA graph) replayed under torch.profiler, its kernels grouped by what they do.

Why: the plan prices a compiled MoE step as the bytes it reads plus a fitted host-free cost per sparse layer
(``graph_moe_layer_s``, fitted on gpt-oss-20b). Qwen3-30B-A3B, held out, measured ~255 us per sparse layer
against gpt-oss's ~150 (docs/lab-notes/2026-12-03-moe-in-a-cuda-graph.md). This shows the kernels
of one step of each, so the difference has a name before the model gets a term for it.

    python3 bench/workers/moe_step_profile.py --cases gpt-oss-20b:32x512,qwen3-30b-a3b:32x512 --out $OUT/profile.json

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from planner.memory import sparse_layer_count
from workers.infer.decode import GraphDecoder
from workers.infer.model_load import load_model

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


def _elapsed_ms(run: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end))


def decode_step_ms(decoder: GraphDecoder, ids: torch.Tensor, new: int,
                   repeat: int = 1) -> tuple[float, float, torch.Tensor]:
    """(ms per compiled step, ms of the prefill alone, the new tokens) of ``decoder`` on ``ids``: two decodes of
    ``new`` tokens capture the graph (reduce-overhead records on its second call) at the measured cache length
    (another ``new`` is another static cache shape, hence another compile), then ``repeat`` timed decodes less as
    many decodes of one token (the prefill, eager, no graph)."""
    mask = torch.ones_like(ids)
    for _ in range(2):
        tokens = decoder.decode(ids, mask, max_new_tokens=new, eos=set())
    total = sum(_elapsed_ms(lambda: decoder.decode(ids, mask, max_new_tokens=new, eos=set())) for _ in range(repeat))
    prefill = sum(_elapsed_ms(lambda: decoder.decode(ids, mask, max_new_tokens=1, eos=set())) for _ in range(repeat))
    return (total - prefill) / repeat / (new - 1), prefill / repeat, tokens


def _kernel_us(decoder: GraphDecoder, ids: torch.Tensor, new: int, sign: float,
               into: dict[str, list[float]]) -> None:
    """Each CUDA kernel's time (us, times ``sign``) in one profiled decode of ``new`` tokens, by kernel name."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        decoder.decode(ids, torch.ones_like(ids), max_new_tokens=new, eos=set())
        torch.cuda.synchronize()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            into[ev.name].append(sign * ev.device_time_total)


def profile_case(spec: str, steps: int) -> dict[str, Any]:
    model_id, shape = spec.split(":")
    batch, prompt = (int(x) for x in shape.split("x"))
    cfg = resolve_model(load_catalog(), model_id)
    model = load_model(cfg, weights="bf16", seed=0, device="cuda")
    decoder = GraphDecoder(model, compile=True)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size, (batch, prompt), generator=gen).cuda()
    step_ms, prefill_ms, _ = decode_step_ms(decoder, ids, steps + 1)
    kernels: dict[str, list[float]] = defaultdict(list)
    _kernel_us(decoder, ids, steps + 1, 1.0, kernels)
    # the prefill's kernels are in the trace too: subtract one prefill's profile, taken alone
    _kernel_us(decoder, ids, 1, -1.0, kernels)
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
    sparse = sparse_layer_count(cfg) if cfg.num_experts > 1 else 0
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
