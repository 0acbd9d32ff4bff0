"""`gpuplan export`'s core: a trained tiny model out as a Hugging Face folder, loaded back by
transformers (and peft) with the same logits as the trained model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import workers.model.build
from errors import Conflict, InvalidInput, NotFound
from tests.workers.tiny import cpu_strategy, final_state, tiny_spec, write_config, write_tokenizer
from workers.model.build import ModelSource, apply_lora, build_model, resolve_model_source
from workers.model.export import export_checkpoint
from workers.model.export_adapter import base_device
from workers.train.loop import TrainJob, run_training

IDS = torch.tensor([[3, 17, 42, 5, 99, 64, 7, 1]])


def _train(tmp_path: Path, *, model: Path, steps: int = 4, **train: Any) -> tuple[str, Any]:
    spec = tiny_spec(model, steps=steps, interval=steps, **train)
    uri = str(tmp_path / "ck")
    strategy = cpu_strategy(finetune=train.get("finetune", "full"), lora_rank=train.get("lora_rank", 16))
    result = run_training(TrainJob(job_id="exp", spec=spec, strategy=strategy, checkpoint_uri=uri, device="cpu",
                                   cpu_threads=1))
    assert result.status == "succeeded"
    return uri, spec


def _trained_logits(uri: str, spec: Any, *, lora_rank: int | None = None) -> torch.Tensor:
    """The trained model's logits, rebuilt independently of the exporter from the checkpoint's weights."""
    source = resolve_model_source(spec)
    if lora_rank is None:  # a full checkpoint holds every weight
        model = build_model(ModelSource(source.config, None), seed=0, weights_dtype=torch.float32)
        model.load_state_dict(final_state(uri)[1])
    else:  # a LoRA checkpoint holds the adapters; the frozen base is rebuilt as training built it
        model = apply_lora(build_model(source, seed=spec.train.seed, weights_dtype=torch.float32), lora_rank)
        assert not model.load_state_dict(final_state(uri)[1], strict=False).unexpected_keys
    model.eval()
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=IDS).logits
    return logits


def _loaded_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=IDS).logits
    return logits


def _adapter_logits(folder: Path, spec: Any, *, base: Path | None = None) -> torch.Tensor:
    """The exported adapter loaded with peft onto a freshly built base (the spec's seed, as training drew it),
    or onto the weights in ``base``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = (build_model(resolve_model_source(spec), seed=spec.train.seed, weights_dtype=torch.float32)
                  if base is None else AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32))
    model = PeftModel.from_pretrained(model, str(folder))
    model.eval()
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=IDS).logits
    return logits


