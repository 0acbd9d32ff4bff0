"""Grouped-query attention for one new token per row without copying the KV cache: each KV head's query heads
become that head's query rows, (b, heads, 1, d) -> (b, kv_heads, heads / kv_heads, d), so SDPA reads K and V once.

Why: transformers' SDPA path repeats every KV head for its query heads (``repeat_kv``) whenever a mask is passed,
and the static-cache decoder (workers/infer/decode.py) always passes one (left padding, the unwritten tail). On an H200
that copy and the attention reading it were 29% of Qwen3-30B-A3B's compiled decode step; packing the heads made the
step 1.33x faster there and 1.52x for llama-3.2-1b at batch 32 (bench/probes/gqa_pack_probe.py,
bench/results/workers/gqa_pack_probe_2026-12-03.json). The scores are the same dot products: the output equals the
repeat path's (tests/workers/infer/test_gqa_attention.py). transformers 5.25 packs too (``pack_gqa``), but not under
torch.compile, i.e. not in this decoder.

Not for one KV head (gemma-3-1b): there ``repeat_kv`` is a stride-0 view, nothing is copied, and packing only
takes parallelism from the kernel (b x heads blocks become b): gemma-3-1b decoded 8-13% slower packed on the H200
(bench/results/workers/graph_decode_packed_2026-12-03_raw.json). Anything else (a prompt, dropout, soft-capping,
attention sinks, one query head per KV head) goes to transformers' own SDPA function unchanged. The model's masks
stay SDPA's: the implementation is registered with SDPA's mask builder under its own name, so models that never ask
for it are untouched.
"""

from __future__ import annotations

from typing import Any

import torch

PACKED_SDPA = "gpuplan_packed_gqa_sdpa"


def packed_gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (b, heads, q, d) query, (b, kv_heads, L, d) key and value;
    returns (b, q, heads, d)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    b, heads, q, d = query.shape
    plain = dropout == 0.0 and kwargs.get("softcap") is None and kwargs.get("s_aux") is None
    one_mask = attention_mask is None or attention_mask.shape[1] == 1
    if plain and groups > 1 and key.shape[1] > 1 and q == 1 and one_mask:
        # the mask (b, 1, 1, L) broadcasts over the packed rows: every query head of a row sees the same keys
        packed = query.reshape(b, heads // groups, groups, d)
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                               scale=scaling)
        return out.reshape(b, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    is_causal=is_causal, **kwargs)
    return out, None


def _register() -> None:
    """Idempotent: the name maps to the same function and SDPA's own mask builder every time."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_SDPA, packed_gqa_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)


def _copies_kv(config: Any) -> bool:
    """Whether transformers' SDPA path copies the cache: several query heads per KV head, and several KV heads."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(text, "num_key_value_heads", 0) or 0)
    return 1 < kv_heads < heads


def use_packed_gqa(model: torch.nn.Module) -> bool:
    """Switch an SDPA model with grouped-query attention to the packed form; whether it now runs packed (an eager
    model, e.g. gpt-oss's sinks, one KV head per query head, or a single KV head, keeps its own)."""
    config: Any = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == PACKED_SDPA:
        return True
    if implementation != "sdpa" or not _copies_kv(config):
        return False
    _register()
    model.set_attn_implementation(PACKED_SDPA)  # type: ignore[operator]
    return True


def use_stock_sdpa(model: torch.nn.Module) -> None:
    """Undo ``use_packed_gqa`` (a no-op on a model it did not switch)."""
    config: Any = getattr(model, "config", None)
    if config is not None and getattr(config, "_attn_implementation", None) == PACKED_SDPA:
        model.set_attn_implementation("sdpa")  # type: ignore[operator]
