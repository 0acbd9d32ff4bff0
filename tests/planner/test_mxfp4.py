"""gpt-oss as published: MXFP4 experts (4.25 bits per weight), everything else bf16, inference only.

The presets gpt-oss-20b-mxfp4 / gpt-oss-120b-mxfp4 and the published config.json (its quantization_config)
plan alike; the weights are sized at the published checkpoint's bytes; decode reads the MXFP4 experts; a GPU
whose stack cannot keep them 4-bit plans the dequantized bf16 size and says so; training is refused with
what to do instead."""

from __future__ import annotations

import pytest

from catalog.loader import PACKAGED_DATA_DIR, load_catalog
from catalog.params import count_params
from errors import InvalidInput
from planner.calibration import MemoryCalibration, ThroughputCalibration, load_calibration
from planner.decoder import decoder_for
from planner.memory import (
    GIB,
    expert_weight_params,
    gathered_expert_bytes,
    infer_memory,
    resident_weight_bytes,
    runtime_model,
)
from planner.search import estimate, plan
from planner.spec import spec_from_dict
from planner.throughput import decode_expert_weight_params, decode_weight_params, infer_throughput, matmul_params
from planner.types import Strategy
from tests.hf_configs import hf_model

CAL = load_calibration()
CAT = load_catalog(PACKAGED_DATA_DIR)
# openai/gpt-oss-20b and -120b on Hugging Face: safetensors of 13.8 GB and 65.3 GB (12.8 / 60.8 GiB); model card
# parameter counts
PUBLISHED = {"gpt-oss-20b-mxfp4": (12.8 * GIB, 20.91e9), "gpt-oss-120b-mxfp4": (60.8 * GIB, 116.83e9)}


def _infer(model: str | dict[str, str], **infer: object) -> dict[str, object]:
    return {"task": "infer", "model": model,
            "infer": {"batch": 8, "prompt_tokens": 2048, "output_tokens": 512, "requests": 1e5, **infer}}


@pytest.mark.parametrize("model_id", sorted(PUBLISHED))
def test_weights_are_the_published_checkpoint_size(model_id: str) -> None:
    disk, params = PUBLISHED[model_id]
    m = CAT.model(model_id)
    pc = count_params(m)
    assert pc.total == pytest.approx(params, rel=0.02)
    assert resident_weight_bytes(m, pc, "mxfp4") == pytest.approx(disk, rel=0.02)
    # the experts are nearly all of it: 4.25 bits each, the remaining ~9% (attention, embeddings, ...) bf16
    experts = expert_weight_params(m)
    assert resident_weight_bytes(m, pc, "mxfp4") == experts * 4.25 / 8 + (pc.total - experts) * 2
    assert resident_weight_bytes(m, pc, "bf16") == pytest.approx(2 * pc.total, rel=1e-9)


def test_preset_is_the_bf16_preset_plus_its_stored_quantization() -> None:
    for size in ("20b", "120b"):
        q, bf16 = CAT.model(f"gpt-oss-{size}-mxfp4"), CAT.model(f"gpt-oss-{size}")
        assert bf16.quantization is None and q.quantization is not None
        assert (q.quantization.method, q.quantization.bits_per_param, q.quantization.weights) == \
            ("mxfp4", 4.25, "experts")
        same = {"id", "quantization", "hf_config", "source"}
        assert q.model_dump(exclude=same) == bf16.model_dump(exclude=same)


def test_the_published_config_json_plans_as_the_preset() -> None:
    """model: {config: config.json} of openai/gpt-oss-20b reads its quantization_config into the same model."""
    read = hf_model("gpt-oss-20b")
    preset = CAT.model("gpt-oss-20b-mxfp4")
    assert read.quantization == preset.quantization and read.assumptions == []
    spec = spec_from_dict(_infer("gpt-oss-20b-mxfp4"))
    via_config = estimate(spec, CAT, "H200", 1, calibration=CAL, model=read)
    via_preset = estimate(spec, CAT, "H200", 1, calibration=CAL)
    assert via_config.model_dump() == via_preset.model_dump()
    assert via_preset.strategy.weights == "mxfp4"