def _no_base_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make building a model fail loudly (the export must not need one); returns the attempts."""
    attempts: list[str] = []

    def refuse(source: ModelSource, **_: Any) -> torch.nn.Module:
        attempts.append(source.config.id)
        raise RuntimeError("interrupted while building the base")

    monkeypatch.setattr(workers.model.build, "build_model", refuse)
    return attempts


def _base_weights(tmp_path: Path) -> Path:
    """A save_pretrained folder to fine-tune from, with its tokenizer beside it."""
    folder = tmp_path / "base-weights"
    source = ModelSource(resolve_model_source(tiny_spec(write_config(tmp_path / "cfg"))).config, None)
    build_model(source, seed=7, weights_dtype=torch.float32).save_pretrained(str(folder))  # type: ignore[operator]
    write_tokenizer(folder)
    return folder


def test_full_fine_tune_round_trips_with_the_same_logits(tmp_path: Path) -> None:
    uri, spec = _train(tmp_path, model=write_config(tmp_path / "m"))
    result = export_checkpoint(uri, tmp_path / "out")
    assert result.kind == "model" and result.step == 4 and result.job == "exp" and not result.tokenizer
    assert (tmp_path / "out" / "config.json").is_file()
    torch.testing.assert_close(_loaded_logits(tmp_path / "out"), _trained_logits(uri, spec), rtol=0, atol=1e-6)


def test_lora_exports_an_adapter_on_its_base_and_merge_gives_the_same_model(tmp_path: Path) -> None:
    base = _base_weights(tmp_path)
    uri, spec = _train(tmp_path, model=base, finetune="lora", lora_rank=4)
    expected = _trained_logits(uri, spec, lora_rank=4)
    adapter = export_checkpoint(uri, tmp_path / "adapter")
    assert adapter.kind == "adapter" and adapter.base == str(base.resolve()) and adapter.tokenizer
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "adapter" / "tokenizer.json").is_file()
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    assert not torch.allclose(_loaded_logits(base), expected, atol=1e-3)  # training moved the adapters
    torch.testing.assert_close(_loaded_logits(tmp_path / "adapter"), expected, rtol=0, atol=1e-5)

    merged = export_checkpoint(uri, tmp_path / "merged", merge=True)
    assert merged.kind == "merged" and not (tmp_path / "merged" / "adapter_config.json").exists()
    torch.testing.assert_close(_loaded_logits(tmp_path / "merged"), expected, rtol=0, atol=1e-5)

    moved = base.rename(tmp_path / "moved")  # the folder it was trained on is gone: still its base, not a random init
    gone = export_checkpoint(uri, tmp_path / "gone")
    assert (gone.base, gone.base_seed) == (str(base), None)
    torch.testing.assert_close(_adapter_logits(tmp_path / "gone", spec, base=moved), expected, rtol=0, atol=1e-5)


def test_lora_on_a_random_init_base_exports_the_adapter_without_building_the_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri, spec = _train(tmp_path, model=write_config(tmp_path / "m"), finetune="lora", lora_rank=4, seed=3)
    expected = _trained_logits(uri, spec, lora_rank=4)
    with monkeypatch.context() as patch:
        attempts = _no_base_builds(patch)
        result = export_checkpoint(uri, tmp_path / "out")
    assert attempts == []  # the adapter is all in the checkpoint: an 8B base took minutes to draw on the CPU
    assert result.kind == "adapter" and result.base is None and result.adapter == str(tmp_path / "out")
    assert (result.base_seed, result.base_drawn_on) == (3, "cpu")  # enough to draw that base again
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "gpuplan_export.json"]
    torch.testing.assert_close(_adapter_logits(tmp_path / "out", spec), expected, rtol=0, atol=1e-5)
    _assert_as_peft_saves_it(tmp_path / "out", uri, spec, tmp_path / "peft")


def _assert_as_peft_saves_it(folder: Path, uri: str, spec: Any, scratch: Path) -> None:
    """The same tensor names, values and target modules as peft's own save_pretrained of the trained model
    (what vLLM and other loaders read)."""
    from safetensors.torch import load_file

    model = apply_lora(build_model(resolve_model_source(spec), seed=spec.train.seed, weights_dtype=torch.float32), 4)
    model.load_state_dict(final_state(uri)[1], strict=False)
    model.save_pretrained(str(scratch), save_embedding_layers=False)  # type: ignore[operator]
    ours, theirs = (load_file(str(f / "adapter_model.safetensors")) for f in (folder, scratch))
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0)
    config, reference = (json.loads((f / "adapter_config.json").read_text()) for f in (folder, scratch))
    # peft spells its targets out in full on a model this small, by their last names on a big one: the same modules
    assert set(config["target_modules"]) == {name.rsplit(".", 1)[-1] for name in reference["target_modules"]}
    assert (config["r"], config["lora_alpha"]) == (reference["r"], reference["lora_alpha"]) == (4, 8)


def test_merge_writes_the_adapter_before_it_builds_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri, spec = _train(tmp_path, model=write_config(tmp_path / "m"), finetune="lora", lora_rank=4)
    stages: list[str] = []
    with monkeypatch.context() as patch:
        attempts = _no_base_builds(patch)
        with pytest.raises(RuntimeError, match="interrupted"):
            export_checkpoint(uri, tmp_path / "out", merge=True, progress=stages.append)
    assert len(attempts) == 1
    assert [stage.split(" ")[0:2] for stage in stages] == [["reading", "the"], ["writing", "the"],
                                                           ["building", "the"]]
    torch.testing.assert_close(_adapter_logits(tmp_path / "out" / "adapter", spec),
                               _trained_logits(uri, spec, lora_rank=4), rtol=0, atol=1e-5)


def test_merge_draws_a_random_init_base_where_training_drew_it(tmp_path: Path) -> None:
    uri, spec = _train(tmp_path, model=write_config(tmp_path / "m"), finetune="lora", lora_rank=4)
    stages: list[str] = []
    # A GPU here would draw other weights from the same seed than the CPU training drew on.
    merged = export_checkpoint(uri, tmp_path / "out", merge=True, progress=stages.append, cuda_available=True)
    assert merged.kind == "merged" and merged.device == "cpu" and merged.base_drawn_on == "cpu"
    assert [stage.split(" ")[0] for stage in stages] == ["reading", "writing", "building", "merging", "writing"]
    torch.testing.assert_close(_loaded_logits(tmp_path / "out"), _trained_logits(uri, spec, lora_rank=4),
                               rtol=0, atol=1e-5)


def test_the_merge_builds_its_base_on_the_gpu_when_there_is_one() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert base_device(None, random_init=False, cuda_available=True) == cuda  # a weights folder loads anywhere
    assert base_device(None, random_init=False, cuda_available=False) == cpu
    assert base_device(None, random_init=False, cuda_available=True, fits_gpu=False) == cpu  # a 70B base on 80 GB
    assert base_device("cuda", random_init=True, cuda_available=True) == cuda
    assert base_device("cpu", random_init=True, cuda_available=True) == cpu  # the same seed, other weights on a GPU
    assert base_device(None, random_init=True, cuda_available=True) == cuda  # an older checkpoint: not recorded
    with pytest.raises(InvalidInput, match="drawn on a GPU") as caught:
        base_device("cuda", random_init=True, cuda_available=False)
    assert caught.value.hint is not None and "without --merge" in caught.value.hint


def test_bad_exports_fail_clearly_and_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="does not exist"):
        export_checkpoint(str(tmp_path / "missing"), tmp_path / "o1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound, match="holds no checkpoint"):
        export_checkpoint(str(tmp_path / "empty"), tmp_path / "o2")
    uri, _ = _train(tmp_path, model=write_config(tmp_path / "m"), steps=2)
    with pytest.raises(InvalidInput, match="full fine-tune"):
        export_checkpoint(uri, tmp_path / "o3", merge=True)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(Conflict, match="not empty"):
        export_checkpoint(uri, tmp_path / "taken")
    assert not any((tmp_path / name).exists() for name in ("o1", "o2", "o3"))
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]
