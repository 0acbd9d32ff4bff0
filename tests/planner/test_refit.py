"""planner.refit: fit on part of the records, judge on the held-out rest; and the user overlay file.

The records are made by the planner itself under a "true" calibration that differs from the shipped
one in known constants, so the test knows what a correct refit finds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.loader import load_catalog
from errors import CatalogError, InvalidInput
from planner.calibration import (
    Calibration,
    apply_overrides,
    load_calibration,
    load_user_calibration,
    user_calibration_path,
)
from planner.refit import MIN_RECORDS, Observation, predict, refit, split
from planner.types import Strategy

CATALOG = load_catalog()
SHIPPED = load_calibration()
TRUE = apply_overrides(SHIPPED, {"memory": {"activation_scale": 1.08, "expandable_overhead": {"single": 0.05}},
                                 "throughput": {"mfu_max": {"bf16": 0.62}}})


def observations(truth: Calibration, n: int = 12) -> list[Observation]:
    gpu = CATALOG.gpu("H200")
    out: list[Observation] = []
    shapes = [(m, mb, seq) for m in ("llama-3.2-1b", "llama-3.2-3b") for mb in (1, 2, 4) for seq in (1024, 2048)]
    for i, (model, mb, seq) in enumerate(shapes[:n]):
        s = Strategy(gpu="H200", gpu_count=1, precision="bf16", micro_batch=mb)
        o = Observation(id=f"run-{i}", gpu=gpu, model=CATALOG.model(model), strategy=s, measured={}, seq_len=seq)
        out.append(Observation(id=o.id, gpu=gpu, model=o.model, strategy=s, measured=predict(o, truth), seq_len=seq))
    return out


def test_refit_finds_the_true_constants_and_held_out_error_falls() -> None:
    result = refit(observations(TRUE), SHIPPED)
    assert len(result.fit_ids) == 8 and len(result.held_out_ids) == 4
    assert not set(result.fit_ids) & set(result.held_out_ids)  # judged only on records it never saw
    changed = {c.name: c.after for c in result.changes}
    assert changed["memory.activation_scale"] == pytest.approx(1.08, rel=0.01)
    assert changed["memory.expandable_overhead.single"] == pytest.approx(0.05, rel=0.05)
    assert changed["throughput.mfu_max.bf16"] == pytest.approx(0.62, rel=0.03)
    report = {r.quantity: r for r in result.report}
    for q in ("peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s"):
        r = report[q]
        assert r.kept and r.held_out == 4
        assert r.median_before is not None and r.median_after is not None and r.max_after is not None
        assert r.median_after < r.median_before / 5 and r.max_after < 0.01
    assert result.overrides["throughput"]["mfu_max"]["bf16"] == changed["throughput.mfu_max.bf16"]
    # the held-out rows are what the table summarises: the refit calibration's own predictions
    row = result.rows[0]
    again = next(o for o in observations(TRUE) if o.id == row.id)
    assert row.after == pytest.approx(predict(again, result.calibration)[row.quantity])


def test_a_refit_that_makes_held_out_worse_is_dropped() -> None:
    obs = observations(TRUE)
    _, held = split(obs)
    held_ids = {o.id for o in held}
    # the held-out runs disagree with the rest: they ran as the shipped constants predict
    mixed = [o if o.id not in held_ids else
             Observation(id=o.id, gpu=o.gpu, model=o.model, strategy=o.strategy, measured=predict(o, SHIPPED),
                         seq_len=o.seq_len) for o in obs]
    result = refit(mixed, SHIPPED)
    assert result.changes == [] and {c.quantity for c in result.reverted} >= {"tokens_per_s", "peak_allocated_bytes"}
    assert all(not r.kept and "stay" in r.note for r in result.report)
    assert result.overrides == {} and result.calibration == SHIPPED


def test_too_few_records_are_refused_saying_how_many_are_needed() -> None:
    with pytest.raises(InvalidInput, match=f"at least {MIN_RECORDS} finished runs.*found 5"):
        refit(observations(TRUE, n=5), SHIPPED)


def test_the_split_is_fixed_by_record_ids() -> None:
    obs = observations(TRUE)
    fit1, held1 = split(obs)
    fit2, held2 = split(list(reversed(obs)))
    assert {o.id for o in held1} == {o.id for o in held2} and len(fit1) == len(fit2) == 8


def test_the_user_file_overlays_single_constants_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    path = user_calibration_path(tmp_path)
    assert path == tmp_path / "calibration.json"
    assert load_calibration(overlay=path) == SHIPPED  # no file: the shipped calibration
    path.write_text(json.dumps({"source": "gpuplan calibrate test", "overrides": {
        "throughput": {"mfu_max": {"bf16": 0.5}}, "cpu": {"throughput": {"layer_overhead_s": 0.01}}}}))
    cal = load_calibration(overlay=path)
    assert cal.throughput.mfu_max["bf16"] == 0.5
    assert cal.throughput.mfu_max["amp-bf16"] == SHIPPED.throughput.mfu_max["amp-bf16"]  # merged key by key
    assert cal.cpu.throughput.layer_overhead_s == 0.01
    assert cal.cpu.throughput.mfu_max == SHIPPED.cpu.throughput.mfu_max
    assert "gpuplan calibrate test" in cal.source and SHIPPED.source in cal.source
    assert load_user_calibration(tmp_path) == cal  # the one loader the edges call: the same, from the home
    path.write_text(json.dumps({"overrides": {"throughput": {"mfu_maxx": 1}}}))
    with pytest.raises(CatalogError, match=r"(?s)calibration file .* is invalid.*mfu_maxx"):
        load_calibration(overlay=path)


def test_bf16_plain_runs_fit_bf16s_constant() -> None:
    """bf16-plain runs bf16's kernels (it only rounds its steps differently): its runs refit mfu_max["bf16"]."""
    from planner.refit import knobs_for

    obs = [Observation(id=o.id, gpu=o.gpu, model=o.model, seq_len=o.seq_len, measured=o.measured,
                       strategy=o.strategy.model_copy(update={"precision": "bf16-plain"}))
           for o in observations(TRUE)]
    paths = {k.path for k in knobs_for(obs, SHIPPED, {o.id: "single" for o in obs})}
    assert ("throughput", "mfu_max", "bf16") in paths and ("throughput", "mfu_max", "bf16-plain") not in paths
