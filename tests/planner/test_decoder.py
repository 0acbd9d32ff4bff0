"""planner.decoder: which decoder the workers run, the one rule the plan's time and memory follow."""

from __future__ import annotations

from catalog.loader import load_catalog, resolve_model
from planner.decoder import decoder_for


def test_sliding_window_models_decode_with_generate_and_dense_full_attention_with_the_graph() -> None:
    """Gemma 3's sliding-window mask recompiled the captured step every token on the H200 (680 tok/s
    against 5,969 planned): such models keep generate(), in the plan and in the workers."""
    catalog = load_catalog()
    gemma = resolve_model(catalog, "gemma-3-1b")
    assert gemma.attn.sliding_window is not None and gemma.attn.sliding_layers > 0
    assert decoder_for(gemma, "nvidia", "bf16") == "generate"
    llama = resolve_model(catalog, "llama-3.2-1b")
    assert decoder_for(llama, "nvidia", "bf16") == "graph"
    assert decoder_for(llama, "nvidia", "int8") == "generate"  # quantized kernels were not measured captured
    assert decoder_for(llama, "amd", "bf16") == "generate"
    assert decoder_for(gemma, "nvidia", "bf16", given="graph") == "graph"  # a caller's choice still wins
