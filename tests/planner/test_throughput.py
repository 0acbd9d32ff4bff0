"""Throughput: FLOP counts, monotonic behaviour, inference roofline."""

from __future__ import annotations

import pytest

from catalog.params import count_params
from planner.calibration import ThroughputCalibration
from planner.throughput import infer_throughput, matmul_params, peak_tflops
from planner.throughput_train import fsdp_collectives, train_flops_per_token, train_throughput
from tests.planner.factory import small_catalog, strat

CAT = small_catalog()
CAL = ThroughputCalibration()


def test_six_n_plus_attention() -> None:
    m = CAT.model("llama-3-8b")
    n, lm = matmul_params(m)
    norms = 2 * m.hidden_size * m.num_layers + m.hidden_size
    assert n == count_params(m).total - m.vocab_size * m.hidden_size - norms  # input embedding is a lookup
    f = train_flops_per_token(m, 4096, "full", False)
    attention = 3 * 2 * 4096 * 4096 * 32
    assert f == pytest.approx(6 * n + attention)
    # activation checkpointing recomputes the decoder layers' forward, not the LM head's
    assert train_flops_per_token(m, 4096, "full", True) == pytest.approx(f * 4 / 3 - 2 * lm)
    assert lm == m.vocab_size * m.hidden_size


def test_peak_follows_precision_and_capability() -> None:
    h200, v100 = CAT.gpu("H200"), CAT.gpu("V100-16GB")
    assert peak_tflops(h200, "fp8") == pytest.approx(2 * peak_tflops(h200, "bf16"), rel=1e-3)
    assert peak_tflops(h200, "fp32") == 67
    assert peak_tflops(v100, "bf16") == 125  # falls back to fp16 units


def test_bigger_micro_batch_and_fp8_are_faster_per_token() -> None:
    m, g = CAT.model("llama-3.2-1b"), CAT.gpu("H200")
    small = train_throughput(m, strat(micro_batch=1), 2048, g, CAL)
    big = train_throughput(m, strat(micro_batch=8), 2048, g, CAL)
    fp8 = train_throughput(m, strat(micro_batch=8, precision="fp8"), 2048, g, CAL)
    assert big.tokens_per_s > small.tokens_per_s
    assert fp8.tokens_per_s > big.tokens_per_s
    assert 0 < big.mfu < 1


def test_more_gpus_more_tokens_but_sublinear_over_network() -> None:
    m, g = CAT.model("llama-3-8b"), CAT.gpu("H100-SXM")
    one = train_throughput(m, strat(gpu="H100-SXM", micro_batch=1, activation_checkpointing=True), 4096, g, CAL)
    eight = train_throughput(m, strat(gpu="H100-SXM", gpu_count=8, sharding="fsdp", micro_batch=1,
                                      activation_checkpointing=True), 4096, g, CAL)
    slow_net = train_throughput(m, strat(gpu="H100-SXM", gpu_count=16, sharding="fsdp", micro_batch=1, nodes=2,
                                         activation_checkpointing=True), 4096, g, CAL, gpus_per_node=8,
                                network_gbps=25)
    # compute scales linearly; only the sharded optimizer step may make 8 GPUs slightly superlinear
    assert eight.breakdown_s["compute"] == pytest.approx(one.breakdown_s["compute"])
    assert one.tokens_per_s < eight.tokens_per_s <= 8 * one.tokens_per_s * 1.15
    assert slow_net.tokens_per_s < 2 * eight.tokens_per_s


def test_decode_is_bandwidth_bound_and_int8_reads_fewer_bytes() -> None:
    m = CAT.model("llama-3-8b")
    h200, l4 = CAT.gpu("H200"), CAT.gpu("L4")
    fast = infer_throughput(m, strat(batch=8, weights="bf16"), 512, 128, h200, CAL)
    slow = infer_throughput(m, strat(gpu="L4", batch=8, weights="bf16"), 512, 128, l4, CAL)
    assert fast.decode_tokens_per_s is not None and slow.decode_tokens_per_s is not None
    assert fast.decode_tokens_per_s > 3 * slow.decode_tokens_per_s
    q = infer_throughput(m, strat(gpu="L4", batch=8, weights="int8"), 512, 128, l4, CAL)
    assert q.decode_tokens_per_s is not None and q.decode_tokens_per_s > slow.decode_tokens_per_s


def test_fsdp_pays_a_fixed_cost_per_collective_and_nothing_else_does() -> None:
    m = CAT.model("llama-3-8b")
    full = strat(gpu_count=2, sharding="fsdp", activation_checkpointing=True, micro_batch=1, grad_accum=2)
    grad_op = strat(gpu_count=2, sharding="fsdp-grad-op", micro_batch=1)
    ddp = strat(gpu_count=2, sharding="ddp", micro_batch=1)
    # per layer: forward, backward and recompute all-gathers + a reduce-scatter (full); grad-op gathers once
    assert fsdp_collectives(full, m.num_layers) == 4 * m.num_layers
    assert fsdp_collectives(grad_op, m.num_layers) == 2 * m.num_layers
    assert fsdp_collectives(ddp, m.num_layers) == 0
    assert fsdp_collectives(strat(sharding="fsdp"), m.num_layers) == 0  # one GPU: nothing to gather
    h200 = CAT.gpu("H200")
    cost = CAL.model_copy(update={"fsdp_collective_s": 1e-3})
    for s in (full, grad_op):
        before = train_throughput(m, s, 2048, h200, CAL).step_time_s
        after = train_throughput(m, s, 2048, h200, cost).step_time_s
        assert after - before == pytest.approx(1e-3 * fsdp_collectives(s, m.num_layers) * s.grad_accum)
    assert train_throughput(m, ddp, 2048, h200, cost).step_time_s == train_throughput(m, ddp, 2048, h200,
                                                                                      CAL).step_time_s
