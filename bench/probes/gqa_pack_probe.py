"""How much the compiled decode step would gain if grouped-query attention stopped copying K/V (a probe, not the
product): the workers' decoder (workers/infer/decode.py) timed as it is, then with SDPA given each KV head's query heads
packed as its query rows.

Why: bench/workers/moe_step_profile.py showed every model with several KV heads copying its whole static cache out to
its query heads every step (transformers' ``repeat_kv``: SDPA may not do GQA itself under a mask, and the static-cache
decoder always passes one), then attention reading the copies: 29-52% of a step. For one new token per row the
query heads that share a KV head can be that head's query rows instead, (b, heads, 1, d) -> (b, kv_heads, heads /
kv_heads, d), with the mask (b, 1, 1, L) broadcast over them: the same scores, K/V read once, nothing copied.
transformers 5.25 does this itself (``pack_gqa``), but not under torch.compile, i.e. not in this decoder.
Since 2026-12-03 the workers' decoder packs (workers/infer/gqa_attention.py): "stock" is
``GraphDecoder(pack_gqa=False)``.

    python3 bench/probes/gqa_pack_probe.py --cases llama-3.2-1b:32x512x128,qwen3-8b:16x1024x128 --out $OUT/gqa_pack.json

Per case and variant: the decode step (CUDA events over ``--repeat`` decodes of the same shape after two that
capture the graph) and the share of rows whose tokens equal the stock variant's (bf16 kernels may flip near-ties).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from workers.infer.decode import GraphDecoder
from workers.infer.model_load import load_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
# the same timing as the kernel profile's
from moe_step_profile import decode_step_ms


def time_decoder(model: torch.nn.Module, ids: torch.Tensor, new: int, repeat: int,
                 pack_gqa: bool) -> tuple[float, float, torch.Tensor]:
    """(ms per compiled step, ms of the prefill, the new tokens) of a fresh compiled decoder of ``model``; dynamo is
    reset after."""
    decoder = GraphDecoder(model, compile=True, pack_gqa=pack_gqa)
    step_ms, prefill_ms, tokens = decode_step_ms(decoder, ids, new, repeat)
    decoder.release()
    torch._dynamo.reset()
    return step_ms, prefill_ms, tokens


def run_case(spec: str, repeat: int, variants: tuple[str, ...] = ("stock", "packed")) -> dict[str, Any]:
    model_id, shape = spec.split(":")
    batch, prompt, new = (int(x) for x in shape.split("x"))
    cfg = resolve_model(load_catalog(), model_id)
    model = load_model(cfg, weights="bf16", seed=0, device="cuda")
    ids = torch.randint(1, cfg.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0)).cuda()
    rec: dict[str, Any] = {"case": spec, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_kv_heads,
                           "attn_implementation": getattr(getattr(model, "config", None), "_attn_implementation", None)}
    try:
        tokens: dict[str, torch.Tensor] = {}
        for variant in variants:
            step_ms, prefill_ms, tokens[variant] = time_decoder(model, ids, new, repeat, pack_gqa=variant == "packed")
            rec[f"{variant}_step_ms"] = round(step_ms, 4)
            rec[f"{variant}_prefill_ms"] = round(prefill_ms, 3)
        if len(tokens) == 2:
            rec.update(speedup=round(rec["stock_step_ms"] / rec["packed_step_ms"], 3),
                       same_rows=float((tokens["packed"] == tokens["stock"]).all(dim=-1).float().mean()),
                       same_tokens=float((tokens["packed"] == tokens["stock"]).float().mean()))
    except Exception as exc:  # a probe: record and go on to the next case
        rec["error"] = repr(exc)[:500]
    print(json.dumps(rec), flush=True)
    del model
    torch.cuda.empty_cache()
    return rec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="llama-3.2-1b:32x512x128,qwen3-8b:16x1024x128,qwen3-30b-a3b:32x512x128")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default="stock,packed", help="which decoders: stock (pack_gqa=False), packed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(0), "cases": []}
    for spec in args.cases.split(","):  # written after every case: a cut-off run keeps what it measured
        out["cases"].append(run_case(spec, args.repeat, tuple(args.variants.split(","))))
        if args.out:
            args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
