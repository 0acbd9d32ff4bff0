"""Sliding-window layers, eager attention with sinks, q/k norms, Gemma's extra norms and per-expert MoE loops
in the planner: generate()'s KV cache keeps only the window (the graph decoder's static cache the whole
context), masked kernels compute the whole square, and the activation bytes follow the autograd graph of the
real transformers layers (checked against a CPU probe)."""

from __future__ import annotations

import pytest

from catalog.hf_config import model_from_hf_config
from catalog.schema import ModelConfig
from planner.activations import eager_attention_backward_bytes_per_token, layer_activation_bytes_per_token
from planner.calibration import MemoryCalibration, ThroughputCalibration
from planner.decoder import moe_decode_kernel
from planner.memory import gathered_expert_bytes, infer_memory, kv_cache_bytes, sparse_layer_count
from planner.memory_train import train_memory, train_moments
from planner.throughput import (
    attention_flops_per_token,
    decode_attention_flops,
    decode_expert_weight_params,
    decode_weight_params,
    infer_throughput,
    layer_kernel_weight,
)
from planner.throughput_train import train_throughput
from planner.types import Strategy
from tests.hf_configs import hf_model as model
from tests.planner.factory import small_catalog

CAT = small_catalog()
H200 = CAT.gpu("H200")
TCAL = ThroughputCalibration()


def test_sliding_layers_cache_only_their_window() -> None:
    m = model("gemma-3-1b")  # 26 layers, 22 sliding with a 512-token window, 1 kv head of 256
    per_token_layer = 2 * 1 * 256 * 2
    assert kv_cache_bytes(m, 1, 8192) == per_token_layer * (4 * 8192 + 22 * 511)
    assert kv_cache_bytes(m, 1, 300) == per_token_layer * 26 * 300  # below the window: all layers alike
    full = model("gemma-3-1b", sliding_window=None)
    assert kv_cache_bytes(full, 1, 8192) == per_token_layer * 26 * 8192


def test_masked_layers_compute_the_whole_square() -> None:
    gemma = model("gemma-3-1b")
    hq = 4 * 256
    # below the window every layer is causal SDPA (half the square); at the window the 22 sliding layers get
    # an explicit mask and SDPA's efficient kernel computes all of it
    assert attention_flops_per_token(gemma, 256) == 2 * 256 * hq * 26
    assert attention_flops_per_token(gemma, 2048) == 2 * 2048 * hq * (26 + 22)
    oss = model("gpt-oss-20b")  # eager attention: every layer the full square, whatever the window
    assert attention_flops_per_token(oss, 64) == 2 * 64 * 64 * 64 * 48
    # decoding reads only the cached window in sliding layers
    assert decode_attention_flops(gemma, 8192) == 2 * hq * (4 * 8192 + 22 * 511)


def test_the_graph_decoder_prices_full_length_sliding_caches() -> None:
    """workers/infer/decode.py builds Gemma 3's static cache as full attention: every layer holds and reads the whole
    context and the window is only in the mask. So under the graph decoder the windowed model decodes and
    caches like one without a window; generate()'s DynamicSlidingWindowLayer keeps the window's saving."""
    gemma, windowless = model("gemma-3-1b"), model("gemma-3-1b", sliding_window=None)
    per_token_layer = 2 * 1 * 256 * 2
    assert kv_cache_bytes(gemma, 1, 8192, full_length=True) == per_token_layer * 26 * 8192
    hq = 4 * 256
    assert decode_attention_flops(gemma, 8192, full_length=True) == 2 * hq * 26 * 8192
    # the prefill of a 256-token prompt meets the 640-token static cache: its sliding layers' mask spans the
    # window, so they compute 256 x 640 in full; the full-attention layers stay causal over the prompt
    assert attention_flops_per_token(gemma, 256, keys=640) == 2 * hq * (256 * 4 + 2 * 640 * 22)
    assert attention_flops_per_token(gemma, 2048, keys=2048) == attention_flops_per_token(gemma, 2048)
    s = Strategy(task="infer", gpu="H200", gpu_count=1, batch=8)
    b, p, o = 8, 4096, 128
    graph = {m.attn.sliding_window: infer_throughput(m, s, p, o, H200, TCAL, decoder="graph")
             for m in (gemma, windowless)}
    assert graph[512].decode_tokens_per_s == pytest.approx(graph[None].decode_tokens_per_s)
    generate = infer_throughput(gemma, s, p, o, H200, TCAL, decoder="generate")
    eager, compiled = generate.decode_tokens_per_s, graph[512].decode_tokens_per_s
    assert eager is not None and compiled is not None and eager < compiled  # host-bound eager steps
    assert generate.breakdown_s["decode"] < \
        infer_throughput(windowless, s, p, o, H200, TCAL, decoder="generate").breakdown_s["decode"]
    cal = MemoryCalibration()
    mem = {m.attn.sliding_window: infer_memory(m, s, p, o, H200, cal, decoder="graph") for m in (gemma, windowless)}
    assert mem[512].breakdown["kv_cache"] == mem[None].breakdown["kv_cache"] == kv_cache_bytes(gemma, b, p + o,
                                                                                               full_length=True)
    # the sliding layers' prefill mask over the static cache: bool + the bf16 bias SDPA makes of it
    extra = mem[512].breakdown["prefill_activations"] - mem[None].breakdown["prefill_activations"]
    assert extra == pytest.approx(b * p * (p + o) * 3)
    assert infer_memory(gemma, s, p, o, H200, cal, decoder="generate").breakdown["kv_cache"] < mem[512].breakdown[
        "kv_cache"]


