"""Token batches for training: from a file of token ids, a JSONL text/chat file (tokenized and
packed by workers.train.text_data), or a seeded synthetic stream.

Every batch is a pure function of (source, seed, sample index), so the data position of a run is
one integer — the number of sequences consumed — and a resumed run reads exactly the batches the
uninterrupted run would have read, on any rank layout with the same world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from errors import InvalidInput
from workers.train.text_data import has_tokenizer, is_jsonl, load_tokenizer, read_documents, tokenize_jsonl

if TYPE_CHECKING:
    from planner.spec import TrainSpec
    from workers.model.build import ModelSource


@dataclass(frozen=True)
class DataLayout:
    """Which sequences a rank reads for one micro-batch of one optimizer step."""

    micro_batch: int
    grad_accum: int
    world_size: int

    @property
    def sequences_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def first_index(self, step: int, accum: int, rank: int) -> int:
        # Interleave ranks within an accumulation slot so the global batch is contiguous.
        return step * self.sequences_per_step + (accum * self.world_size + rank) * self.micro_batch


class TokenSource:
    """Sequences of ``seq_len`` token ids (the model shifts labels itself: ``model(ids, labels=ids)``)."""

    def __init__(self, *, seq_len: int, vocab_size: int, seed: int, path: str | None = None,
                 tokenizer: str | None = None) -> None:
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.seed = seed
        self.path = path
        self._tokens: np.ndarray | None = None
        if path is not None and is_jsonl(path):
            self._tokens = _tokenize(Path(path).expanduser(), tokenizer, vocab_size, seq_len)
        elif path is not None:
            self._tokens = _open_tokens(Path(path).expanduser(), vocab_size, seq_len)

    @property
    def description(self) -> str:
        if self._tokens is None:
            return f"synthetic tokens (seed {self.seed}, vocab {self.vocab_size})"
        return f"{self.path} ({len(self._tokens):,} tokens)"

    def sequence(self, index: int) -> np.ndarray:
        if self._tokens is None:
            return self._synthetic(index)
        window = self.seq_len
        count = len(self._tokens) // window
        start = (index % count) * window  # epochs wrap around
        return np.asarray(self._tokens[start : start + window], dtype=np.int64)

    def _synthetic(self, index: int) -> np.ndarray:
        """A seeded arithmetic progression mod vocab with 10% random tokens. Uniform random tokens
        cannot go below ln(vocab) loss; this stream is learnable, so a run visibly learns (and a
        broken optimizer, precision or resume shows up as a loss that stops falling)."""
        rng = np.random.default_rng([self.seed, index])
        start = int(rng.integers(0, self.vocab_size))
        stride = int(rng.integers(1, 8))
        seq = (start + stride * np.arange(self.seq_len, dtype=np.int64)) % self.vocab_size
        noise = rng.random(self.seq_len) < 0.1
        seq[noise] = rng.integers(0, self.vocab_size, size=int(noise.sum()), dtype=np.int64)
        return seq

    def batch(self, first_index: int, rows: int) -> torch.Tensor:
        """``rows`` consecutive sequences from ``first_index``: a (rows, seq_len) int64 tensor."""
        return torch.from_numpy(np.stack([self.sequence(first_index + i) for i in range(rows)]))


def tokenizer_dir(train: TrainSpec, source: ModelSource) -> str | None:
    """The spec's tokenizer, else the one saved beside the model's weights, if any."""
    if train.tokenizer is not None:
        return train.tokenizer
    if source.weights_dir is not None and has_tokenizer(source.weights_dir):
        return str(source.weights_dir)
    return None


def check_data(train: TrainSpec, source: ModelSource) -> None:
    """Refuse a missing or malformed data file, or a mismatched tokenizer, before a run starts."""
    assert train.data is not None
    path = Path(train.data).expanduser()
    if not is_jsonl(path):
        _open_tokens(path, source.config.vocab_size, train.seq_len)
        return
    read_documents(path)
    folder = tokenizer_dir(train, source)
    if folder is None:
        raise InvalidInput(f"{path} is text: it needs the model's tokenizer", path="train.tokenizer",
                           hint="set train.tokenizer to a folder written by tokenizer.save_pretrained()")
    load_tokenizer(Path(folder).expanduser(), source.config.vocab_size)


def _tokenize(path: Path, tokenizer: str | None, vocab_size: int, seq_len: int) -> np.ndarray:
    if tokenizer is None:
        raise InvalidInput(f"{path} is text: it needs the model's tokenizer", path="train.tokenizer",
                           hint="set train.tokenizer to a folder written by tokenizer.save_pretrained()")
    tokens = tokenize_jsonl(path, Path(tokenizer).expanduser(), vocab_size)
    if len(tokens) < seq_len:
        raise InvalidInput(f"{path} has {len(tokens)} tokens, fewer than one sequence of {seq_len}",
                           path="train.data", hint="add data or use a smaller train.seq_len")
    return tokens


def _open_tokens(path: Path, vocab_size: int, seq_len: int) -> np.ndarray:
    if not path.is_file():
        raise InvalidInput(f"data file {str(path)!r} does not exist", path="train.data",
                           hint="give a .npy or .bin file of token ids, or omit train.data for synthetic tokens")
    if path.suffix == ".npy":
        try:
            tokens = np.load(path, mmap_mode="r")
        except ValueError as exc:
            raise InvalidInput(f"{path} is not a valid .npy file: {exc}", path="train.data") from None
        if tokens.ndim != 1:
            tokens = tokens.reshape(-1)
        if not np.issubdtype(tokens.dtype, np.integer):
            raise InvalidInput(f"{path} holds {tokens.dtype} values; token ids must be integers", path="train.data")
    elif path.suffix == ".bin":
        # nanoGPT convention: raw little-endian uint16 when the vocabulary fits, else uint32.
        dtype = np.uint16 if vocab_size <= 65536 else np.uint32
        tokens = np.memmap(path, dtype=dtype, mode="r")
    else:
        raise InvalidInput(f"{path} is neither .npy nor .bin", path="train.data",
                           hint="save token ids with numpy.save (.npy) or as raw uint16/uint32 (.bin)")
    if len(tokens) < seq_len:
        raise InvalidInput(f"{path} has {len(tokens)} tokens, fewer than one sequence of {seq_len}",
                           path="train.data", hint="use a bigger file or a smaller train.seq_len")
    # Check a prefix: scanning a multi-GB memmap at start-up would cost more than it saves.
    head = np.asarray(tokens[: min(len(tokens), 1 << 20)])
    top = int(head.max())
    if top >= vocab_size or int(head.min()) < 0:
        raise InvalidInput(f"{path} holds token id {top}, outside the model's vocabulary of {vocab_size}",
                           path="train.data", hint="tokenize with the model's tokenizer")
    result: np.ndarray = tokens
    return result
