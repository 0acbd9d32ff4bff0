"""Throughput: FLOP counts, monotonic behaviour, inference roofline."""

from __future__ import annotations

import pytest

from catalog.params import count_params
from planner.calibration import ThroughputCalibration
from planner.throughput import infer_throughput, matmul_params, peak_tflops, train_flops_per_token, train_throughput
from planner.types import Strategy
from tests.planner.factory import small_catalog

CAT = small_catalog()
CAL = ThroughputCalibration()


def strat(**kw: object) -> Strategy:
    base: dict[str, object] = {"gpu": "H200", "gpu_count": 1}
    base.update(kw)
    return Strategy.model_validate(base)


def test_six_n_plus_attention() -> None:
    m = CAT.model("llama-3-8b")
    n, lm = matmul_params(m)
    norms = 2 * m.hidden_size * m.num_layers + m.hidden_size
    assert n == count_params(m).total - m.vocab_size * m.hidden_size - norms  # input embedding is a lookup
    f = train_flops_per_token(m, 4096, "full", False)
    attention = 3 * 2 * 4096 * 4096 * 32
    assert f == pytest.approx(6 * n + attention)
    assert train_flops_per_token(m, 4096, "full", True) == pytest.approx(f * 4 / 3)
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
