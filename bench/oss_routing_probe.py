"""Does a random-weights gpt-oss route like a trained one? Counts the distinct experts each MoE layer visits
per decode step under generate(), and times the step, with the router as built (random weights) and with
it forced to balanced routing (each token's top-k drawn uniformly, as a trained router's load balancing
aims for, and as planner.throughput.experts_visited assumes). Standalone (device python3, no gpuplan):

    python3 bench/oss_routing_probe.py --out $OUT/oss_routing.json        # on a GPU machine
    python3 bench/oss_routing_probe.py --tiny --device cpu --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure_h200 as M


def run(batch: int, prompt: int, output: int, forced: bool, model: Any, cfg: Any, device: str) -> dict[str, Any]:
    import torch
    from transformers.models.gpt_oss import modeling_gpt_oss as G

    seen: list[int] = []
    k, e = cfg.num_experts_per_tok, cfg.num_local_experts
    original = G.GptOssTopKRouter.forward

    def balanced(self: Any, hidden_states: Any) -> Any:
        logits, scores, idx = original(self, hidden_states)
        if forced:  # uniform top-k per token: random keys, the k largest
            idx = torch.rand(hidden_states.shape[0], e, device=hidden_states.device).topk(k, dim=-1).indices
        if hidden_states.shape[0] == batch:  # a decode step's tokens (the prefill has batch x prompt)
            seen.append(int(torch.unique(idx).numel()))
        return logits, scores, idx

    G.GptOssTopKRouter.forward = balanced
    try:
        gen = torch.Generator(device=device).manual_seed(1234)
        ids = torch.randint(3, int(cfg.vocab_size), (batch, prompt), device=device, generator=gen)
        kw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None,
                              "attention_mask": torch.ones_like(ids)}
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
            stamps = M.StepStamps()
            seen.clear()
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=output, min_new_tokens=output,
                           stopping_criteria=M.stopping_list([stamps]), **kw)
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t0
    finally:
        G.GptOssTopKRouter.forward = original
    steps = stamps.intervals_ms()
    return {"batch": batch, "prompt": prompt, "output": output, "forced_uniform": forced,
            "distinct_experts_per_layer_step": statistics.mean(seen) if seen else None,
            "uniform_expectation": e * (1 - (1 - k / e) ** batch),
            "decode_step_ms_median": statistics.median(steps[1:]) if len(steps) > 1 else None, "wall_s": wall}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default=str(Path(__file__).resolve().parent / "cases_moe_infer.yaml"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--batches", default="1,4,8,16,32")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch
    import yaml

    models = yaml.safe_load(Path(a.cases).read_text())["models"]
    cfg = M.hf_config(models, {"model": "gpt-oss-20b"}, a.tiny)
    model = M.build_model(cfg, torch.bfloat16, a.device, train=False)
    rows = []
    for b in (int(x) for x in a.batches.split(",")):
        for forced in (False, True):
            rows.append(run(b, a.prompt, a.output, forced, model, cfg, a.device))
            print(json.dumps(rows[-1]), flush=True)
    Path(a.out).write_text(json.dumps({"rows": rows, "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
