"""The graph decoder's tokens equal transformers' greedy ``generate()`` for the same left-padded batch,
on the families whose KV cache differs (full attention, sliding-window layers, GPT-2's learned positions),
and it stops early only when every row has produced an EOS. Run eagerly on CPU; the CUDA graph is the
same step captured (bench/probes/decode_modes_probe.py checks it on the GPU). Sliding-window models also run
the step through torch.compile on CPU, to show it compiles once rather than once per token."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.workers.tiny import left_padded, tiny_model
from workers.infer.decode import GraphDecoder

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97, "max_position_embeddings": 128},
    "qwen3": {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97,
              "max_position_embeddings": 128},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 97, "n_positions": 128},
    "gemma3-sliding": {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128,
                       "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                       "vocab_size": 97, "max_position_embeddings": 128, "sliding_window": 6,
                       "layer_types": ["sliding_attention", "sliding_attention", "full_attention"]},
    # every layer through the window, no layer_types: one mask, not a dict per layer type
    "mistral-sliding": {"model_type": "mistral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 97,
                        "max_position_embeddings": 128, "sliding_window": 6},
}
# Gemma 3 as the probe (bench/probes/decode_sliding_probe.py): an 8-token window, one sliding and one full layer
GEMMA3_WINDOW_8: dict[str, Any] = {
    "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 256,
    "max_position_embeddings": 256, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"]}




@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tokens_equal_greedy_generate(family: str) -> None:
    model = tiny_model(FAMILIES[family])
    ids, mask = left_padded([9, 4, 12], vocab=97)
    with torch.inference_mode():
        expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,  # type: ignore[operator]
                                  min_new_tokens=10, pad_token_id=0, eos_token_id=None)[:, ids.shape[1]:]
    got = GraphDecoder(model, compile=False).decode(ids, mask, max_new_tokens=10, eos=set())
    assert torch.equal(got, expected)


def test_stops_early_only_once_every_row_has_ended() -> None:
    model = tiny_model(FAMILIES["llama"])
    ids, mask = left_padded([5, 7], vocab=97)
    full = GraphDecoder(model, compile=False).decode(ids, mask, max_new_tokens=12, eos=set())
    first_row_token = int(full[0, 1])  # an "EOS" row 0 reaches at step 2; row 1 may never reach it
    ended_both = {int(full[0, 1]), int(full[1, 2])}
    checked = GraphDecoder(model, compile=False, check_every=4)
    assert torch.equal(checked.decode(ids, mask, max_new_tokens=12, eos={first_row_token})[0], full[0])
    if first_row_token not in full[1].tolist():
        assert checked.decode(ids, mask, max_new_tokens=12, eos={first_row_token}).shape[1] == 12
    early = checked.decode(ids, mask, max_new_tokens=12, eos=ended_both)
    assert early.shape[1] == 4  # both rows ended by step 3: stopped at the first check
    assert torch.equal(early, full[:, :4])


def test_timing_splits_the_prompt_pass_from_the_steps() -> None:
    """What a run reports of its prefill and its decode steps: every step counted (new tokens - 1; fewer when
    every row ended early), both times measured, nothing before the first call."""
    model = tiny_model(FAMILIES["llama"])
    ids, mask = left_padded([5, 7], vocab=97)
    decoder = GraphDecoder(model, compile=False, check_every=4)
    assert decoder.timing() is None
    full = decoder.decode(ids, mask, max_new_tokens=9, eos=set())
    timing = decoder.timing()
    assert timing is not None and timing.steps == 8 and timing.prefill_s > 0 and timing.steps_s > 0
    early = decoder.decode(ids, mask, max_new_tokens=9, eos={int(full[0, 1]), int(full[1, 2])})
    assert early.shape[1] == 4
    timing = decoder.timing()
    assert timing is not None and timing.steps == 3
    decoder.decode(ids, mask, max_new_tokens=1, eos=set())
    timing = decoder.timing()
    assert timing is not None and timing.steps == 0 and timing.steps_s >= 0


def _greedy(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, new: int) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,  # type: ignore[operator]
                                           do_sample=False, min_new_tokens=new, pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:]


def test_gemma3_past_the_window_with_left_padding_equals_generate() -> None:
    """Prompts longer than the 8-token window, rows left-padded to different lengths, 12 new tokens: the
    prefill and every step read a full-length cache for the sliding layer, the window only in the mask."""
    model = tiny_model(GEMMA3_WINDOW_8)
    ids, mask = left_padded([14, 5, 10], vocab=256)
    expected = _greedy(model, ids, mask, 12)
    assert torch.equal(GraphDecoder(model, compile=False).decode(ids, mask, max_new_tokens=12, eos=set()), expected)


@pytest.mark.usefixtures("eager_compile")
def test_gemma3_compiled_step_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 recompiled Gemma 3's step every token (the sliding layers' Python-int offset); with the
    full-length cache the step is traced once for the whole decode and gives generate()'s tokens."""
    from torch._dynamo.exc import RecompileError

    import workers.infer.decode as decode

    model = tiny_model(GEMMA3_WINDOW_8)
    ids, mask = left_padded([14, 5, 10], vocab=256)
    expected = _greedy(model, ids, mask, 12)
    assert torch.equal(GraphDecoder(model, compile=True).decode(ids, mask, max_new_tokens=12, eos=set()), expected)
    # the check sees the failure it guards against: transformers' own sliding cache recompiles
    torch._dynamo.reset()
    monkeypatch.setattr(decode, "full_attention_config", lambda config: config)
    with pytest.raises(RecompileError):
        GraphDecoder(model, compile=True).decode(ids, mask, max_new_tokens=12, eos=set())
    torch._dynamo.reset()


