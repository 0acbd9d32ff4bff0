"""Integrity of bench/accuracy/cases_models.yaml (issue 12's H200 cases), pure file checks: a third held out, chosen
by position; every measured shape is the catalog preset's (or the preset with fewer layers); every case
the planner is asked about fits one H200, so a measurement can only confirm or refute the numbers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from catalog.hf_config import model_from_hf_config
from catalog.loader import PACKAGED_DATA_DIR, load_catalog

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "bench" / "accuracy" / "cases_models.yaml"
LAYER_KEYS = {"num_hidden_layers", "layer_types", "max_window_layers"}


def _load() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = yaml.safe_load(CASES.read_text())
    return data["models"], [{**data["defaults"], **c} for c in data["cases"]]


def test_every_third_case_is_held_out() -> None:
    _, cases = _load()
    assert len({c["id"] for c in cases}) == len(cases)
    assert [c["holdout"] for c in cases] == [i % 3 == 2 for i in range(len(cases))]


def test_models_are_the_presets_or_the_presets_with_fewer_layers() -> None:
    models, cases = _load()
    cat = load_catalog(PACKAGED_DATA_DIR)
    assert {c["model"] for c in cases} <= set(models)
    for name, cfg in models.items():
        base = re.sub(r"-l\d+$", "", name)
        preset = cat.model(base).hf_config
        keys = (set(cfg) | set(preset)) - {"architectures", "torch_dtype", "transformers_version"}
        differing = {k for k in keys if cfg.get(k) != preset.get(k)}
        if base == name:
            assert differing == set(), name
        else:
            assert differing <= LAYER_KEYS and cfg["num_hidden_layers"] == int(name.rsplit("-l", 1)[1]), name
        model_from_hf_config(cfg, name)  # parses


def test_the_issue_12_mechanisms_are_all_covered() -> None:
    models, cases = _load()
    parsed = {name: model_from_hf_config(cfg, name) for name, cfg in models.items()}
    used = [parsed[c["model"]] for c in cases]
    assert any(m.attn.eager and m.moe is not None and m.moe.expert_loop for m in used)  # gpt-oss
    assert any(m.attn.sliding_layers and m.attn.qk_norm == "head" for m in used)  # Gemma 3
    assert any(m.attn.qk_norm == "full" for m in used)  # OLMo 2
    assert any(m.moe is not None and not m.moe.expert_loop for m in used)  # grouped MoE
    small = [c for c in cases if c["task"] == "train" and c["micro_batch"] == 1 and c["seq_len"] <= 256]
    assert len(small) >= 3  # launch-bound training steps
    for task in ("train", "infer"):
        assert any(c["holdout"] for c in cases if c["task"] == task)
