"""The compiled decoder's shipped constants are what the documented fits give on the stored H200 records
(bench/probes/prefill_probe.py --fit, bench/workers/graph_decode.py --fit;
docs/lab-notes/2026-12-03-prompt-pass-and-step-apart.md): a refit that is not committed, or a record edited by hand,
fails here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.bench.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "workers"
SHIPPED = json.loads((ROOT / "planner" / "calibration.json").read_text())["throughput"]


def _calibration_copy(tmp_path: Path) -> Path:
    path = tmp_path / "calibration.json"
    shutil.copy(ROOT / "planner" / "calibration.json", path)
    return path


def test_the_prompt_pass_constants_are_the_fit_on_the_probe_record(tmp_path: Path) -> None:
    probe = load_script("probes/prefill_probe", "prefill_probe")
    path = _calibration_copy(tmp_path)
    probe.fit([RESULTS / "prefill_probe_2026-12-03.json", RESULTS / "prefill_probe_moefit_2026-12-04.json"],
              {"qwen3-8b", "llama-3-8b", "gemma-3-12b", "qwen3-30b-a3b"}, path)
    fitted = json.loads(path.read_text())["throughput"]
    for key in ("graph_prefill_mfu", "graph_prefill_hidden_half", "graph_prefill_layer_s", "graph_prefill_expert_mfu",
                "graph_prefill_expert_width_half", "graph_prefill_expert_rows_half"):
        assert fitted[key] == pytest.approx(SHIPPED[key]), key


def test_the_decode_step_constants_are_the_fit_on_the_split_records(tmp_path: Path) -> None:
    graph_decode = load_script("workers/graph_decode", "graph_decode")
    path = _calibration_copy(tmp_path)
    records = [RESULTS / name for name in ("graph_decode_split2_2026-12-03.json", "graph_decode_split_2026-12-03.json",
                                           "graph_decode_moefit_a_2026-12-04.json",
                                           "graph_decode_moefit_b_2026-12-04.json")]
    holdout = {"llama-3.2-1b:32x512x128", "gemma-3-1b:32x512x128", "qwen3-8b:16x1024x128", "llama-3-8b:32x512x128",
               "qwen3-30b-a3b:32x512x128", "qwen3-30b-a3b:8x512x128", "qwen3-30b-a3b:64x512x128"}
    graph_decode.fit(records, holdout, path)
    fitted = json.loads(path.read_text())["throughput"]
    # the shipped values are the fit's, rounded to 4 significant figures
    assert fitted["graph_decode_layer_s"] == pytest.approx(SHIPPED["graph_decode_layer_s"], rel=1e-3)
    for key in ("graph_moe_layer_s", "graph_moe_expert_bw_efficiency", "graph_compile_layer_s"):
        assert fitted[key] == pytest.approx(SHIPPED[key], rel=1e-3), key
    assert fitted["graph_moe_pair_s"] == SHIPPED["graph_moe_pair_s"] == 0.0  # a candidate the fit did not choose
    assert fitted["graph_decode_row_param_s"] == SHIPPED["graph_decode_row_param_s"] == 0.0


def test_the_planners_defaults_are_the_shipped_fit() -> None:
    """bench/accuracy/accuracy.py --fit rebuilds planner/calibration.json from planner/calibration.py's defaults and
    does not refit the compiled decoder's constants: its defaults must be the shipped fit, or a generate() refit drops
    it."""
    from planner.calibration import ThroughputCalibration

    defaults = ThroughputCalibration()
    for key, value in SHIPPED.items():
        if key.startswith(("graph_decode_", "graph_prefill_", "graph_moe_", "graph_compile_")):
            assert getattr(defaults, key) == pytest.approx(value), key