_TINY = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97, "max_position_embeddings": 128}
# every mixture-of-experts architecture of the catalog (gpt-oss, Qwen3-MoE, Mixtral, DeepSeek-V3/R1)
MOE_FAMILIES: dict[str, dict[str, Any]] = {
    "gpt-oss": {**_TINY, "model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 6, "layer_types": ["sliding_attention", "full_attention"]},
    "qwen3-moe": {**_TINY, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 32},
    "mixtral": {**_TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2},
    "deepseek-v3": {**_TINY, "model_type": "deepseek_v3", "head_dim": 8, "num_key_value_heads": 4,
                    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
                    "kv_lora_rank": 16, "q_lora_rank": None, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16},
}


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
@pytest.mark.usefixtures("one_graph_compile")
def test_a_mixture_of_experts_decode_step_is_one_graph(family: str) -> None:
    """The planner sends bf16 mixtures of experts to the compiled decoder (planner.decoder.graph_decode) because
    transformers' grouped_mm experts route without leaving the GPU: the step must trace as one graph (fullgraph:
    a break raises) and once for the whole decode (a recompile raises), and give the eager step's tokens."""
    model: Any = tiny_model(MOE_FAMILIES[family], dtype=torch.bfloat16)
    assert model.config._experts_implementation == "grouped_mm"
    ids, mask = left_padded([9, 4, 7], vocab=97)
    eager = GraphDecoder(model, compile=False).decode(ids, mask, max_new_tokens=6, eos=set())
    compiled = GraphDecoder(model, compile=True).decode(ids, mask, max_new_tokens=6, eos=set())
    assert torch.equal(compiled, eager)
    # the check has teeth: transformers' per-expert loop (the "eager" experts) syncs on the experts hit
    torch._dynamo.reset()
    model.set_experts_implementation("eager")
    with pytest.raises(Exception, match=r"(?i)data.dependent|nonzero|graph break|unsupported"):
        GraphDecoder(model, compile=True).decode(ids, mask, max_new_tokens=2, eos=set())
    torch._dynamo.reset()
