"""CPU probe: can the workers' compiled decode step serve a sliding-window model (Gemma 3) without recompiling?

transformers' static cache gives sliding layers a window-sized buffer whose update branches on a Python int
(`cumulative_length_int`), and its mask code reads the same int: torch.compile guards on it, so every token is
a new graph (the H200 saw 680 tok/s and a 375 s first batch). This probe tries the recipe for a fix: a static
cache built as if every layer were full attention (a full-length buffer for the sliding layers too, written by
position), and the per-layer-type masks built outside the compiled step and passed as transformers 5's mask
dict. It prints dynamo's recompiles (run with TORCH_LOGS=recompiles) and whether the tokens equal
generate()'s past the window.

    TORCH_LOGS=recompiles .venv/bin/python bench/probes/decode_sliding_probe.py
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, StaticCache
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask


def main() -> int:
    cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=32, vocab_size=256, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"], max_position_embeddings=256)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(cfg).eval()

    def step(ids: torch.Tensor, pos: torch.Tensor, masks: dict[str, Any], cache: Any) -> torch.Tensor:
        out = model(input_ids=ids, position_ids=pos, attention_mask=masks, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        return out.logits[:, -1, :].argmax(-1)

    compiled = torch.compile(step, mode="default", fullgraph=False, dynamic=False)

    def masks_for(ids: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cache: Any) -> dict[str, Any]:
        kw = {"config": model.config, "inputs_embeds": model.model.embed_tokens(ids), "attention_mask": mask,
              "cache": cache, "position_ids": pos}
        return {"full_attention": create_causal_mask(**kw),
                "sliding_attention": create_sliding_window_causal_mask(**kw)}

    rows, width, new = 2, 12, 12  # 24 positions through an 8-token window
    ids = torch.randint(0, 256, (rows, width))
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)[:, width:]
    flat = copy.deepcopy(model.config)
    flat.layer_types = ["full_attention"] * flat.num_hidden_layers
    flat.sliding_window = None
    cache = StaticCache(config=flat, max_cache_len=width + new)
    mask = torch.zeros((rows, width + new), dtype=torch.long)
    mask[:, :width] = 1
    pos = torch.arange(width)[None].expand(rows, -1)
    out = []
    with torch.inference_mode():
        tok = step(ids, pos, masks_for(ids, pos, mask, cache), cache)
        p = pos[:, -1:] + 1
        for t in range(new):
            out.append(tok)
            if t + 1 == new:
                break
            mask[:, width + t] = 1
            tid = tok[:, None]
            tok = compiled(tid, p, masks_for(tid, p, mask, cache), cache).clone()
            p = p + 1
    got = torch.stack(out, 1)
    print("tokens equal generate():", bool((got == ref).all()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
