"""The trained model out of a checkpoint, as a folder Hugging Face tools load.

A full fine-tune becomes a ``save_pretrained`` model folder (``AutoModelForCausalLM.from_pretrained``
loads it). A LoRA or QLoRA run becomes a peft adapter folder, written from the checkpoint alone (no
base model is built), whose ``base_model_name_or_path`` is the weights folder it was trained from
(none for a base that was a random init: ``base_seed`` says which). ``merge=True`` writes that adapter
to ``<out>/adapter`` first, then builds the base (on the GPU when there is one), folds the adapters in
and writes a plain model folder. The tokenizer the run used, if any, is saved beside the weights.

Every checkpoint carries the job's spec, strategy and model shape (workers.train.loop), so nothing but
the checkpoint is needed to rebuild the model.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from catalog.schema import ModelConfig
from errors import Conflict, InvalidInput, NotFound
from planner.spec import JobSpec, ModelRef
from planner.strategies import finetune_kind
from planner.types import Strategy
from workers.model.export_adapter import base_device, write_adapter

Progress = Callable[[str], None]  # told each stage as it starts ("reading the checkpoint at ...")
ExportKind = Literal["model", "adapter", "merged"]
_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_checkpoint_wrapped_module.")


@dataclass(frozen=True)
class ExportResult:
    out: str
    kind: ExportKind
    step: int
    job: str
    model: str
    base: str | None  # the adapter's base model folder (None for a random-init base)
    tokenizer: bool
    checkpoint: str
    adapter: str | None = None  # the peft adapter folder (kinds "adapter" and "merged")
    base_seed: int | None = None  # a random-init base: the seed that draws it (on base_drawn_on)
    base_drawn_on: str | None = None  # the device type training drew that base on, where the checkpoint says
    device: str | None = None  # where --merge built the base

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
    base_drawn_on: str | None = None  # where training drew a random-init base (older checkpoints: unknown)


def _quiet(_stage: str) -> None:
    pass


def export_checkpoint(uri: str, out: Path, *, merge: bool = False, progress: Progress = _quiet,
                      cuda_available: bool | None = None) -> ExportResult:
    """Write the newest checkpoint at ``uri`` to ``out`` (which must not hold anything yet), telling
    ``progress`` each stage. ``cuda_available``: whether --merge may build the base on the GPU (default: torch's
    answer)."""
    _check_out(out)
    progress(f"reading the checkpoint at {uri}")
    restored = _restore(uri)
    lora = finetune_kind(restored.strategy.finetune).adapters
    if merge and not lora:
        raise InvalidInput("--merge folds LoRA adapters into the weights, but this run was a full fine-tune",
                           path="merge", hint="export without --merge: the folder already holds the full weights")
    out.mkdir(parents=True, exist_ok=True)
    if lora:
        result = _export_lora(restored, out, merge=merge, progress=progress, cuda_available=(
            torch.cuda.is_available() if cuda_available is None else cuda_available))
    else:
        model = _rebuild(restored)
        progress(f"writing the model to {out}")
        _save_model(model, out)
        result = _result(restored, out, "model")
    result = ExportResult(**{**result.to_dict(), "checkpoint": uri, "tokenizer": _save_tokenizer(restored, out)})
    (out / "gpuplan_export.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _result(restored: _Restored, out: Path, kind: ExportKind, **extra: Any) -> ExportResult:
    return ExportResult(out=str(out), kind=kind, step=restored.step, job=restored.job, model=restored.config.id,
                        base=extra.pop("base", None), tokenizer=False, checkpoint="", **extra)


def _export_lora(restored: _Restored, out: Path, *, merge: bool, progress: Progress,
                 cuda_available: bool) -> ExportResult:
    """The adapter first, from the checkpoint alone (an interrupted --merge still leaves it); the base is built
    only to merge into."""
    base_dir, random_init = _base_of(restored.spec)
    adapter_dir = out / "adapter" if merge else out
    progress(f"writing the adapter to {adapter_dir}")
    write_adapter(restored.state, adapter_dir, rank=restored.strategy.lora_rank, base=base_dir)
    seed = restored.spec.train.seed if restored.spec.train is not None else 0
    about: dict[str, Any] = {"adapter": str(adapter_dir), "base": base_dir,
                             "base_seed": seed if random_init else None,
                             "base_drawn_on": restored.base_drawn_on if random_init else None}
    if not merge:
        return _result(restored, out, "adapter", **about)
    recorded = random_init and restored.base_drawn_on is not None  # then only that device draws the same base
    device = base_device(restored.base_drawn_on, random_init=random_init, cuda_available=cuda_available,
                         fits_gpu=cuda_available and not recorded and _fits_gpu(restored))
    progress(f"building the base model {restored.config.id} on {device.type}")
    base = _build_base(restored, device)
    progress("merging the adapter into the base")
    from peft import PeftModel

    merged = PeftModel.from_pretrained(base, str(adapter_dir), low_cpu_mem_usage=True).merge_and_unload()
    progress(f"writing the merged model to {out}")
    _save_model(merged, out)
    return _result(restored, out, "merged", **about, device=device.type)


def _base_of(spec: JobSpec) -> tuple[str | None, bool]:
    """(the adapter's base folder, whether the base was a random init). A weights folder that is gone is still
    named as the run gave it: the adapter was trained on it, not on a random init."""
    from workers.model.build import resolve_model_source

    try:
        weights_dir = resolve_model_source(spec).weights_dir
    except InvalidInput:
        return str(spec.model.config if isinstance(spec.model, ModelRef) else spec.model), False
    return (None, True) if weights_dir is None else (str(weights_dir.resolve()), False)


def _fits_gpu(restored: _Restored) -> bool:
    """Whether training's rule builds this base on the GPU (a 70B base in bf16 does not fit one 80 GB card)."""
    from workers.model.build import ModelSource
    from workers.train.setup import build_device

    source = ModelSource(config=restored.config, weights_dir=None)
    return build_device(restored.strategy, source, torch.device("cuda", torch.cuda.current_device())).type == "cuda"


def _build_base(restored: _Restored, device: torch.device) -> torch.nn.Module:
    """The frozen base exactly as training built it: its weights folder, or the spec's seed drawn on ``device``."""
    from workers.model.build import build_model, resolve_model_source
    from workers.train.setup import weights_dtype

    dtype = weights_dtype(restored.strategy)
    source = resolve_model_source(restored.spec)
    seed = restored.spec.train.seed if restored.spec.train is not None else 0
    model = build_model(source, seed=seed, weights_dtype=dtype, device=device)
    model.to(device)  # a weights folder loads on the host
    model.eval()
    return model


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise Conflict(f"{out} already exists and is not empty",
                       hint="give --out a new folder (nothing is overwritten)")


def _restore(uri: str) -> _Restored:
    from workers.checkpoint.local import open_store
    from workers.train.state_load import read_checkpoint_state

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
                     trainable_only=bool(metadata.get("trainable_only", False)),
                     base_drawn_on=metadata.get("base_drawn_on"))


