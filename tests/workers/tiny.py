"""Tiny models and specs for worker tests: each training step takes milliseconds on one CPU core."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from planner.spec import JobSpec, spec_from_dict
from planner.types import Strategy
from workers.checkpoint.local import open_store
from workers.train.state_load import read_checkpoint_state

TINY_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def write_config(folder: Path, **overrides: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps({**TINY_CONFIG, **overrides}))
    return path


def tiny_spec(config: Path, *, steps: int = 12, seq_len: int = 16, micro_batch: int = 2, grad_accum: int = 1,
              world: int = 1, interval: int | None = 4, seed: int = 0, **train: Any) -> JobSpec:
    tokens = steps * seq_len * micro_batch * grad_accum * world
    section = {"tokens": tokens, "seq_len": seq_len, "checkpoint_interval_steps": interval, "seed": seed,
               "learning_rate": 1e-2, **train}
    return spec_from_dict({"name": "tiny", "task": "train", "model": {"config": str(config)}, "train": section})


def cpu_strategy(*, micro_batch: int = 2, grad_accum: int = 1, workers: int = 1, **extra: Any) -> Strategy:
    values: dict[str, Any] = {"gpu": "cpu", "gpu_count": workers, "precision": "fp32", "micro_batch": micro_batch,
                              "grad_accum": grad_accum}
    values.update(extra)
    return Strategy(**values)


def final_state(uri: str) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, model weights) of the newest checkpoint in the store at ``uri``."""
    found = read_checkpoint_state(open_store(uri))
    assert found is not None, f"no checkpoint in {uri}"
    return found


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], *, rtol: float = 0.0,
                        atol: float = 0.0) -> None:
    """The same tensors: bit for bit, or within ``rtol``/``atol`` (``a`` is the actual, ``b`` the expected)."""
    assert a.keys() == b.keys()
    for name in a:
        if rtol or atol:
            torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol)
        else:
            assert torch.equal(a[name], b[name]), f"{name} differs"


TINY_TEXTS = [
    "the cat sat on the mat and the dog sat on the log",
    "a quick brown fox jumps over the lazy dog again and again",
    "gpus are rented by the hour so a plan that fits saves money",
    "checkpoints survive preemption and training resumes where it stopped",
]


def write_tokenizer(folder: Path, *, vocab_size: int = 100, chat_template: str | None = None) -> Path:
    """A tiny BPE tokenizer trained here on a few lines (no hub download), saved as a transformers folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<unk>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()[:0], show_progress=False)
    tok.train_from_iterator(TINY_TEXTS * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>")
    if chat_template is not None:
        fast.chat_template = chat_template
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(folder))
    return folder


@dataclass(frozen=True)
class Gate:
    """A step hook (``workers.train.hooks.StepHook``) that holds a run at a step the test chose, so a test
    never races a fast job.

    While the file at ``path`` names a step the run has reached, the run waits: a training run
    before it computes the next step (its progress then reads that step), an inference run after
    the batch that reached it. The test moves the hold with ``hold`` and lets the run go with
    ``release``; a run that starts to wait writes the step to ``<path>.held`` (``held``). Files, not
    memory: it is pickled to Ray workers, on any node of the local test cluster.
    ``until_notice``: also let go once Ray Train tells this worker of a spot notice, so that the
    next step's poll acts on it (only inside a single-worker Ray Train run).
    """

    path: str
    until_notice: bool = False

    def hold(self, step: int) -> None:
        _write_atomically(Path(self.path), str(step))

    def release(self) -> None:
        Path(self.path).unlink(missing_ok=True)

    def held(self) -> int | None:
        try:
            return int(Path(f"{self.path}.held").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def wait_held(self, step: int, timeout: float = 300) -> None:
        """Block until a run holds at ``step`` (the timeout only guards against a hang)."""
        deadline = time.monotonic() + timeout
        while self.held() != step:
            assert time.monotonic() < deadline, f"no run held at step {step}; last held at {self.held()}"
            time.sleep(0.02)

    def __call__(self, step: int, where: str) -> None:
        if where not in ("forward", "batch"):
            return
        announced = False
        while (target := self._target()) is not None and step >= target and not self._noticed():
            if not announced:
                _write_atomically(Path(f"{self.path}.held"), str(step))
                announced = True
            time.sleep(0.02)

    def _target(self) -> int | None:
        try:
            return int(Path(self.path).read_text())
        except FileNotFoundError:
            return None

    def _noticed(self) -> bool:
        if not self.until_notice:
            return False
        import ray.train

        return ray.train.get_preemption_info() is not None


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def tiny_model(hf: dict[str, Any], dtype: torch.dtype = torch.float32) -> Any:
    """A causal LM from a config dict (seed 0), in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**hf)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def left_padded(widths: list[int], vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of rows ``widths`` long, left-padded with 0 to the longest (seed 1)."""
    width = max(widths)
    gen = torch.Generator().manual_seed(1)
    ids = torch.zeros((len(widths), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, w in enumerate(widths):
        ids[row, width - w:] = torch.randint(1, vocab, (w,), generator=gen)
        mask[row, width - w:] = 1
    return ids, mask
