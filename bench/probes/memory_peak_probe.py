"""What is alive at a training step's peak, allocation by allocation (for one GPU).

Runs cases of a cases file (bench/accuracy/cases_models.yaml's shape) the way bench/accuracy/measure_h200.py does, with
PyTorch's memory history recording on, then replays the allocator trace of the steady-state steps to find
the moment of the peak and lists the largest blocks alive then, each with the Python frames that made it.
Used to find which tensors a planner moment misses (docs/lab-notes/2026-12-02-gpt-oss-peak.md).

    python3 bench/probes/memory_peak_probe.py --cases bench/accuracy/cases_models.yaml \
        --only oss20l4-bf16-adamw-ckpt-s4096-b2 --out $OUT/peak_probe.json
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_cases

GIB = 2**30


def frames_of(entry: dict[str, Any], depth: int = 6) -> list[str]:
    """The innermost frames of model code (transformers, torch's autograd or the optimizer)."""
    out: list[str] = []
    for f in entry.get("frames", []):
        name = f.get("filename", "")
        if name.endswith(".py") and ("transformers" in name or "torch/optim" in name or "torch/utils" in name
                                     or "torch/nn" in name or "measure_h200" in name or "autograd" in name):
            out.append(f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}")
        if len(out) >= depth:
            break
    return out


def replay(trace: list[dict[str, Any]], start: int) -> dict[str, Any]:
    """Live bytes after each event from ``start`` on (blocks alive before ``start`` are counted too);
    the peak and what was alive at it."""
    live: dict[int, dict[str, Any]] = {}
    total = 0
    for e in trace[:start]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    peak, peak_at, peak_live = total, start, dict(live)
    for i in range(start, len(trace)):
        e = trace[i]
        if e["action"] == "alloc":
            live[e["addr"]] = e
            total += e["size"]
            if total > peak:
                peak, peak_at, peak_live = total, i, dict(live)
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])["size"]
    blocks = sorted(peak_live.values(), key=lambda b: -b["size"])
    by_site: Counter[str] = Counter()
    for b in blocks:
        fr = frames_of(b, 2)
        by_site[fr[0] if fr else "?"] += b["size"]
    return {
        "peak_bytes": peak,
        "peak_event": peak_at,
        "events": len(trace),
        "top_blocks": [{"gib": round(b["size"] / GIB, 3), "frames": frames_of(b)} for b in blocks[:25]],
        "by_site_gib": {k: round(v / GIB, 3) for k, v in by_site.most_common(25)},
    }


def probe(case: dict[str, Any], models: dict[str, Any], steps: int) -> dict[str, Any]:
    import torch

    step = probe_cases.training_step(case, models)
    step()  # the optimizer's states exist from here on: the steady state
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    # Blocks alive before recording began (weights, optimizer states) are not in the trace: count them
    # from the segments' active blocks that no traced event allocated.
    traced = {e["addr"] for e in trace if e["action"] == "alloc"}
    pre = sum(b["size"] for s in snap["segments"] for b in s["blocks"]
              if b["state"] == "active_allocated" and b["address"] not in traced)
    res = replay(trace, 0)
    res["alive_before_recording_gib"] = round(pre / GIB, 3)
    res["peak_gib_with_untraced"] = round((res["peak_bytes"] + pre) / GIB, 3)
    res["max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
    return res  # the model and optimizer go with this frame; main() empties the cache before the next case


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="bench/accuracy/cases_models.yaml")
    p.add_argument("--only", required=True, help="comma-separated case ids")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    probe_cases.run_cases(args.cases, args.only, args.out, lambda case, models: probe(case, models, args.steps),
                          "top_blocks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
