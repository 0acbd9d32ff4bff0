"""Every table the CLI prints, at 60, 80 and 160 columns: each cell that is an id, a name or a number is
printed whole on one line (never cut, folded or ellipsised), every header whole, free text wraps between
words, and the columns a narrow terminal leaves out are named. The tables are the real commands' output on
real data (the real planner, catalog, store and scheduling loop); what each table should hold is what the
command handed the one table fitter, so a new table is checked as soon as a command prints it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.cells import cell_len
from rich.text import Text
from typer.testing import CliRunner

from cli import app
from commands import output
from tests.cli.test_calibrate import _team_records
from tests.cli.test_rendering import tables

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "llama3-8b-sft.yaml")
TRACE = str(ROOT / "tests" / "data" / "traces" / "flaky-a.json")
runner = CliRunner()


@dataclass
class Printed:
    """What a command handed output.fit_table, and whether a table came back (None: one record per row)."""

    title: str
    cols: list[output.Col]
    rows: list[list[str]]
    shown: list[str] | None
    dropped: list[str]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local database with nine finished jobs (attempts, metrics, events) and a second team with a token."""
    home = tmp_path_factory.mktemp("widths") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUPLAN_HOME", str(home))
        mp.delenv("GPUPLAN_API_URL", raising=False)
        mp.delenv("GPUPLAN_DATABASE_URL", raising=False)
        mp.delenv("GPUPLAN_TEAM", raising=False)
        _team_records(home)
        for args in (["team", "create", "research-and-development-east"], ["team", "token", "default"]):
            assert runner.invoke(app, args).exit_code == 0
    yield home


@pytest.fixture(params=[60, 80, 160])
def width(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, home: Path) -> int:
    columns = int(request.param)
    monkeypatch.setattr(output, "console", output.make_console(width=columns))
    monkeypatch.setattr(output, "err_console", output.make_console(stderr=True, width=columns))
    monkeypatch.setenv("GPUPLAN_HOME", str(home))
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_TEAM", raising=False)
    return columns


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> list[Printed]:
    """Every table a command prints, as handed to the fitter and as it came back."""
    calls: list[Printed] = []
    fit = output.fit_table

    def spy(title: str, cols: list[output.Col], rows: list[list[str | Text]], width: int) -> Any:
        table, dropped = fit(title, cols, rows, width)
        calls.append(Printed(title, cols, [[c.plain if isinstance(c, Text) else c for c in r] for r in rows],
                             None if table is None else [c.header for c in cols if c.header not in dropped], dropped))
        return table, dropped

    monkeypatch.setattr(output, "fit_table", spy)
    return calls


def _job_id(home: Path) -> str:
    return str(json.loads(runner.invoke(app, ["list", "--json"]).stdout)[0]["id"])


COMMANDS: dict[str, list[str]] = {
    "list": ["list"],
    "status": ["status", "{job}"],
    "catalog gpus": ["catalog", "gpus"],
    "catalog offers": ["catalog", "offers", "--limit", "30"],
    "catalog offers spot": ["catalog", "offers", "--gpu", "H100", "--spot"],
    "catalog models": ["catalog", "models"],
    "report accuracy": ["report", "accuracy", "--source", "team"],
    "report spend": ["report", "spend"],
    "report spend all": ["report", "spend", "--all"],
    "report dry-run": ["report", "dry-run", EXAMPLE, "--top", "3", "--out", "{tmp}"],
    "plan": ["plan", EXAMPLE, "--top", "8"],
    "plan rejections": ["plan", "{tight}"],
    "estimate": ["estimate", EXAMPLE, "--gpu", "H100", "--count", "8"],
    "team list": ["team", "list"],
    "team tokens": ["team", "token", "default", "--list"],
    "simulate": ["simulate", "--trace", TRACE, "--job-hours", "20", "--deadline-hours", "30"],
    "simulate stream": ["simulate", "--trace", TRACE, "--job-hours", "20", "--deadline-hours", "30", "--jobs", "3",
                        "--every-hours", "24"],
    "calibrate": ["calibrate", "--source", "team", "--dry-run"],
}


def _fill(args: list[str], home: Path, tmp_path: Path) -> list[str]:
    tight = tmp_path / "tight.yaml"  # a deadline and a cloud that rule options out: the rejections table
    tight.write_text(yaml.safe_dump({"name": "tight", "task": "train", "model": "llama-3-8b",
                                     "train": {"tokens": 2e9, "seq_len": 4096},
                                     "resources": {"clouds": ["aws"], "deadline": "12h"}}))
    values = {"{job}": _job_id(home) if "{job}" in args else "", "{tmp}": str(tmp_path / "report"),
              "{tight}": str(tight)}
    return [values.get(a, a) for a in args]


def _rows(body: list[list[str]]) -> list[list[list[str]]]:
    """Body lines grouped by row: a row starts where its first cell (never free text) is not blank."""
    rows: list[list[list[str]]] = []
    for line in body:
        if line[0] or not rows:
            rows.append([])
        rows[-1].append(line)
    return rows


