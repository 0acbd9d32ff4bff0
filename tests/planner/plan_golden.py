"""Pinned ``plan()`` answers: the whole Plan JSON of a fixed set of specs on frozen inputs.

The inputs are a copy of the catalog data and calibration as of the golden's making
(``tests/planner/data/golden/``), so refreshed prices or a refit elsewhere do not move it; only a change
to the planner's code does. A change that is meant to alter plans regenerates the file and shows the
changed numbers in its diff:

    PYTHONPATH=$PWD .venv/bin/python -m tests.planner.plan_golden   # rewrites data/golden/plans.json.gz
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from catalog.loader import Catalog, load_catalog
from errors import GpuplanError
from planner.calibration import Calibration, load_calibration
from planner.search import Objective, plan
from planner.spec import JobSpec, spec_from_dict

DATA = Path(__file__).resolve().parent / "data" / "golden"
GOLDEN = DATA / "plans.json.gz"

# (name, objective, spec): the job types of bench/service/plan_speed.py and examples/, plus pinned knobs, multi-node,
# MoE, spot-only, fp8, and a spec whose every option is rejected (its error is pinned too).
SPECS: list[tuple[str, Objective, dict[str, Any]]] = [
    ("example-8b-sft", "cheapest", {
        "name": "llama3-8b-sft", "task": "train", "model": "llama-3-8b",
        "train": {"tokens": 2.0e9, "seq_len": 4096, "global_batch": 64},
        "resources": {"spot": "auto", "deadline": "48h", "budget_usd": 2500}}),
    ("70b-full-4k", "cheapest", {
        "task": "train", "model": "llama-3-70b", "train": {"tokens": 1e9, "seq_len": 4096},
        "resources": {"deadline": "72h"}}),
    ("1b-lora", "fastest", {
        "task": "train", "model": "llama-3.2-1b", "train": {"tokens": 5e8, "seq_len": 2048, "finetune": "lora"}}),
    ("8b-infer", "cheapest", {
        "task": "infer", "model": "llama-3-8b",
        "infer": {"batch": 32, "prompt_tokens": 1024, "output_tokens": 256, "requests": 1e6}}),
    ("mixtral-qlora", "cheapest", {
        "task": "train", "model": "mixtral-8x7b",
        "train": {"tokens": 2e8, "seq_len": 2048, "finetune": "qlora", "activation_checkpointing": True},
        "resources": {"spot": "never", "max_gpus": 8}}),
    ("70b-lora-spot", "cheapest", {
        "task": "train", "model": "llama-3-70b", "train": {"tokens": 5e8, "seq_len": 4096, "finetune": "lora"},
        "resources": {"accelerators": ["H100", "H200", "A100-80GB"], "spot": "always", "deadline": "72h",
                      "budget_usd": 3000}}),
    ("8b-pinned-fp8-fsdp-16", "fastest", {
        "task": "train", "model": "llama-3.1-8b",
        "train": {"tokens": 5e9, "seq_len": 8192, "precision": "fp8", "sharding": "fsdp", "micro_batch": 2,
                  "optimizer": "adamw-8bit"},
        "resources": {"accelerators": ["H100:16", "H200:16"]}}),
    ("qwen3-moe-train", "cheapest", {
        "task": "train", "model": "qwen3-30b-a3b", "train": {"tokens": 1e9, "seq_len": 4096, "global_batch": 128},
        "resources": {"max_gpus": 32}}),
    ("gpt-oss-20b-infer", "fastest", {
        "task": "infer", "model": "gpt-oss-20b",
        "infer": {"batch": 8, "prompt_tokens": 2048, "output_tokens": 512, "requests": 1e5}}),
    ("gpt2-sgd-fp32", "cheapest", {
        "task": "train", "model": "gpt2",
        "train": {"tokens": 1e8, "seq_len": 1024, "precision": "fp32", "optimizer": "sgd"}}),
    ("gemma-int8-serve", "cheapest", {
        "task": "infer", "model": "gemma-3-27b",
        "infer": {"batch": 16, "prompt_tokens": 4096, "output_tokens": 256, "requests": 1e5, "weights": "int8"}}),
    ("405b-nothing-fits", "cheapest", {
        "task": "train", "model": "llama-3-405b", "train": {"tokens": 1e9, "seq_len": 4096},
        "resources": {"accelerators": ["L4"], "max_gpus": 8}}),
]


def inputs() -> tuple[Catalog, Calibration]:
    return load_catalog(DATA / "catalog"), load_calibration(DATA / "calibration.json")


def answer(catalog: Catalog, cal: Calibration, objective: Objective, spec: JobSpec) -> dict[str, Any]:
    """The plan as JSON-ready data, or the error it raises (type, message, hint)."""
    try:
        result = plan(spec, catalog, calibration=cal, objective=objective)
    except GpuplanError as exc:  # the refusal is part of the pinned answer
        return {"error": type(exc).__name__, "message": str(exc), "hint": getattr(exc, "hint", None)}
    loaded: dict[str, Any] = json.loads(result.model_dump_json())
    return loaded


def answers() -> dict[str, dict[str, Any]]:
    catalog, cal = inputs()
    return {name: answer(catalog, cal, objective, spec_from_dict(spec)) for name, objective, spec in SPECS}


def load_golden() -> dict[str, dict[str, Any]]:
    with gzip.open(GOLDEN, "rt", encoding="utf-8") as f:
        loaded: dict[str, dict[str, Any]] = json.load(f)
    return loaded


def main() -> int:
    data = json.dumps(answers(), indent=1, sort_keys=True)
    with gzip.GzipFile(GOLDEN, "wb", mtime=0) as f:  # mtime 0: the same answers give the same bytes
        f.write(data.encode("utf-8"))
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
