"""Batch inference on CPU with a tiny random Llama: outputs per request, resume after a kill, bad input."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.schema import ModelConfig
from errors import InvalidInput
from tests.processes import kill_9_when_ready
from workers.infer.generate import generate_batch, run_inference

TINY_HF = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
TINY = ModelConfig(
    id="tiny-llama",
    family="llama",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=256,
    max_position_embeddings=128,
    hf_config=TINY_HF,
)


def _prompts(path: Path, n: int) -> Path:
    """n requests mixing text prompts (byte tokenizer) and token ids, of different lengths."""
    with path.open("w") as fh:
        for i in range(n):
            if i % 2:
                fh.write(json.dumps({"id": f"r{i}", "prompt": "hello world " * (1 + i % 3)}) + "\n")
            else:
                fh.write(json.dumps({"id": f"r{i}", "input_ids": [(7 * i + k) % 256 for k in range(3 + i)]}) + "\n")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _by_id(path: Path) -> dict[str, list[int]]:
    return {str(r["id"]): r["output_ids"] for r in _records(path)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An uninterrupted run over 10 prompts (batch 2, 6 new tokens): the outputs others must match."""
    root = tmp_path_factory.mktemp("ref")
    prompts = _prompts(root / "prompts.jsonl", 10)
    outputs = root / "out.jsonl"
    run_inference(TINY, prompts, outputs, batch=2, max_new_tokens=6, dtype="fp32", seed=3)
    return prompts, outputs


def test_one_output_per_request(reference: tuple[Path, Path], tmp_path: Path) -> None:
    prompts, _ = reference
    outputs = tmp_path / "sub" / "out.jsonl"
    seen: list[tuple[int, int]] = []
    result = run_inference(
        TINY,
        prompts,
        outputs,
        batch=3,
        max_new_tokens=6,
        dtype="fp32",
        seed=3,
        progress=lambda d, t: seen.append((d, t)),
    )
    records = _records(outputs)
    assert [r["id"] for r in records] == [f"r{i}" for i in range(10)]
    assert [r["index"] for r in records] == list(range(10))
    for rec in records:
        assert 1 <= rec["new_tokens"] == len(rec["output_ids"]) <= 6
        assert rec["finish_reason"] in ("eos", "length")
        assert all(0 <= t < 256 for t in rec["output_ids"])
    assert records[1]["prompt_tokens"] == len(b"hello world " * 2)
    assert (result.requests_total, result.requests_done, result.requests_skipped) == (10, 10, 0)
    assert result.tokens_generated == sum(r["new_tokens"] for r in records)
    assert result.tokens_per_s > 0 and result.peak_memory_bytes is None and result.weights == "fp32"
    assert result.steady_prefill_s is None and result.steady_step_s is None  # generate() is not split
    assert seen == [(3, 10), (6, 10), (9, 10), (10, 10)]
    # Left padding + attention mask: batch composition does not change greedy outputs.
    assert _by_id(outputs) == _by_id(reference[1])


def test_graph_decoder_writes_the_same_outputs_as_generate(reference: tuple[Path, Path], tmp_path: Path) -> None:
    """The decoder GPUs run (workers/infer/decode.py; compiled only on CUDA) against transformers' generate()."""
    prompts, _ = reference
    outputs = tmp_path / "out.jsonl"
    result = run_inference(TINY, prompts, outputs, batch=4, max_new_tokens=6, dtype="fp32", seed=3, decoder="graph")
    assert result.decoder == "graph" and result.packed_gqa  # 4 query heads on 2 KV heads
    assert _by_id(outputs) == _by_id(reference[1])
    # the prompt pass and the steps timed apart after the first batch, as the plan prices them
    assert result.steady_prefill_s is not None and result.steady_prefill_s > 0
    assert result.steady_step_s is not None and result.steady_step_s > 0
    assert [r["finish_reason"] for r in _records(outputs)] == [r["finish_reason"] for r in _records(reference[1])]


