"""How HF generate()'s decode modes compare on one GPU: the default dynamic KV cache (eager, one
kernel launch at a time, so host-bound at small batches) against a static KV cache, with and without
transformers' automatic torch.compile (CUDA graphs). Records first-call time (compile) and steady time.

    python3 bench/probes/decode_modes_probe.py --out $OUT/decode_modes.json

Standalone: needs only torch and transformers (random init from a Llama-3.2-1B-shaped config).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                rope_theta=500000.0, tie_word_embeddings=True)


def timed(fn: Any) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32x512x128,8x1024x128,1x32x128",
                        help="batch x prompt x output, comma-separated")
    parser.add_argument("--modes", default="dynamic,static-compile,static-eager")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(**LLAMA_1B)  # type: ignore[arg-type]
    with torch.device("cuda"):
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    record: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "cases": []}
    for shape in args.shapes.split(","):
        b, p, o = (int(x) for x in shape.split("x"))
        for mode in args.modes.split(","):
            kw: dict[str, Any] = {"max_new_tokens": o, "min_new_tokens": o, "do_sample": False, "pad_token_id": 0}
            if mode.startswith("static"):
                kw["cache_implementation"] = "static"
                kw["disable_compile"] = mode == "static-eager"
            times: list[float] = []
            widths: list[int] = []
            for i in range(args.repeats + 2):
                # the last call uses a different prompt width: does a new shape recompile?
                width = p if i <= args.repeats else p + 7
                ids = torch.randint(0, config.vocab_size, (b, width), device="cuda")
                mask = torch.ones_like(ids)
                mask[0, :3] = 0  # left padding on one row, as the worker's batches have
                try:
                    with torch.inference_mode():
                        times.append(timed(lambda ids=ids, mask=mask, kw=kw: model.generate(
                            input_ids=ids, attention_mask=mask, **kw)))
                except Exception as exc:
                    record["cases"].append({"shape": shape, "mode": mode, "error": repr(exc)[:500]})
                    print(shape, mode, "ERROR", repr(exc)[:300], flush=True)
                    break
                widths.append(width)
                print(shape, mode, f"call {i} width {width}: {times[-1]:.3f} s", flush=True)
            else:
                steady = sorted(times[1:args.repeats + 1])[len(times[1:args.repeats + 1]) // 2]
                rec = {"shape": shape, "mode": mode, "first_s": times[0], "steady_s": steady,
                       "new_width_s": times[-1], "all_s": times, "widths": widths,
                       "steady_tok_s": b * o / steady}
                record["cases"].append(rec)
                print(json.dumps({k: rec[k] for k in ("shape", "mode", "first_s", "steady_s", "new_width_s",
                                                      "steady_tok_s")}), flush=True)
            torch._dynamo.reset()
    args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
