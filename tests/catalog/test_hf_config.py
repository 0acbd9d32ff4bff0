"""HF config.json parsing and model resolution: family key names, clear errors naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.hf_config import model_from_hf_config
from catalog.loader import Catalog, resolve_model
from catalog.params import count_params
from errors import CatalogError, InvalidInput, UnknownName

LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096, "max_position_embeddings": 1024}


def test_gpt2_key_names_and_defaults() -> None:
    m = model_from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                              "n_positions": 1024, "n_inner": None}, model_id="my-gpt2")
    assert (m.hidden_size, m.num_layers, m.num_kv_heads, m.intermediate_size) == (768, 12, 12, 3072)
    assert m.tie_word_embeddings and m.max_position_embeddings == 1024
    assert count_params(m).total == 124_439_808


def test_mixtral_expert_keys() -> None:
    m = model_from_hf_config({**LLAMA, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})
    assert (m.num_experts, m.experts_per_token) == (8, 2)
    assert count_params(m).active < count_params(m).total


def test_family_from_architectures_when_model_type_missing() -> None:
    cfg = {k: v for k, v in LLAMA.items() if k != "model_type"} | {"architectures": ["Qwen2ForCausalLM"]}
    assert model_from_hf_config(cfg).family == "qwen2"


@pytest.mark.parametrize("drop,named", [("hidden_size", "hidden_size"), ("num_hidden_layers", "num_hidden_layers"),
                                        ("vocab_size", "vocab_size"), ("model_type", "model_type")])
def test_missing_key_is_named(drop: str, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        model_from_hf_config({k: v for k, v in LLAMA.items() if k != drop})


@pytest.mark.parametrize("key,value,named", [
    ("hidden_size", -1, "hidden_size"), ("num_attention_heads", "4", "num_attention_heads"),
    ("num_key_value_heads", 3, "num_key_value_heads"), ("num_attention_heads", 3, "num_attention_heads"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings"), ("head_dim", 0, "head_dim"),
])
def test_bad_values_are_named(key: str, value: object, named: str) -> None:
    with pytest.raises(InvalidInput, match=named):
        model_from_hf_config({**LLAMA, key: value})


def test_more_experts_per_token_than_experts() -> None:
    with pytest.raises(InvalidInput, match="num_experts_per_tok"):
        model_from_hf_config({**LLAMA, "num_local_experts": 2, "num_experts_per_tok": 4})


def test_resolve_model_preset_path_folder_and_mapping(catalog: Catalog, tmp_path: Path) -> None:
    assert resolve_model(catalog, "LLaMA-3-8B").id == "llama-3-8b"
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    by_file = resolve_model(catalog, str(folder / "config.json"))
    assert by_file.id == "my-model" and by_file.hidden_size == 256
    assert resolve_model(catalog, folder) == by_file
    assert resolve_model(catalog, {"config": str(folder)}) == by_file


def test_resolve_model_errors(catalog: Catalog, tmp_path: Path) -> None:
    with pytest.raises(UnknownName, match="llama-3-8b"):
        resolve_model(catalog, "llama3-8b-typo")
    with pytest.raises(InvalidInput, match="does not exist"):
        resolve_model(catalog, str(tmp_path / "nope" / "config.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InvalidInput, match="not valid JSON"):
        resolve_model(catalog, str(bad))
    with pytest.raises(InvalidInput, match="config"):
        resolve_model(catalog, {"weights": "x"})


def test_catalog_rejects_duplicate_and_ambiguous_gpu_names(catalog: Catalog) -> None:
    h100 = catalog.gpu("H100-SXM")
    with pytest.raises(CatalogError, match="duplicate GPU id"):
        Catalog(gpus=(h100, h100), offers=(), models=())
    clash = catalog.gpu("A100-80GB").model_copy(update={"aliases": ["H100"]})
    with pytest.raises(CatalogError, match="'H100' is used by both"):
        Catalog(gpus=(h100, clash), offers=(), models=())
