"""Integrity of the shipped catalog data: every row valid, consistent and sourced."""

from __future__ import annotations

from collections import Counter

import pytest

from catalog.hf_config import model_from_hf_config
from catalog.loader import PACKAGED_DATA_DIR, Catalog, load_catalog, normalize_name
from catalog.params import count_params

REQUIRED_GPUS = {
    "H100-SXM", "H100-PCIe", "H100-NVL", "H200", "B200", "GB200", "A100-40GB", "A100-80GB", "A10G", "L4",
    "L40S", "T4", "V100-16GB", "V100-32GB", "RTX4090", "RTX6000-Ada", "MI300X", "MI325X", "MI250X",
    "M3-Max", "M4-Max", "TPU-v5e", "TPU-v5p", "Jetson-AGX-Orin",
    "B300", "GB300", "MI355X", "RTX-PRO-6000", "H20", "TPU-v6e", "Gaudi3", "Trainium2",
}
FP4_PARTS = ("B200", "GB200", "B300", "GB300", "MI355X", "RTX-PRO-6000")  # parts with FP4 tensor rates
# Published parameter counts (model cards / HF safetensors metadata): (total, active).
PUBLISHED = {
    "llama-3-8b": (8.03e9, None), "llama-3-70b": (70.6e9, None), "llama-3-405b": (405.9e9, None),
    "llama-3.2-1b": (1.24e9, None), "llama-3.2-3b": (3.21e9, None), "llama-2-7b": (6.74e9, None),
    "llama-2-13b": (13.0e9, None), "llama-2-70b": (69.0e9, None), "mistral-7b": (7.24e9, None),
    "mixtral-8x7b": (46.7e9, 12.9e9), "qwen2.5-7b": (7.61e9, None), "qwen2.5-72b": (72.7e9, None),
    "gpt2": (124e6, None), "gpt2-medium": (355e6, None), "gpt2-large": (774e6, None), "gpt2-xl": (1.558e9, None),
    "llama-3.1-8b": (8.03e9, None), "llama-3.1-70b": (70.6e9, None), "llama-3.1-405b": (405.9e9, None),
    "qwen3-0.6b": (0.6e9, None), "qwen3-8b": (8.2e9, None), "qwen3-32b": (32.8e9, None),
    "qwen3-30b-a3b": (30.5e9, 3.3e9), "qwen3-235b-a22b": (235e9, 22e9), "deepseek-v3": (671e9, 37e9),
    "llama-3.3-70b": (70.6e9, None), "deepseek-r1": (671e9, 37e9),
    # gpt-oss: the model card's active figure leaves out the input embedding (0.58B), counted here
    "gpt-oss-20b": (20.91e9, 3.61e9 + 0.579e9), "gpt-oss-120b": (116.83e9, 5.13e9 + 0.579e9),
    "gpt-oss-20b-mxfp4": (20.91e9, 3.61e9 + 0.579e9), "gpt-oss-120b-mxfp4": (116.83e9, 5.13e9 + 0.579e9),
    # Gemma 3 4B-27B: the text decoder the preset builds (the published total less the 0.42B vision tower)
    "gemma-3-1b": (1.0e9, None), "gemma-3-4b": (4.30e9 - 0.42e9, None), "gemma-3-12b": (12.19e9 - 0.42e9, None),
    "gemma-3-27b": (27.43e9 - 0.42e9, None), "mistral-small-3-24b": (23.57e9, None), "phi-4": (14.66e9, None),
    "olmo-2-7b": (7.30e9, None), "qwen3-1.7b": (1.72e9, None), "qwen3-4b": (4.02e9, None), "qwen3-14b": (14.77e9, None),
}
ORDER = ("fp32", "tf32", "bf16", "fp8")  # each at least the one before, where the part has both


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog(PACKAGED_DATA_DIR)  # packaged data only, no user overrides


def test_required_gpus_present(cat: Catalog) -> None:
    assert {g.id for g in cat.gpus} >= REQUIRED_GPUS


def test_fp4_recorded_where_the_part_has_it(cat: Catalog) -> None:
    for gpu_id in FP4_PARTS:
        g = cat.gpu(gpu_id)
        assert "fp4" in g.dtypes and g.tflops["fp4"] >= 2 * g.tflops["fp8"] * 0.99, gpu_id


