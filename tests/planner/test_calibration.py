"""The shipped calibration file: valid, physical, and fitted on non-holdout cases only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from errors import CatalogError
from planner.calibration import DEFAULT_CALIBRATION_PATH, MIB, Calibration, load_calibration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "accuracy"
CASE_FILES = (BENCH / "cases.yaml", BENCH / "cases_models.yaml", BENCH / "cases_quant_moe.yaml",
              BENCH / "cases_moe_infer.yaml")


def test_shipped_calibration_loads_and_is_physical() -> None:
    cal = load_calibration()
    assert DEFAULT_CALIBRATION_PATH.is_file()
    assert 200 * MIB < cal.memory.cuda_context_bytes < 2048 * MIB
    assert all(0 <= v < 1.5 for v in cal.memory.reserved_overhead.values())
    assert all(0 < v <= 1 for v in cal.throughput.mfu_max.values())
    assert 0 < cal.throughput.decode_bw_efficiency <= 1 and 0 < cal.throughput.prefill_mfu <= 1
    # batched_mm's gathers stream at about the datasheet bandwidth (repeated reads partly from L2), not beyond
    assert 0.7 < cal.throughput.decode_gather_bw_efficiency < 1.5
    assert all(v > 0 for v in cal.throughput.optimizer_passes.values())
    assert cal.source


def test_no_holdout_case_was_used_for_fitting() -> None:
    if not all(f.is_file() for f in CASE_FILES):
        pytest.skip("a bench/accuracy/cases*.yaml file the calibration was fitted on is not in this checkout")
    cases = [c for f in CASE_FILES for c in yaml.safe_load(f.read_text())["cases"]]
    holdout = {c["id"] for c in cases if c.get("holdout")}
    fitted = set(load_calibration().fitted_on)
    assert not fitted & holdout
    assert fitted <= {c["id"] for c in cases}


def test_missing_default_file_means_defaults_and_bad_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        load_calibration(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"memory": {"cuda_context_bytes": "lots"}}')
    with pytest.raises(CatalogError, match="invalid"):
        load_calibration(bad)
    assert Calibration().memory.cuda_context_bytes > 0


ACCEPTANCE = Path(__file__).resolve().parents[2] / "bench" / "results" / "acceptance"


def test_reserved_memory_under_expandable_segments_matches_the_h200_acceptance_runs(tmp_path: Path) -> None:
    """The training runs bench/accuracy/gpu_acceptance.py measured on one H200 with the workers' allocator:
    the shipped calibration predicts their peak reserved within 3%, and the plans that ran stay fit
    verdicts (allocated + slack + context within the limit) although reserved fills more of the GPU."""
    import json

    from catalog.loader import load_catalog, resolve_model
    from planner.memory_train import train_memory
    from planner.types import Strategy

    catalog = load_catalog()
    qwen = tmp_path / "qwen3-0.6b.json"
    qwen.write_text(json.dumps({
        "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
        "max_position_embeddings": 40960, "tie_word_embeddings": True}))
    models = {"1b-full-auto": catalog.model("llama-3.2-1b"), "8b-lora-auto": catalog.model("llama-3-8b"),
              "kill-resume": catalog.model("llama-3.2-1b"), "config-path": resolve_model(catalog, qwen)}
    cal = load_calibration().memory
    runs = json.loads((ACCEPTANCE / "2026-12-01_run3.json").read_text())["cases"]
    runs += [c for c in json.loads((ACCEPTANCE / "2026-12-01_run2.json").read_text())["cases"]
             if c["case"] in ("1b-full-auto", "8b-lora-auto")]
    checked = 0
    for case in runs:
        if case["case"] not in models or not case["measured_peak_reserved_bytes"]:
            continue
        marker = '"strategy": '
        text = case["output_tail"]
        strategy = Strategy.model_validate(json.JSONDecoder().raw_decode(text, text.index(marker) + len(marker))[0])
        est = train_memory(models[case["case"]], strategy, 2048, catalog.gpu("H200"), cal)
        assert est.peak_allocated_bytes == pytest.approx(case["measured_peak_allocated_bytes"], rel=0.01)
        assert est.peak_reserved_bytes == pytest.approx(case["measured_peak_reserved_bytes"], rel=0.03), case["case"]
        assert est.fits
        checked += 1
    assert checked == 4  # 1b full (twice: run 2, and run 3 resumed), 8b LoRA, Qwen3-0.6B config
