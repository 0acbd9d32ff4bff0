"""Greedy decoding that keeps the GPU busy: a static KV cache, a decode step compiled into a CUDA
graph, and a host that queues steps without waiting for each token.

Why not ``generate()``: it issues every kernel eagerly and syncs the host on every token (its stopping
criteria), so at the batch sizes people serve with, decode is bound by how fast the host's Python runs,
not by the GPU. On one H200, llama-3.2-1b at batch 32 (prompt 512, 128 new tokens) ran at 1,576 tok/s
on one day's host and 2,842 on another's (bench/results/decode_modes_2026-12-01.json,
docs/lab-notes/2026-12-01-compiled-decoder.md): no plan can predict the host. Here the host work per token is a graph
replay, so the step time is the GPU's: the weights and the KV cache read at memory bandwidth.

Sliding-window layers (Gemma 3, Mistral): transformers' static cache gives them a window-sized ring buffer
whose update and mask sizes branch on a Python int that grows every token, so torch.compile guarded on it and
built a new graph per token until its recompile limit (680 tok/s against 5,969 planned for gemma-3-1b on an
H200, bench/results/workers/graph_decode_gemma_2026-12-02.txt). Here their cache is built as if every layer
were full attention: a full-length buffer written by position, whose offset is a tensor as for dense models,
and the window lives only in the mask, which the model's own mask code builds per layer type (the sliding
one from the model's config) against that buffer. The step then compiles once (CPU: one graph, no recompile,
tests/workers/infer/test_decode.py) and its tokens equal generate()'s past the window. The price is a full-length
KV cache for the sliding layers, read whole every step; the planner prices that (planner/decoder.py).

Grouped-query attention: the decoder switches an SDPA model with several query heads per KV head to
workers/infer/gqa_attention.py's packed form, which reads the cache once instead of copying it out to every query head
each step (1.33-1.52x a step on an H200); ``pack_gqa=False`` keeps transformers' own (the probes' baseline).
Latent attention (DeepSeek's MLA): the step attends over the cached latents with the key and value projections
folded into the query and the output (workers/infer/mla_attention.py) instead of expanding the whole cache every step;
``absorb_mla=False`` keeps transformers' expansion.

Greedy decoding of independent rows: every row is decoded to ``max_new_tokens``; the caller cuts each
row at its first EOS, and the loop stops early (one host sync every ``check_every`` tokens) once
every row has produced one. The tokens equal ``generate(do_sample=False)``'s for the same inputs.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workers.infer.gqa_attention import use_packed_gqa, use_stock_sdpa
from workers.infer.mla_attention import use_absorbed_mla, use_stock_mla

logger = logging.getLogger(__name__)

StepFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class DecodeTiming:
    """Where one ``decode`` call's time went, so a run can price its prompt and its tokens apart (the plan
    does: planner.throughput.infer_throughput's prefill and decode step). On CUDA these are the GPU's own
    times between events queued with the work (no host sync inside the loop); on a CPU, wall times."""

    prefill_s: float  # the prompt's forward pass (eager), its static cache filled
    steps: int  # compiled decode steps after it (new tokens - 1)
    steps_s: float  # those steps, together


class _Stopwatch:
    """Marks on the device's stream (CUDA events) or the host's clock; read after the work is done."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._cuda = device.type == "cuda"
        self._marks: list[Any] = []

    def mark(self) -> None:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(self._device))  # the decoding device's, not device 0's
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Seconds between consecutive marks; waits for the last mark's work on CUDA."""
        if self._cuda:
            self._marks[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:], strict=False)]
        return [b - a for a, b in zip(self._marks, self._marks[1:], strict=False)]


