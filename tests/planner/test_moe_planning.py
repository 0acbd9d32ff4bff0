"""Fine-grained MoE and MLA models in the planner: sized by their real parameters, MLA's compressed cache,
and the assumptions behind a config gpuplan does not model exactly shown as warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from catalog.params import count_params
from catalog.schema import ModelConfig
from planner.activations import layer_activation_bytes_per_token, merged_expert_bytes
from planner.calibration import MemoryCalibration, load_calibration
from planner.memory import infer_memory, kv_cache_bytes, mla_expanded_kv_bytes
from planner.memory_train import lora_params_per_layer, train_memory
from planner.search import estimate, plan
from planner.spec import spec_from_dict
from planner.throughput import attention_flops_per_token, decode_weight_params, matmul_params
from planner.throughput_train import train_flops_per_token
from planner.types import MemoryEstimate, Strategy
from tests.hf_configs import hf_model as model
from tests.planner.factory import small_catalog

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

CAT = small_catalog()
H200 = CAT.gpu("H200")


def test_deepseek_v3_caches_the_compressed_latent_per_layer() -> None:
    m = model("deepseek-v3")
    assert kv_cache_bytes(m, batch=2, context=1000) == 61 * (512 + 64) * 1000 * 2 * 2
    # the layer being run expands it to 128 heads x (128 + 64 + 128)
    assert mla_expanded_kv_bytes(m, 2, 1000) == 128 * 320 * 1000 * 2 * 2
    assert mla_expanded_kv_bytes(model("qwen3-30b-a3b"), 2, 1000) == 0


def test_qwen3_30b_a3b_bf16_inference_fits_one_h200() -> None:
    m = model("qwen3-30b-a3b")
    s = Strategy.model_validate({"gpu": "H200", "gpu_count": 1, "weights": "bf16", "batch": 1})
    est = infer_memory(m, s, 1000, 200, H200, MemoryCalibration())
    assert est.breakdown["weights"] == pytest.approx(2 * 30.5e9, rel=0.02)
    assert est.fits


def test_full_finetune_weights_are_the_real_parameter_count() -> None:
    m = model("qwen3-235b-a22b")
    s = Strategy.model_validate({"gpu": "H200", "gpu_count": 1, "precision": "bf16", "micro_batch": 1})
    est = train_memory(m, s, 1024, H200, MemoryCalibration())
    assert est.breakdown["weights"] == pytest.approx(2 * 235e9, rel=0.02)


def test_training_flops_follow_active_parameters() -> None:
    for name in ("qwen3-30b-a3b", "deepseek-v3"):
        m = model(name)
        n, _ = matmul_params(m)
        pc = count_params(m)
        assert n == pytest.approx(pc.active - pc.embedding, rel=0.01)  # lm_head does matmuls, the lookup does not
        flops = train_flops_per_token(m, 128, "full", False)
        assert flops == pytest.approx(6 * n, rel=0.05)  # short sequences: attention is small


def test_decode_reads_only_the_experts_the_batch_picks() -> None:
    m = model("qwen3-30b-a3b")
    n, lm = matmul_params(m)
    one = decode_weight_params(m, 1)
    assert one == n - lm
    many = [decode_weight_params(m, b) for b in (2, 8, 64, 1024)]
    assert many == sorted(many) and one < many[0]
    assert many[-1] == pytest.approx(count_params(m).non_embedding, rel=0.01)  # every expert is hit


def test_lora_adapters_use_the_expert_width() -> None:
    m = model("qwen3-30b-a3b")
    per_layer = lora_params_per_layer(m, 16)
    attn = 16 * ((2048 + 4096) + 2 * (2048 + 512) + (4096 + 2048))
    assert per_layer == attn + 128 * 16 * 3 * (2048 + 768)


def test_unknown_model_type_warns_in_estimate_and_plan() -> None:
    m = model("qwen3-0.6b", model_type="fancy_lm")
    spec = spec_from_dict({"name": "t", "task": "train", "model": "qwen3-0.6b",
                           "train": {"tokens": 1e7, "seq_len": 1024}})
    e = estimate(spec, CAT, "H200", 1, model=m, calibration=CAL)
    assert any("'fancy_lm'" in w and "llama-style" in w for w in e.warnings)
    p = plan(spec, CAT, model=m, calibration=CAL)
    assert any("'fancy_lm'" in w for w in p.warnings)


def test_modeled_config_brings_no_warning() -> None:
    spec = spec_from_dict({"name": "t", "task": "train", "model": "qwen3-0.6b",
                           "train": {"tokens": 1e7, "seq_len": 1024}})
    assert estimate(spec, CAT, "H200", 1, model=model("qwen3-0.6b"), calibration=CAL).warnings == []



PROBE = Path(__file__).resolve().parents[2] / "bench" / "results" / "workers" / "moe_lora_probe_2026-12-04"


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "qwen3-30b-a3b"])
def test_lora_keeps_each_sparse_layers_merged_expert_weights(name: str) -> None:
    """peft adapts transformers 5's fused experts through their merged weight, which autograd keeps for the
    layer's backward: the two largest tensors the H200 probe saw saved in a sparse layer under LoRA are exactly
    the layer's routed experts' gate_up and down weights, which the planner counts; full fine-tuning saves no
    such weight-sized tensor."""
    rec = json.loads((PROBE / f"moe_lora_probe_{name}.json").read_text())
    modes = {m["mode"]: m for m in rec["modes"]}
    m = model(name)
    merged = merged_expert_bytes(m, "lora")
    largest = modes["lora"]["largest_saved_in_sparse_layer"]
    assert largest[0][2] + largest[1][2] == merged
    assert merged_expert_bytes(m, "qlora") == merged and merged_expert_bytes(m, "full") == 0.0
    assert modes["full"]["largest_saved_in_sparse_layer"][0][2] < merged / 2
    assert merged_expert_bytes(model("qwen3-0.6b"), "lora") == 0.0


def test_lora_of_a_mixture_of_experts_holds_every_merged_weight_until_backward() -> None:
    """The plan shows the merged expert weights as their own memory component: without checkpointing every sparse
    layer's at the peak (the start of backward), whatever the micro-batch; with it, the peak holds at most one
    layer's and its gradient. Full fine-tuning and a dense model's LoRA hold none."""
    m = model("deepseek-v2-lite")
    merged = merged_expert_bytes(m, "lora")
    sparse = m.num_layers - 1

    def memory(finetune: str, checkpointing: bool, micro_batch: int = 1, of: ModelConfig = m) -> MemoryEstimate:
        s = Strategy.model_validate({"gpu": "H200", "gpu_count": 1, "precision": "bf16", "finetune": finetune,
                                     "micro_batch": micro_batch, "activation_checkpointing": checkpointing})
        return train_memory(of, s, 2048, H200, MemoryCalibration())

    plain = memory("lora", False)
    assert plain.peak_moment == "backward start"
    assert plain.breakdown["merged_expert_weights"] == int(sparse * merged)
    assert memory("lora", False, micro_batch=4).breakdown["merged_expert_weights"] == int(sparse * merged)
    assert memory("lora", True).breakdown.get("merged_expert_weights", 0) <= 2 * merged
    assert "merged_expert_weights" not in memory("full", False).breakdown
    assert "merged_expert_weights" not in memory("lora", False, of=model("qwen3-0.6b")).breakdown
    # the merged weights come on top of what the same LoRA saves per token
    assert plain.peak_allocated_bytes - memory("lora", True).peak_allocated_bytes > 0.9 * sparse * merged


def test_lora_of_a_mixture_of_experts_computes_the_experts_weight_gradients() -> None:
    """LoRA's backward skips frozen weights' gradients, but not the routed experts' merged weight's: its FLOPs
    per token are the forward, the input gradients and attention's, plus twice the routed experts' active
    matmul parameters (their weight gradients); a dense model's LoRA has no such term."""
    m = model("deepseek-v2-lite")
    fwd = train_flops_per_token(m, 2048, "full", False) / 3
    attn = attention_flops_per_token(m, 2048)
    routed = (m.num_layers - 1) * m.experts_per_token * 3 * m.hidden_size * 1408
    assert train_flops_per_token(m, 2048, "lora", False) == pytest.approx(2 * fwd + attn + 2 * routed, rel=1e-12)
    dense = model("qwen3-0.6b")
    dense_fwd = train_flops_per_token(dense, 2048, "full", False) / 3
    assert train_flops_per_token(dense, 2048, "lora", False) == pytest.approx(
        2 * dense_fwd + attention_flops_per_token(dense, 2048), rel=1e-12)


