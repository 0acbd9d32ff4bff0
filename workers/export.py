"""The trained model out of a checkpoint, as a folder Hugging Face tools load.

A full fine-tune becomes a ``save_pretrained`` model folder (``AutoModelForCausalLM.from_pretrained``
loads it). A LoRA or QLoRA run becomes a peft adapter folder whose ``base_model_name_or_path`` is
the weights folder it was trained from, or, for a base that was a random init, a copy of that base
written to ``<out>/base``; ``merge=True`` folds the adapters into the weights and writes a plain
model folder instead. The tokenizer the run used, if any, is saved beside the weights.

Every checkpoint carries the job's spec, strategy and model shape (workers.train), so nothing but
the checkpoint is needed to rebuild the model.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from catalog.errors import Conflict, InvalidInput, NotFound
from catalog.schema import ModelConfig
from planner.numerics import BF16_WEIGHTS
from planner.spec import JobSpec
from planner.types import Strategy

ExportKind = Literal["model", "adapter", "merged"]
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class ExportResult:
    out: str
    kind: ExportKind
    step: int
    job: str
    model: str
    base: str | None  # the adapter's base model folder (kind "adapter")
    tokenizer: bool
    checkpoint: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Restored:
    step: int
    job: str
    spec: JobSpec
    strategy: Strategy
    config: ModelConfig
    state: dict[str, torch.Tensor]
    trainable_only: bool = False  # a LoRA checkpoint: the adapters; the base comes back from its source


def export_checkpoint(uri: str, out: Path, *, merge: bool = False) -> ExportResult:
    """Write the newest checkpoint at ``uri`` to ``out`` (which must not hold anything yet)."""
    _check_out(out)
    restored = _restore(uri)
    lora = restored.strategy.finetune in ("lora", "qlora")
    if merge and not lora:
        raise InvalidInput("--merge folds LoRA adapters into the weights, but this run was a full fine-tune",
                           path="merge", hint="export without --merge: the folder already holds the full weights")
    model = _rebuild(restored)
    out.mkdir(parents=True, exist_ok=True)
    base: str | None = None
    if not lora:
        kind: ExportKind = "model"
        _save_model(model, out)
    elif merge:
        kind = "merged"
        _save_model(model.merge_and_unload(), out)  # type: ignore[operator]
    else:
        kind = "adapter"
        base = _save_adapter(model, restored, out)
    tokenizer = _save_tokenizer(restored, out)
    result = ExportResult(out=str(out), kind=kind, step=restored.step, job=restored.job, model=restored.config.id,
                          base=base, tokenizer=tokenizer, checkpoint=uri)
    (out / "gpuplan_export.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Conflict(f"{out} already exists and is not empty",
                       hint="give --out a new folder (nothing is overwritten)")


def _restore(uri: str) -> _Restored:
    from workers.checkpoint import open_store
    from workers.train_state_load import read_checkpoint_state

    if "://" not in uri and not Path(uri).expanduser().is_dir():
        raise NotFound(f"checkpoint directory {uri!r} does not exist",
                       hint="give the --checkpoint-dir of a `gpuplan run`, or a job id")
    store = open_store(uri)
    info = store.latest()
    found = read_checkpoint_state(store) if info is not None else None
    if info is None or found is None:
        raise NotFound(f"{uri} holds no checkpoint to export",
                       hint="a job has one once it has saved a step; see train.checkpoint_interval_steps")
    step, state = found
    metadata: dict[str, Any] = next((dict(store.metadata(i)) for i in store.list() if i.step == step), {})
    missing = [key for key in ("spec", "strategy", "model_config") if key not in metadata]
    if missing:
        raise InvalidInput(f"the checkpoint of step {step} in {uri} does not record the job's model "
                           f"({', '.join(missing)} missing): it was written by an older gpuplan",
                           hint="resume the job with this gpuplan (`gpuplan run SPEC --resume`) to write a new one")
    return _Restored(step=int(step), job=str(metadata.get("job_id", "")),
                     spec=JobSpec.model_validate(metadata["spec"]),
                     strategy=Strategy.model_validate(metadata["strategy"]),
                     config=ModelConfig.model_validate(metadata["model_config"]),
                     state={_clean(k): v for k, v in state.items()},
                     trainable_only=bool(metadata.get("trainable_only", False)))


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _rebuild(restored: _Restored) -> torch.nn.Module:
    """The trained model: the job's architecture with the checkpoint's state. A LoRA checkpoint holds the
    adapters only, so its frozen base is rebuilt exactly as training built it (weights folder, or the
    spec's seed); a full checkpoint holds every weight, so nothing random is drawn first."""
    from workers.model import ModelSource, apply_lora, build_model, resolve_model_source

    dtype = torch.bfloat16 if restored.strategy.precision in BF16_WEIGHTS else torch.float32
    if restored.trainable_only:
        source = resolve_model_source(restored.spec)
        seed = restored.spec.train.seed if restored.spec.train is not None else 0
        model = build_model(source, seed=seed, weights_dtype=dtype)
    else:
        with _skip_init():  # every weight comes from the checkpoint: drawing random ones first is wasted minutes
            model = build_model(ModelSource(config=restored.config, weights_dir=None), seed=0, weights_dtype=dtype)
    if restored.strategy.finetune in ("lora", "qlora"):
        model = apply_lora(model, restored.strategy.lora_rank)
    try:
        result = model.load_state_dict(restored.state, strict=not restored.trainable_only)
    except RuntimeError as exc:
        raise InvalidInput(f"the checkpoint does not match the model it records: {str(exc).splitlines()[0]}",
                           hint="export a checkpoint written by this gpuplan") from None
    if restored.trainable_only and result.unexpected_keys:
        raise InvalidInput(f"the checkpoint holds weights the model lacks: {', '.join(result.unexpected_keys[:3])}",
                           hint="export a checkpoint written by this gpuplan")
    model.eval()
    return model


def _skip_init() -> Any:
    """transformers' no_init_weights, wherever this version keeps it (a plain init where it has none)."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        with contextlib.suppress(ImportError, AttributeError):
            return importlib.import_module(module).no_init_weights()
    return contextlib.nullcontext()


def _save_model(model: Any, out: Path) -> None:
    model.config.use_cache = True  # training turned the KV cache off; generation wants it
    model.save_pretrained(str(out))


def _weights_dir(spec: JobSpec) -> Path | None:
    from workers.model import resolve_model_source

    try:
        return resolve_model_source(spec).weights_dir
    except InvalidInput:  # the folder it was trained from is gone
        return None


def _save_adapter(model: Any, restored: _Restored, out: Path) -> str:
    """The adapter, pointing at a base a loader can find: the original weights, or a copy in out/base."""
    base_dir = _weights_dir(restored.spec)
    if base_dir is None:
        base_dir = out / "base"
    config = model.peft_config["default"]
    config.base_model_name_or_path = str(base_dir.resolve())
    model.save_pretrained(str(out), save_embedding_layers=False)  # LoRA trains no embeddings (all-linear)
    if base_dir == out / "base":
        _save_model(model.unload(), base_dir)  # the frozen base, adapters removed (not merged)
    return str(base_dir.resolve())


def _save_tokenizer(restored: _Restored, out: Path) -> bool:
    from workers.text_data import has_tokenizer

    train = restored.spec.train
    given = train.tokenizer if train is not None else None
    folder = Path(given).expanduser() if given else _weights_dir(restored.spec)
    if folder is None or not has_tokenizer(folder):
        return False
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(folder), local_files_only=True).save_pretrained(str(out))
    return True
