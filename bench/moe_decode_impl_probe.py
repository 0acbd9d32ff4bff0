"""generate()'s decode of a mixture of experts with transformers' batched_mm (its default switch on a GPU: every
(token, expert) pair's weights gathered) against grouped_mm kept for the decode (each routed expert read once):
decode step ms per batch size. Standalone (device python3, no gpuplan):

    python3 bench/moe_decode_impl_probe.py --model gpt-oss-20b --batches 1,4,8,16,32 --out $OUT/impl.json
    python3 bench/moe_decode_impl_probe.py --tiny --device cpu --batches 2 --out /tmp/impl.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure_h200 as M


def step_ms(model: Any, cfg: Any, batch: int, prompt: int, output: int, device: str) -> float | None:
    import torch

    ids = torch.randint(3, int(cfg.vocab_size), (batch, prompt), device=device)
    kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None,
                          "attention_mask": torch.ones_like(ids)}
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
        stamps = M.StepStamps()
        model.generate(ids, max_new_tokens=output, min_new_tokens=output,
                       stopping_criteria=M.stopping_list([stamps]), **kw)
    steps = stamps.intervals_ms()
    return statistics.median(steps[1:]) if len(steps) > 1 else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=str(Path(__file__).resolve().parent / "cases_moe_infer.yaml"))
    p.add_argument("--model", default="gpt-oss-20b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batches", default="1,4,8,16,32")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=32)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch
    import yaml

    models = yaml.safe_load(Path(a.cases).read_text())["models"]
    cfg = M.hf_config(models, {"model": a.model}, a.tiny)
    model = M.build_model(cfg, torch.bfloat16, a.device, train=False)
    hook = hasattr(model, "_optimize_model_for_decode")
    rows = []
    for b in (int(x) for x in a.batches.split(",")):
        t0 = time.perf_counter()
        default = step_ms(model, cfg, b, a.prompt, a.output, a.device)
        grouped = None
        if hook:  # keep grouped_mm for the decode steps too
            model._optimize_model_for_decode = contextlib.nullcontext
            try:
                grouped = step_ms(model, cfg, b, a.prompt, a.output, a.device)
            finally:
                del model._optimize_model_for_decode
        rows.append({"model": a.model, "batch": b, "prompt": a.prompt, "batched_mm_step_ms": default,
                     "grouped_mm_step_ms": grouped, "wall_s": time.perf_counter() - t0})
        print(json.dumps(rows[-1]), flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows, "switch_hook": hook, "torch": torch.__version__,
                                       "experts_implementation": getattr(cfg, "_experts_implementation", None)},
                                      indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
