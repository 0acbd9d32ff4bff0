"""Why the first full-length ``generate()`` of a process is slow: allocator growth or something else.

Standalone (device python3: torch, transformers). Builds one model of bench/accuracy/cases.yaml's shapes
(random init, bf16, sdpa), runs a 2-token warm-up ``generate()`` like bench/accuracy/measure_h200.py, then
times ``--repeats`` full ``generate()`` calls and, for each, the caching allocator's new device
segments (``segment.all.allocated``: one cudaMalloc each) and bytes reserved. With ``--prereserve``
one large block is allocated and freed after the warm-up, so the allocator can serve the first
generate() from cached memory without cudaMalloc. ``--malloc-probe`` times bare cudaMalloc/cudaFree
through the allocator (fresh 32-160 MiB segments after ``empty_cache``).

    python3 bench/probes/first_generate_probe.py --model gpt2 --batch 32 --prompt 512 --output 256 --out $OUT/a.json
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/probes/first_generate_probe.py ... --out $OUT/b.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def main() -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prereserve-gib", type=float, default=0.0)
    ap.add_argument("--malloc-probe", action="store_true")
    ap.add_argument("--sdp-off", default="", help="SDPA backends to disable: cudnn,flash,mem_efficient,math")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    for name in filter(None, args.sdp_off.split(",")):
        getattr(torch.backends.cuda, f"enable_{name}_sdp")(False)
    raw = dict(yaml.safe_load((HERE.parent / "accuracy" / "cases.yaml").read_text())["models"][args.model])
    cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    cfg.use_cache = True
    with torch.device("cuda"):
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    model.eval()
    b, p, o = args.batch, args.prompt, args.output
    ids = torch.randint(3, int(cfg.vocab_size), (b, p), device="cuda")
    mask = torch.ones_like(ids)
    gkw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}

    def segs() -> tuple[int, int]:
        s = torch.cuda.memory_stats()
        return int(s.get("segment.all.allocated", 0)), int(torch.cuda.memory_reserved())

    rec: dict[str, Any] = {
        "model": args.model,
        "batch": b,
        "prompt": p,
        "output": o,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "prereserve_gib": args.prereserve_gib,
        "runs": [],
    }
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2, **gkw)
        torch.cuda.synchronize()
        if args.prereserve_gib > 0:
            block = torch.empty(int(args.prereserve_gib * 2**30), dtype=torch.uint8, device="cuda")
            del block  # stays reserved in the allocator's cache, split on demand
        for _ in range(args.repeats):
            n0, r0 = segs()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=mask, max_new_tokens=o, min_new_tokens=o, **gkw)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            n1, r1 = segs()
            rec["runs"].append(
                {"generate_s": dt, "step_ms": dt / o * 1e3, "new_segments": n1 - n0, "reserved_growth_bytes": r1 - r0}
            )
            print(rec["runs"][-1], flush=True)
    if args.malloc_probe:
        del model
        torch.cuda.empty_cache()
        times = []
        for i in range(40):
            n = (32 + 4 * i) * 2**20  # distinct sizes, each a fresh segment
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            x = torch.empty(n, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
            del x
            torch.cuda.empty_cache()
        rec["malloc_ms_median"] = sorted(times)[len(times) // 2]
        rec["malloc_ms_all"] = times
    Path(args.out).write_text(json.dumps(rec, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
