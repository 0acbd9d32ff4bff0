"""Files of batch inference: the JSONL prompts it reads, the JSONL outputs it appends, and resume.

Prompts: one JSON object per line, ``{"id": ..., "prompt": "text"}`` or ``{"id": ..., "input_ids": [..]}``
(``id`` optional: the request's index is used). Outputs: one JSON object per finished request,
appended a batch at a time and fsynced, so after a crash the file holds whole batches plus at most
one torn last line, which resume truncates. Finished ids are never generated again.

Tokenizing: with a tokenizer directory, ``transformers.AutoTokenizer`` (local files only). Without
one (this box is offline), text prompts use :class:`ByteTokenizer`: token id = UTF-8 byte value
(0..255), so the model needs ``vocab_size >= 256``; it exists so jobs run end to end without a
tokenizer, not to produce meaningful text.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from errors import InvalidInput

logger = logging.getLogger(__name__)


class Tokenizer(Protocol):
    pad_token_id: int
    eos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Deterministic byte-level tokenizer: each UTF-8 byte is one token (ids 0..255), pad = 0."""

    pad_token_id = 0
    eos_token_id: int | None = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HfTokenizer:
    """A transformers tokenizer from a local directory (never the network)."""

    def __init__(self, directory: Path) -> None:
        from workers.model.isolation import library_lock

        try:
            with library_lock():  # transformers imports the tokenizer's module on first use
                from transformers import AutoTokenizer

                self._tok: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise InvalidInput(
                f"cannot load a tokenizer from {directory}: {exc}",
                hint="give a directory written by tokenizer.save_pretrained(), or omit it to use input_ids",
            ) from None
        eos = self._tok.eos_token_id
        pad = self._tok.pad_token_id
        self.eos_token_id = int(eos) if eos is not None else None
        self.pad_token_id = int(pad if pad is not None else (eos if eos is not None else 0))

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self._tok.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))


@dataclass(frozen=True)
class Request:
    index: int  # position in the prompts file (0-based, blank lines not counted)
    id: object  # the line's "id", or the index
    key: str  # str(id): what resume matches on
    input_ids: tuple[int, ...]
    line: int  # 1-based line number, for messages


def read_requests(path: Path, tokenizer: Tokenizer, *, vocab_size: int, max_positions: int) -> list[Request]:
    """Parse and validate every prompt up front, so a bad line fails the job before any work."""
    if not path.is_file():
        raise InvalidInput(
            f"prompts file {path} does not exist",
            hint='write one JSON object per line: {"id": "a", "prompt": "text"} or {"id": "a", "input_ids": [1, 2]}',
        )
    requests: list[Request] = []
    seen: dict[str, int] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                item = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise InvalidInput(
                    f"line {lineno} is not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})",
                    path=where,
                    hint="each line must be one JSON object",
                ) from None
            if not isinstance(item, dict):
                raise InvalidInput(f"line {lineno} must be a JSON object, got {type(item).__name__}", path=where)
            index = len(requests)
            ident = item.get("id", index)
            if not isinstance(ident, str | int) or isinstance(ident, bool):
                raise InvalidInput(f"line {lineno}: id must be a string or integer, got {ident!r}", path=where)
            key = str(ident)
            if key in seen:
                raise InvalidInput(
                    f"line {lineno}: id {ident!r} repeats line {seen[key]}",
                    path=where,
                    hint="give every request a unique id",
                )
            seen[key] = lineno
            ids = _input_ids(item, tokenizer, lineno, where)
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                hint = (
                    "the byte-level tokenizer needs a model with vocab_size >= 256; give input_ids or a tokenizer"
                    if isinstance(tokenizer, ByteTokenizer) and "prompt" in item
                    else None
                )
                raise InvalidInput(
                    f"line {lineno}: token id {bad[0]} is outside the model's vocabulary (0..{vocab_size - 1})",
                    path=where,
                    hint=hint,
                )
            if len(ids) >= max_positions:
                raise InvalidInput(
                    f"line {lineno}: prompt has {len(ids)} tokens, the model's context is {max_positions}",
                    path=where,
                    hint="shorten the prompt",
                )
            requests.append(Request(index=index, id=ident, key=key, input_ids=tuple(ids), line=lineno))
    if not requests:
        raise InvalidInput(f"prompts file {path} has no requests", hint="add one JSON object per line")
    return requests


def infer_tokenizer_dir(given: str | None, weights_dir: Path | None) -> Path | None:
    """The spec's tokenizer, else the one saved beside the model's weights, else none (byte-level)."""
    from workers.train.text_data import has_tokenizer

    if given is not None:
        return Path(given).expanduser()
    return weights_dir if weights_dir is not None and has_tokenizer(weights_dir) else None


def prompt_lengths(path: Path, tokenizer: Tokenizer) -> list[int]:
    """Tokens of every prompt in a prompts file, validated as :func:`read_requests` does (the model's own
    vocabulary and context are checked when the job runs)."""
    unbounded = 1 << 62
    return [len(r.input_ids) for r in read_requests(path, tokenizer, vocab_size=unbounded, max_positions=unbounded)]


def _input_ids(item: dict[str, Any], tokenizer: Tokenizer, lineno: int, where: str) -> list[int]:
    if "input_ids" in item:
        ids = item["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise InvalidInput(f"line {lineno}: input_ids must be a non-empty list of integers", path=where)
        return ids
    prompt = item.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidInput(f"line {lineno}: needs a non-empty 'prompt' string or an 'input_ids' list", path=where)
    ids = tokenizer.encode(prompt)
    if not ids:
        raise InvalidInput(f"line {lineno}: prompt tokenizes to nothing", path=where)
    return ids


def load_finished(outputs: Path, known: set[str]) -> set[str]:
    """Keys already in ``outputs``. A torn last line (a crash mid-write) is cut off and logged."""
    if not outputs.exists():
        return set()
    data = outputs.read_bytes()
    keep = len(data)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    finished: set[str] = set()
    offset = 0
    for number, line in enumerate(lines, start=1):
        end = offset + len(line) + 1
        last = number == len(lines)
        try:
            if end > len(data):  # no newline: the write was cut short
                raise ValueError("no trailing newline")
            record = json.loads(line)
            key = str(record["id"])
        except (ValueError, KeyError, TypeError) as exc:
            if not last:
                raise InvalidInput(
                    f"line {number} of the outputs file is not a finished record ({exc})",
                    path=str(outputs),
                    hint="this file was not written by gpuplan or was damaged; move it away and rerun",
                ) from None
            logger.warning("outputs %s: dropping torn last line %d (%d bytes)", outputs, number, len(line))
            keep = offset
            break
        if key not in known:
            raise InvalidInput(
                f"line {number} of the outputs file has id {record['id']!r}, which is not in the prompts file",
                path=str(outputs),
                hint="these outputs belong to another prompts file; write to a new outputs path",
            )
        finished.add(key)
        offset = end
    if keep < len(data):
        with outputs.open("r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
    return finished


class OutputWriter:
    """Appends one batch of records with a single write, then flush + fsync (the unit of resume)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = path.open("ab")

    def write(self, records: Sequence[dict[str, object]]) -> None:
        blob = b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in records)
        self._fh.write(blob)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def write_synthetic_prompts(path: Path, *, requests: int, prompt_tokens: int, vocab_size: int, seed: int) -> Path:
    """A seeded prompts file of random token ids (for specs without a prompts file)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(requests):
            ids = [rng.randrange(vocab_size) for _ in range(prompt_tokens)]
            fh.write(json.dumps({"id": i, "input_ids": ids}) + "\n")
    return path