def test_non_gpu_vendors_are_recorded_as_not_run(cat: Catalog) -> None:
    """Gaudi 3 (intel) and Trainium2 (aws) are catalogued, and support.yaml says why nothing runs there."""
    for gpu_id, vendor in (("Gaudi3", "intel"), ("Trainium2", "aws")):
        g = cat.gpu(gpu_id)
        record = cat.support.platform(g.vendor, g.architecture)
        assert g.vendor == vendor and record is not None and "pick a GPU" in record.unsupported


def test_gpu_ids_and_aliases_unique_and_unambiguous(cat: Catalog) -> None:
    names = Counter(normalize_name(n) for g in cat.gpus for n in {normalize_name(x) for x in (g.id, *g.aliases)})
    assert [n for n, k in names.items() if k > 1] == []
    for g in cat.gpus:
        for name in (g.id, *g.aliases):
            assert cat.gpu(name).id == g.id


ALIASES = [("H100", "H100-SXM"), ("H100-80GB", "H100-SXM"), ("A100", "A100-80GB"), ("V100", "V100-16GB"),
           ("RTX-4090", "RTX4090"), ("rtx 6000 ada", "RTX6000-Ada")]


@pytest.mark.parametrize("alias,gpu_id", ALIASES)
def test_documented_aliases(cat: Catalog, alias: str, gpu_id: str) -> None:
    assert cat.gpu(alias).id == gpu_id


def test_gpu_tflops_sane(cat: Catalog) -> None:
    for g in cat.gpus:
        assert set(g.dtypes) == set(g.tflops), g.id
        assert all(v > 0 for v in g.tflops.values()), g.id
        present = [g.tflops[d] for d in ORDER if d in g.tflops]
        assert present == sorted(present), f"{g.id}: {dict(g.tflops)}"
        if "fp16" in g.tflops and "bf16" in g.tflops:
            assert g.tflops["fp16"] == g.tflops["bf16"], g.id
        # Dense figures: nothing on the list beats 15 PFLOPS fp4 per GPU (GB300 dense).
        assert max(g.tflops.values()) <= 15_000, g.id
        assert 8 <= g.memory_gib <= 300 and 100 <= g.memory_bandwidth_gbps <= 8000, g.id


def test_every_row_has_source_and_date(cat: Catalog) -> None:
    sources = [g.source for g in cat.gpus] + [o.source for o in cat.offers] + [m.source for m in cat.models]
    for source in sources:
        assert source is not None and source.url.startswith("https://"), source
        assert source.as_of.year >= 2023


def test_offers_reference_gpus_and_prices_sane(cat: Catalog) -> None:
    assert {o.cloud for o in cat.offers} >= {"aws", "gcp", "azure", "lambda", "runpod"}
    gpu_ids = {g.id for g in cat.gpus}
    for o in cat.offers:
        assert o.gpu in gpu_ids
        assert o.on_demand_usd_per_h is not None or o.spot_usd_per_h is not None, o
        if o.on_demand_usd_per_h is not None and o.spot_usd_per_h is not None:
            assert o.spot_usd_per_h < o.on_demand_usd_per_h, o
        per_gpu = (o.on_demand_usd_per_h or o.spot_usd_per_h or 0) / o.gpu_count
        assert 0.05 < per_gpu < 20, o  # $/GPU-hour within what any cloud charges
    keys = Counter((o.cloud, o.instance_type, o.region, o.zone) for o in cat.offers)
    assert [k for k, n in keys.items() if n > 1] == []


def test_aws_p5_price_matches_design_note(cat: Catalog) -> None:
    p5 = [o for o in cat.offers if o.instance_type == "p5.48xlarge" and o.region == "us-east-1"]
    assert p5 and all(o.on_demand_usd_per_h == pytest.approx(55.04) for o in p5)
    aws_types = {o.instance_type.split(".")[0] for o in cat.offers if o.cloud == "aws"}
    assert {"p5", "p5e", "p5en", "p6-b200", "p4d", "p4de", "g6e", "g6", "g5", "g4dn", "p3"} <= aws_types


