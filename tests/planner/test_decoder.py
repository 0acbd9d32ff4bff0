"""planner.decoder: which decoder the workers run, the one rule the plan's time and memory follow."""

from __future__ import annotations

from catalog.loader import load_catalog, resolve_model
from planner.decoder import decoder_for


def test_dense_models_decode_with_the_graph_sliding_windows_included() -> None:
    """Gemma 3's sliding layers once recompiled the captured step every token on the H200 (680 tok/s against
    5,969 planned); the workers now build their static cache as full attention (workers/decode.py), so
    sliding-window models take the graph like any dense model. MoE and quantized weights keep generate()."""
    catalog = load_catalog()
    gemma = resolve_model(catalog, "gemma-3-1b")
    assert gemma.attn.sliding_window is not None and gemma.attn.sliding_layers > 0
    assert decoder_for(gemma, "nvidia", "bf16") == "graph"
    assert decoder_for(resolve_model(catalog, "mistral-7b"), "nvidia", "bf16") == "graph"  # every layer sliding
    assert decoder_for(gemma, "nvidia", "int8") == "generate"
    llama = resolve_model(catalog, "llama-3.2-1b")
    assert decoder_for(llama, "nvidia", "bf16") == "graph"
    assert decoder_for(llama, "nvidia", "int8") == "generate"  # quantized kernels were not measured captured
    assert decoder_for(llama, "amd", "bf16") == "generate"
    assert decoder_for(resolve_model(catalog, "gpt-oss-20b"), "nvidia", "bf16") == "generate"  # MoE
    assert decoder_for(gemma, "nvidia", "bf16", given="generate") == "generate"  # a caller's choice still wins