def test_an_unmodeled_quantization_config_is_a_stated_assumption() -> None:
    cfg_model = hf_model("gpt-oss-20b", quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    assert cfg_model.quantization is None
    (note,) = cfg_model.assumptions
    assert "'fp8' is not modeled" in note


def test_hopper_keeps_the_experts_in_mxfp4() -> None:
    spec = spec_from_dict(_infer("gpt-oss-120b-mxfp4"))
    est = estimate(spec, CAT, "H200", 1, calibration=CAL)
    m = CAT.model("gpt-oss-120b-mxfp4")
    assert est.strategy.weights == "mxfp4" and est.warnings == [] and est.memory.fits
    assert est.memory.breakdown["weights"] == int(resident_weight_bytes(m, count_params(m), "mxfp4"))
    # 60.8 GiB of weights leave one 80 GB H100 room for a short batch (the bf16 model's 218 GiB never fit it);
    # batch 8 of 2k-token prompts does not: eager attention's prefill scores alone are 12.9 GB
    short = spec_from_dict(_infer("gpt-oss-120b-mxfp4", batch=1, prompt_tokens=1024, output_tokens=256))
    assert estimate(short, CAT, "H100", 1, calibration=CAL).memory.fits
    assert not estimate(spec, CAT, "H100", 1, calibration=CAL).memory.fits


def test_without_mxfp4_kernels_the_plan_uses_the_dequantized_size_and_says_so() -> None:
    spec = spec_from_dict(_infer("gpt-oss-20b-mxfp4"))
    est = estimate(spec, CAT, "A100-80GB", 1, calibration=CAL)
    m = CAT.model("gpt-oss-20b-mxfp4")
    assert est.strategy.weights == "bf16"
    assert est.memory.breakdown["weights"] == int(resident_weight_bytes(m, count_params(m), "bf16"))
    (warning,) = est.warnings
    assert "dequantized to bf16" in warning and "A100-80GB" in warning and "Hopper" in warning
    # pinned mxfp4 there: refused with the platform's reason, in estimate and in a plan's rejections
    pinned = spec_from_dict(_infer("gpt-oss-20b-mxfp4", weights="mxfp4"))
    with pytest.raises(InvalidInput, match="weights mxfp4 does not run on nvidia ampere"):
        estimate(pinned, CAT, "A100-80GB", 1, calibration=CAL)
    result = plan(pinned, CAT, calibration=CAL)
    assert {c.estimate.strategy.weights for c in result.candidates} == {"mxfp4"}
    assert {CAT.gpu(c.offer.gpu).architecture for c in result.candidates} <= {"hopper", "blackwell"}
    assert any(r.constraint == "support" and "mxfp4" in r.reason and r.option.endswith("A100-80GB")
               for r in result.rejections)


def test_a_plan_chosen_on_a_gpu_without_the_kernels_carries_the_warning() -> None:
    spec = spec_from_dict({**_infer("gpt-oss-20b-mxfp4"), "resources": {"accelerators": ["A100-80GB"]}})
    result = plan(spec, CAT, calibration=CAL)
    assert result.chosen is not None and result.chosen.estimate.strategy.weights == "bf16"
    assert any("dequantized to bf16" in w for w in result.warnings)


def test_decode_reads_the_experts_at_mxfp4_bytes() -> None:
    """Memory-bound decode: MXFP4's triton kernels read each visited expert once at its stored bits, where bf16
    weights under generate() gather every (token, expert) pair's weights (batched_mm: read, write, read again),
    so a step is shorter by exactly that difference over the bandwidth."""
    m = CAT.model("gpt-oss-20b-mxfp4")
    grouped = runtime_model(m, "mxfp4")
    assert grouped.moe is not None and not grouped.moe.expert_loop  # transformers' MXFP4 path: grouped matmul_ogs
    h200 = CAT.gpu("H200")
    tcal = ThroughputCalibration()
    for batch in (1, 8):
        fp4 = infer_throughput(m, Strategy(task="infer", gpu="H200", gpu_count=1, weights="mxfp4", batch=batch),
                               256, 128, h200, tcal)
        bf16 = infer_throughput(grouped, Strategy(task="infer", gpu="H200", gpu_count=1, weights="bf16",
                                                  batch=batch), 256, 128, h200, tcal, decoder="generate")
        assert fp4.decode_tokens_per_s is not None and bf16.decode_tokens_per_s is not None
        bw = h200.memory_bandwidth_gbps * 1e9
        gathered = 3 * gathered_expert_bytes(grouped, batch, "bf16", batched_mm=True) * 24
        read = decode_expert_weight_params(m, batch) * 4.25 / 8
        step_gap = batch / bf16.decode_tokens_per_s - batch / fp4.decode_tokens_per_s
        assert step_gap == pytest.approx(gathered / (bw * tcal.decode_gather_bw_efficiency)
                                         - read / (bw * tcal.decode_bw_efficiency))
    # one token visits k of the experts: those are what it reads
    n, lm = matmul_params(m)
    assert decode_expert_weight_params(m, 1) == 24 * 4 * 3 * 2880 * 2880
    assert decode_expert_weight_params(m, 1) < decode_weight_params(m, 1) == n - lm


def test_decoder_rule_keeps_generate_for_mxfp4() -> None:
    m = CAT.model("gpt-oss-20b-mxfp4")
    assert decoder_for(m, "nvidia", "mxfp4") == "generate"
    mem = infer_memory(m, Strategy(task="infer", gpu="H200", gpu_count=1, weights="mxfp4", batch=4), 512, 64,
                       CAT.gpu("H200"), MemoryCalibration())
    assert mem.breakdown["weights"] > 0


def test_training_is_refused_with_what_to_train_instead() -> None:
    for size in ("20b", "120b"):
        spec = spec_from_dict({"task": "train", "model": f"gpt-oss-{size}-mxfp4", "train": {"tokens": 1e8}})
        with pytest.raises(InvalidInput) as err:
            plan(spec, CAT, calibration=CAL)
        text = str(err.value)
        assert f"the bf16 preset gpt-oss-{size} " in text and "finetune: lora" in text and "inference only" in text
        assert err.value.path == "task"
    # a config.json with the quantization_config: the same refusal, naming the config instead of a preset
    spec = spec_from_dict({"task": "train", "model": "gpt-oss-20b-mxfp4", "train": {"tokens": 1e8}})
    with pytest.raises(InvalidInput, match="without its quantization_config"):
        plan(spec, CAT, calibration=CAL, model=hf_model("gpt-oss-20b").model_copy(update={"id": "my-oss"}))


def test_the_bf16_preset_still_trains() -> None:
    spec = spec_from_dict({"task": "train", "model": "gpt-oss-20b",
                           "train": {"tokens": 1e8, "seq_len": 1024, "finetune": "lora"}})
    assert plan(spec, CAT, calibration=CAL).chosen is not None


@pytest.mark.parametrize("weights,model_id,match", [
    ("int8", "gpt-oss-20b-mxfp4", "would re-quantize a dequantized copy"),
    ("fp8", "gpt-oss-120b-mxfp4", "plan the bf16 preset gpt-oss-120b with weights fp8"),
    ("mxfp4", "gpt-oss-20b", "the format a checkpoint ships in"),
    ("mxfp4", "llama-3-8b", "the format a checkpoint ships in"),
])
def test_weights_a_checkpoint_cannot_run_with_are_refused(weights: str, model_id: str, match: str) -> None:
    with pytest.raises(InvalidInput, match=match) as err:
        plan(spec_from_dict(_infer(model_id, weights=weights)), CAT, calibration=CAL)
    assert err.value.path == "infer.weights"


def test_pinned_bf16_plans_the_dequantized_model_with_a_note() -> None:
    spec = spec_from_dict(_infer("gpt-oss-20b-mxfp4", weights="bf16"))
    est = estimate(spec, CAT, "H200", 1, calibration=CAL)
    assert est.strategy.weights == "bf16" and "Mxfp4Config(dequantize=True)" in est.warnings[0]
    same_as_bf16_preset = estimate(spec_from_dict(_infer("gpt-oss-20b", weights="bf16")), CAT, "H200", 1,
                                   calibration=CAL)
    assert est.memory == same_as_bf16_preset.memory and est.throughput == same_as_bf16_preset.throughput

