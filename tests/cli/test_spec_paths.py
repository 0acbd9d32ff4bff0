"""Paths in a submitted spec mean what they mean to the user who wrote the file: the CLI makes them absolute
against the spec file's folder, in-process and over HTTP alike, and the service refuses at submit one the
machine running the job cannot read (relative, or not there), and JSONL text data with no tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from tests.cli.test_scheduler import remote  # noqa: F401 - the fixture

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["in-process", "http"])
def where(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The CLI talking to a real server over HTTP (GPUPLAN_API_URL), or to the service in this process."""
    if request.param == "http":
        request.getfixturevalue("remote")
    else:
        monkeypatch.delenv("GPUPLAN_API_URL", raising=False)
        monkeypatch.delenv("GPUPLAN_DATABASE_URL", raising=False)
        monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    return str(request.param)


def submit(spec: str) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["submit", spec, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_the_readme_inference_example_submits_with_its_prompts_path_resolved(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the README's command, from a checkout: the spec's folder is relative to the shell's, not the server's
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    code, job = submit("examples/tiny-infer.yaml")
    assert code == 0, job
    detail = json.loads(runner.invoke(app, ["status", str(job["id"]), "--json"]).stdout)
    prompts = detail["spec"]["infer"]["prompts"]
    assert prompts == str(tmp_path / "examples" / "tiny-prompts.jsonl")


def test_a_path_the_server_cannot_read_is_refused_at_submit(where: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "gen", "task": "infer", "model": "tiny-llama",
                                    "infer": {"prompts": "missing/prompts.jsonl", "prompt_tokens": 8,
                                              "requests": 4}}))
    code, body = submit(str(spec))
    error = body["error"]
    assert code == 2 and error["code"] == "unreachable_path", body  # type: ignore[index]
    assert error["message"].startswith(  # type: ignore[index]
        f"infer.prompts: '{tmp_path / 'missing' / 'prompts.jsonl'}' does not exist on ")
    assert "submit again" in error["message"]  # type: ignore[index]


def test_jsonl_training_data_without_a_tokenizer_is_refused_by_plan_and_submit(where: str, tmp_path: Path) -> None:
    (tmp_path / "chat.jsonl").write_text('{"text": "hello"}\n')
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"name": "sft", "task": "train", "model": "tiny-llama",
                                    "train": {"tokens": 1e5, "seq_len": 128, "data": "chat.jsonl"}}))
    for command in ("plan", "submit"):
        result = runner.invoke(app, [command, str(spec), "--json"])
        assert result.exit_code == 2, (command, result.stdout)
        message = json.loads(result.stdout)["error"]["message"]
        assert message.startswith("train.tokenizer: ") and "needs a tokenizer" in message, message
        assert "set train.tokenizer" in message
