"""Every local job type through the CLI: config-path and weights-folder models, JSONL text data with
a tokenizer, `task: infer` (resumable), and `gpuplan export` of the result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from cli import app
from tests.workers.tiny import TINY_TEXTS, write_config, write_tokenizer
from workers.model.build import ModelSource, build_model, resolve_model_source

RUNNER = CliRunner()
INTERNAL_NAMES = ("resolve_model", "catalog.", "workers.", "model=", "DESIGN.md")


@pytest.fixture()
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder as a user has it: a model config, a tokenizer, data and prompts, specs with relative paths."""
    monkeypatch.setenv("GPUPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GPUPLAN_DATABASE_URL", f"sqlite:///{tmp_path / 'jobs.db'}")
    write_config(tmp_path / "model")
    write_tokenizer(tmp_path / "tok")
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TINY_TEXTS))
    prompts = [{"id": "a", "prompt": "the cat sat"}, {"id": "b", "prompt": "gpus are"},
               {"id": "c", "input_ids": [5, 6, 7]}]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return tmp_path


def _spec(folder: Path, name: str, **doc: Any) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **doc}))
    return path


def _train(**extra: Any) -> dict[str, Any]:
    return {"tokens": 6 * 2 * 16, "seq_len": 16, "micro_batch": 2, "checkpoint_interval_steps": 3, **extra}


def _invoke(*args: str) -> dict[str, Any]:
    result = RUNNER.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def _error(*args: str, code: int) -> str:
    result = RUNNER.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    message = json.loads(result.stdout)["error"]["message"]
    assert not any(name in message for name in INTERNAL_NAMES), message
    return str(message)


def test_train_on_jsonl_text_from_a_config_path_then_export_by_job_name(project: Path) -> None:
    spec = _spec(project, "sft", task="train", model={"config": "model/config.json"},
                 train=_train(data="data.jsonl", tokenizer="tok"))
    run = _invoke("run", str(spec))
    assert run["status"] == "succeeded" and run["steps"] == 6 and run["final_loss"] > 0

    exported = _invoke("export", "sft", "--out", str(project / "out"))
    assert exported["kind"] == "model" and exported["step"] == 6 and exported["tokenizer"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(project / "out"))
    ids = AutoTokenizer.from_pretrained(str(project / "out"))("the cat sat", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], 128)
    assert "not empty" in _error("export", "sft", "--out", str(project / "out"), code=5)


def test_training_starts_from_a_save_pretrained_folder(project: Path) -> None:
    config = resolve_model_source(_load(project, {"config": "model/config.json"})).config
    base = build_model(ModelSource(config, None), seed=123, weights_dtype=torch.float32)
    base.save_pretrained(str(project / "weights"))  # type: ignore[operator]
    # A learning rate so small that the trained weights stay those of the folder, not a fresh init.
    spec = _spec(project, "from-weights", task="train", model="./weights",
                 train=_train(optimizer="sgd", learning_rate=1e-12))
    assert _invoke("run", str(spec))["status"] == "succeeded"
    _invoke("export", str(project / "home" / "checkpoints" / "from-weights"), "--out", str(project / "out"))
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(str(project / "out")).state_dict()
    for name, value in base.state_dict().items():
        torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-6)


def _load(project: Path, model: Any) -> Any:
    from commands.specfile import load_spec

    return load_spec(_spec(project, "probe", task="train", model=model, train=_train()))


def test_infer_writes_outputs_and_a_rerun_only_answers_what_is_missing(project: Path) -> None:
    spec = _spec(project, "gen", task="infer", model={"config": "model/config.json"},
                 infer={"prompts": "prompts.jsonl", "tokenizer": "tok", "batch": 2, "prompt_tokens": 16,
                        "output_tokens": 4})  # within the tiny model's 64-token context
    first = _invoke("run", str(spec), "--checkpoint-dir", str(project / "answers"))
    assert first["status"] == "succeeded" and first["task"] == "infer" and first["steps"] == 3
    outputs = Path(first["outputs"])
    lines = outputs.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["a", "b", "c"]
    assert all(json.loads(line)["new_tokens"] == 4 for line in lines)

    outputs.write_text(lines[0] + "\n" + lines[1] + "\n")  # as if the run had died after its first batch
    again = _invoke("run", str(spec), "--checkpoint-dir", str(project / "answers"))
    assert again["status"] == "succeeded" and again["resumed_from_step"] == 2 and again["tokens"] == 4
    assert outputs.read_text().splitlines() == lines  # greedy and batched as before: the same answers


def test_a_prompts_file_sizes_the_job_so_prompt_tokens_can_be_left_out(project: Path) -> None:
    """Left out, prompt_tokens once defaulted to 1,024, past this model's 64-token context: refused."""
    spec = _spec(project, "sized", task="infer", model={"config": "model/config.json"},
                 infer={"prompts": "prompts.jsonl", "tokenizer": "tok", "batch": 2, "output_tokens": 4})
    out = _invoke("run", str(spec), "--checkpoint-dir", str(project / "sized-answers"))
    assert out["status"] == "succeeded" and out["steps"] == 3


def test_the_readme_inference_example_runs(project: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny-infer.yaml"
    out = _invoke("run", str(example), "--checkpoint-dir", str(project / "readme"))
    assert out["status"] == "succeeded" and out["steps"] == 5
    assert len(Path(out["outputs"]).read_text().splitlines()) == 5
    # the table a person reads: the measured rate next to the plan's (a CPU run decodes with generate(), so no
    # prompt pass / decode step split is measured and none is shown)
    table = RUNNER.invoke(app, ["run", str(example), "--checkpoint-dir", str(project / "readme-table")])
    assert table.exit_code == 0, table.output
    assert "tokens/s measured / predicted" in table.output and "prompt pass" not in table.output


def test_bad_inputs_get_clear_errors_that_name_no_internals(project: Path) -> None:
    missing = _spec(project, "m1", task="train", model={"config": "nope/config.json"}, train=_train())
    assert "does not exist" in _error("run", str(missing), code=2)
    no_tok = _spec(project, "m2", task="train", model={"config": "model/config.json"}, train=_train(data="data.jsonl"))
    assert "tokenizer" in _error("run", str(no_tok), code=2)
    (project / "empty.jsonl").write_text("\n")
    empty = _spec(project, "m3", task="train", model={"config": "model/config.json"},
                  train=_train(data="empty.jsonl", tokenizer="tok"))
    assert "has no records" in _error("run", str(empty), code=2)
    prompts = _spec(project, "m4", task="infer", model={"config": "model/config.json"},
                    infer={"prompts": "missing.jsonl", "prompt_tokens": 16, "output_tokens": 4})
    assert "does not exist" in _error("run", str(prompts), code=2)
    assert "not a checkpoint directory" in _error("export", "no-such-job", "--out", str(project / "o"), code=4)
    (project / "empty-ck").mkdir()
    assert "holds no checkpoint" in _error("export", str(project / "empty-ck"), "--out", str(project / "o"), code=4)


def test_export_of_a_database_job_without_a_checkpoint_is_refused(project: Path) -> None:
    spec = _spec(project, "queued", task="train", model="tiny-llama", train=_train())
    job = _invoke("submit", str(spec))
    message = _error("export", job["id"], "--out", str(project / "o"), code=4)
    assert message.startswith(f"job {job['id']} (queued) has no checkpoint to export")
    assert not (project / "o").exists()