def _check_table(call: Printed, headers: list[str], body: list[list[str]]) -> None:
    assert headers == call.shown, (call.title, headers)  # whole headers: 'stat e' or 'H100-…' is none of them
    cols = {c.header: c for c in call.cols}
    grouped = _rows(body)
    assert len(grouped) == len(call.rows), call.title
    for expected, lines in zip(call.rows, grouped, strict=True):
        values = dict(zip([c.header for c in call.cols], expected, strict=True))
        for k, header in enumerate(headers):
            parts = [line[k] for line in lines if line[k]]
            if cols[header].wrap:  # free text: its words in order, a word longer than the column folded
                assert "".join("".join(parts).split()) == "".join(values[header].split()), (header, parts)
            else:  # an id, a name, a number: whole, on the row's first line
                assert [line[k] for line in lines] == [values[header], *[""] * (len(lines) - 1)], (header, lines)


def _check_records(call: Printed, out: str) -> None:
    flat = " ".join(out.split())
    assert "one line per field" in flat
    for row in call.rows:
        for col, value in zip(call.cols, row, strict=True):
            assert " ".join(f"{col.header}: {value}".split()) in flat, (col.header, value)
            if not col.wrap and value and cell_len(f"{col.header}: {value}") <= output.console.width:
                assert any(line.strip() == f"{col.header}: {value}".strip() for line in out.splitlines())


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_table_fits_and_cuts_nothing(command: str, width: int, printed: list[Printed], home: Path,
                                           tmp_path: Path) -> None:
    result = runner.invoke(app, _fill(COMMANDS[command], home, tmp_path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert printed, "the command printed no table"
    assert "…" not in out
    for line in out.splitlines():
        assert cell_len(line) <= width, line
    found = list(tables(out))
    assert len(found) == sum(call.shown is not None for call in printed)
    drawn = iter(found)
    for call in printed:
        if call.shown is None:
            _check_records(call, out)
            continue
        _check_table(call, *next(drawn))
        if call.dropped:
            assert f"{', '.join(call.dropped)} hidden at {width} columns" in " ".join(out.split())
    if width >= 160:
        assert not any(call.dropped or call.shown is None for call in printed), command


@pytest.mark.parametrize("name", ["tiny", "llama3-70b-finetune-with-a-rather-long-name"])
@pytest.mark.parametrize("columns", [60, 80, 160])
def test_run_progress_line_never_cuts_a_number(columns: int, name: str) -> None:
    from io import StringIO
    from types import SimpleNamespace

    from rich.console import Console

    from commands.progress import progress_bar

    buffer = StringIO()
    console = Console(width=columns, file=buffer, markup=False)
    progress, show = progress_bar(console, name, infer=False)
    show(SimpleNamespace(state=SimpleNamespace(value="running"),
                         progress=SimpleNamespace(step=6400, total_steps=10000, loss=1.23456, tokens_per_s=123456.7)))
    console.print(progress.get_renderable())
    lines = buffer.getvalue().rstrip("\n").splitlines()
    assert len(lines) == 1 and cell_len(lines[0]) <= columns, lines
    words = lines[0].split()
    assert name in words[0] and "6,400/10,000" in words and "…" not in lines[0]
    numbers = {w for w in words[1:] if any(ch.isdigit() for ch in w)}  # each whole, or not there at all
    assert numbers <= {"6,400/10,000", "1.2346", "123,457", "$0.00"}, words
    if columns >= 160:
        assert {"1.2346", "123,457", "running", "$0.00"} <= set(words)


def test_run_summary_prints_every_field_whole_at_60_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from commands.run import _print_run_summary

    monkeypatch.setattr(output, "console", output.make_console(width=60))
    measured = {"tokens_per_s": 123456.7, "peak_allocated_bytes": 3 * 2**30, "peak_rss_bytes": None}
    predicted = {"tokens_per_s": 120000.0, "peak_allocated_bytes": 2.5 * 2**30}
    result = {"job": "tiny-train", "status": "succeeded", "message": "ran 100 steps", "strategy_label": "1xcpu fp32",
              "engine": "torch", "device": "cpu", "steps": 100, "total_steps": 100, "final_loss": 2.5,
              "checkpoints_written": 2, "checkpoint_dir": "/home/someone/.gpuplan/checkpoints/tiny-train",
              "resumes": 0, "resumed_from_step": None, "measured": measured, "predicted": predicted, "wall_s": 12.3}
    with output.console.capture() as captured:
        _print_run_summary(result)  # type: ignore[arg-type]
    out = captured.get()
    assert all(cell_len(line) <= 60 for line in out.splitlines())
    assert "tokens/s measured / predicted: 123,457 / 120,000" in out
    assert "/home/someone/.gpuplan/checkpoints/tiny-train" in out and "…" not in out