def test_model_presets_match_their_hf_config(cat: Catalog) -> None:
    for m in cat.models:
        parsed = model_from_hf_config(m.hf_config, model_id=m.id)
        assert parsed.model_dump(exclude={"source"}) == m.model_dump(exclude={"source"}), m.id


def test_quantized_presets_name_their_bf16_preset(cat: Catalog) -> None:
    """A preset of a checkpoint as published (stored quantization, inference only) is '<bf16 preset>-<method>',
    the bf16 preset of the same shape exists (training is refused with its name), and the stored format is one
    the workers run (support.yaml)."""
    quantized = [m for m in cat.models if m.quantization is not None]
    assert {m.id for m in quantized} >= {"gpt-oss-20b-mxfp4", "gpt-oss-120b-mxfp4"}
    for m in quantized:
        assert m.quantization is not None and m.id.endswith(f"-{m.quantization.method}")
        bf16 = cat.model(m.id.removesuffix(f"-{m.quantization.method}"))
        assert bf16.quantization is None
        assert m.model_dump(include={"hidden_size", "num_layers", "num_experts", "moe", "attention"}) == \
            bf16.model_dump(include={"hidden_size", "num_layers", "num_experts", "moe", "attention"})
        assert m.quantization.method in cat.support.workers.infer.weights.run


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_param_counts_match_published_sizes(cat: Catalog, model_id: str) -> None:
    total, active = PUBLISHED[model_id]
    counts = count_params(cat.model(model_id))
    assert counts.total == pytest.approx(total, rel=0.02)
    assert counts.active == pytest.approx(active if active is not None else total, rel=0.02)


def test_tiny_llama_is_small_enough_for_the_cpu_demo(cat: Catalog) -> None:
    assert 5e6 <= count_params(cat.model("tiny-llama")).total <= 20e6


@pytest.mark.slow
def test_presets_build_with_transformers(cat: Catalog) -> None:
    from transformers import AutoConfig

    for m in cat.models:
        config = AutoConfig.for_model(**m.hf_config)  # type: ignore[arg-type]  # model_type is in the dict
        assert config.model_type == m.family
        assert getattr(config, "num_hidden_layers", None) == m.num_layers or config.n_layer == m.num_layers


@pytest.mark.slow
@pytest.mark.parametrize("model_id", ["tiny-llama", "gpt2"])
def test_param_count_equals_a_real_transformers_model(cat: Catalog, model_id: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    m = cat.model(model_id)
    with torch.device("meta"):
        config = AutoConfig.for_model(**m.hf_config)  # type: ignore[arg-type]  # model_type is in the dict
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    real = sum(p.numel() for p in model.parameters())  # parameters() de-duplicates tied weights
    assert count_params(m).total == real


def test_torch_total_is_below_driver_total(cat: Catalog) -> None:
    measured = [g for g in cat.gpus if g.torch_total_gib is not None]
    assert measured, "at least the H200 measured in docs/lab-notes/2026-11-30-h200-measurements.md"
    for g in measured:
        assert g.torch_total_gib is not None and 0.97 * g.memory_gib < g.torch_total_gib <= g.memory_gib


def test_the_platform_record_is_consistent_with_the_gpus(cat: Catalog) -> None:
    """Every GPU's (vendor, architecture) has a record; it claims no precision the part lacks; and for
    each value the workers run it either lists it or says why not."""
    need = {"fp32": "fp32", "amp-bf16": "bf16", "bf16": "bf16", "bf16-plain": "bf16", "amp-fp16": "fp16",
                "fp8": "fp8"}
    w = cat.support.workers
    for gpu in cat.gpus:
        record = cat.support.platform(gpu.vendor, gpu.architecture)
        assert record is not None, gpu.id
        for precision in record.precision:
            assert need[precision] in gpu.dtypes, f"{gpu.id}: {precision}"
        if record.unsupported:
            continue
        for knob, values in (("precision", w.train.precision.run), ("optimizer", w.train.optimizer.run),
                             ("finetune", w.train.finetune.run), ("weights", w.infer.weights.run)):
            for value in values:
                listed = value in getattr(record, knob)
                assert listed != (f"{knob} {value}" in record.not_run), f"{gpu.id}: {knob} {value}"
    keys = {(r.vendor, r.architecture) for r in cat.support.platforms}
    assert len(keys) == len(cat.support.platforms)  # one record per platform
