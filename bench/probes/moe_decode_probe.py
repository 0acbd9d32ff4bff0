"""How generate() decodes a mixture of experts on a GPU, three probes of one model (standalone: the device's
python3, no gpuplan; results in docs/lab-notes/2026-12-03-moe-under-generate.md):

    python3 bench/probes/moe_decode_probe.py routing --batches 1,4,8,16,32 --out $OUT/routing.json
    python3 bench/probes/moe_decode_probe.py profile --batches 8,32 --prompt 64 --output 24 --out $OUT/profile.txt
    python3 bench/probes/moe_decode_probe.py impl --batches 1,8,16,32 --output 32 --out $OUT/impl.json
    python3 bench/probes/moe_decode_probe.py impl --tiny --device cpu --batches 2 --prompt 16 --output 4 \
        --out /tmp/i.json

- ``routing`` (gpt-oss): the distinct experts each MoE layer visits per decode step and the step's time, with
  the router as built (random weights) and forced to uniform top-k (what a trained router's load balancing
  aims for, and what planner.throughput.experts_visited assumes).
- ``profile``: torch.profiler over generate(), the top kernels by CUDA time (prefill included: keep the
  prompt short).
- ``impl``: the decode step with generate()'s switch to ``batched_mm`` (every (token, expert) pair's weights
  gathered) and with ``grouped_mm`` kept as the workers keep it (each routed expert read once), alternating.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accuracy"))  # measure_h200
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # workers.infer.moe_decode (torch and transformers only)

import measure_h200 as M


def _prompt(cfg: Any, batch: int, prompt: int, device: str) -> tuple[Any, dict[str, Any]]:
    """Seeded random prompt ids and greedy generate() arguments that run every requested token."""
    import torch

    gen = torch.Generator(device=device).manual_seed(1234)
    ids = torch.randint(3, int(cfg.vocab_size), (batch, prompt), device=device, generator=gen)
    return ids, {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, "attention_mask": torch.ones_like(ids)}


def _timed(model: Any, cfg: Any, batch: int, a: argparse.Namespace, before: Any = None) -> dict[str, Any]:
    """A warm generate() of ``a.output`` tokens: the median decode step (ms) and the wall time (s)."""
    import torch

    ids, kw = _prompt(cfg, batch, a.prompt, a.device)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
        if before is not None:
            before()
        stamps = M.StepStamps()
        if a.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=a.output, min_new_tokens=a.output,
                       stopping_criteria=M.stopping_list([stamps]), **kw)
        if a.device == "cuda":
            torch.cuda.synchronize()
    steps = stamps.intervals_ms()
    return {"decode_step_ms_median": statistics.median(steps[1:]) if len(steps) > 1 else None,
            "wall_s": time.perf_counter() - t0}


@contextlib.contextmanager
def _routing_counted(cfg: Any, batch: int, forced: bool, seen: list[int]) -> Iterator[None]:
    """gpt-oss's router, counting the distinct experts of each decode step (forced: uniform top-k)."""
    import torch
    from transformers.models.gpt_oss import modeling_gpt_oss as G

    k, e = cfg.num_experts_per_tok, cfg.num_local_experts
    original = G.GptOssTopKRouter.forward

    def counted(self: Any, hidden_states: Any) -> Any:
        logits, scores, idx = original(self, hidden_states)
        if forced:  # uniform top-k per token: random keys, the k largest
            idx = torch.rand(hidden_states.shape[0], e, device=hidden_states.device).topk(k, dim=-1).indices
        if hidden_states.shape[0] == batch:  # a decode step's tokens (the prefill has batch x prompt)
            seen.append(int(torch.unique(idx).numel()))
        return logits, scores, idx

    G.GptOssTopKRouter.forward = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        G.GptOssTopKRouter.forward = original  # type: ignore[method-assign]


def routing(model: Any, cfg: Any, batch: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    k, e = cfg.num_experts_per_tok, cfg.num_local_experts
    rows = []
    for forced in (False, True):
        seen: list[int] = []
        with _routing_counted(cfg, batch, forced, seen):
            timed = _timed(model, cfg, batch, a, before=seen.clear)
        rows.append({"batch": batch, "prompt": a.prompt, "output": a.output, "forced_uniform": forced,
                     "distinct_experts_per_layer_step": statistics.mean(seen) if seen else None,
                     "uniform_expectation": e * (1 - (1 - k / e) ** batch), **timed})
    return rows


def impl(model: Any, cfg: Any, batch: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    """The decode step with generate()'s switch to batched_mm and with grouped_mm kept the way the workers keep
    it (workers/infer/moe_decode.py), alternating ``--repeat`` times so that a change of the host's speed shows."""
    from workers.infer.moe_decode import keep_grouped_mm

    original = model.get_experts_implementation()
    row: dict[str, Any] = {"model": a.model, "batch": batch, "prompt": a.prompt, "batched_mm_step_ms": [],
                           "grouped_mm_step_ms": [], "host_python_loop_2m_s": []}
    for _ in range(a.repeat):
        row["host_python_loop_2m_s"].append(M.host_probe(a.device)["python_loop_2m_s"])
        row["batched_mm_step_ms"].append(_timed(model, cfg, batch, a)["decode_step_ms_median"])
        if keep_grouped_mm(model):
            try:
                row["grouped_mm_step_ms"].append(_timed(model, cfg, batch, a)["decode_step_ms_median"])
            finally:
                model.set_experts_implementation(original)
    return [row]


def profile(model: Any, cfg: Any, batch: int, a: argparse.Namespace) -> list[str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
    ids, kw = _prompt(cfg, batch, a.prompt, a.device)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
        with profile(activities=acts) as prof:
            model.generate(ids, max_new_tokens=a.output, min_new_tokens=a.output, **kw)
    key = "self_cuda_time_total" if a.device == "cuda" else "self_cpu_time_total"
    return [f"=== {a.model} batch {batch}, prompt {a.prompt}, {a.output} new tokens (prefill included) ===",
            prof.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=["routing", "profile", "impl"])
    p.add_argument("--cases", default=str(Path(__file__).resolve().parents[1] / "accuracy" / "cases_moe_infer.yaml"))
    p.add_argument("--model", default="gpt-oss-20b", help="a model of the cases file")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU dry run)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=64, help="new tokens per generate()")
    p.add_argument("--repeat", type=int, default=2, help="impl: alternations of the two kernels per batch")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch
    import yaml

    if a.probe == "routing" and a.model != "gpt-oss-20b":
        p.error("routing counts gpt-oss's router only")
    models = yaml.safe_load(Path(a.cases).read_text())["models"]
    cfg = M.hf_config(models, {"model": a.model}, a.tiny)
    model = M.build_model(cfg, torch.bfloat16, a.device, train=False)
    rows: list[Any] = []
    for b in (int(x) for x in a.batches.split(",")):
        got = {"routing": routing, "impl": impl, "profile": profile}[a.probe](model, cfg, b, a)
        rows += got
        for item in got:
            print(item if isinstance(item, str) else json.dumps(item), flush=True)
    if a.probe == "profile":
        Path(a.out).write_text("\n".join(rows))
    else:
        Path(a.out).write_text(json.dumps({"probe": a.probe, "rows": rows, "torch": torch.__version__}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
