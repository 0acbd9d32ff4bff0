"""Tiny models and specs for worker tests: each training step takes milliseconds on one CPU core."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from planner.spec import JobSpec, spec_from_dict
from planner.types import Strategy
from workers.checkpoint import open_store
from workers.train_state import read_checkpoint_state

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def write_config(folder: Path, **overrides: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **overrides}))
    return path


def tiny_spec(config: Path, *, steps: int = 12, seq_len: int = 16, micro_batch: int = 2, grad_accum: int = 1,
              world: int = 1, interval: int | None = 4, seed: int = 0, **train: Any) -> JobSpec:
    tokens = steps * seq_len * micro_batch * grad_accum * world
    section = {"tokens": tokens, "seq_len": seq_len, "checkpoint_interval_steps": interval, "seed": seed,
               "learning_rate": 1e-2, **train}
    return spec_from_dict({"name": "tiny", "task": "train", "model": {"config": str(config)}, "train": section})


def cpu_strategy(*, micro_batch: int = 2, grad_accum: int = 1, workers: int = 1, **extra: Any) -> Strategy:
    values: dict[str, Any] = {"gpu": "cpu", "gpu_count": workers, "precision": "fp32", "micro_batch": micro_batch,
                              "grad_accum": grad_accum}
    values.update(extra)
    return Strategy(**values)


def final_state(uri: str) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, model weights) of the newest checkpoint in the store at ``uri``."""
    found = read_checkpoint_state(open_store(uri))
    assert found is not None, f"no checkpoint in {uri}"
    return found


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs"
