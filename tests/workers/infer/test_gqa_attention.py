"""Packed grouped-query attention (workers/infer/gqa_attention.py): the query heads of each KV head as that head's query
rows must give the repeat-K/V path's output, the graph decoder must actually take it (a switched model whose
attention still copied K/V would decode right and slow), and generate() must get the model's own attention back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.workers.infer.test_decode import FAMILIES, GEMMA3_WINDOW_8
from tests.workers.tiny import left_padded, tiny_model
from workers.infer.decode import GraphDecoder
from workers.infer.gqa_attention import PACKED_SDPA, packed_gqa_sdpa, use_packed_gqa, use_stock_sdpa


class _Attention(torch.nn.Module):
    num_key_value_groups = 4
    is_causal = True


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_packed_heads_attend_as_the_repeated_cache_does(dtype: torch.dtype) -> None:
    from transformers.integrations.sdpa_attention import repeat_kv

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen) for shape in ((3, 8, 1, 16), (3, 2, 20, 16), (3, 2, 20, 16)))
    mask = torch.ones(3, 1, 1, 20, dtype=torch.bool) if dtype == torch.bool else torch.zeros(3, 1, 1, 20)
    mask[0, ..., :5] = False if dtype == torch.bool else float("-inf")  # a left-padded row
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask,
                                                            scale=0.25).transpose(1, 2)
    got, _ = packed_gqa_sdpa(_Attention(), q, k, v, mask, scaling=0.25)
    assert got.shape == want.shape == (3, 1, 8, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # a prompt (several query positions) is left to transformers' own path, which gives the same
    q4 = torch.randn((3, 8, 4, 16), generator=gen)
    mask4 = torch.ones(3, 1, 4, 20, dtype=torch.bool)
    want4 = torch.nn.functional.scaled_dot_product_attention(q4, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=mask4,
                                                             scale=0.25).transpose(1, 2)
    got4, _ = packed_gqa_sdpa(_Attention(), q4, k, v, mask4, scaling=0.25)
    torch.testing.assert_close(got4, want4, rtol=1e-5, atol=1e-6)


@pytest.fixture
def sdpa_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """(query rows per head, key heads) of every SDPA call: a packed decode step has several query rows per head
    and as many heads as the keys; transformers' path one row per query head, against repeated keys."""
    calls: list[tuple[int, int]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query: torch.Tensor, key: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append((query.shape[2], key.shape[1]))
        return sdpa(query, key, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    yield calls


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3-sliding", "mistral-sliding"])
def test_the_decoder_packs_and_decodes_the_stock_tokens(family: str, sdpa_calls: list[tuple[int, int]]) -> None:
    model: Any = tiny_model(FAMILIES[family])
    ids, mask = left_padded([9, 4, 12], vocab=97)
    stock = GraphDecoder(model, compile=False, pack_gqa=False).decode(ids, mask, max_new_tokens=10, eos=set())
    assert model.config._attn_implementation == "sdpa" and all(rows > 1 or kv == 4 for rows, kv in sdpa_calls)
    sdpa_calls.clear()
    decoder = GraphDecoder(model, compile=False)
    assert decoder.packed_gqa and model.config._attn_implementation == PACKED_SDPA
    packed = decoder.decode(ids, mask, max_new_tokens=10, eos=set())
    assert torch.equal(packed, stock)
    groups = FAMILIES[family]["num_attention_heads"] // FAMILIES[family]["num_key_value_heads"]
    layers = FAMILIES[family]["num_hidden_layers"]
    # the prompt through transformers' path (12 rows against 4 repeated heads), every decode step packed
    assert sdpa_calls.count((groups, 2)) == 9 * layers
    assert all(call == (groups, 2) or call == (12, 4) for call in sdpa_calls)
    decoder.release()
    assert model.config._attn_implementation == "sdpa" and not decoder.packed_gqa


def test_a_model_without_grouped_heads_or_sdpa_keeps_its_attention() -> None:
    gpt2: Any = tiny_model(FAMILIES["gpt2"])  # one KV head per query head: nothing to pack
    assert not use_packed_gqa(gpt2) and gpt2.config._attn_implementation == "sdpa"
    single: Any = tiny_model(GEMMA3_WINDOW_8)  # one KV head: repeat_kv is a view, packing only costs parallelism
    assert not use_packed_gqa(single) and single.config._attn_implementation == "sdpa"
    eager: Any = tiny_model(FAMILIES["llama"])
    eager.set_attn_implementation("eager")  # gpt-oss's sinks run eager: its own expansion stays
    assert not GraphDecoder(eager, compile=False).packed_gqa and eager.config._attn_implementation == "eager"
    use_stock_sdpa(eager)
    assert eager.config._attn_implementation == "eager"


@pytest.mark.usefixtures("one_graph_compile")
def test_the_packed_step_compiles_once() -> None:
    """The compiled decoder captures the packed step as one graph for the whole decode (a break or a recompile
    raises), as the CUDA graph on the GPU needs."""
    model = tiny_model(FAMILIES["qwen3"])
    ids, mask = left_padded([9, 4, 12], vocab=97)
    eager = GraphDecoder(model, compile=False).decode(ids, mask, max_new_tokens=8, eos=set())
    decoder = GraphDecoder(model, compile=True)
    compiled = decoder.decode(ids, mask, max_new_tokens=8, eos=set())
    assert decoder.packed_gqa and torch.equal(compiled, eager)


def test_a_single_kv_head_attends_as_transformers_does() -> None:
    q, k, v = torch.randn(2, 4, 1, 8), torch.randn(2, 1, 6, 8), torch.randn(2, 1, 6, 8)
    got, _ = packed_gqa_sdpa(_Attention(), q, k, v, torch.ones(2, 1, 1, 6, dtype=torch.bool), scaling=0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q, k.expand(2, 4, 6, 8), v.expand(2, 4, 6, 8), scale=0.5)
    torch.testing.assert_close(got, want.transpose(1, 2))