class GraphDecoder:
    """One per loaded model; ``compile=True`` (CUDA) captures the decode step once per batch shape,
    so callers keep shapes fixed (rows and prompt width padded to the job's). It switches ``model`` to packed
    grouped-query attention (``pack_gqa``) or, for latent attention, to the absorbed form (``absorb_mla``);
    ``release()`` gives it back as it was."""

    def __init__(self, model: torch.nn.Module, *, compile: bool, check_every: int = 32, pack_gqa: bool = True,
                 absorb_mla: bool = True) -> None:
        self._model = model
        self.absorbed_mla = use_absorbed_mla(model) if absorb_mla else False
        self.packed_gqa = use_packed_gqa(model) if pack_gqa and not self.absorbed_mla else False
        self._check_every = check_every
        self._step: StepFn = self._next_token
        self._watch: _Stopwatch | None = None
        self._steps = 0
        if compile:
            self._step = torch.compile(self._next_token, mode="reduce-overhead", fullgraph=False, dynamic=False)

    def release(self) -> None:
        """The model's own attention back (before generate() takes over from a failed compiled step)."""
        if self.packed_gqa:
            use_stock_sdpa(self._model)
            self.packed_gqa = False
        if self.absorbed_mla:
            use_stock_mla(self._model)
            self.absorbed_mla = False

    def timing(self) -> DecodeTiming | None:
        """The last ``decode`` call's prefill and step times (None before the first call). On CUDA this waits
        for that call's work, which the caller's copy of its tokens has waited for anyway."""
        if self._watch is None:
            return None
        prefill, steps = self._watch.seconds()
        return DecodeTiming(prefill_s=prefill, steps=self._steps, steps_s=steps)

    def _next_token(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache_position: torch.Tensor,
                    attention_mask: torch.Tensor, cache: Any) -> torch.Tensor:
        # logits_to_keep=1: the prefill's logits for every prompt position would be rows x width x vocab
        # (4.2 GB for 32 x 512 tokens of a 128k vocabulary), as generate() also avoids
        out = self._model(input_ids=input_ids, position_ids=position_ids, cache_position=cache_position,
                          attention_mask=attention_mask, past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits: torch.Tensor = out.logits
        return logits[:, -1, :].argmax(-1)

    def decode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
               eos: set[int]) -> torch.Tensor:
        """New token ids, (rows, <= max_new_tokens), for left-padded ``input_ids``."""
        from transformers import StaticCache

        rows, width = input_ids.shape
        device = input_ids.device
        config: Any = getattr(self._model, "config")  # noqa: B009 - every HF causal LM has one
        cache = StaticCache(config=config, max_cache_len=width + max_new_tokens)
        if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
            # the buffers are allocated on first use: this replaces nothing but the layers' bookkeeping
            cache = StaticCache(config=full_attention_config(config), max_cache_len=width + max_new_tokens)
        mask = torch.zeros((rows, width + max_new_tokens), dtype=torch.long, device=device)
        mask[:, :width] = attention_mask
        # positions count real tokens only, as generate() does for left padding
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        out = torch.empty((rows, max_new_tokens), dtype=torch.long, device=device)
        eos_ids = torch.tensor(sorted(eos), dtype=torch.long, device=device) if eos else None
        watch = _Stopwatch(device)
        with torch.inference_mode():
            watch.mark()
            token = self._next_token(input_ids, positions, torch.arange(width, device=device), mask, cache)
            watch.mark()
            position = positions[:, -1:] + 1
            cache_position = torch.tensor([width], dtype=torch.long, device=device)
            steps = max_new_tokens
            for t in range(max_new_tokens):
                out[:, t] = token
                if t + 1 == max_new_tokens:
                    break
                if eos_ids is not None and (t + 1) % self._check_every == 0 and self._all_ended(out[:, : t + 1],
                                                                                                 eos_ids):
                    steps = t + 1
                    break
                mask[:, width + t] = 1
                token = self._step(token[:, None], position, cache_position, mask, cache).clone()
                position = position + 1
                cache_position = cache_position + 1
            watch.mark()
        self._watch, self._steps = watch, steps - 1
        return out[:, :steps]

    @staticmethod
    def _all_ended(tokens: torch.Tensor, eos_ids: torch.Tensor) -> bool:
        return bool(torch.isin(tokens, eos_ids).any(dim=-1).all())


def full_attention_config(config: Any) -> Any:
    """A copy of the model's (text) config whose every layer is full attention, to size a static cache from:
    sliding layers then get a full-length buffer written by position (see the module docstring). The model
    keeps its own config, so its masks still apply the window."""
    flat = copy.deepcopy(config.get_text_config(decoder=True))
    if getattr(flat, "layer_types", None) is not None:
        flat.layer_types = ["full_attention"] * len(flat.layer_types)
    flat.sliding_window = None
    return flat
