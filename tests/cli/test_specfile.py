"""Reading a job spec file at the edge: one-line errors for a missing or malformed file, and paths in it
relative to the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands.specfile import load_spec
from errors import InvalidInput
from planner.spec import ModelRef


def test_load_spec_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_load_spec_bad_yaml(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("task: train\nmodel: [unclosed\n")
    with pytest.raises(InvalidInput, match="not valid YAML") as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message  # one line: the CLI prints it as one error line
    assert "line 3, column 1" in message and "expected ',' or ']'" in message


def test_load_spec_bad_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"task": "train",\n "model": }\n')
    with pytest.raises(InvalidInput, match="not valid JSON") as info:
        load_spec(path)
    assert "\n" not in str(info.value) and "line 2, column 11" in str(info.value)


def test_model_config_path_is_resolved_relative_to_the_spec(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("task: infer\nmodel: {config: cfg/config.json}\n")
    spec = load_spec(path)
    assert isinstance(spec.model, ModelRef)
    assert spec.model.config == str(tmp_path / "cfg/config.json")


def test_data_tokenizer_prompts_and_weights_paths_are_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "weights").mkdir()
    train = tmp_path / "train.yaml"
    train.write_text("task: train\nmodel: ./weights\ntrain: {tokens: 100, data: d.jsonl, tokenizer: /abs/tok}\n")
    spec = load_spec(train)
    assert spec.model == str(tmp_path / "./weights") and spec.train is not None
    assert spec.train.data == str(tmp_path / "d.jsonl") and spec.train.tokenizer == "/abs/tok"
    infer = tmp_path / "infer.yaml"
    infer.write_text("task: infer\nmodel: llama-3-8b\ninfer: {prompts: p.jsonl, tokenizer: tok}\n")
    spec = load_spec(infer)
    assert spec.model == "llama-3-8b" and spec.infer is not None  # a preset id is not a path
    assert spec.infer.prompts == str(tmp_path / "p.jsonl") and spec.infer.tokenizer == str(tmp_path / "tok")


def _prompts_spec(tmp_path: Path, infer: str) -> Path:
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "Hello"}\n'
                                      '{"id": "b", "input_ids": [1, 2, 3, 4, 5, 6, 7]}\n'
                                      '{"id": "c", "prompt": "héllo"}\n')
    path = tmp_path / "job.yaml"
    path.write_text(f"task: infer\nmodel: tiny-llama\ninfer:\n  prompts: p.jsonl\n  output_tokens: 16\n{infer}")
    return path


def test_a_prompts_file_sizes_the_job(tmp_path: Path) -> None:
    """The README's tiny-infer example once failed its context check: prompt_tokens defaulted to 1,024, and
    1,024 + 16 output tokens is past tiny-llama's context. The prompts file says how long the prompts are
    (7 tokens: the input_ids line; "héllo" is 6 bytes) and how many (3)."""
    spec = load_spec(_prompts_spec(tmp_path, ""))
    assert spec.infer is not None
    assert (spec.infer.prompt_tokens, spec.infer.requests) == (7, 3)


def test_what_the_spec_sets_is_kept(tmp_path: Path) -> None:
    spec = load_spec(_prompts_spec(tmp_path, "  prompt_tokens: 100\n  requests: 50\n"))
    assert spec.infer is not None
    assert (spec.infer.prompt_tokens, spec.infer.requests) == (100, 50)
    spec = load_spec(_prompts_spec(tmp_path, "  requests: 50\n"))
    assert spec.infer is not None and (spec.infer.prompt_tokens, spec.infer.requests) == (7, 50)


def test_a_bad_prompts_line_is_reported_when_the_spec_is_read(tmp_path: Path) -> None:
    path = _prompts_spec(tmp_path, "")
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": ""}\n')
    with pytest.raises(InvalidInput, match="needs a non-empty 'prompt'"):
        load_spec(path)


def test_the_readme_inference_example_plans(tmp_path: Path) -> None:
    from catalog.loader import load_catalog
    from planner.resolve import resolve_spec_model

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "tiny-infer.yaml")
    resolve_spec_model(spec, load_catalog(), None)  # the context check that refused it
    assert spec.infer is not None and spec.infer.requests == 5
