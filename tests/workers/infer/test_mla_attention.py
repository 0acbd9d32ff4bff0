"""workers/infer/mla_attention.py: the absorbed latent attention of a decode step gives the expanded form's output (a
DeepSeek-V2 and a DeepSeek-V3 shape, fp32 on CPU), the graph decoder's tokens are generate()'s, prompt passes still
expand, and the switch is undone by release()."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.workers.tiny import left_padded, tiny_model
from workers.infer.decode import GraphDecoder
from workers.infer.mla_attention import ABSORBED_MLA, use_absorbed_mla, use_stock_mla

_TINY = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 97, "max_position_embeddings": 128, "kv_lora_rank": 16,
         "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12, "n_routed_experts": 8,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1, "first_k_dense_replace": 1}
MLA: dict[str, dict[str, Any]] = {
    "deepseek-v2": {**_TINY, "model_type": "deepseek_v2", "q_lora_rank": None, "n_group": 1, "topk_group": 1},
    "deepseek-v3-q-lora": {**_TINY, "model_type": "deepseek_v3", "q_lora_rank": 24, "n_group": 2, "topk_group": 1},
}




@pytest.mark.parametrize("family", sorted(MLA))
def test_an_absorbed_step_gives_the_expanded_steps_logits(family: str) -> None:
    """One prompt pass and four single-token steps with a growing cache, left-padded rows: every step's logits
    equal the stock model's to fp32 rounding (the absorbed form is the same sums in another order)."""
    from transformers import DynamicCache

    model = tiny_model(MLA[family])
    ids, mask = left_padded([7, 3, 5], vocab=97)

    def run() -> list[torch.Tensor]:
        cache, m, logits = DynamicCache(config=model.config), mask.clone(), []
        with torch.inference_mode():
            out = model(input_ids=ids, attention_mask=m, past_key_values=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(4):
                m = torch.cat([m, torch.ones_like(token)], dim=1)
                out = model(input_ids=token, attention_mask=m, past_key_values=cache, use_cache=True)
                logits.append(out.logits[:, -1])
                token = out.logits[:, -1].argmax(-1, keepdim=True)
        return logits

    expansions = []
    for layer in model.model.layers:  # kv_b_proj runs only where the cache is expanded
        layer.self_attn.kv_b_proj.register_forward_hook(lambda *_: expansions.append(1))
    stock = run()
    layers = len(model.model.layers)
    assert len(expansions) == 5 * layers  # the prompt and every step expand the whole cache
    assert use_absorbed_mla(model) and model.config._attn_implementation == ABSORBED_MLA
    expansions.clear()
    absorbed = run()
    assert len(expansions) == layers  # only the prompt pass expands; the four steps attend over the latents
    for a, b in zip(absorbed, stock, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    use_stock_mla(model)
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model.model.layers[0].self_attn, "_gpuplan_latent_kv")
    torch.testing.assert_close(run()[0], stock[0])


@pytest.mark.parametrize("family", sorted(MLA))
def test_the_graph_decoder_absorbs_and_its_tokens_equal_generate(family: str) -> None:
    model = tiny_model(MLA[family])
    ids, mask = left_padded([9, 4, 12], vocab=97)
    with torch.inference_mode():
        expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                                  min_new_tokens=8, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    decoder = GraphDecoder(model, compile=False)
    assert decoder.absorbed_mla and not decoder.packed_gqa
    got = decoder.decode(ids, mask, max_new_tokens=8, eos=set())
    assert torch.equal(got, expected)
    decoder.release()
    assert model.config._attn_implementation == "sdpa"
    assert not GraphDecoder(model, compile=False, absorb_mla=False).absorbed_mla


def test_a_model_without_latent_attention_is_left_alone() -> None:
    llama = tiny_model({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50})
    assert not use_absorbed_mla(llama) and llama.config._attn_implementation == "sdpa"


def test_a_quantized_latent_projection_is_left_to_transformers() -> None:
    """A kv_b_proj that is not a plain floating-point weight (torchao's quantized tensors) cannot be sliced per head:
    such layers keep the expansion, and a model with no other is not switched at all."""
    model = tiny_model(MLA["deepseek-v2"])
    for layer in model.model.layers:
        proj = layer.self_attn.kv_b_proj
        proj.weight = torch.nn.Parameter(proj.weight.data.to(torch.int8), requires_grad=False)
    assert not use_absorbed_mla(model) and model.config._attn_implementation == "sdpa"
