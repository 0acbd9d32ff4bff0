"""Tiny random-init Hugging Face models and left-padded prompt batches, for the decoder tests."""

from __future__ import annotations

from typing import Any

import torch


def tiny_model(hf: dict[str, Any], dtype: torch.dtype = torch.float32) -> Any:
    """A causal LM from a config dict (seed 0), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**hf)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def left_padded(widths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of rows ``widths`` long, left-padded with 0 to the longest (seed 1)."""
    width = max(widths)
    gen = torch.Generator().manual_seed(1)
    ids = torch.zeros((len(widths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, w in enumerate(widths):
        ids[row, width - w:] = torch.randint(1, vocab, (w,), generator=gen)
        mask[row, width - w:] = 1
    return ids, mask