def test_a_failed_compiled_step_hands_generate_the_models_own_attention(
        reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.infer.decode

    implementations: list[str] = []

    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("inductor could not lower this")

    def spy_generate(model: Any, *args: Any, **kwargs: Any) -> Any:
        implementations.append(model.config._attn_implementation)
        return generate_batch(model, *args, **kwargs)

    monkeypatch.setattr(workers.infer.decode.GraphDecoder, "decode", broken)
    monkeypatch.setattr("workers.infer.generate.generate_batch", spy_generate)
    outputs = tmp_path / "out.jsonl"
    result = run_inference(TINY, reference[0], outputs, batch=4, max_new_tokens=6, dtype="fp32", seed=3,
                           decoder="graph")
    assert result.decoder == "generate" and not result.packed_gqa
    # the first call is the compiled decoder's (packed), every generate() after it on SDPA
    assert implementations[0] == "gpuplan_packed_gqa_sdpa" and set(implementations[1:]) == {"sdpa"}
    assert _by_id(outputs) == _by_id(reference[1])


def test_rerun_skips_everything_finished(reference: tuple[Path, Path], tmp_path: Path) -> None:
    prompts, ref_out = reference
    outputs = tmp_path / "out.jsonl"
    outputs.write_bytes(ref_out.read_bytes())
    before = outputs.read_bytes()
    result = run_inference(TINY, prompts, outputs, batch=2, max_new_tokens=6, dtype="fp32", seed=3)
    assert (result.requests_done, result.requests_skipped, result.tokens_generated) == (0, 10, 0)
    assert outputs.read_bytes() == before


def _child_infer(prompts: str, outputs: str, stalled: Any) -> None:
    """Runs in a spawned process: stalls (until killed) once two batches are on disk."""

    def progress(done: int, total: int) -> None:
        if done >= 4:
            stalled.set()
            time.sleep(120)

    run_inference(
        TINY, Path(prompts), Path(outputs), batch=2, max_new_tokens=6, dtype="fp32", seed=3, progress=progress
    )


@pytest.mark.slow
def test_killed_mid_run_resumes_without_duplicates_or_gaps(reference: tuple[Path, Path], tmp_path: Path) -> None:
    prompts, ref_out = reference
    outputs = tmp_path / "out.jsonl"
    kill_9_when_ready(_child_infer, str(prompts), str(outputs), timeout_s=120, waiting_for="finished two batches")
    assert [r["id"] for r in _records(outputs)] == ["r0", "r1", "r2", "r3"]

    result = run_inference(TINY, prompts, outputs, batch=2, max_new_tokens=6, dtype="fp32", seed=3)
    assert (result.requests_done, result.requests_skipped) == (6, 4)
    ids = [r["id"] for r in _records(outputs)]
    assert sorted(ids) == sorted(set(ids)) == sorted(f"r{i}" for i in range(10))
    assert _by_id(outputs) == _by_id(ref_out), "resumed outputs equal an uninterrupted run's"


def test_torn_last_line_is_truncated_and_redone(
    reference: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    prompts, ref_out = reference
    lines = ref_out.read_bytes().splitlines(keepends=True)
    outputs = tmp_path / "out.jsonl"
    outputs.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # crash mid-write of r3
    with caplog.at_level(logging.WARNING):
        result = run_inference(TINY, prompts, outputs, batch=2, max_new_tokens=6, dtype="fp32", seed=3)
    assert any("torn" in r.getMessage() for r in caplog.records)
    assert (result.requests_done, result.requests_skipped) == (7, 3)
    ids = [r["id"] for r in _records(outputs)]
    assert len(ids) == len(set(ids)) == 10
    assert _by_id(outputs) == _by_id(ref_out)


def test_weights_from_a_local_directory(reference: tuple[Path, Path], tmp_path: Path) -> None:
    """save_pretrained of the seeded random model, loaded back, generates the same tokens."""
    from workers.infer.model_load import load_model

    model = load_model(TINY, weights="fp32", seed=3, device="cpu")
    model.save_pretrained(tmp_path / "weights")  # type: ignore[operator]
    prompts, ref_out = reference
    outputs = tmp_path / "out.jsonl"
    run_inference(
        TINY, prompts, outputs, batch=2, max_new_tokens=6, dtype="fp32", seed=999, weights_dir=tmp_path / "weights"
    )
    assert _by_id(outputs) == _by_id(ref_out)


@pytest.mark.slow
def test_int8_weights_through_torchao(reference: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    from workers.infer.model_load import load_model

    model = load_model(TINY, weights="int8", seed=3, device="cpu")
    q_proj: Any = model.get_submodule("model.layers.0.self_attn.q_proj")
    assert "Int8" in type(q_proj.weight).__name__
    assert model.get_submodule("lm_head").weight.dtype.is_floating_point
    prompts, _ = reference
    result = run_inference(TINY, prompts, tmp_path / "o.jsonl", batch=4, max_new_tokens=4, dtype="int8", seed=3)
    assert result.weights == "int8" and result.requests_done == 10
    assert len(_records(tmp_path / "o.jsonl")) == 10


def test_tokenizer_directory(tmp_path: Path) -> None:
    """A local tokenizer (built offline here) encodes text prompts and decodes outputs; its EOS stops."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "hello", "world", "the", "quick", "brown", "fox", "jumps", "lazy", "dog"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.save_pretrained(str(tmp_path / "tok"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "prompt": "hello world fox"})
        + "\n"
        + json.dumps({"id": "b", "prompt": "lazy dog"})
        + "\n"
    )
    result = run_inference(
        TINY,
        prompts,
        tmp_path / "o.jsonl",
        batch=2,
        max_new_tokens=5,
        dtype="fp32",
        seed=0,
        tokenizer_dir=tmp_path / "tok",
    )
    records = _records(tmp_path / "o.jsonl")
    assert result.requests_done == 2 and [r["prompt_tokens"] for r in records] == [3, 2]
    for rec in records:
        assert rec["text"] == fast.decode(rec["output_ids"], skip_special_tokens=True)
        assert (rec["finish_reason"] == "eos") == (1 in rec["output_ids"])
        assert 1 not in rec["output_ids"][:-1], "generation stops at the tokenizer's EOS"
    with pytest.raises(InvalidInput, match="cannot load a tokenizer"):
        run_inference(TINY, prompts, tmp_path / "o2.jsonl", batch=2, max_new_tokens=5, tokenizer_dir=tmp_path / "none")


# -- bad input -------------------------------------------------------------------------------------


def _run(prompts: Path, outputs: Path, **kw: Any) -> Any:
    args: dict[str, Any] = {"batch": 2, "max_new_tokens": 4, "dtype": "fp32", "seed": 0, **kw}
    return run_inference(TINY, prompts, outputs, **args)


def test_missing_prompts_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="does not exist") as err:
        _run(tmp_path / "nope.jsonl", tmp_path / "o.jsonl")
    assert "nope.jsonl" in str(err.value) and "input_ids" in str(err.value)


@pytest.mark.parametrize(
    ("third_line", "message"),
    [
        ('{"id": "c", "prompt": "x"', "line 3 is not valid JSON"),
        ('["a list"]', "line 3 must be a JSON object"),
        ('{"id": "c"}', "line 3: needs a non-empty 'prompt'"),
        ('{"id": "c", "input_ids": [1, "two"]}', "line 3: input_ids must be"),
        ('{"id": "c", "input_ids": [1, 999]}', "line 3: token id 999 is outside"),
        ('{"id": "a", "prompt": "dup"}', "line 3: id 'a' repeats line 1"),
        ('{"id": "c", "input_ids": ' + json.dumps(list(range(128))) + "}", "line 3: prompt has 128 tokens"),
    ],
)
def test_malformed_prompt_line_is_named(tmp_path: Path, third_line: str, message: str) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n\n' + third_line + "\n")
    with pytest.raises(InvalidInput, match=message) as err:
        _run(prompts, tmp_path / "o.jsonl")
    assert f"{prompts}:3" in str(err.value)
    assert not (tmp_path / "o.jsonl").exists(), "nothing is generated before the whole file validates"


def test_other_bad_input(reference: tuple[Path, Path], tmp_path: Path) -> None:
    prompts, _ = reference
    with pytest.raises(InvalidInput, match="int4"):
        _run(prompts, tmp_path / "o.jsonl", dtype="int4")
    with pytest.raises(InvalidInput, match="fp8 weights need a CUDA"):
        _run(prompts, tmp_path / "o.jsonl", dtype="fp8")
    with pytest.raises(InvalidInput, match="a random init builds the bf16 experts"):
        _run(prompts, tmp_path / "o.jsonl", dtype="mxfp4")
    with pytest.raises(InvalidInput, match="mxfp4 weights stay 4-bit only on a CUDA GPU"):
        _run(prompts, tmp_path / "o.jsonl", dtype="mxfp4", weights_dir=tmp_path)
    with pytest.raises(InvalidInput, match="unknown weights dtype"):
        _run(prompts, tmp_path / "o.jsonl", dtype="fp64")
    with pytest.raises(InvalidInput, match="batch must be at least 1"):
        _run(prompts, tmp_path / "o.jsonl", batch=0)
    with pytest.raises(InvalidInput, match="exceed the model's context"):
        _run(prompts, tmp_path / "o.jsonl", max_new_tokens=120)
    with pytest.raises(InvalidInput, match="must differ"):
        _run(prompts, prompts)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(InvalidInput, match="no requests"):
        _run(empty, tmp_path / "o.jsonl")
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(json.dumps({"id": "zz", "output_ids": [1]}) + "\n")
    with pytest.raises(InvalidInput, match="not in the prompts file"):
        _run(prompts, foreign)
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("garbage\n" + json.dumps({"id": "r0", "output_ids": [1]}) + "\n")
    with pytest.raises(InvalidInput, match="line 1 of the outputs file"):
        _run(prompts, damaged)


def test_infer_jobspec_with_synthetic_prompts_resumes_on_the_same_requests(tmp_path: Path) -> None:
    from planner.spec import spec_from_dict
    from workers.infer.generate import run_infer_spec

    (tmp_path / "config.json").write_text(json.dumps(TINY_HF))
    spec = spec_from_dict(
        {
            "task": "infer",
            "model": {"config": str(tmp_path / "config.json")},
            "infer": {"batch": 2, "prompt_tokens": 5, "output_tokens": 3, "requests": 5, "weights": "auto"},
        }
    )
    outputs = tmp_path / "out.jsonl"
    first = run_infer_spec(spec, outputs, workdir=tmp_path / "work", seed=1, device="cpu")
    assert (first.requests_total, first.requests_done, first.weights) == (5, 5, "fp32")
    records = _records(outputs)
    assert [r["prompt_tokens"] for r in records] == [5] * 5
    assert all(r["new_tokens"] <= 3 for r in records)
    prompts_before = (tmp_path / "work" / "synthetic-prompts.jsonl").read_bytes()
    again = run_infer_spec(spec, outputs, workdir=tmp_path / "work", seed=1, device="cpu")
    assert (again.requests_done, again.requests_skipped) == (0, 5)
    assert (tmp_path / "work" / "synthetic-prompts.jsonl").read_bytes() == prompts_before
    train = spec_from_dict(
        {"task": "train", "model": {"config": str(tmp_path / "config.json")}, "train": {"tokens": 1000}}
    )
    with pytest.raises(InvalidInput, match="not infer"):
        run_infer_spec(train, outputs, workdir=tmp_path)


@settings(max_examples=80, deadline=None)
@given(cut=st.integers(min_value=0, max_value=10_000), n=st.integers(min_value=1, max_value=8))
def test_resume_after_a_crash_at_any_byte(cut: int, n: int) -> None:
    """Cut a finished outputs file at any byte: resume keeps exactly the whole lines, drops the rest."""
    import tempfile

    from workers.infer.files import OutputWriter, load_finished

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.jsonl"
        writer = OutputWriter(path)
        for i in range(0, n, 3):  # batches of up to 3 records
            writer.write([{"id": f"r{j}", "output_ids": list(range(j + 1))} for j in range(i, min(i + 3, n))])
        writer.close()
        data = path.read_bytes()
        cut = min(cut, len(data))
        path.write_bytes(data[:cut])
        whole = data[:cut].count(b"\n")
        finished = load_finished(path, {f"r{j}" for j in range(n)})
        assert finished == {f"r{j}" for j in range(whole)}
        assert path.read_bytes() == b"".join(data.splitlines(keepends=True)[:whole])
