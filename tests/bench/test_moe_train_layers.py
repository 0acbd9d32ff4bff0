"""bench/accuracy/moe_train_layers.py's machinery without a GPU: the shapes it cuts and its --compare table."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.scripts import load_script

RECORD = (Path(__file__).resolve().parents[2] / "bench" / "results" / "workers" / "moe_train_layers_2026-12-04"
          / "moe_train_layers.json")


def test_a_cut_keeps_the_published_shape_and_its_dense_first_layers() -> None:
    bench = load_script("accuracy/moe_train_layers", "bench_moe_train_layers")
    deepseek = bench.cut("deepseek-v2-lite", 6)
    assert deepseek.num_layers == 6 and deepseek.moe.dense_layers == 1 and deepseek.num_experts == 64
    mixtral = bench.cut("mixtral-8x7b", 2)  # a catalog preset: its hf_config, cut
    assert (mixtral.num_layers, mixtral.hf_config["num_hidden_layers"], mixtral.num_experts) == (2, 2, 8)


def test_compare_prints_one_row_per_recorded_case_with_the_planners_times() -> None:
    bench = load_script("accuracy/moe_train_layers", "bench_moe_train_layers")
    record = json.loads(RECORD.read_text())
    record["cases"].append({"case": "broken/full/nockpt/1", "error": "OutOfMemoryError: CUDA out of memory"})
    rows = bench.compare(record).splitlines()
    assert len(rows) == 2 + len(record["cases"])
    assert rows[2].startswith("| qwen3-30b-a3b/lora/ckpt/16 | 99.2 | 33.4 / 67.1 | ")
    assert "OutOfMemoryError" in rows[-1]


def test_fit_gives_back_the_calibrations_routing_merge_and_loss_constants() -> None:
    """planner/calibration.json's three layer-record constants are this record's least squares (the loss's 71.5 was
    fitted before the last accuracy refit moved the other constants; the same command now says 71.8)."""
    bench = load_script("accuracy/moe_train_layers", "bench_moe_train_layers")
    rows = {r.split("|")[1].strip(): r.split("|") for r in bench.fit(json.loads(RECORD.read_text())).splitlines()[2:]}
    assert set(rows) == {"moe_dispatch_bytes", "lora_merged_expert_bytes", "loss_bytes_per_logit"}
    for fitted, kept in (rows[n][3:5] for n in rows):
        assert abs(float(fitted) / float(kept) - 1) < 0.01
    assert "mixtral" not in rows["moe_dispatch_bytes"][2] and "qwen3-30b" not in rows["loss_bytes_per_logit"][2]
