"""gpuplan plan / estimate through typer's CliRunner, on the shipped catalog and example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from commands import output

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "llama3-8b-sft.yaml")
runner = CliRunner()


def test_plan_json_has_chosen_candidates_and_reasoned_rejections() -> None:
    result = runner.invoke(app, ["plan", EXAMPLE, "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    chosen = body["chosen"]
    assert chosen is not None and chosen == body["candidates"][0]
    assert chosen["estimate"]["memory"]["fits"] is True
    assert chosen["cost"]["usd"] <= 2500 and chosen["cost"]["hours"] <= 48
    assert all(r["reason"] and r["constraint"] for r in body["rejections"])


def test_plan_table_shows_ranked_rows_chosen_and_rejection_summary() -> None:
    result = runner.invoke(app, ["plan", EXAMPLE, "--top", "3", "--objective", "fastest"])
    assert result.exit_code == 0, result.output
    assert "chosen:" in result.output and "rejected options" in result.output


def test_estimate_json_follows_the_design_contract() -> None:
    result = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "H200", "--count", "1", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    mem = body["memory"]
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "total_bytes", "fits", "breakdown"):
        assert key in mem
    assert mem["peak_reserved_bytes"] >= mem["peak_allocated_bytes"] and mem["total_bytes"] > mem["peak_reserved_bytes"]
    assert body["throughput"]["tokens_per_s"] > 0 and body["strategy"]["gpu"] == "H200"


def test_unknown_gpu_exits_2_with_did_you_mean() -> None:
    result = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "H10", "--json"])
    assert result.exit_code == 2
    assert "did you mean" in json.loads(result.stdout)["error"]["message"]


def test_nothing_feasible_exits_3_naming_the_constraint(tmp_path: Path) -> None:
    spec = tmp_path / "tight.yaml"
    spec.write_text("task: train\nmodel: llama-3-8b\ntrain: {tokens: 2.0e9, seq_len: 4096}\n"
                    "resources: {budget_usd: 1}\n")
    result = runner.invoke(app, ["plan", str(spec)])
    assert result.exit_code == 3
    assert "budget $1 removed the last" in result.output and "raise budget_usd" in result.output


def test_bad_objective_is_refused() -> None:
    result = runner.invoke(app, ["plan", EXAMPLE, "--objective", "slowest"])
    assert result.exit_code == 2 and "cheapest or fastest" in result.output
    result = runner.invoke(app, ["plan", EXAMPLE, "--objective", "slowest", "--json"])
    assert json.loads(result.stdout)["error"]["message"] == "--objective: must be cheapest or fastest, got 'slowest'"


def test_inference_example_plans_and_estimates() -> None:
    serve = str(Path(EXAMPLE).with_name("llama3-8b-serve.yaml"))
    planned = runner.invoke(app, ["plan", serve, "--json"])
    assert planned.exit_code == 0, planned.output
    chosen = json.loads(planned.stdout)["chosen"]
    assert chosen["estimate"]["strategy"]["task"] == "infer" and chosen["cost"]["hours"] <= 24
    est = runner.invoke(app, ["estimate", serve, "--gpu", "L4", "--count", "1", "--json"])
    assert est.exit_code == 0, est.output
    body = json.loads(est.stdout)
    assert body["throughput"]["requests_per_s"] > 0 and "kv_cache" in body["memory"]["breakdown"]
    # the table says which decoder the hours assume and that the compiled one's capture is in them: on an L4 the
    # 8B model needs quantized weights (generate()), on an H100 it runs bf16 through the compiled decoder
    assert body["throughput"]["warmup_s"] == 0
    shown = " ".join(runner.invoke(app, ["estimate", serve, "--gpu", "L4", "--count", "1"]).stdout.split())
    assert "h for the job (generate())" in shown
    h100 = json.loads(runner.invoke(app, ["estimate", serve, "--gpu", "H100-SXM", "--count", "1", "--json"]).stdout)
    warmup = h100["throughput"]["warmup_s"]
    shown = " ".join(runner.invoke(app, ["estimate", serve, "--gpu", "H100-SXM", "--count", "1"]).stdout.split())
    start = h100["start_s"]
    assert warmup > 0 and f"h for the job (compiled decoder), its start included: {start:,.0f} s, {warmup:,.0f} s " \
        "of it the capture" in shown
    # and a batch's two terms, as a run logs them and `gpuplan report accuracy` compares them
    prefill = h100["throughput"]["breakdown_s"]["prefill"]
    assert f"per batch of {h100['strategy']['batch']}: prompt pass {prefill * 1e3:,.1f} ms, then" in shown
    assert "per batch of" not in " ".join(runner.invoke(app, ["estimate", EXAMPLE, "--gpu",
                                                              "H200", "--count", "1"]).stdout.split())


def test_model_given_as_hf_config_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 4096, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 4096}))
    spec = tmp_path / "job.yaml"
    spec.write_text("task: train\nmodel: {config: config.json}\ntrain: {tokens: 1.0e8, seq_len: 1024}\n")
    result = runner.invoke(app, ["estimate", str(spec), "--gpu", "L4", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["memory"]["fits"] and body["strategy"]["gpu"] == "L4"


def test_estimate_that_does_not_fit_exits_3_without_hours() -> None:
    result = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "L4", "--count", "1"])
    assert result.exit_code == 3, result.output
    assert "does not fit" in result.stdout and "h for the job" not in result.stdout
    assert "no time estimate" in result.stdout
    as_json = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "L4", "--count", "1", "--json"])
    assert as_json.exit_code == 3
    body = json.loads(as_json.stdout)
    assert body["memory"]["fits"] is False and body["hours"] is None
    assert "Exit codes: 0 it fits; 3 it does not fit" in " ".join(
        runner.invoke(app, ["estimate", "--help"], env={"COLUMNS": "200"}).stdout.split())


def test_estimate_explains_needs_reserved_and_total(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "console", output.make_console(width=160))
    result = runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "H200", "--count", "2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    body = json.loads(runner.invoke(app, ["estimate", EXAMPLE, "--gpu", "H200", "--count", "2", "--json"]).stdout)
    mem = body["memory"]
    gib = lambda n: f"{n / 2**30:.1f}"  # noqa: E731
    assert f"= peak allocated │ {gib(mem['peak_allocated_bytes'])} │ torch.cuda.max_memory_allocated()" in text
    assert f"= peak reserved │ {gib(mem['peak_reserved_bytes'])} │ torch.cuda.max_memory_reserved()" in text
    assert f"= total │ {gib(mem['total_bytes'])} │ what nvidia-smi shows" in text
    assert f"needs │ {gib(mem['required_bytes'])} │ peak allocated + 2% slack + context" in text
    assert "compared with limit" in text


def test_estimate_of_a_mixture_of_experts_lora_shows_its_merged_expert_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LoRA of Qwen3-30B-A3B on an H200: 48 sparse layers each keep their merged experts (1.13 GiB) until backward,
    a component of its own in the table (with why) and in --json; with activation checkpointing it is one layer's."""
    monkeypatch.setattr(output, "console", output.make_console(width=200))
    spec = tmp_path / "moe-lora.yaml"
    spec.write_text("task: train\nmodel: qwen3-30b-a3b\ntrain: {tokens: 1.0e6, seq_len: 2048, finetune: lora, "
                    "micro_batch: 1, activation_checkpointing: false}\n")
    body = json.loads(runner.invoke(app, ["estimate", str(spec), "--gpu", "H200", "--json"]).stdout)
    merged = body["memory"]["breakdown"]["merged_expert_weights"]
    assert merged == 48 * 128 * 3 * 2048 * 768 * 2
    shown = runner.invoke(app, ["estimate", str(spec), "--gpu", "H200"])
    text = " ".join(shown.stdout.split())
    assert f"merged_expert_weights │ {merged / 2**30:.1f} │ LoRA on a mixture of experts" in text
    spec.write_text(spec.read_text().replace("activation_checkpointing: false", "activation_checkpointing: true"))
    body = json.loads(runner.invoke(app, ["estimate", str(spec), "--gpu", "H200", "--json"]).stdout)
    assert body["memory"]["breakdown"].get("merged_expert_weights", 0) <= 2 * merged / 48


