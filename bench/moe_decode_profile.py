"""Where a MoE decode step's GPU time goes as the batch grows: torch.profiler over generate()'s decode
steps, top kernels by total CUDA time. Standalone (device python3):

    python3 bench/moe_decode_profile.py --model gpt-oss-20b --batches 8,32 --out $OUT/oss_decode_profile.txt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure_h200 as M


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=str(Path(__file__).resolve().parent / "cases_moe_infer.yaml"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--model", default="gpt-oss-20b", help="a model of the cases file")
    p.add_argument("--batches", default="8,32")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch
    import yaml
    from torch.profiler import ProfilerActivity, profile

    models = yaml.safe_load(Path(a.cases).read_text())["models"]
    cfg = M.hf_config(models, {"model": a.model}, a.tiny)
    model = M.build_model(cfg, torch.bfloat16, a.device, train=False)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    out = []
    for b in (int(x) for x in a.batches.split(",")):
        ids = torch.randint(3, int(cfg.vocab_size), (b, a.prompt), device=a.device)
        kw = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, "attention_mask": torch.ones_like(ids)}
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
            with profile(activities=acts) as prof:
                model.generate(ids, max_new_tokens=a.steps, min_new_tokens=a.steps, **kw)
        key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
        out.append(f"=== {a.model} batch {b}, prompt {a.prompt}, {a.steps} new tokens (prefill included) ===")
        out.append(prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
        print(out[-2], flush=True)
    Path(a.out).write_text("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
