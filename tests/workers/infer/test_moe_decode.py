"""A mixture of experts decodes with grouped GEMMs where the plan says so: generate()'s switch to batched_mm is kept
off (it copies every (token, expert) pair's weights), with the same tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from catalog.hf_config import model_from_hf_config
from tests.workers.test_eager_models import TINY_LLAMA, TINY_OSS
from workers.infer.generate import run_inference
from workers.infer.moe_decode import KEPT_GROUPED_MM, keep_grouped_mm
from workers.model.build import ModelSource, build_model

OSS = model_from_hf_config(TINY_OSS, model_id="tiny-oss")


def _tiny_oss() -> Any:
    model: Any = build_model(ModelSource(config=OSS, weights_dir=None), seed=0, weights_dtype=torch.float32)
    model.config.use_cache = True
    return model.eval()


def _greedy(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        out: torch.Tensor = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    return out


@pytest.fixture
def on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """generate() switches grouped_mm to batched_mm only off a CPU: make the model report another device."""
    from transformers import PreTrainedModel

    monkeypatch.setattr(PreTrainedModel, "device", property(lambda self: torch.device("meta")))
    yield


def _impl_during_decode(model: Any) -> dict[str, str | None]:
    with model._optimize_model_for_decode():
        got: dict[str, str | None] = model.get_experts_implementation()
    return got


def test_generate_switches_grouped_mm_off_a_cpu(on_a_gpu: None) -> None:
    """The behaviour the workers work around (transformers 5): a control for the test below."""
    model = _tiny_oss()
    assert model.get_experts_implementation() == {"": "grouped_mm"}
    assert _impl_during_decode(model) == {"": "batched_mm"}


def test_kept_grouped_mm_survives_generate_and_decodes_the_same_tokens(on_a_gpu: None) -> None:
    model = _tiny_oss()
    ids = torch.randint(3, 128, (3, 9), generator=torch.Generator().manual_seed(0))
    before = _greedy(model, ids)  # on a CPU-resident model: grouped_mm throughout
    assert keep_grouped_mm(model)
    assert _impl_during_decode(model) == {"": KEPT_GROUPED_MM}
    assert torch.equal(_greedy(model, ids), before)


def test_dense_models_are_left_alone() -> None:
    model: Any = build_model(ModelSource(config=model_from_hf_config(TINY_LLAMA), weights_dir=None), seed=0,
                             weights_dtype=torch.float32)
    assert not keep_grouped_mm(model)
    assert not keep_grouped_mm(torch.nn.Linear(2, 2))


def test_the_worker_decodes_a_mixture_of_experts_with_the_planned_kernel(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"r{i}", "input_ids": [3 + i, 9, 27, 81 % 128]}) + "\n"
                               for i in range(3)))
    result = run_inference(OSS, prompts, tmp_path / "out.jsonl", batch=2, max_new_tokens=4, dtype="fp32", seed=0)
    assert result.moe_kernel == "grouped_mm" and result.requests_done == 3  # a CPU: generate() keeps grouped_mm too
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == ["r0", "r1", "r2"]


def test_the_compiled_decoder_decodes_a_mixture_of_experts_as_generate_does(tmp_path: Path) -> None:
    """The decoder the plan picks for a bf16 MoE on a GPU (workers/infer/decode.py; its step is captured there, eager
    here): the same tokens as generate() for requests of different lengths (left padding), sliding and full
    layers (the tiny gpt-oss alternates them), grouped_mm experts both ways."""
    rng = torch.Generator().manual_seed(3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": f"r{i}", "input_ids": torch.randint(3, 128, (int(n),), generator=rng).tolist()}) + "\n"
        for i, n in enumerate(torch.randint(3, 14, (5,), generator=rng))))
    outs: dict[str, dict[str, list[int]]] = {}
    for decoder in ("graph", "generate"):
        result = run_inference(OSS, prompts, tmp_path / f"{decoder}.jsonl", batch=2, max_new_tokens=7, dtype="fp32",
                               seed=0, decoder=decoder)
        assert (result.decoder, result.moe_kernel, result.requests_done) == (decoder, "grouped_mm", 5)
        outs[decoder] = {r["id"]: r["output_ids"] for r in map(json.loads, (tmp_path / f"{decoder}.jsonl")
                                                               .read_text().splitlines())}
    assert outs["graph"] == outs["generate"]
    assert len({tuple(v) for v in outs["graph"].values()}) > 1  # the rows are not all one sequence
