"""Latent attention (DeepSeek's MLA) for one new token per row without expanding the cache: the decode step attends
over the cached latents themselves, the key and value projections folded into the query and the output.

Why: transformers caches MLA's compressed latents (the normalized ``kv_lora_rank`` vector and the shared rotary key
of every position) and, every step, expands the whole cache back to per-head keys and values (``expand_kv``:
``kv_b_proj`` over every cached position, then a copy into a new key tensor) before SDPA reads them. On an H200 that
expansion was a ~3.2 ms GEMM of DeepSeek-V2-Lite's 19.7 ms step at 32 rows x 576 positions, and reading the
expanded keys and values another ~3 ms (bench/workers/decode_step_profile.py,
docs/lab-notes/2026-12-04-decode-step-profile.md "Where a compiled decode
step's time goes"). For one query position the expansion can be folded away (the "absorbed" form DeepSeek's own
inference uses): with ``W_k``, ``W_v`` a head's slices of ``kv_b_proj``, the head's score of position ``j`` is
``q_nope . (W_k c_j) + q_rope . r_j = (W_k^T q_nope) . c_j + q_rope . r_j`` and its output
``sum_j p_j W_v c_j = W_v (sum_j p_j c_j)``. The step then reads each latent once for every head, at
``kv_lora_rank + rope`` numbers a position instead of ``heads x (2 x head_dim)``.

Prompt passes (more than one query position) expand as before: the absorbed scores cost ``kv_lora_rank /
qk_nope_head_dim`` times the FLOPs there and would materialise their scores. The output equals the expanded form's
up to rounding (tests/workers/infer/test_mla_attention.py). Only modules with transformers' latent cache and its
``expand_kv`` (DeepSeek-V2/V3 and their relatives) and a bias-free ``kv_b_proj`` are switched; ``use_stock_mla``
switches them back.
"""

from __future__ import annotations

import types
from typing import Any

import torch

ABSORBED_MLA = "gpuplan_absorbed_mla"
_LATENT = "_gpuplan_latent_kv"  # a module attribute: its expand_kv returns the latents, this attention absorbs them


def _latent_expand_kv(self: Any, kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's latents as they are: (b, 1, L, kv_lora_rank) and (b, 1, L, rope); the attention expands them
    for a prompt and absorbs them for a step."""
    return kv_nope, k_rot


def absorbed_mla_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; ``key``/``value`` are the latents (``_latent_expand_kv``) on a
    switched module. Returns (b, q, heads, v_head_dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not getattr(module, _LATENT, False):
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        return out, None
    latent, rope = key, value
    _, heads, q, _ = query.shape
    if q != 1 or dropout != 0.0:
        k, v = type(module).expand_kv(module, latent, rope)  # the class's own expansion, not the switched one
        out, _ = sdpa_attention_forward(module, query, k, v, attention_mask, dropout=dropout, scaling=scaling,
                                        **kwargs)
        return out, None
    nope, rank = module.qk_nope_head_dim, module.kv_lora_rank
    weight = module.kv_b_proj.weight.view(heads, nope + module.v_head_dim, rank)
    # the heads are the rows of one matmul against the one latent "KV head" of each row: (b, heads, .) x (b, L, .)
    # as batched matmuls, never broadcast over the heads (a broadcast matmul copies the cache once per head: tried,
    # 2.3x slower on the H200)
    lat, rope_k = latent[:, 0], rope[:, 0]  # (b, L, rank), (b, L, rope)
    q_latent = torch.einsum("bhd,hdr->bhr", query[:, :, 0, :nope], weight[:, :nope])  # each head's query, folded
    scores = (torch.bmm(q_latent, lat.transpose(1, 2))
              + torch.bmm(query[:, :, 0, nope:], rope_k.transpose(1, 2)))  # (b, heads, L)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = scores.float() * scale
    if attention_mask is not None:
        mask = attention_mask[:, 0, :, -lat.shape[1]:]  # (b, 1, L)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(lat.dtype)
    out_latent = torch.bmm(probs, lat)  # (b, heads, rank)
    out = torch.einsum("bhr,hvr->bhv", out_latent, weight[:, nope:])
    return out[:, None], None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ABSORBED_MLA, absorbed_mla_attention)
    AttentionMaskInterface.register(ABSORBED_MLA, sdpa_mask)


def _latent_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' latent-cache attention modules: a class ``expand_kv`` and a bias-free ``kv_b_proj`` whose weight
    is a plain floating-point tensor (a quantized one, e.g. torchao's, cannot be sliced per head as it stands)."""
    out: list[torch.nn.Module] = []
    for m in model.modules():
        proj = getattr(m, "kv_b_proj", None)
        plain = (isinstance(proj, torch.nn.Linear) and proj.bias is None and type(proj.weight.data) is torch.Tensor
                 and proj.weight.dtype in (torch.float32, torch.bfloat16, torch.float16))
        if (plain and callable(getattr(type(m), "expand_kv", None)) and hasattr(m, "kv_lora_rank")
                and hasattr(m, "qk_nope_head_dim")):
            out.append(m)
    return out


def use_absorbed_mla(model: torch.nn.Module) -> bool:
    """Switch an SDPA model with transformers' latent MLA cache to the absorbed decode; whether it now runs so."""
    config: Any = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == ABSORBED_MLA:
        return True
    modules = _latent_modules(model)
    if implementation != "sdpa" or not modules:
        return False
    _register()
    for m in modules:
        setattr(m, "expand_kv", types.MethodType(_latent_expand_kv, m))  # noqa: B010 - an instance's own method
        setattr(m, _LATENT, True)
    model.set_attn_implementation(ABSORBED_MLA)  # type: ignore[operator]
    return True


def use_stock_mla(model: torch.nn.Module) -> None:
    """Undo ``use_absorbed_mla`` (a no-op on a model it did not switch)."""
    config: Any = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != ABSORBED_MLA:
        return
    for m in _latent_modules(model):
        if getattr(m, _LATENT, False):
            del m.expand_kv
            delattr(m, _LATENT)
    model.set_attn_implementation("sdpa")  # type: ignore[operator]