def test_latent_attention_and_fp32_router_activations_match_the_h200_probe() -> None:
    """What autograd saved per token in a DeepSeek-V2-Lite dense layer and sparse layer on one H200 (bf16, b4 s2048;
    bench/probes/moe_lora_probe.py --all-saved), against the planner's per-layer bytes: latent attention (q and k at 192
    wide, the kv_b output, o_proj's copy, the low-rank norm) and the router's fp32 input are counted, within 1% under
    full fine-tuning; under LoRA (the merged expert weights apart) within 7% a layer and 2% over the model."""
    rec = json.loads((PROBE / "moe_lora_profile_deepseek_4layers.json").read_text())
    seen = {m["mode"]: m["saved_bytes_per_token"] for m in rec["modes"]}
    merged_per_token = merged_expert_bytes(model("deepseek-v2-lite"), "lora") / (rec["batch"] * rec["seq"])
    dense_only = model("deepseek-v2-lite", num_hidden_layers=1)
    whole = model("deepseek-v2-lite")

    def planned(m: ModelConfig, finetune: str) -> float:
        return layer_activation_bytes_per_token(m, "bf16", finetune, 16, 1, rec["seq"])

    assert planned(dense_only, "full") == pytest.approx(seen["full"]["0"], rel=0.01)
    measured_mean = (seen["full"]["0"] + 26 * seen["full"]["3"]) / 27
    assert planned(whole, "full") == pytest.approx(measured_mean, rel=0.01)
    assert planned(dense_only, "lora") == pytest.approx(seen["lora"]["0"], rel=0.07)
    lora_mean = (seen["lora"]["0"] + 26 * (seen["lora"]["3"] - merged_per_token)) / 27
    assert planned(whole, "lora") == pytest.approx(lora_mean, rel=0.02)


def test_merged_expert_weights_are_in_the_frozen_weights_dtype() -> None:
    """bf16 LoRA merges in bf16, fp32 and autocast LoRA in the fp32 master weights; QLoRA's fused experts stay bf16."""
    m = model("qwen3-30b-a3b")
    elements = 128 * 3 * 2048 * 768
    assert merged_expert_bytes(m, "lora", precision="bf16") == elements * 2
    assert merged_expert_bytes(m, "lora", precision="fp32") == elements * 4
    assert merged_expert_bytes(m, "lora", precision="amp-bf16") == elements * 4
    assert merged_expert_bytes(m, "qlora", precision="amp-bf16") == elements * 2
    assert merged_expert_bytes(m, "lora", tp=2) == elements
