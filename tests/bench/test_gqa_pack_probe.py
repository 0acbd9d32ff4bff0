"""bench/gqa_pack_probe.py's packed attention: the query heads of each KV head as that head's query rows must give
the scores of transformers' repeat-K/V path exactly, so the probe's speed-up is the same computation's."""

from __future__ import annotations

import pytest
import torch

from tests.bench.scripts import load_script


class _Attention(torch.nn.Module):
    num_key_value_groups = 4
    is_causal = True


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_packed_heads_attend_as_the_repeated_cache_does(dtype: torch.dtype) -> None:
    from transformers.integrations.sdpa_attention import repeat_kv

    probe = load_script("gqa_pack_probe", "gqa_pack_probe")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((3, 8, 1, 16), (3, 2, 20, 16), (3, 2, 20, 16)))
    mask = torch.ones(3, 1, 1, 20, dtype=torch.bool) if dtype == torch.bool else torch.zeros(3, 1, 1, 20)
    mask[0, ..., :5] = False if dtype == torch.bool else float("-inf")  # a left-padded row
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask,
                                                            scale=0.25).transpose(1, 2)
    got, _ = probe.packed_sdpa(_Attention(), q, k, v, mask, scaling=0.25)
    assert got.shape == want.shape == (3, 1, 8, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # a prompt (several query positions) is left to transformers' own path, which gives the same
    q4 = torch.randn((3, 8, 4, 16), generator=gen)
    mask4 = torch.ones(3, 1, 4, 20, dtype=torch.bool)
    want4 = torch.nn.functional.scaled_dot_product_attention(q4, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask4,
                                                             scale=0.25).transpose(1, 2)
    got4, _ = probe.packed_sdpa(_Attention(), q4, k, v, mask4, scaling=0.25)
    torch.testing.assert_close(got4, want4, rtol=1e-5, atol=1e-6)
