"""Fine-tuning data as people have it: a JSONL file of text or chat messages, plus a local tokenizer.

Each line is one document, either ``{"text": "..."}`` or ``{"messages": [{"role": "user",
"content": "..."}, ...]}``. Chat documents go through the tokenizer's chat template when it has
one; otherwise each message becomes ``<|role|>\\ncontent\\n`` and the document ends with the EOS
token (see README). Documents are tokenized in file order and concatenated, with the tokenizer's
EOS token after each, into one token stream that ``workers.train.batches.TokenSource`` cuts into
``seq_len`` windows. The stream is a pure function of the file and the tokenizer, so the data
position of a run stays one integer and a resumed run reads exactly the batches it would have.
The loss covers every token (prompts included).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from errors import InvalidInput

JSONL_SUFFIXES = (".jsonl", ".ndjson")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_FORMAT_HINT = 'write one JSON object per line: {"text": "..."} or {"messages": [{"role": "user", "content": "..."}]}'


def is_jsonl(path: str | Path) -> bool:
    return Path(path).suffix.lower() in JSONL_SUFFIXES


def has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(directory: Path, vocab_size: int) -> Any:
    """A transformers tokenizer from local files only; refused if its ids do not fit the model."""
    if not directory.is_dir():
        raise InvalidInput(f"tokenizer directory {str(directory)!r} does not exist", path="train.tokenizer",
                           hint="give a folder written by tokenizer.save_pretrained()")
    from workers.model.isolation import library_lock

    try:
        with library_lock():  # transformers imports the tokenizer's module on first use
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidInput(f"cannot load a tokenizer from {directory}: {exc}", path="train.tokenizer",
                           hint="give a folder written by tokenizer.save_pretrained()") from None
    size = len(tokenizer)
    if size > vocab_size:
        raise InvalidInput(f"the tokenizer in {directory} has {size:,} tokens but the model's vocabulary has "
                           f"{vocab_size:,}: it is not this model's tokenizer", path="train.tokenizer",
                           hint="use the tokenizer that came with the model's weights")
    return tokenizer


def read_documents(path: Path) -> list[str | list[dict[str, str]]]:
    """Every document of the file (text, or a list of chat messages), validated with line numbers."""
    if not path.is_file():
        raise InvalidInput(f"data file {str(path)!r} does not exist", path="train.data", hint=_FORMAT_HINT)
    documents: list[str | list[dict[str, str]]] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                documents.append(_document(raw, lineno, path))
    if not documents:
        raise InvalidInput(f"data file {path} has no records", path="train.data", hint=_FORMAT_HINT)
    return documents


def _document(raw: bytes, lineno: int, path: Path) -> str | list[dict[str, str]]:
    where = f"{path}:{lineno}"
    try:
        item = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"line {lineno} of {path} is not valid JSON ({getattr(exc, 'msg', exc)})",
                           path=where, hint=_FORMAT_HINT) from None
    if isinstance(item, dict) and isinstance(item.get("text"), str) and item["text"]:
        return str(item["text"])
    if isinstance(item, dict) and isinstance(item.get("messages"), list) and item["messages"]:
        messages = item["messages"]
        for i, message in enumerate(messages):
            ok = isinstance(message, dict) and isinstance(message.get("role"), str) \
                and isinstance(message.get("content"), str)
            if not ok:
                raise InvalidInput(f"line {lineno} of {path}: message {i} needs string 'role' and 'content'",
                                   path=where, hint=_FORMAT_HINT)
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    raise InvalidInput(f"line {lineno} of {path} has neither a non-empty 'text' string nor a 'messages' list",
                       path=where, hint=_FORMAT_HINT)


def plain_chat(messages: list[dict[str, str]]) -> str:
    """The chat format for tokenizers without a chat template."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)


def _render(tokenizer: Any, document: str | list[dict[str, str]]) -> tuple[str, bool]:
    """(text to tokenize, whether the tokenizer adds its special tokens): a chat template brings its own."""
    if isinstance(document, str):
        return document, True
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(document, tokenize=False)), False
    return plain_chat(document), True


def _encode_chunk(tokenizer: Any, documents: list[str | list[dict[str, str]]], eos: int | None) -> np.ndarray:
    """One chunk of documents, batch-encoded (the fast tokenizer works in parallel), in file order."""
    rendered = [_render(tokenizer, d) for d in documents]
    ids: list[list[int]] = [[] for _ in rendered]
    for special in (True, False):
        picked = [i for i, (_, flag) in enumerate(rendered) if flag is special]
        if picked:
            encoded = tokenizer([rendered[i][0] for i in picked], add_special_tokens=special)["input_ids"]
            for i, row in zip(picked, encoded, strict=True):
                ids[i] = list(row)
    if eos is not None:
        ids = [row if row and row[-1] == eos else [*row, eos] for row in ids]
    return np.fromiter((t for row in ids for t in row), dtype=np.int64)


def tokenize_jsonl(path: Path, tokenizer_dir: Path, vocab_size: int, *, chunk: int = 1024) -> np.ndarray:
    """The file's documents as one packed stream of token ids (EOS between documents)."""
    documents = read_documents(path)
    tokenizer = load_tokenizer(tokenizer_dir, vocab_size)
    eos = int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else None
    parts = [_encode_chunk(tokenizer, documents[i : i + chunk], eos) for i in range(0, len(documents), chunk)]
    tokens = np.concatenate(parts)
    if len(tokens) and (int(tokens.max()) >= vocab_size or int(tokens.min()) < 0):
        raise InvalidInput(f"the tokenizer in {tokenizer_dir} produced token id {int(tokens.max())}, outside the "
                           f"model's vocabulary of {vocab_size}", path="train.tokenizer",
                           hint="use the tokenizer that came with the model's weights")
    return tokens
