"""The shipped calibration file: valid, physical, and fitted on non-holdout cases only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from catalog.errors import CatalogError
from planner.calibration import DEFAULT_CALIBRATION_PATH, MIB, Calibration, load_calibration

CASES = Path(__file__).resolve().parents[2] / "bench" / "cases.yaml"


def test_shipped_calibration_loads_and_is_physical() -> None:
    cal = load_calibration()
    assert DEFAULT_CALIBRATION_PATH.is_file()
    assert 200 * MIB < cal.memory.cuda_context_bytes < 2048 * MIB
    assert all(0 <= v < 1.5 for v in cal.memory.reserved_overhead.values())
    assert all(0 < v <= 1 for v in cal.throughput.mfu_max.values())
    assert 0 < cal.throughput.decode_bw_efficiency <= 1 and 0 < cal.throughput.prefill_mfu <= 1
    assert all(v > 0 for v in cal.throughput.optimizer_passes.values())
    assert cal.source


def test_no_holdout_case_was_used_for_fitting() -> None:
    if not CASES.is_file():
        pytest.skip("bench/cases.yaml is not in this checkout")
    cases = yaml.safe_load(CASES.read_text())["cases"]
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
