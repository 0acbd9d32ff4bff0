"""Memory model: known numbers, formulas, and monotonic behaviour."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.params import count_params
from planner.activations import layer_activation_bytes_per_token
from planner.calibration import GIB, MemoryCalibration
from planner.knobs import Knobs
from planner.memory import infer_memory, kv_cache_bytes
from planner.memory_train import max_micro_batch, memory_lines, train_memory
from tests.planner.factory import small_catalog, strat

CAT = small_catalog()
H200 = CAT.gpu("H200")
CAL = MemoryCalibration()


def test_llama3_8b_bf16_weights_are_16_06_gb() -> None:
    m = CAT.model("llama-3-8b")
    assert count_params(m).total * 2 / 1e9 == pytest.approx(16.06, abs=0.005)
    est = train_memory(m, strat(precision="bf16"), 1024, H200, CAL)
    assert est.breakdown["weights"] == pytest.approx(16.06e9, rel=1e-3)


def test_kv_cache_formula() -> None:
    m = CAT.model("llama-3-8b")  # 32 layers, 8 kv heads x 128
    assert kv_cache_bytes(m, batch=4, context=1000) == 2 * 32 * 8 * 128 * 1000 * 4 * 2
    s = strat(batch=4, weights="bf16")
    est = infer_memory(m, s, 900, 100, H200, CAL)
    # the peak holds the weights and at least the whole cache of prompt + output tokens
    assert est.peak_allocated_bytes >= est.breakdown["weights"] + kv_cache_bytes(m, 4, 1000)


def test_adamw_step_holds_params_grads_two_states_and_one_temporary() -> None:
    m = CAT.model("llama-3-8b")
    p = count_params(m).total
    est = train_memory(m, strat(precision="bf16", micro_batch=1), 512, H200, CAL)
    assert est.peak_moment == "optimizer step"
    assert est.breakdown["optimizer_states"] == pytest.approx(2 * 2 * p, rel=1e-6)
    assert est.breakdown["optimizer_temporaries"] == pytest.approx(2 * p, rel=1e-6)
    assert est.peak_allocated_bytes == pytest.approx(10 * p, rel=0.01)


def test_amp_doubles_master_weights_and_keeps_bf16_copies() -> None:
    m = CAT.model("llama-3.2-1b")
    bf16 = train_memory(m, strat(precision="bf16", micro_batch=4), 2048, H200, CAL)
    amp = train_memory(m, strat(precision="amp-bf16", micro_batch=4), 2048, H200, CAL)
    assert amp.peak_allocated_bytes > bf16.peak_allocated_bytes
    # at backward start, amp keeps the autocast bf16 copies of every linear weight alive
    assert "autocast_weight_copies" in amp.breakdown or amp.peak_moment == "optimizer step"


def test_small_model_big_vocab_peaks_on_the_fp32_logits() -> None:
    m = CAT.model("llama-3.2-1b")
    est = train_memory(m, strat(precision="bf16", micro_batch=8), 2048, H200, CAL)
    assert est.peak_moment == "backward start"
    # cross_entropy(logits.float()): 12 bytes per logit at the loss backward
    assert est.breakdown["logits_loss"] == pytest.approx(8 * 2048 * m.vocab_size * 12, rel=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "amp-bf16", "bf16", "fp8"])
def test_checkpointing_saves_memory_for_long_sequences(precision: str) -> None:
    m = CAT.model("llama-3-8b")
    off = train_memory(m, strat(precision=precision, micro_batch=4), 4096, H200, CAL)
    on = train_memory(m, strat(precision=precision, micro_batch=4, activation_checkpointing=True), 4096, H200, CAL)
    assert on.peak_allocated_bytes < off.peak_allocated_bytes


def test_lora_and_qlora_need_less_than_full() -> None:
    m = CAT.model("llama-3-8b")
    full = train_memory(m, strat(micro_batch=1), 2048, H200, CAL)
    lora = train_memory(m, strat(micro_batch=1, finetune="lora"), 2048, H200, CAL)
    qlora = train_memory(m, strat(micro_batch=1, finetune="qlora"), 2048, H200, CAL)
    assert qlora.breakdown["weights"] < lora.breakdown["weights"] / 2
    assert lora.peak_allocated_bytes < full.peak_allocated_bytes / 2


@pytest.mark.parametrize("optimizer", ["adamw", "adamw-8bit", "sgd", "adafactor"])
def test_optimizer_state_ordering(optimizer: str) -> None:
    m = CAT.model("llama-3-8b")
    est = train_memory(m, strat(optimizer=optimizer), 512, H200, CAL)
    p = count_params(m).total
    per_param = est.breakdown.get("optimizer_states", 0) / p
    expected = {"adamw": 4.0, "adamw-8bit": 2.03, "sgd": 2.0, "adafactor": 0.008}[optimizer]
    assert per_param == pytest.approx(expected, rel=0.02)


def test_fsdp_shards_state_and_adds_gathered_units() -> None:
    m = CAT.model("llama-3-8b")
    one = train_memory(m, strat(gpu_count=1, activation_checkpointing=True), 2048, H200, CAL)
    two = train_memory(m, strat(gpu_count=2, sharding="fsdp", activation_checkpointing=True), 2048, H200, CAL)
    assert two.breakdown["weights"] == pytest.approx(one.breakdown["weights"] / 2, rel=1e-6)
    assert two.breakdown.get("fsdp_root_unsharded", 0) > 0 or two.peak_moment == "optimizer step"
    assert two.peak_reserved_bytes / two.peak_allocated_bytes > one.peak_reserved_bytes / one.peak_allocated_bytes


def test_ddp_adds_a_bucket_copy_of_the_gradients() -> None:
    m = CAT.model("llama-3.2-1b")
    est = train_memory(m, strat(gpu_count=2, sharding="ddp", micro_batch=1), 512, H200, CAL)
    assert est.breakdown["ddp_buckets"] == est.breakdown["gradients"]
    assert est.breakdown["nccl"] == CAL.nccl_bytes


def test_quantized_inference_weights_shrink_with_scale_overhead() -> None:
    m = CAT.model("llama-3-8b")
    sizes = {w: infer_memory(m, strat(weights=w, batch=1), 128, 16, H200, CAL).breakdown["weights"]
             for w in ("bf16", "int8", "int4")}
    assert sizes["int8"] < sizes["bf16"] < 2.01 * sizes["int8"]
    assert sizes["int4"] < sizes["int8"]


def test_fits_compares_need_with_usable_and_totals_add_up() -> None:
    m = CAT.model("llama-3-70b")
    est = train_memory(m, strat(precision="bf16"), 2048, H200, CAL)
    assert not est.fits and est.required_bytes > est.usable_bytes
    assert est.usable_bytes == int(140.4 * GIB)
    assert est.total_bytes == est.peak_reserved_bytes + CAL.cuda_context_bytes
    assert est.peak_reserved_bytes >= est.peak_allocated_bytes
    assert est.peak_allocated_bytes % (2 << 20) == 0


def test_gpt2_activation_count_is_positive_and_grows_with_precision_bytes() -> None:
    m = CAT.model("gpt2")
    bf16 = layer_activation_bytes_per_token(m, "bf16", "full", 16)
    fp32 = layer_activation_bytes_per_token(m, "fp32", "full", 16)
    assert 0 < bf16 < fp32


@settings(max_examples=40, deadline=None)
@given(model=st.sampled_from(["gpt2", "llama-3.2-1b", "llama-3-8b", "llama-2-13b"]),
       precision=st.sampled_from(["fp32", "amp-bf16", "bf16"]), ckpt=st.booleans(),
       seq=st.sampled_from([512, 2048, 8192]), gpu=st.sampled_from(["H200", "H100-SXM", "L4"]),
       finetune=st.sampled_from(["full", "lora"]), headroom=st.floats(0.0, 0.5))
def test_max_micro_batch_agrees_with_the_full_estimate(model: str, precision: str, ckpt: bool, seq: int, gpu: str,
                                                      finetune: str, headroom: float) -> None:
    m, g = CAT.model(model), CAT.gpu(gpu)
    knobs = Knobs(precision=precision, activation_checkpointing=ckpt, finetune=finetune)
    candidates = [1, 2, 4, 8, 16, 32, 64]
    mb = max_micro_batch(memory_lines(m, knobs, seq, CAL), 1, g, CAL, candidates, headroom)
    if mb is None:
        assert not train_memory(m, knobs.with_micro_batch(1), seq, g, CAL, headroom=headroom).fits
        return
    # one rule for the choice and the verdict: every chosen micro-batch, 1 included, leaves the headroom
    est = train_memory(m, knobs.with_micro_batch(mb), seq, g, CAL, headroom=headroom)
    assert est.fits and est.headroom == headroom
    assert est.required_bytes <= est.usable_bytes * (1 - headroom)
    if mb < candidates[-1]:
        bigger = train_memory(m, knobs.with_micro_batch(mb * 2), seq, g, CAL, headroom=headroom)
        assert not bigger.fits
        assert bigger.required_bytes > bigger.usable_bytes * (1 - headroom)


def test_expandable_segments_predict_reserved_from_their_own_overhead() -> None:
    """The workers' allocator (expandable segments) has its own measured overhead (5.3% on one GPU);
    the stock allocator's table applies only when the calibration says the stock allocator runs."""
    m = CAT.model("llama-3.2-1b")
    s = strat(precision="amp-bf16", micro_batch=4)
    expandable = train_memory(m, s, 2048, H200, CAL)
    stock = train_memory(m, s, 2048, H200, CAL.model_copy(update={"allocator": "default",
                                                                  "reserved_overhead": {"single": 0.2}}))
    assert expandable.peak_allocated_bytes == stock.peak_allocated_bytes
    assert CAL.expandable_overhead["single"] == 0.053
    assert expandable.peak_reserved_bytes == pytest.approx(expandable.peak_allocated_bytes * 1.053, abs=2 << 20)
    assert stock.peak_reserved_bytes == pytest.approx(stock.peak_allocated_bytes * 1.2, abs=2 << 20)
    assert expandable.required_bytes == stock.required_bytes  # the fit verdict rests on allocated + slack


def test_apple_unified_memory_offers_only_the_metal_working_set() -> None:
    from catalog.schema import GpuSpec

    m3 = GpuSpec.model_validate({**H200.model_dump(), "id": "M3-Max", "aliases": [], "vendor": "apple",
                                 "memory_gib": 128.0, "dtypes": ["fp32", "fp16", "bf16"]})
    est = train_memory(CAT.model("llama-3.2-1b"), strat(gpu="M3-Max"), 512, m3, CAL)
    assert est.usable_bytes == int(128 * GIB * 0.75)
