"""What a user is told about a spec or a submit option: every problem at once, no error for a default they
never wrote, plain words for .nan, a directory or a file in another encoding, and never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from catalog.loader import load_catalog
from cli import app
from planner.spec import model_problems, spec_from_dict

runner = CliRunner()
TINY: dict[str, object] = {"name": "tiny", "task": "train", "model": "tiny-llama", "train": {"tokens": 1e6}}


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
    monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
    return tmp_path


def _spec(tmp_path: Path, body: dict[str, object], name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_every_problem_in_one_message(local: Path) -> None:
    spec = _spec(local, {**TINY, "train": {"tokens": 1e6, "seq_len": 4096},
                         "resources": {"accelerators": ["H900:1"], "clouds": ["awz"]}})
    result = runner.invoke(app, ["plan", spec])
    assert result.exit_code == 2, result.output
    said = result.stderr
    assert "3 problems in the spec" in said and "Traceback" not in said
    assert "train.seq_len: 4,096 tokens is longer than tiny-llama's context of 1,024" in said
    assert "resources.accelerators[0]: unknown GPU 'H900'" in said and "did you mean H200" in said
    assert "resources.clouds[0]: unknown cloud 'awz'" in said


def test_an_unknown_gpu_is_not_hidden_behind_a_default(local: Path) -> None:
    spec = _spec(local, {**TINY, "resources": {"accelerators": ["H900:1"]}})
    result = runner.invoke(app, ["plan", spec, "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["code"] == "unknown_name" and error["path"] == "resources.accelerators[0]"
    assert "seq_len" not in error["message"]


def test_a_default_the_user_never_wrote_is_fitted_to_the_model(local: Path) -> None:
    spec = _spec(local, TINY)  # tiny-llama's context is 1,024; the default seq_len 2,048
    planned = runner.invoke(app, ["plan", spec, "--json"])
    assert planned.exit_code == 0, planned.output
    submitted = runner.invoke(app, ["submit", spec, "--json"])
    assert submitted.exit_code == 0, submitted.output
    job = json.loads(runner.invoke(app, ["status", json.loads(submitted.stdout)["id"], "--json"]).stdout)
    assert job["spec"]["train"]["seq_len"] == 1024  # what the worker will run
    # a spec that reaches the planner without it (the HTTP API) is told the length is the default
    unfitted = spec_from_dict(TINY)
    (path, message), = model_problems(unfitted, load_catalog().model("tiny-llama"))
    assert path == "train.seq_len" and message.startswith("not set, and its default of 2,048 tokens is longer")
    # and a length the spec writes stays as written: too long is an error
    result = runner.invoke(app, ["plan", _spec(local, {**TINY, "train": {"tokens": 1e6, "seq_len": 2048}})])
    assert result.exit_code == 2 and "train.seq_len: 2,048 tokens is longer" in result.stderr


@pytest.mark.parametrize(("value", "said"), [(".nan", "not a number"), (".inf", "infinite")])
def test_nan_and_inf_say_so(local: Path, value: str, said: str) -> None:
    path = local / "nan.yaml"
    path.write_text(f"name: n\ntask: train\nmodel: tiny-llama\ntrain: {{tokens: {value}, seq_len: 256}}\n")
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert f"train.tokens: {said}" in result.stderr


def test_a_directory_is_called_a_directory(local: Path) -> None:
    result = runner.invoke(app, ["plan", str(local)])
    assert result.exit_code == 2 and "is a directory" in result.stderr and "does not exist" not in result.stderr


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_a_utf16_spec_with_a_bom_is_read(local: Path, command: str) -> None:
    path = local / "windows.yaml"
    path.write_bytes(yaml.safe_dump({**TINY, "train": {"tokens": 1e6, "seq_len": 256}}).encode("utf-16"))
    result = runner.invoke(app, [command, str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["plan", "submit"])
def test_bytes_that_are_not_text_are_an_error_not_a_traceback(local: Path, command: str) -> None:
    path = local / "latin1.yaml"
    path.write_bytes("name: caf\u00e9\ntask: train\n".encode("latin-1"))
    result = runner.invoke(app, [command, str(path)])
    assert result.exit_code == 2, result.output
    assert "is not UTF-8 text (byte 0xe9 at offset 9)" in result.stderr and result.exception is not None
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(("key", "said"), [("k" * 201, "is 201 characters long; at most 200"),
                                           ("a\tb", "control character U+0009")])
def test_a_bad_submit_key_names_the_option(local: Path, key: str, said: str) -> None:
    spec = _spec(local, {**TINY, "train": {"tokens": 1e6, "seq_len": 256}})
    result = runner.invoke(app, ["submit", spec, "--key", key])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "--key: " in result.stderr and said in result.stderr