def _clean(name: str) -> str:
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _rebuild(restored: _Restored) -> torch.nn.Module:
    """A full fine-tune: the job's architecture with the checkpoint's state, which holds every weight, so
    nothing random is drawn first."""
    from workers.model.build import ModelSource, build_model
    from workers.train.setup import weights_dtype

    dtype = weights_dtype(restored.strategy)
    with _skip_init():  # every weight comes from the checkpoint: drawing random ones first is wasted minutes
        model = build_model(ModelSource(config=restored.config, weights_dir=None), seed=0, weights_dtype=dtype)
    try:
        model.load_state_dict(restored.state, strict=True)
    except RuntimeError as exc:
        raise InvalidInput(f"the checkpoint does not match the model it records: {str(exc).splitlines()[0]}",
                           hint="export a checkpoint written by this gpuplan") from None
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
    from workers.model.build import resolve_model_source

    try:
        return resolve_model_source(spec).weights_dir
    except InvalidInput:  # the folder it was trained from is gone
        return None


def _save_tokenizer(restored: _Restored, out: Path) -> bool:
    from workers.train.text_data import has_tokenizer

    train = restored.spec.train
    given = train.tokenizer if train is not None else None
    folder = Path(given).expanduser() if given else _weights_dir(restored.spec)
    if folder is None or not has_tokenizer(folder):
        return False
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(folder), local_files_only=True).save_pretrained(str(out))
    return True