def test_an_eager_attention_backward_holds_its_score_gradients_beside_the_probabilities() -> None:
    """With activation checkpointing a gpt-oss step peaks in a layer's attention backward at long sequences:
    the recomputed layer less its MLP (whose backward ran first) and 3 seq x seq score gradients beside the
    probabilities (H200 allocator trace, bench/probes/memory_peak_probe.py); SDPA models keep the layer rule."""
    oss = model("gpt-oss-20b", num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    cal = MemoryCalibration(backward_working_layers=0.0, eager_score_grad_buffers=3.0)
    s = Strategy(gpu="H200", gpu_count=1, precision="bf16", optimizer="adamw", activation_checkpointing=True,
                 micro_batch=2, finetune="full")
    tokens, scores = 2 * 4096, 64 * (4096 + 1) * 2  # heads x (keys + the sink column) x bf16
    # gpt-oss's clamped SwiGLU saves 7 tensors per element of the 4 experts a token visits, and the router
    # dispatch 2 copies of the hidden state per visit plus the router's logits and probabilities
    mlp = 7 * 2 * 4 * 2880 + 4 * 2 * 2 * 2880 + 2 * 2 * 32
    layer = layer_activation_bytes_per_token(oss, "bf16", "full", 16, seq_len=4096)
    assert eager_attention_backward_bytes_per_token(oss, "bf16", "full", 4096, layer, 3.0) == \
        pytest.approx(layer - mlp + 3 * scores)
    moments = {m.name: m for m in train_moments(oss, s, 4096, cal)[0]}
    saved = moments["backward start"].parts["activations"]
    assert moments["backward end"].parts["activations"] - saved == pytest.approx(tokens * (layer - mlp + 3 * scores))
    assert max(moments.values(), key=lambda m: m.total).name == "backward end"
    # at a short sequence the layer's own activations are the larger: the layer rule holds
    short = {m.name: m for m in train_moments(oss, s, 256, cal)[0]}
    layer_short = layer_activation_bytes_per_token(oss, "bf16", "full", 16, seq_len=256)
    assert short["backward end"].parts["activations"] - short["backward start"].parts["activations"] == \
        pytest.approx(2 * 256 * layer_short)
    llama = CAT.model("llama-3-8b")
    assert eager_attention_backward_bytes_per_token(llama, "bf16", "full", 4096, 1e6, 3.0) == 0.0


def test_eager_scores_grow_with_the_sequence_and_sdpa_does_not() -> None:
    oss = model("gpt-oss-20b")
    short = layer_activation_bytes_per_token(oss, "bf16", "full", 16, seq_len=1024)
    long = layer_activation_bytes_per_token(oss, "bf16", "full", 16, seq_len=4096)
    assert long - short == pytest.approx(64 * 3072 * 2)  # heads x extra keys x bf16 probabilities
    llama = CAT.model("llama-3-8b")
    assert layer_activation_bytes_per_token(llama, "bf16", "full", 16, seq_len=1024) == \
        layer_activation_bytes_per_token(llama, "bf16", "full", 16, seq_len=4096)


def test_window_mask_is_saved_only_once_the_sequence_reaches_the_window() -> None:
    gemma = model("gemma-3-1b")
    below = layer_activation_bytes_per_token(gemma, "bf16", "full", 16, seq_len=511)
    at = layer_activation_bytes_per_token(gemma, "bf16", "full", 16, seq_len=512)
    assert at - below == pytest.approx(2 * 512 * 22 / 26, rel=0.01)


def test_gpt_oss_prefill_holds_the_eager_scores() -> None:
    oss = model("gpt-oss-20b")
    big = infer_memory(oss, Strategy(task="infer", gpu="H200", gpu_count=1, batch=4), 4096, 64, H200,
                       MemoryCalibration())
    scores = 3 * 64 * 4 * 4096 * 4097 * 2
    assert big.peak_moment == "prefill"
    assert big.breakdown["prefill_activations"] > scores * 0.9


def test_expert_loop_makes_gpt_oss_training_slower_than_grouped_experts() -> None:
    oss = model("gpt-oss-20b")
    assert oss.moe is not None
    grouped = oss.model_copy(update={"moe": oss.moe.model_copy(update={"expert_loop": False})})
    train = Strategy(gpu="H200", gpu_count=1, micro_batch=1)
    cal = TCAL.model_copy(update={"expert_loop_s": 1e-4})
    assert train_throughput(grouped, train, 1024, H200, cal).tokens_per_s > \
        train_throughput(oss, train, 1024, H200, cal).tokens_per_s


def _pair_bytes(m: ModelConfig) -> int:
    """One routed expert's gate_up and down weights (and gpt-oss's biases) in bf16."""
    assert m.moe is not None
    width = m.moe.expert_intermediate_size
    return 2 * (3 * m.hidden_size * width + (2 * width + m.hidden_size if m.moe.expert_bias else 0))


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_generate_decode_gathers_every_token_experts_weights(name: str) -> None:
    """transformers' batched_mm (what generate() decodes a mixture of experts with on a GPU) copies each
    (token, expert) pair's weights and reads them again: a decode step grows with batch x top-k, not with the
    distinct experts the batch visits (which saturate at the expert count)."""
    m = model(name)
    steps = {}
    for b in (16, 32):
        est = infer_throughput(m, Strategy(task="infer", gpu="H200", gpu_count=1, batch=b), 512, 64, H200, TCAL,
                               decoder="generate", moe_kernel="batched_mm")
        assert est.decode_tokens_per_s is not None
        steps[b] = b / est.decode_tokens_per_s
    gathered = 3 * 16 * m.experts_per_token * _pair_bytes(m) * m.num_layers
    expected = gathered / (H200.memory_bandwidth_gbps * 1e9 * TCAL.decode_gather_bw_efficiency)
    assert steps[32] - steps[16] == pytest.approx(expected, rel=0.1)


def test_gathered_experts_are_alive_at_the_decode_peak() -> None:
    """H200, gpt-oss-20b b32 p512 o64 (bench/results/h200_moe_infer.json): 45.68 GiB allocated at the peak, 6.4 GB
    of it the decode's gathered expert weights, which a prefill-only account missed (-4.2%)."""
    oss = model("gpt-oss-20b")
    strategy = Strategy(task="infer", gpu="H200", gpu_count=1, batch=32)
    est = infer_memory(oss, strategy, 512, 64, H200, MemoryCalibration(), decoder="generate", moe_kernel="batched_mm")
    assert est.peak_moment == "decode end"
    assert est.breakdown["gathered_experts"] == 32 * 4 * _pair_bytes(oss)
    assert gathered_expert_bytes(oss, 32, "bf16", batched_mm=False) == 0.0  # grouped_mm: the experts read in place
    assert gathered_expert_bytes(model("qwen3-0.6b"), 32, "bf16", batched_mm=True) == 0.0
    # the workers keep grouped_mm at this batch (planner.decoder.moe_decode_kernel): nothing gathered
    kept = infer_memory(oss, strategy, 512, 64, H200, MemoryCalibration(), decoder="generate")
    assert kept.breakdown.get("gathered_experts", 0.0) == 0.0
    assert kept.peak_moment == "prefill" and kept.peak_allocated_bytes < est.peak_allocated_bytes


@pytest.mark.parametrize(("name", "batched_below"), [("gpt-oss-20b", 16), ("qwen3-30b-a3b", 32)])
def test_moe_decode_kernel_rule(name: str, batched_below: int) -> None:
    """generate()'s batched_mm below two visits per expert per step, grouped_mm from there (measured on the H200:
    gpt-oss level at 16, faster from 32; Qwen3-30B-A3B slower at 16, faster from 32)."""
    m = model(name)
    assert moe_decode_kernel(m, "nvidia", "bf16", batched_below - 1) == "batched_mm"
    assert moe_decode_kernel(m, "nvidia", "int8", batched_below) == "grouped_mm"
    assert moe_decode_kernel(m, "amd", "bf16", 1) == "batched_mm"
    assert moe_decode_kernel(m, "cpu", "bf16", 1) == "grouped_mm"  # generate() switches only on an accelerator
    assert moe_decode_kernel(m, "nvidia", "bf16", 64, given="batched_mm") == "batched_mm"
    assert moe_decode_kernel(m, "nvidia", "mxfp4", 64) is None  # the checkpoint's triton kernels
    assert moe_decode_kernel(m, "nvidia", "bf16", 1, graph=True) == "grouped_mm"  # the compiled step's own
    assert moe_decode_kernel(m, "nvidia", "bf16", 1, graph=True, given="batched_mm") == "grouped_mm"
    assert moe_decode_kernel(model("qwen3-0.6b"), "nvidia", "bf16", 64) is None
    # the estimate says which it priced (gpuplan plan --json): generate() where the graph is not taken (fp16)
    for b, kernel in ((batched_below - 1, "batched_mm"), (batched_below, "grouped_mm")):
        est = infer_throughput(m, Strategy(task="infer", gpu="H200", gpu_count=1, batch=b, weights="fp16"), 512, 64,
                               H200, TCAL)
        assert (est.decoder, est.moe_kernel) == ("generate", kernel)
    est = infer_throughput(m, Strategy(task="infer", gpu="H200", gpu_count=1, batch=1), 512, 64, H200, TCAL)
    assert (est.decoder, est.moe_kernel) == ("graph", "grouped_mm")
    dense = infer_throughput(model("qwen3-0.6b"), Strategy(task="infer", gpu="H200", gpu_count=1, batch=8), 512, 64,
                             H200, TCAL)
    assert (dense.decoder, dense.moe_kernel) == ("graph", None)


def test_grouped_decode_pays_host_work_per_sparse_layer_and_reads_each_expert_once() -> None:
    """With grouped_mm kept, a decode step stops growing with batch x top-k: gpt-oss-20b at batch 64 decodes
    several times faster than under batched_mm (measured 50 against 204 ms a step), for a fixed host cost per
    sparse layer."""
    oss = model("gpt-oss-20b")
    steps: dict[tuple[int, str], float] = {}
    for b in (16, 64):
        for kernel in ("batched_mm", "grouped_mm"):
            est = infer_throughput(oss, Strategy(task="infer", gpu="H200", gpu_count=1, batch=b), 512, 64, H200,
                                   TCAL, decoder="generate", moe_kernel=kernel)
            assert est.decode_tokens_per_s is not None
            steps[b, kernel] = b / est.decode_tokens_per_s
    assert steps[64, "batched_mm"] > 3 * steps[64, "grouped_mm"]
    assert steps[64, "grouped_mm"] - steps[16, "grouped_mm"] < 0.1 * steps[16, "grouped_mm"]
    free = TCAL.model_copy(update={"decode_grouped_layer_s": 0.0})
    est = infer_throughput(oss, Strategy(task="infer", gpu="H200", gpu_count=1, batch=64), 512, 64, H200, free,
                           decoder="generate", moe_kernel="grouped_mm")
    assert est.decode_tokens_per_s is not None
    assert steps[64, "grouped_mm"] - 64 / est.decode_tokens_per_s == pytest.approx(
        TCAL.decode_grouped_layer_s * oss.num_layers)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_compiled_moe_decode_pays_its_sparse_layers_and_no_host(name: str) -> None:
    """The compiled step (a CUDA graph, bench/results/workers/graph_decode_moe_2026-12-03.json) prices the routed
    experts' bytes, ``graph_moe_layer_s`` per sparse layer and no host work: far faster than generate()."""
    m = model(name)
    strategy = Strategy(task="infer", gpu="H200", gpu_count=1, batch=32)
    graph = infer_throughput(m, strategy, 512, 64, H200, TCAL)
    assert (graph.decoder, graph.moe_kernel) == ("graph", "grouped_mm")
    eager = infer_throughput(m, strategy, 512, 64, H200, TCAL, decoder="generate")
    assert graph.tokens_per_s > 1.5 * eager.tokens_per_s
    free = infer_throughput(m, strategy, 512, 64, H200, TCAL.model_copy(update={"graph_moe_layer_s": 0.0}))
    assert graph.decode_tokens_per_s is not None and free.decode_tokens_per_s is not None
    assert 32 / graph.decode_tokens_per_s - 32 / free.decode_tokens_per_s == pytest.approx(
        TCAL.graph_moe_layer_s * m.num_layers)  # every layer of both is sparse


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b"])
def test_compiled_moe_decode_reads_the_routed_experts_at_the_grouped_gemms_bandwidth(name: str) -> None:
    """The compiled step's grouped GEMMs read only the experts some row routed to, at their own share of the
    bandwidth (graph_moe_expert_bw_efficiency); each routed (row, expert) pair adds graph_moe_pair_s per sparse
    layer. The other weights stay at decode_bw_efficiency."""
    m = model(name)
    strategy = Strategy(task="infer", gpu="H200", gpu_count=1, batch=16)
    base = TCAL.model_copy(update={"graph_moe_expert_bw_efficiency": 0.7, "graph_moe_pair_s": 0.0,
                                   "decode_bw_efficiency": 0.7})
    slow = base.model_copy(update={"graph_moe_expert_bw_efficiency": 0.35, "graph_moe_pair_s": 1e-6})
    steps = {}
    for key, cal in (("base", base), ("slow", slow)):
        est = infer_throughput(m, strategy, 512, 64, H200, cal)
        assert est.decode_tokens_per_s is not None and est.decoder == "graph"
        steps[key] = 16 / est.decode_tokens_per_s
    experts = decode_expert_weight_params(m, 16) * 2
    bw = H200.memory_bandwidth_gbps * 1e9
    assert 0 < experts < decode_weight_params(m, 16) * 2  # the step reads the touched experts and the rest
    assert steps["slow"] - steps["base"] == pytest.approx(
        experts / (bw * 0.35) - experts / (bw * 0.7) + 1e-6 * 16 * m.experts_per_token * sparse_layer_count(m))


def test_compiled_eager_attention_reads_its_expanded_cache_every_step() -> None:
    """gpt-oss's eager attention repeats each KV head for its 8 query heads before the matmuls; in the compiled
    step the whole static cache is expanded, written and read every token, so the step grows with the batch at
    17x the cache's bytes (1 + 2 x 8). Qwen3-30B-A3B runs SDPA: nothing expanded."""
    oss = model("gpt-oss-20b")
    assert oss.attn.eager and oss.num_attention_heads // oss.num_kv_heads == 8
    cal = TCAL.model_copy(update={"graph_decode_row_param_s": 0.0})
    step = {}
    for b in (32, 64):
        est = infer_throughput(oss, Strategy(task="infer", gpu="H200", gpu_count=1, batch=b), 512, 128, H200, cal)
        assert est.decode_tokens_per_s is not None
        step[b] = b / est.decode_tokens_per_s
    cache = kv_cache_bytes(oss, 32, 640, full_length=True)
    bw = H200.memory_bandwidth_gbps * 1e9 * TCAL.decode_bw_efficiency
    assert step[64] - step[32] == pytest.approx(17 * cache / bw, rel=0.05)


def test_kernel_weight_is_one_for_llama_and_more_for_heavier_layers() -> None:
    assert layer_kernel_weight(CAT.model("llama-3-8b")) == 1.0
    assert layer_kernel_weight(CAT.model("gpt2")) == pytest.approx(21 / 43)  # fused LayerNorms, no RoPE
    gemma, qwen3 = model("gemma-3-1b"), model("qwen3-0.6b")
    assert layer_kernel_weight(gemma) > layer_kernel_weight(qwen3) > 1.0


def test_gemma_27b_full_training_does_not_fit_one_h200() -> None:
    gemma = model("gemma-3-27b")
    est = train_memory(gemma, Strategy(gpu="H200", gpu_count=1, micro_batch=1, activation_checkpointing=True),
                       2048, H200, MemoryCalibration())
    assert not est.fits  # 27B bf16 weights + grads + AdamW states = 216 GB


# ---------------------------------------------------------------- the activation formula vs the real layers

H, WIDTH, HEADS, KV, HD, VOCAB, SEQ, BATCH = 256, 768, 4, 2, 64, 512, 256, 2
BASE: dict[str, object] = {
    "hidden_size": H, "intermediate_size": WIDTH, "num_attention_heads": HEADS, "num_key_value_heads": KV,
    "head_dim": HD, "vocab_size": VOCAB, "max_position_embeddings": 4096, "tie_word_embeddings": False}
PROBES: dict[str, dict[str, object]] = {
    "llama": {"model_type": "llama"},
    "qwen3": {"model_type": "qwen3"},
    "olmo2": {"model_type": "olmo2"},
    "gemma3_text": {"model_type": "gemma3_text", "sliding_window": 4096},
    "qwen3_moe": {"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 128, "intermediate_size": 256},
    "gpt_oss": {"model_type": "gpt_oss", "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4096,
                "intermediate_size": 256},
}


def _saved_bytes_per_layer(cfg: dict[str, object]) -> float:
    """Bytes autograd saves per token per decoder layer in a real bf16 transformers model on CPU: the
    difference between a 4- and a 2-layer model, unique storages, parameters excluded."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    def saved(layers: int) -> int:
        config = AutoConfig.for_model(**{**cfg, "num_hidden_layers": layers})  # type: ignore[arg-type]
        attn = "eager" if cfg["model_type"] == "gpt_oss" else "sdpa"
        torch.manual_seed(0)
        net = AutoModelForCausalLM.from_config(config, attn_implementation=attn,  # type: ignore[no-untyped-call]
                                               dtype=torch.bfloat16)
        net.train()
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        ids = torch.randint(0, VOCAB, (BATCH, SEQ))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            net(input_ids=ids)
        params = {p.untyped_storage().data_ptr() for p in net.parameters()}
        return sum(n for ptr, n in storages.items() if ptr not in params)

    return (saved(4) - saved(2)) / 2 / (BATCH * SEQ)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROBES))
def test_activation_bytes_match_the_real_layers(name: str) -> None:
    cfg = {**BASE, **PROBES[name]}
    predicted = layer_activation_bytes_per_token(model_from_hf_config({**cfg, "num_hidden_layers": 4}), "bf16",
                                                 "full", 16, seq_len=SEQ)
    assert predicted == pytest.approx(_saved_bytes_per_layer(cfg), rel=0.02)


def test_eager_scores_cost_memory_passes_in_a_training_step() -> None:
    """Eager attention materialises seq x seq scores that a dozen separate kernels read and write (H200
    profile: softmax, mask add, sink concat, max, copies); SDPA models never do."""
    oss = model("gpt-oss-20b", num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    s = Strategy(gpu="H200", gpu_count=1, precision="bf16", optimizer="adamw", activation_checkpointing=True,
                 micro_batch=1, finetune="full")
    none, sixty = ThroughputCalibration(eager_score_passes=0.0), ThroughputCalibration(eager_score_passes=60.0)
    scores = 4 * 1 * 64 * 8192 * (8192 + 1) * 2  # layers x micro-batch x heads x queries x (keys + sink) x bf16
    extra = 60 * scores * 4 / 3 / (H200.memory_bandwidth_gbps * 1e9)  # the recompute reads them once more

    def added(seq: int) -> float:
        with_scores = train_throughput(oss, s, seq, H200, sixty).step_time_s
        return with_scores - train_throughput(oss, s, seq, H200, none).step_time_s

    assert added(8192) == pytest.approx(extra)
    assert added(1024) == pytest.approx(extra * (1024 * 1025) / (8192 * 8193))  # quadratic in the sequence
    llama = CAT.model("llama-3-8b")
    assert train_throughput(llama, s, 8192, H200, sixty).step_time_s == \
        train_throughput(llama, s, 8192, H200, none).step_time_s
