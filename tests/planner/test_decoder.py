"""planner.decoder: which decoder the workers run, the one rule the plan's time and memory follow."""

from __future__ import annotations

import pytest

from catalog.loader import load_catalog, resolve_model
from planner.decoder import decoder_for, grouped_gemm_gpu, moe_decode_phrase


def test_dense_models_decode_with_the_graph_sliding_windows_included() -> None:
    """Gemma 3's sliding layers once recompiled the captured step every token on the H200 (680 tok/s against
    5,969 planned); the workers now build their static cache as full attention (workers/infer/decode.py), so
    sliding-window models take the graph like any dense model. Quantized weights keep generate()."""
    catalog = load_catalog()
    gemma = resolve_model(catalog, "gemma-3-1b")
    assert gemma.attn.sliding_window is not None and gemma.attn.sliding_layers > 0
    assert decoder_for(gemma, "nvidia", "bf16") == "graph"
    assert decoder_for(resolve_model(catalog, "mistral-7b"), "nvidia", "bf16") == "graph"  # every layer sliding
    assert decoder_for(gemma, "nvidia", "int8") == "generate"
    llama = resolve_model(catalog, "llama-3.2-1b")
    assert decoder_for(llama, "nvidia", "bf16") == "graph"
    assert decoder_for(llama, "nvidia", "int8") == "generate"  # quantized kernels were not measured captured
    assert decoder_for(llama, "amd", "bf16") == "generate"
    assert decoder_for(gemma, "nvidia", "bf16", given="generate") == "generate"  # a caller's choice still wins


def test_mixtures_of_experts_decode_with_the_graph_in_bf16_on_grouped_gemm_gpus() -> None:
    """transformers' grouped_mm experts route on the GPU, so a MoE's decode step is one CUDA graph (1.7-2.6x
    generate() on an H200); inductor lowers grouped_mm for bf16 only and torch runs it from sm80."""
    catalog = load_catalog()
    for name in ("gpt-oss-20b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"):
        moe = resolve_model(catalog, name)
        assert decoder_for(moe, "nvidia", "bf16") == "graph"
        assert decoder_for(moe, "nvidia", "bf16", capability="9.0") == "graph"
        assert decoder_for(moe, "nvidia", "bf16", capability="8.0") == "graph"
        assert decoder_for(moe, "nvidia", "bf16", capability="7.5") == "generate"  # T4: no grouped GEMM
        assert decoder_for(moe, "nvidia", "fp16") == "generate"  # inductor's grouped_mm is bf16 only
        assert decoder_for(moe, "nvidia", "int8") == "generate"
        assert decoder_for(moe, "amd", "bf16") == "generate"
        assert decoder_for(moe, "cpu", "bf16") == "generate"
    assert decoder_for(resolve_model(catalog, "gpt-oss-20b-mxfp4"), "nvidia", "mxfp4") == "generate"
    # a dense model needs no grouped GEMM: the capability does not matter to it
    assert decoder_for(resolve_model(catalog, "llama-3.2-1b"), "nvidia", "fp16", capability="7.0") == "graph"


def test_grouped_gemm_gpus_and_the_words_a_plan_prints() -> None:
    assert grouped_gemm_gpu("nvidia", "10.3") and grouped_gemm_gpu("nvidia", "8.9") and grouped_gemm_gpu("nvidia", None)
    assert not grouped_gemm_gpu("nvidia", "7.0") and not grouped_gemm_gpu("amd", "gfx942")
    assert not grouped_gemm_gpu("nvidia", "sm_90")  # not the catalog's form: no claim
    assert moe_decode_phrase("graph", None) == ""
    assert moe_decode_phrase("graph", "grouped_mm") == ", experts decoded with grouped_mm in a CUDA graph"
    assert moe_decode_phrase("generate", "batched_mm") == ", experts decoded with batched_mm"


