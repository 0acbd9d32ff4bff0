"""What the CLI prints, as a user's terminal shows it: at 80 and 160 columns, ids and numbers whole,
headers broken only between words, and text in square brackets printed as written."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len
from typer.testing import CliRunner

from cli import app
from commands import output
from commands.jobs import JOB_COLS
from commands.plan import PLAN_COLS
from commands.simulate import SIM_COLS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "llama3-8b-sft.yaml")
TRACES = ROOT / "tests" / "data" / "traces"
runner = CliRunner()
POLICIES = {"uniform-progress", "on-demand", "spot-only", "greedy", "omniscient", "gpuplan"}
# Columns of free text, which may wrap between words; every other cell stays on one line.
WRAPPING = {c.header for c in PLAN_COLS + JOB_COLS + SIM_COLS if c.wrap} | {"example", "reason"}
HEADERS = {c.header for c in PLAN_COLS + JOB_COLS + SIM_COLS} | {
    "constraint", "count", "example", "time", "from", "to", "reason",  # rejections, events
    "deadlines met", "finished", "unfinished", "median $", "median x bound", "median finish h"}  # a stream


@pytest.fixture(params=[80, 160])
def width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The terminal width: the CLI's consoles as `gpuplan` builds them, at that many columns."""
    columns = int(request.param)
    monkeypatch.setattr(output, "console", output.make_console(width=columns))
    monkeypatch.setattr(output, "err_console", output.make_console(stderr=True, width=columns))
    return columns


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split("[┃│]", line)[1:-1]]


def tables(out: str) -> Iterator[tuple[list[str], list[list[str]]]]:
    """(headers, body lines split into cells) of every table in ``out``; a header's lines joined by spaces."""
    lines = out.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("┏"):
            head, body = [], []
            i += 1
            while not lines[i].startswith("┡"):
                head.append(cells(lines[i]))
                i += 1
            i += 1
            while not lines[i].startswith("└"):
                body.append(cells(lines[i]))
                i += 1
            yield [" ".join(h[k] for h in head if h[k]) for k in range(len(head[0]))], body
        i += 1


def check_rendering(out: str, width: int) -> list[tuple[list[str], list[list[str]]]]:
    """Every line fits; headers are whole words of real headers; no id or number continues on a second line."""
    assert out.strip()
    for line in out.splitlines():
        assert cell_len(line) <= width, line
    found = list(tables(out))
    assert found
    for headers, body in found:
        assert set(headers) <= HEADERS, headers  # 'deadl…' or 'preem tions' would not be a header
        for row in body:
            if not row[0]:  # a continuation line of the row above: only free text may go on
                kept = [cell for header, cell in zip(headers, row, strict=True) if header not in WRAPPING]
                assert not any(kept), (headers, row)
    return found


def test_plan_at_80_and_160_columns(width: int) -> None:
    result = runner.invoke(app, ["plan", EXAMPLE, "--top", "5"])
    assert result.exit_code == 0, result.output
    (headers, body), *_ = check_rendering(result.stdout, width)
    plan = json.loads(runner.invoke(app, ["plan", EXAMPLE, "--json"]).stdout)
    firsts = [row for row in body if row[0]]
    totals = [row[headers.index("total $")] for row in firsts]
    assert totals == [f"{c['cost']['usd']:,.0f}" for c in plan["candidates"][:5]]  # whole numbers, in order
    assert [row[headers.index("hours")] for row in firsts] == [f"{c['cost']['hours']:,.1f}"
                                                               for c in plan["candidates"][:5]]
    if width >= 160:
        assert set(headers) == {c.header for c in PLAN_COLS}  # nothing hidden on a wide terminal
    else:
        assert "hidden at 80 columns" in result.stdout  # and it says what a narrow one leaves out


@pytest.fixture
def two_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two queued jobs in a local database (the real planner and catalog)."""
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump({"name": "a-rather-long-job-name-for-the-table", "task": "train",
                                    "model": "tiny-llama", "train": {"tokens": 1e6, "seq_len": 256}}))
    ids = []
    for _ in range(2):
        result = runner.invoke(app, ["submit", str(spec), "--json"])
        assert result.exit_code == 0, result.output
        ids.append(json.loads(result.stdout)["id"])
    return ids


def test_list_and_status_keep_the_whole_job_id(two_jobs: list[str], width: int) -> None:
    listed = runner.invoke(app, ["list"])
    assert listed.exit_code == 0, listed.output
    (headers, body), = check_rendering(listed.stdout, width)
    assert headers[0] == "id" and sorted(row[0] for row in body if row[0]) == sorted(two_jobs)
    if width >= 160:
        assert set(headers) == {c.header for c in JOB_COLS}
    status = runner.invoke(app, ["status", two_jobs[0]])
    assert status.exit_code == 0, status.output
    jobs, events = check_rendering(status.stdout, width)
    assert [row[0] for row in jobs[1] if row[0]] == [two_jobs[0]]
    assert "queued" in [row[2] for row in events[1]]


@pytest.mark.parametrize("args", [[], ["--jobs", "3", "--every-hours", "24"]])
def test_simulate_keeps_policy_names_whole(width: int, args: list[str]) -> None:
    result = runner.invoke(app, ["simulate", "--trace", str(TRACES / "flaky-a.json"), "--job-hours", "20",
                                 "--deadline-hours", "30", *args])
    assert result.exit_code == 0, result.output
    (_, body), = check_rendering(result.stdout, width)
    assert {row[0] for row in body if row[0]} == POLICIES


def test_text_in_square_brackets_prints_as_written(tmp_path: Path) -> None:
    spec = tmp_path / "gcp.yaml"
    spec.write_text(yaml.safe_dump({"name": "j", "task": "train", "model": "llama-3.2-1b",
                                    "train": {"tokens": 1e8}, "resources": {"clouds": ["gcp"]}}))
    result = runner.invoke(app, ["cluster", "config", str(spec)])
    assert result.exit_code == 2
    assert "restrict the spec with resources.clouds: [aws]" in " ".join(result.stderr.split())


def test_help_shows_bracketed_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    result = runner.invoke(app, ["catalog", "refresh", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "[default: $GPUPLAN_HOME/catalog/offers/<cloud>.csv" in result.stdout
