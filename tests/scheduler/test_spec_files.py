"""The service refuses at submit (and plan) a spec whose files the machine running the job cannot read, with
what path, why, and what to do; the spec a client sends is taken as it is, never against the server's own
working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from errors import InvalidInput, UnreachablePath
from scheduler.service import SchedulerService
from scheduler.store.models import JobCreate
from tests.scheduler.conftest import ml_team
from tests.workers.tiny import write_config, write_tokenizer


def _infer(prompts: str) -> dict[str, object]:
    return {"name": "gen", "task": "infer", "model": "tiny-llama",
            "infer": {"prompts": prompts, "prompt_tokens": 8, "requests": 4}}


def test_a_relative_path_is_refused_even_where_it_exists_beside_the_server(
        svc: SchedulerService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    principal = ml_team(svc)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    monkeypatch.chdir(tmp_path)  # the server's working directory holds a file of that name: not the user's
    with pytest.raises(UnreachablePath) as refused:
        svc.submit(principal, JobCreate(spec=_infer("prompts.jsonl")))
    assert refused.value.path == "infer.prompts"
    assert "'prompts.jsonl' is a relative path" in str(refused.value)
    assert "gpuplan submit SPEC" in str(refused.value)
    with pytest.raises(UnreachablePath, match="relative path"):
        svc.plan({"name": "m", "task": "train", "model": {"config": "cfg/config.json"}, "train": {"tokens": 1e6}})


def test_a_path_that_exists_is_accepted_and_a_missing_one_refused(svc: SchedulerService, tmp_path: Path) -> None:
    principal = ml_team(svc)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    assert svc.submit(principal, JobCreate(spec=_infer(str(tmp_path / "prompts.jsonl")))).state == "queued"
    with pytest.raises(UnreachablePath, match=r"does not exist on .*, the machine that runs the job"):
        svc.submit(principal, JobCreate(spec=_infer(str(tmp_path / "gone.jsonl"))))


def test_jsonl_data_needs_a_tokenizer_given_or_beside_the_weights(svc: SchedulerService, tmp_path: Path) -> None:
    principal = ml_team(svc)
    data = tmp_path / "chat.jsonl"
    data.write_text('{"text": "hello"}\n')
    spec: dict[str, object] = {"name": "sft", "task": "train", "model": {"config": str(write_config(tmp_path / "m"))},
                               "train": {"tokens": 1e5, "seq_len": 16, "data": str(data)}}
    with pytest.raises(InvalidInput, match=r"train\.tokenizer: .* is JSONL text, which needs a tokenizer"):
        svc.submit(principal, JobCreate(spec=spec))
    tokenizer = write_tokenizer(tmp_path / "tok")
    given = {**spec, "train": {**spec["train"], "tokenizer": str(tokenizer)}}  # type: ignore[dict-item]
    assert svc.submit(principal, JobCreate(spec=given)).state == "queued"


def test_a_model_given_by_its_config_file_is_planned_by_the_servers_own_planner(tmp_path: Path) -> None:
    """The server's planner (scheduler.composition) reads a config.json the spec names, as `gpuplan plan` does; it
    answered "unknown model '/…/config.json'" before, so no cluster job could name its model by a file."""
    from scheduler.composition import make_service

    config = write_config(tmp_path / "m")
    svc = make_service(f"sqlite:///{tmp_path / 'db.sqlite'}", checkpoint_root=tmp_path / "ckpt")
    spec = {"name": "own", "task": "train", "model": {"config": str(config)},
            "train": {"tokens": 1e6, "seq_len": 32}, "resources": {"accelerators": ["A100-40GB:1"]}}
    job = svc.submit(ml_team(svc), JobCreate(spec=spec))
    assert job.state == "queued"
    tiny = svc.plan(spec).chosen
    llama = svc.plan({**spec, "model": "tiny-llama"}).chosen
    assert tiny is not None and llama is not None  # the file's model is planned, not a preset's
    assert tiny.estimate.memory.breakdown != llama.estimate.memory.breakdown
    with pytest.raises(UnreachablePath, match="does not exist"):
        svc.plan({**spec, "model": {"config": str(tmp_path / "gone" / "config.json")}})
    # the file changed under the same spec: the plan is the new file's, never a cached one of the old
    write_config(tmp_path / "m", hidden_size=64, intermediate_size=128)
    assert not svc.plan_is_cached(spec)
    wider = svc.plan(spec).chosen
    assert wider is not None and wider.estimate.memory.breakdown != tiny.estimate.memory.breakdown
