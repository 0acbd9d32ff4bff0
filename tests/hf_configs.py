"""Published Hugging Face config.json files (tests/data/hf_configs), as dicts and as gpuplan models."""

from __future__ import annotations

import json
from pathlib import Path

from catalog.hf_config import model_from_hf_config
from catalog.schema import ModelConfig

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


def hf_config(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def hf_model(name: str, **over: object) -> ModelConfig:
    """The model ``name``'s config.json describes, with the keys in ``over`` replaced."""
    return model_from_hf_config({**hf_config(name), **over}, model_id=name)
