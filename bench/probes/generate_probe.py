"""Why the inference worker's generate() is slower than a bare one: the same model, batch and
lengths, timed under each difference between the two calls, one at a time.

    python3 bench/probes/generate_probe.py --model llama-3.2-1b --batch 32 --prompt 512 --output 128 \
        --out $OUT/probe.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from catalog.loader import load_catalog, resolve_model
from workers.infer.files import Request
from workers.infer.generate import generate_batch
from workers.infer.model_load import load_model
from workers.model.build import attn_implementation, hf_config


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--output", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    cfg = resolve_model(load_catalog(), args.model)
    model = load_model(cfg, weights="bf16", seed=0, device=args.device)
    from transformers import AutoModelForCausalLM

    config = hf_config(cfg)
    config.use_cache = True  # before construction, as bench/workers/infer_worker.py's bare side does
    with torch.device(args.device):
        bare_model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.bfloat16, attn_implementation=attn_implementation(cfg))
    bare_model.eval()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt), device=args.device)
    mask = torch.ones_like(ids)
    variants: dict[str, dict[str, Any]] = {
        "bare": {"min_new_tokens": args.output, "pad_token_id": 0},
        "bare-no-min": {"pad_token_id": 0},
        "eos-list": {"pad_token_id": 0, "eos_token_id": [eos] if eos is not None else None},
        "eos-none": {"pad_token_id": 0, "eos_token_id": None},
        "bare-model": {"min_new_tokens": args.output, "pad_token_id": 0, "_model": bare_model},
    }
    results: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.repeats + 1):
        for name, extra in variants.items():
            sync()
            t0 = time.perf_counter()
            with torch.inference_mode():
                call = extra.get("_model", model).generate
                extra = {k: v for k, v in extra.items() if k != "_model"}
                out = call(input_ids=ids, attention_mask=mask, max_new_tokens=args.output, do_sample=False,
                          use_cache=True, **extra)
            sync()
            results[name].append(time.perf_counter() - t0)
            print(name, f"{results[name][-1]:.3f} s", out.shape[1] - args.prompt, "new", flush=True)
    reqs = [Request(id=str(i), index=i, key=str(i), input_ids=tuple(ids[i].tolist()), line=i + 1)
            for i in range(args.batch)]
    worker_s: list[float] = []
    for _ in range(args.repeats + 1):
        sync()
        t0 = time.perf_counter()
        generate_batch(model, reqs, max_new_tokens=args.output, pad_id=0,
                       eos=set() if eos is None else {eos}, device=args.device)
        worker_s.append(time.perf_counter() - t0)
        print("worker generate_batch", f"{worker_s[-1]:.3f} s", flush=True)
    summary = {name: min(ts[1:]) for name, ts in results.items()} | {"worker_generate_batch": min(worker_s[1:])}
    gc_model = {k: str(v) for k, v in model.generation_config.to_dict().items()}
    gc_bare = {k: str(v) for k, v in bare_model.generation_config.to_dict().items()}
    record = {"args": vars(args) | {"out": str(args.out)}, "eos": eos,
              "generation_config_diff": {k: (gc_model.get(k), gc_bare.get(k)) for k in set(gc_model) | set(gc_bare)
                                         if gc_model.get(k) != gc_bare.get(k)},
              "min_s": summary, "all_s": results | {"worker_generate_batch": worker_s}}
    args.out.write_text(json.dumps(record, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
