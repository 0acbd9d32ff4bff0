"""The plan says what each candidate's weight updates go through (issue 46): the ranked table and --json carry
each training candidate's numerics, and pinning bf16-plain for a full fine-tune is said to drop updates."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli import app
from planner.strategies import PRECISIONS

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "llama3-8b-sft.yaml")
runner = CliRunner()


def test_every_candidate_in_plan_json_names_its_numerics() -> None:
    result = runner.invoke(app, ["plan", EXAMPLE, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    seen = {c["estimate"]["numerics"] for c in body["candidates"]}
    assert seen <= {p.numerics for p in PRECISIONS.values()} and "fp32 master" in seen
    for c in body["candidates"]:
        assert c["estimate"]["numerics"] == PRECISIONS[c["estimate"]["strategy"]["precision"]].numerics
    assert all(c["estimate"]["strategy"]["precision"] != "bf16-plain" for c in body["candidates"])  # never auto


def test_estimate_of_a_bf16_full_fine_tune_says_it_rounds_stochastically() -> None:
    """The issue's case: one H200, Llama-3-8B full fine-tune, auto picks pure-bf16 memory."""
    result = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "H200", "--count", "1", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["strategy"]["precision"] == "bf16"
    assert body["numerics"] == "bf16 + stochastic rounding"


def test_pinned_bf16_plain_is_planned_and_warned_about(tmp_path: Path) -> None:
    spec = tmp_path / "plain.yaml"
    spec.write_text("task: train\nmodel: llama-3.2-1b\ntrain: {tokens: 1.0e8, seq_len: 2048, precision: bf16-plain}\n")
    result = runner.invoke(app, ["estimate", str(spec), "--gpu", "H100", "--count", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["numerics"] == "pure bf16 (drops small updates)"
    assert "round to nothing" in result.stderr
    table = runner.invoke(app, ["plan", str(spec), "--top", "2"], env={"COLUMNS": "220"})
    assert table.exit_code == 0, table.output
    assert "pure bf16 (drops small updates)" in table.stdout