def test_no_deadline_no_chance_to_meet_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "console", output.make_console(width=200))
    spec = tmp_path / "nodeadline.yaml"
    spec.write_text(Path(EXAMPLE).read_text().replace("  deadline: 48h\n", ""))
    result = runner.invoke(app, ["plan", str(spec), "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "chosen:" in result.stdout and "chance" not in result.stdout and "P(deadline)" not in result.stdout
    with_deadline = runner.invoke(app, ["plan", EXAMPLE, "--top", "3"])
    assert "chance to meet the deadline" in " ".join(with_deadline.stdout.split())  # the line wraps between words


def test_a_mixture_of_experts_serving_plan_says_how_its_experts_decode(tmp_path: Path) -> None:
    """gpt-oss-20b at batch 64 on an H200: the workers decode its grouped_mm experts in a CUDA graph (1.7x generate()
    with grouped_mm kept, 7x its own batched_mm there); the plan prices it and says so, in the table's chosen line
    and in --json. In fp16 (no compiled grouped_mm) generate() keeps grouped_mm at this batch."""
    spec = tmp_path / "serve.yaml"
    spec.write_text("name: oss-serve\ntask: infer\nmodel: gpt-oss-20b\ninfer:\n  requests: 100000\n"
                    "  prompt_tokens: 512\n  output_tokens: 256\n  batch: 64\n  weights: bf16\n"
                    "resources:\n  accelerators: [H200]\n")
    shown = runner.invoke(app, ["plan", str(spec)], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "experts decoded with grouped_mm in a CUDA graph" in " ".join(shown.output.split())
    body = json.loads(runner.invoke(app, ["plan", str(spec), "--json"]).stdout)
    throughput = body["chosen"]["estimate"]["throughput"]
    assert (throughput["decoder"], throughput["moe_kernel"]) == ("graph", "grouped_mm")
    spec.write_text(spec.read_text().replace("weights: bf16", "weights: fp16"))
    fp16 = json.loads(runner.invoke(app, ["plan", str(spec), "--json"]).stdout)["chosen"]["estimate"]["throughput"]
    assert (fp16["decoder"], fp16["moe_kernel"]) == ("generate", "grouped_mm")
    assert fp16["tokens_per_s"] < throughput["tokens_per_s"] / 1.3
