"""`gpuplan estimate` prices the placement and says when its hours miss the spec's deadline; a short job reads in
seconds or minutes and cents, not "0.0 h, $0". Real catalog, planner and CPU probe; no local GPU (faked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import catalog.local
from cli import app
from commands.human import duration, money

runner = CliRunner()


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(catalog.local, "detect_local_device", lambda: None)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "tiny.yaml"
    spec.write_text("name: tiny\ntask: train\nmodel: tiny-llama\ntrain: {tokens: 32768, seq_len: 128, micro_batch: 4}\n"
                    "resources: {deadline: 1m}\n")
    return spec


def test_estimate_prices_a_short_job_in_cents_and_says_it_meets_the_deadline(tiny: Path) -> None:
    shown = runner.invoke(app, ["estimate", str(tiny), "--gpu", "T4"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    body = json.loads(runner.invoke(app, ["estimate", str(tiny), "--gpu", "T4", "--json"]).stdout)
    hours, cost = body["hours"], body["cost"]
    assert body["deadline_h"] == pytest.approx(1 / 60) and body["meets_deadline"] is True
    assert cost["usd"] == pytest.approx(hours * cost["usd_per_h"]) and cost["offer"].startswith("aws g4dn")
    assert f"cost: {money(cost['usd'])} for {duration(hours)}" in text and "¢" in text
    assert "0.0 h" not in text and "$0," not in text
    assert f"meets the deadline: {duration(hours)} of the spec's 1 min" in text  # a T4 takes under a minute


def test_estimate_tells_a_deadline_the_cpu_misses(tiny: Path) -> None:
    spec = tiny.read_text().replace("deadline: 1m", "deadline: 1s")
    tiny.write_text(spec)
    shown = runner.invoke(app, ["estimate", str(tiny), "--gpu", "cpu"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "misses the deadline:" in text and "> the spec's 1 s" in text and "cost: $0 for" in text
    body = json.loads(runner.invoke(app, ["estimate", str(tiny), "--gpu", "cpu", "--json"]).stdout)
    assert body["meets_deadline"] is False and body["cost"]["usd"] == 0


@pytest.mark.parametrize(("hours", "text"), [(10 / 3600, "10 s"), (0.25, "15 min"), (28.8, "28.8 h"), (250, "250 h")])
def test_durations_read_in_seconds_minutes_or_hours(hours: float, text: str) -> None:
    assert duration(hours) == text


@pytest.mark.parametrize(("usd", "text"), [(0, "$0"), (0.0033, "0.33¢"), (0.5, "50¢"), (71.06, "$71.06"),
                                           (1234.5, "$1,234")])
def test_amounts_read_in_cents_or_dollars(usd: float, text: str) -> None:
    assert money(usd) == text
