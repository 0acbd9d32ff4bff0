"""Fine-tuning on a JSONL file of text or chat with a local tokenizer: packing, exact resume, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from errors import InvalidInput
from tests.workers.test_resume import KillAt, Killed
from tests.workers.tiny import (
    TINY_TEXTS,
    assert_same_weights,
    cpu_strategy,
    final_state,
    tiny_spec,
    write_config,
    write_tokenizer,
)
from workers.model.build import resolve_model_source
from workers.train.batches import TokenSource, check_data
from workers.train.loop import TrainJob, run_training
from workers.train.text_data import plain_chat, tokenize_jsonl

CHAT = [{"role": "user", "content": "the cat sat"}, {"role": "assistant", "content": "on the mat"}]
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }} {% endfor %}"


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _texts(tmp_path: Path) -> Path:
    return _jsonl(tmp_path / "data.jsonl", [{"text": t} for t in TINY_TEXTS] + [{"messages": CHAT}])


def test_documents_are_tokenized_in_order_and_packed_with_eos_between(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok_dir = write_tokenizer(tmp_path / "tok")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    source = TokenSource(seq_len=8, vocab_size=128, seed=0, path=str(_texts(tmp_path)), tokenizer=str(tok_dir))
    expected: list[int] = []
    for doc in [*TINY_TEXTS, plain_chat(CHAT)]:  # this tokenizer has no chat template: the plain format
        expected += [*tok.encode(doc), tok.eos_token_id]
    windows = len(expected) // 8
    got = np.concatenate([source.sequence(i) for i in range(windows)])
    assert got.tolist() == expected[: windows * 8]
    assert source.sequence(windows).tolist() == source.sequence(0).tolist()  # epochs wrap around
    small_chunks = tokenize_jsonl(_texts(tmp_path), tok_dir, 128, chunk=2)  # chunking never shows in the stream
    assert small_chunks.tolist() == expected


def test_chat_uses_the_tokenizers_template_when_it_has_one(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok_dir = write_tokenizer(tmp_path / "tok", chat_template=TEMPLATE)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    data = _jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}] * 4)
    source = TokenSource(seq_len=8, vocab_size=128, seed=0, path=str(data), tokenizer=str(tok_dir))
    one = [*tok.encode("[user] the cat sat [assistant] on the mat "), tok.eos_token_id]
    assert source.sequence(0).tolist() == (one * 4)[:8]


def _run(spec: Any, uri: Path, hooks: Any = None) -> None:
    job = TrainJob(job_id="text", spec=spec, strategy=cpu_strategy(micro_batch=2, grad_accum=2),
                   checkpoint_uri=str(uri), device="cpu", cpu_threads=1, log_every_s=60.0)
    result = run_training(job, hooks)
    assert result.status == "succeeded"


def test_a_resumed_run_reads_the_same_batches_and_ends_with_the_same_weights(tmp_path: Path) -> None:
    tok_dir = write_tokenizer(tmp_path / "tok")
    spec = tiny_spec(write_config(tmp_path / "m"), steps=9, interval=3, grad_accum=2, data=str(_texts(tmp_path)),
                     tokenizer=str(tok_dir))
    _run(spec, tmp_path / "straight")
    with pytest.raises(Killed):
        _run(spec, tmp_path / "killed", KillAt(5, "backward"))
    assert final_state(str(tmp_path / "killed"))[0] == 3
    _run(spec, tmp_path / "killed")
    straight, resumed = final_state(str(tmp_path / "straight")), final_state(str(tmp_path / "killed"))
    assert straight[0] == resumed[0] == 9
    assert_same_weights(straight[1], resumed[1])


def test_the_tokenizer_beside_the_model_weights_is_used_when_none_is_given(tmp_path: Path) -> None:
    import torch

    from workers.model.build import ModelSource, build_model
    from workers.train.batches import tokenizer_dir

    folder = tmp_path / "weights"
    config = resolve_model_source(tiny_spec(write_config(tmp_path / "cfg"))).config
    build_model(ModelSource(config, None), seed=0, weights_dtype=torch.float32).save_pretrained(  # type: ignore[operator]
        str(folder))
    write_tokenizer(folder)
    spec = tiny_spec(folder, data=str(_texts(tmp_path)))
    assert spec.train is not None
    assert tokenizer_dir(spec.train, resolve_model_source(spec)) == str(folder)
    check_data(spec.train, resolve_model_source(spec))


@pytest.mark.parametrize(("rows", "message"), [
    ([], "has no records"),
    ([{"text": "the cat"}, "not json {", {"text": "ok"}], "line 2 .* not valid JSON"),
    ([{"text": "the cat"}, {"prompt": "x"}], "line 2 .* neither a non-empty 'text'"),
    ([{"messages": [{"role": "user"}]}], "line 1 .* message 0 needs string 'role' and 'content'"),
])
def test_empty_or_malformed_jsonl_is_refused_with_the_line(tmp_path: Path, rows: list[Any], message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    spec = tiny_spec(write_config(tmp_path / "m"), data=str(path), tokenizer=str(write_tokenizer(tmp_path / "t")))
    assert spec.train is not None
    with pytest.raises(InvalidInput, match=message):
        check_data(spec.train, resolve_model_source(spec))


def test_a_tokenizer_bigger_than_the_models_vocabulary_is_refused(tmp_path: Path) -> None:
    spec = tiny_spec(write_config(tmp_path / "m", vocab_size=64), data=str(_texts(tmp_path)),
                     tokenizer=str(write_tokenizer(tmp_path / "tok", vocab_size=100)))
    assert spec.train is not None
    with pytest.raises(InvalidInput, match="has 100 tokens but the model's vocabulary has 64"):
        check_data(spec.train, resolve_model_source(spec))


def test_missing_files_and_a_missing_tokenizer_are_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "m")
    cases = [
        (tiny_spec(config, data=str(tmp_path / "nope.jsonl"), tokenizer=str(tmp_path)), "does not exist"),
        (tiny_spec(config, data=str(_texts(tmp_path)), tokenizer=str(tmp_path / "no-tok")), "does not exist"),
        (tiny_spec(config, data=str(_texts(tmp_path))), "needs the model's tokenizer"),
    ]
    for spec, message in cases:
        assert spec.train is not None
        with pytest.raises(InvalidInput, match=message):
            check_data(spec.train, resolve_model_source(spec))
