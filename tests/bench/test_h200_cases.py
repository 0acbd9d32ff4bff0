"""Integrity of the H200 calibration cases and their measured results (pure file checks, no GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "bench" / "accuracy" / "cases.yaml"
RESULTS = ROOT / "bench" / "results" / "h200.json"
PRESETS = ROOT / "catalog" / "data" / "models.yaml"

# Shape keys that decide memory and FLOPs; the measured model must be the catalog preset's shape.
SHAPE_KEYS = [
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
    "n_embd",
    "n_layer",
    "n_head",
    "n_positions",
]
TRAIN_KNOBS = {
    "precision": {"fp32", "amp-bf16", "bf16", "fp8"},
    "optimizer": {"adamw", "adamw-8bit", "sgd", "adafactor"},
    "finetune": {"full", "lora", "qlora"},
    "sharding": {"none", "ddp", "fsdp", "fsdp-grad-op"},
}


def _load() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    data = yaml.safe_load(CASES.read_text())
    return data["models"], [{**data["defaults"], **c} for c in data["cases"]]


def test_exactly_a_third_held_out_and_spread_over_groups() -> None:
    _, cases = _load()
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len(cases) % 3 == 0
    held = [c for c in cases if c["holdout"]]
    assert len(held) == len(cases) // 3
    # every group (task x single/multi GPU) has hold-out cases
    groups = {(c["task"], c["gpu_count"] > 1) for c in cases}
    assert groups == {(c["task"], c["gpu_count"] > 1) for c in held}


def test_coverage_matches_the_brief() -> None:
    _, cases = _load()
    train = [c for c in cases if c["task"] == "train" and c["gpu_count"] == 1]
    multi = [c for c in cases if c["gpu_count"] == 2]
    assert len(train) + sum(c["task"] == "infer" for c in cases) >= 28
    assert len(multi) >= 4
    for knob, values in TRAIN_KNOBS.items():
        seen = {c[knob] for c in cases if c["task"] == "train"}
        assert seen <= values, f"{knob} has unknown values {seen - values}"
        if knob != "sharding":
            assert seen == values, f"{knob} never measured: {values - seen}"
    assert {c["sharding"] for c in multi} == {"ddp", "fsdp", "fsdp-grad-op"}
    assert {c["activation_checkpointing"] for c in train} == {True, False}
    assert {c["weights"] for c in cases if c["task"] == "infer"} >= {"bf16", "int8", "fp8"}


def test_case_models_have_the_catalog_preset_shapes() -> None:
    models, cases = _load()
    presets = {m["id"]: m["hf_config"] for m in yaml.safe_load(PRESETS.read_text())}
    for model_id in {c["model"] for c in cases}:
        assert model_id in presets, f"{model_id} is not a catalog preset"
        mine, theirs = models[model_id], presets[model_id]
        for key in SHAPE_KEYS:
            if key in mine or key in theirs:
                assert mine.get(key) == theirs.get(key), f"{model_id}.{key}: {mine.get(key)} != {theirs.get(key)}"


def test_infer_cases_fit_their_context() -> None:
    models, cases = _load()
    for c in cases:
        if c["task"] != "infer":
            continue
        assert c["seq_len"] == c["prompt_tokens"] + c["output_tokens"], c["id"]
        m = models[c["model"]]
        assert c["seq_len"] <= m.get("max_position_embeddings", m.get("n_positions")), c["id"]


@pytest.mark.skipif(not RESULTS.exists(), reason="no measured results yet")
def test_results_match_cases_and_are_consistent() -> None:
    _, cases = _load()
    doc = json.loads(RESULTS.read_text())
    by_id = {r["id"]: r for r in doc["results"]}
    assert set(by_id) <= {c["id"] for c in cases}
    for c in cases:
        r = by_id.get(c["id"])
        if r is None:
            continue
        for key in ("model", "task", "seq_len", "micro_batch", "precision", "optimizer", "holdout", "gpu_count"):
            assert r[key] == c[key], f"{c['id']}.{key} differs between cases.yaml and results"
        if r.get("oom"):
            assert "out of memory" in r["error"].lower()
        elif not r.get("error"):
            # a measured run: peak allocated <= peak reserved <= the GPU, and a positive speed
            assert 0 < r["peak_allocated_bytes"] <= r["peak_reserved_bytes"] <= r["gpu_total_bytes"]
            assert r["weights_and_state_after_build_bytes"] <= r["peak_allocated_bytes"]
            speed = r.get("tokens_per_s") if c["task"] == "train" else r.get("decode_tokens_per_s")
            assert speed and speed > 0
    assert any(r.get("oom") for r in by_id.values()), "at least one measured case must not fit"
