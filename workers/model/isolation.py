"""What jobs that run side by side in one process share, and how each keeps its own.

The in-process executor (``gpuplan server --executor inprocess``, ``gpuplan run --no-ray``) runs every attempt
in a thread of one process, so its attempts share two things no job may disturb in another:

- The imports. transformers resolves its names lazily (``_LazyModule.__getattr__``), which is not
  thread-safe: two attempts starting together failed with ``ImportError: cannot import name
  'AutoModelForCausalLM' from 'transformers'``. :func:`load_libraries` imports and resolves, once per
  process and under one lock, every name the workers take from transformers (and, when a job needs them,
  peft and torchao); every attempt and every build calls it first, and code that loads more of transformers
  lazily (a tokenizer's module, a model family's) does so holding :func:`library_lock`.
- torch's global random generator. transformers' weight init and peft's LoRA init draw from it and take no
  generator of their own. :func:`seeded_build` holds the same lock, saves the generator's state, seeds it with
  the job's seed for the build's draws and restores it after, so a seeded job builds the same weights
  whatever runs beside it, and its build leaves no trace on the others. Everything else that sets the global
  state (a resume restoring a checkpoint's, :func:`seed_global` after a training build) holds the lock too.
  What a job draws while it runs (dropout, where a config has any) still comes from the one global generator:
  two such jobs side by side interleave their draws; the Ray executor runs each in its own process.

Torch is imported inside the functions: reading a spec (workers.infer.files) imports this module without it.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# Re-entrant: a build holding it loads libraries and tokenizers, which take it again.
_LOCK = threading.RLock()
_LOADED: set[str] = set()

# (module, names resolved from it); a module missing from an older release is skipped (its caller copes)
_LIBRARIES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "transformers": (
        ("transformers", ("AutoConfig", "AutoModelForCausalLM", "AutoTokenizer", "StaticCache",
                          "AttentionInterface", "PreTrainedModel", "GenerationConfig")),
        ("transformers.masking_utils", ("AttentionMaskInterface", "sdpa_mask")),
        ("transformers.integrations.sdpa_attention", ("sdpa_attention_forward",)),
        ("transformers.integrations.moe", ("ExpertsInterface", "grouped_mm_experts_forward")),
    ),
    "peft": (("peft", ("LoraConfig", "get_peft_model")),),
    "torchao": (
        ("torchao.quantization", ("quantize_", "Int8WeightOnlyConfig", "Float8DynamicActivationFloat8WeightConfig")),
        ("torchao.prototype._nf4tensor_api", ("NF4WeightOnlyConfig",)),
        ("torchao.float8", ("convert_to_float8_training",)),
    ),
}


def load_libraries(*names: str) -> None:
    """Import ``names`` (``transformers``, ``peft``, ``torchao``) and resolve what the workers use of them,
    once per process, under the lock. An uninstalled top-level package raises ImportError (callers that
    can run without it catch it); a submodule that an older release lacks is skipped."""
    for name in names:
        if name in _LOADED:
            continue
        with _LOCK:
            if name in _LOADED:
                continue
            for position, (module_name, attributes) in enumerate(_LIBRARIES[name]):
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    if position == 0:
                        raise
                    continue
                for attribute in attributes:
                    getattr(module, attribute, None)
            _LOADED.add(name)


@contextmanager
def library_lock() -> Iterator[None]:
    """Held while code loads more of a lazily importing library (a tokenizer's or a model family's module)."""
    load_libraries("transformers")
    with _LOCK:
        yield


@contextmanager
def rng_lock() -> Iterator[None]:
    """Held while the process's global random state is read or set outside a build (a checkpoint's save or
    resume), so it never lands in the middle of another job's seeded build."""
    with _LOCK:
        yield


@contextmanager
def seeded_build(seed: int, device: Any = None, *,
                 libraries: tuple[str, ...] = ("transformers",)) -> Iterator[None]:
    """The scope of one job's model build on ``device`` (a ``torch.device``; None: the CPU): its ``libraries``
    loaded, the lock held, and torch's global generators (the CPU's, and that GPU's) seeded with ``seed``
    inside and restored on exit."""
    import torch

    load_libraries(*libraries)
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device is not None and device.type == "cuda" else []
    with _LOCK, torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def seed_global(seed: int) -> None:
    """Seed torch's global generators (the CPU's and every GPU's) with ``seed``, never inside another job's build."""
    import torch

    with _LOCK:
        torch.manual_seed(seed)
