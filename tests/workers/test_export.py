"""`gpuplan export`'s core: a trained tiny model out as a Hugging Face folder, loaded back by
transformers (and peft) with the same logits as the trained model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from catalog.errors import Conflict, InvalidInput, NotFound
from tests.workers.tiny import cpu_strategy, final_state, tiny_spec, write_config, write_tokenizer
from workers.export import export_checkpoint
from workers.model import ModelSource, apply_lora, build_model, resolve_model_source
from workers.train import TrainJob, run_training

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


def test_lora_on_a_random_init_base_writes_the_base_beside_the_adapter(tmp_path: Path) -> None:
    uri, spec = _train(tmp_path, model=write_config(tmp_path / "m"), finetune="lora", lora_rank=4)
    result = export_checkpoint(uri, tmp_path / "out")
    assert result.base == str((tmp_path / "out" / "base").resolve())
    torch.testing.assert_close(_loaded_logits(tmp_path / "out"), _trained_logits(uri, spec, lora_rank=4),
                               rtol=0, atol=1e-5)


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