def test_the_compiled_decoders_capture_is_in_the_jobs_hours() -> None:
    """The first batch of a compiled job holds the capture (18-114 s on the H200, per fresh process, growing with
    the layers): the plan's hours include it once, generate() pays none; both pay the job's measured start
    (process, plan, model load)."""
    from planner.calibration import load_calibration
    from planner.search import plan
    from planner.spec import spec_from_dict

    catalog, cal = load_catalog(), load_calibration()

    def chosen(weights: str) -> tuple[float, float, float, float]:
        spec = spec_from_dict({"name": "serve", "task": "infer", "model": "llama-3.2-1b",
                               "infer": {"requests": 64, "prompt_tokens": 256, "output_tokens": 64, "batch": 32,
                                         "weights": weights},
                               "resources": {"accelerators": ["H200:1"], "spot": "never"}})
        e = plan(spec, catalog, calibration=cal).chosen.estimate
        assert e.throughput.requests_per_s is not None
        return e.hours, e.throughput.warmup_s, 64 / e.throughput.requests_per_s, e.start_s

    start = cal.cost.infer_start_s
    hours, warmup, run_s, start_s = chosen("bf16")
    assert warmup == cal.throughput.graph_compile_layer_s * 16 > 0 and start > 0
    assert start_s == pytest.approx(start + warmup) and hours * 3600 == pytest.approx(run_s + start_s)
    hours, warmup, run_s, start_s = chosen("int8")  # generate(): nothing to capture
    assert warmup == 0.0 and start_s == start and hours * 3600 == pytest.approx(run_s + start)


def test_the_compiled_decoders_prompt_pass_has_its_own_price() -> None:
    """The compiled decoder's eager prompt pass is priced on its own fit (bench/probes/prefill_probe.py), not
    generate()'s curve: a floor of layers x graph_prefill_layer_s for a short prompt; the lm head on each row's last
    position only, so a longer prompt adds no lm-head work; a mixture's routed experts at graph_prefill_expert_mfu."""
    from planner.calibration import load_calibration
    from planner.throughput import infer_throughput, matmul_params
    from planner.types import Strategy

    catalog, cal = load_catalog(), load_calibration().throughput
    gpu = catalog.gpu("H200")

    def prefill(model: str, batch: int, prompt: int, decoder: str, **update: float) -> float:
        est = infer_throughput(resolve_model(catalog, model), Strategy(gpu="H200", gpu_count=1, batch=batch),
                               prompt, 128, gpu, cal.model_copy(update=update), decoder=decoder)
        return est.breakdown_s["prefill"]

    llama = resolve_model(catalog, "llama-3.2-1b")
    assert prefill("llama-3.2-1b", 1, 32, "graph") == pytest.approx(llama.num_layers * cal.graph_prefill_layer_s)
    assert prefill("llama-3.2-1b", 1, 32, "generate") < prefill("llama-3.2-1b", 1, 32, "graph")
    # a long prompt: compute bound, the lm head once per row (its 0.26 B of 1.24 B matmul params not per token)
    n, lm = matmul_params(llama)
    long, longer = prefill("llama-3.2-1b", 32, 512, "graph"), prefill("llama-3.2-1b", 32, 1024, "graph")
    assert 1.9 < longer / long < 2.1 + 0.1 * lm / n
    assert prefill("llama-3.2-1b", 32, 512, "graph", graph_prefill_mfu=cal.graph_prefill_mfu / 2) > 1.9 * long
    # routed experts: their own efficiency moves a mixture's prompt pass and leaves a dense model's alone
    slow = cal.graph_prefill_expert_mfu / 2
    assert prefill("qwen3-30b-a3b", 32, 512, "graph", graph_prefill_expert_mfu=slow) > 1.3 * prefill(
        "qwen3-30b-a3b", 32, 512, "graph")
    assert prefill("llama-3.2-1b", 32, 512, "graph", graph_prefill_expert_mfu=slow) == long
