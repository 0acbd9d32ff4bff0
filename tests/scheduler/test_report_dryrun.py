"""Dry-run report: Markdown + self-contained HTML with the plan table, spot overhead and plots."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import load_catalog
from cli import app
from errors import InvalidInput
from planner.calibration import load_calibration
from planner.search import plan
from planner.spec import spec_from_dict
from planner.types import Plan
from scheduler.report import build_dry_run, spot_pairs, write_dry_run

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

SPEC = {"name": "sft-a", "task": "train", "model": "llama-3-8b", "train": {"tokens": 2.0e9, "seq_len": 4096},
        "resources": {"spot": "auto", "deadline": "24h"}}


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


@pytest.fixture(scope="module")
def plans() -> list[Plan]:
    catalog = load_catalog()
    other = {**SPEC, "name": "sft-b", "resources": {"spot": "never", "deadline": "48h"}}
    return [plan(spec_from_dict(SPEC), catalog, calibration=CAL), plan(spec_from_dict(other), catalog, calibration=CAL)]


def test_html_is_self_contained_and_shows_spot_overhead_and_deadline_probability(plans: list[Plan]) -> None:
    report = build_dry_run(plans)
    parser = _Collector()
    parser.feed(report.html)
    text = " ".join(parser.text)
    images = [a for t, a in parser.tags if t == "img"]
    assert len(images) >= 3  # two Pareto plots and at least one spot-vs-on-demand plot
    for attrs in images:
        src = attrs["src"] or ""
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:4] == b"\x89PNG"
    for tag, attrs in parser.tags:
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not value.startswith(("http:", "https:", "//")), f"external resource in <{tag}>"
        assert tag != "script"
    assert "sft-a" in text and "sft-b" in text
    assert "preemption overhead h" in text and "P(deadline)" in text
    chosen = plans[0].chosen
    assert chosen is not None
    assert f"{chosen.cost.usd:,.2f}" in text
    # The never-spot job has no spot rows; the other one compares both markets.
    assert report.summary[1]["spot_vs_on_demand"] == []
    pairs = spot_pairs(plans[0])
    assert pairs and all(p.spot_usd > 0 for p in pairs)
    assert all(p.spot_overhead_h >= 0 and p.deadline_probability is not None for p in pairs)


def test_markdown_and_files(plans: list[Plan], tmp_path: Path) -> None:
    report = build_dry_run(plans[:1], top=3)
    files = write_dry_run(report, tmp_path / "out")
    md = Path(files["markdown"]).read_text()
    assert md.startswith("# gpuplan dry-run report")
    assert "| strategy | instance |" in md and "### Spot vs on-demand" in md
    for name in report.images:
        assert f"]({name})" in md
        assert (tmp_path / "out" / name).read_bytes()[:4] == b"\x89PNG"
    assert Path(files["html"]).read_text().startswith("<!DOCTYPE html>")
    with pytest.raises(InvalidInput):
        build_dry_run([])
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInput, match="is a file"):
        write_dry_run(report, tmp_path / "file")
    with pytest.raises(InvalidInput, match=r"cannot write the report to .*: Not a directory"):
        write_dry_run(report, tmp_path / "file" / "sub")  # under a file: mkdir fails, one error line


def test_cli_dry_run_json(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    result = CliRunner().invoke(app, ["report", "dry-run", str(spec), "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert Path(doc["files"]["html"]).is_file()
    chosen = doc["jobs"][0]["chosen"]
    assert chosen["expected_usd"] > 0 and "deadline_probability" in chosen
    bad = CliRunner().invoke(app, ["report", "dry-run", str(tmp_path / "missing.yaml"), "--json"])
    assert bad.exit_code == 2 and "does not exist" in bad.stdout
