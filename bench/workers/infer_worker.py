"""The inference worker's tokens/s and peak memory against bare ``generate()`` on the same model.

Both sides run the same random-init model, batch, prompt length and new tokens, greedy with the
default KV cache. The bare loop times ``generate`` alone on random token ids; the worker side is
``workers.infer.generate.run_inference`` over a JSONL prompts file (parse, pad, generate, trim, JSONL append
+ fsync per batch). Both drop the first batch (CUDA warm-up) and report steady-state tokens/s.

    python3 bench/workers/infer_worker.py --model llama-3.2-1b --batch 64 --prompt 2048 --output 128 \
        --weights bf16 --batches 4 --out $OUT/inf-l1b.json
    python3 bench/workers/infer_worker.py --compare bench/results/workers/inf_*.json   # planner vs recorded runs

Every tokens/s here is one definition: generated (output) tokens of the whole batch per second of
``generate()`` (prefill included, model load and the dropped warm-up batch excluded). That is the
planner's ``ThroughputEstimate.tokens_per_s`` and bench/accuracy/measure_h200.py's ``e2e_output_tokens_per_s``,
so the three are directly comparable; ``--compare`` recomputes the planner side with the current
planner and calibration (no GPU needed) and writes it next to the recorded measurements.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from catalog.schema import ModelConfig
from planner.calibration import load_calibration
from planner.throughput import infer_throughput
from planner.types import Strategy
from workers.infer.files import write_synthetic_prompts
from workers.infer.generate import run_inference
from workers.infer.model_load import quantize_weights
from workers.model.build import attn_implementation, hf_config


def bare(cfg: Any, *, batch: int, prompt: int, output: int, weights: str, batches: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    dtype = {"fp32": torch.float32, "fp16": torch.float16}.get(weights, torch.bfloat16)
    config = hf_config(cfg)
    config.use_cache = True
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype, attn_implementation=attn_implementation(cfg)
        )
    quantize_weights(model, weights)
    model.eval()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    for i in range(batches):
        ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device="cuda", generator=None)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=output,
                min_new_tokens=output,
                do_sample=False,
                pad_token_id=0,
                use_cache=True,
            )
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print(f"bare batch {i}: {times[-1]:.3f} s", flush=True)
    peak = torch.cuda.max_memory_allocated()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    steady = sum(times[1:])
    return {
        "tokens_per_s": batch * output * (batches - 1) / steady,
        "peak_allocated_bytes": float(peak),
        "batch_s": steady / (batches - 1),
    }


def worker(cfg: Any, *, batch: int, prompt: int, output: int, weights: str, batches: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        prompts = write_synthetic_prompts(
            Path(tmp) / "p.jsonl", requests=batch * batches, prompt_tokens=prompt, vocab_size=cfg.vocab_size, seed=0
        )
        outputs = Path(tmp) / "o.jsonl"
        stamps: list[float] = []
        result = run_inference(
            cfg,
            prompts,
            outputs,
            batch=batch,
            max_new_tokens=output,
            dtype=weights,
            seed=0,
            device="cuda",
            progress=lambda done, total: stamps.append(time.perf_counter()),
        )
        records = [json.loads(line) for line in outputs.read_text().splitlines()]
    per_batch = [sum(r["new_tokens"] for r in records[i * batch : (i + 1) * batch]) for i in range(batches)]
    steady = stamps[-1] - stamps[0]
    return {
        "tokens_per_s": sum(per_batch[1:]) / steady,
        "peak_allocated_bytes": float(result.peak_memory_bytes or 0),
        "batch_s": steady / (batches - 1),
        "all_batches_tokens_per_s": result.tokens_per_s,
        "load_s": result.load_seconds,
        "tokens": float(sum(per_batch)),
        "eos_stops": float(sum(r["finish_reason"] == "eos" for r in records)),
    }


def planner_side(cfg: ModelConfig, *, batch: int, prompt: int, output: int, weights: str,
                 gpu: str = "H200") -> dict[str, float]:
    """The planner's estimate for the same shape, in the benchmark's definition (see module doc)."""
    est = infer_throughput(cfg, Strategy(gpu=gpu, gpu_count=1, weights=weights, batch=batch), prompt, output,
                           load_catalog().gpu(gpu), load_calibration().throughput)
    prefill = est.breakdown_s["prefill"]
    return {
        "tokens_per_s": est.tokens_per_s,
        "decode_tokens_per_s": float(est.decode_tokens_per_s or 0.0),
        "batch_s": est.step_time_s or 0.0,
        "prefill_s": prefill,
        "decode_step_s": est.breakdown_s["decode"] / output,
    }


def compare(paths: list[Path]) -> str:
    """Markdown table: recorded bare/worker tokens/s against the current planner, same definition.

    The measured decode step is implied from the bare batch time minus the planner's prefill (prefill
    is compute bound and within a few % of the sweep's measured prefill), over ``output`` steps."""
    catalog = load_catalog()
    lines = [
        "| model | weights | batch | prompt | out | bare tok/s | worker tok/s | planner tok/s | planner / bare "
        "| bare decode step (implied) | planner decode step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path in paths:
        rec = json.loads(path.read_text())
        kw = {k: int(rec[k]) for k in ("batch", "prompt", "output")}
        plan = planner_side(resolve_model(catalog, rec["model"]), batch=kw["batch"], prompt=kw["prompt"],
                            output=kw["output"], weights=str(rec["weights"]))
        bare_tps = float(rec["bare"]["tokens_per_s"])
        implied = (float(rec["bare"]["batch_s"]) - plan["prefill_s"]) / kw["output"]
        lines.append(
            f"| {rec['model']} | {rec['weights']} | {kw['batch']} | {kw['prompt']} | {kw['output']} "
            f"| {bare_tps:.0f} | {float(rec['worker']['tokens_per_s']):.0f} | {plan['tokens_per_s']:.0f} "
            f"| {plan['tokens_per_s'] / bare_tps:.2f} | {implied * 1e3:.1f} ms | {plan['decode_step_s'] * 1e3:.1f} ms |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    if "--compare" in sys.argv:
        cmp = argparse.ArgumentParser(description="planner vs recorded infer_worker runs")
        cmp.add_argument("--compare", type=Path, nargs="+", required=True)
        print(compare(cmp.parse_args().compare))
        return
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--prompt", type=int, required=True)
    parser.add_argument("--output", type=int, required=True)
    parser.add_argument("--weights", default="bf16")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = resolve_model(load_catalog(), args.model)
    kw = {
        "batch": args.batch,
        "prompt": args.prompt,
        "output": args.output,
        "weights": args.weights,
        "batches": args.batches,
    }
    record = {
        "model": args.model,
        **kw,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "bare": bare(cfg, **kw),
        "worker": worker(cfg, **kw),
    }
    record["worker_vs_bare"] = record["worker"]["tokens_per_s"] / record["bare"]["tokens_per_s"]
    record["planner"] = planner_side(cfg, batch=args.batch, prompt=args.prompt, output=args.output,
                                     weights=args.weights)
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
