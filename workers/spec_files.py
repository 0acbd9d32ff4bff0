"""The files a job spec names, checked where a spec is accepted, so a job never fails on them only when it runs.

A spec's paths (its model's config or weights folder, ``train.data`` and ``train.tokenizer``, ``infer.prompts``
and ``infer.tokenizer``: planner.spec.spec_paths) mean what they mean to the user who wrote the file: the CLI
makes them absolute against the spec file's folder (commands.specfile) before a spec leaves it, whether for
this process's service or a server's. The service then refuses (:func:`check_reachable`) a path the machine
running the job cannot read: one still relative (a server cannot tell what it was relative to: its own working
directory is not the user's) or one that does not exist there. Both it and the CLI refuse text data with no
tokenizer to read it (:func:`check_text_data`).

No torch here: the CLI reads specs with this module, and the API checks them on its event loop.
"""

from __future__ import annotations

import socket
from pathlib import Path

from catalog.loader import Catalog, resolve_model
from catalog.schema import ModelConfig
from errors import InvalidInput, UnreachablePath
from planner.spec import JobSpec, ModelRef, model_is_path, spec_paths
from workers.train.text_data import has_tokenizer, is_jsonl

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def weights_folder(spec: JobSpec) -> Path | None:
    """The folder of the model's weights when the spec's model is one (or a config.json in one), else None."""
    ref = Path(spec.model.config if isinstance(spec.model, ModelRef) else spec.model).expanduser()
    if not (isinstance(spec.model, ModelRef) or ref.exists()):
        return None
    folder = ref if ref.is_dir() else ref.parent
    return folder if any((folder / name).is_file() for name in WEIGHT_FILES) else None


def spec_model(spec: JobSpec, catalog: Catalog) -> ModelConfig | None:
    """The model of a spec that names it by a path (a config.json, a ``save_pretrained`` folder), read from this
    machine's disk for the planner, which reads no files; None for a preset, which the planner looks up itself."""
    return resolve_model(catalog, spec.model_id) if model_is_path(spec.model) else None


def check_text_data(spec: JobSpec) -> None:
    """Refuse JSONL text data with no tokenizer: neither ``train.tokenizer`` nor one saved beside the model's
    weights (what the worker tokenizes it with, workers.train.batches.tokenizer_dir)."""
    train = spec.train
    if spec.task != "train" or train is None or train.data is None or not is_jsonl(train.data) or train.tokenizer:
        return
    folder = weights_folder(spec)
    if folder is not None and has_tokenizer(folder):
        return
    beside = f" and the model's folder {str(folder)!r} holds none" if folder is not None else ""
    raise InvalidInput(f"{train.data!r} is JSONL text, which needs a tokenizer: train.tokenizer is not set{beside}",
                       path="train.tokenizer",
                       hint="set train.tokenizer to the model's tokenizer folder (written by "
                       "tokenizer.save_pretrained()), give a model folder that holds one, or give token ids (.npy "
                       "or .bin) as train.data")


def check_reachable(spec: JobSpec, host: str | None = None) -> None:
    """Refuse a path in ``spec`` that this machine (``host``: its name in messages) cannot read."""
    where = host or socket.gethostname()
    for field, value in spec_paths(spec):
        path = Path(value).expanduser()
        if not path.is_absolute():
            raise UnreachablePath(
                f"{value!r} is a relative path: the server cannot tell what it is relative to (its own working "
                "directory is not yours)", path=field,
                hint="submit the spec file with `gpuplan submit SPEC`, which makes its paths absolute against the "
                "file's folder, or write an absolute path")
        if not path.exists():
            raise UnreachablePath(
                f"{str(path)!r} does not exist on {where}, the machine that runs the job", path=field,
                hint="put the file on storage this server's workers read (the same path on a shared disk), or fix "
                "the path, and submit again")


def check_spec_files(spec: JobSpec, host: str | None = None) -> None:
    """What the service checks of a spec's files before it plans it: every path readable here, text data with
    its tokenizer."""
    check_reachable(spec, host)
    check_text_data(spec)
