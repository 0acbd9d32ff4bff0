"""Load the catalog's data files into one immutable, indexed :class:`Catalog`.

Files (all under one data directory; the packaged one is ``catalog/data``):

- ``gpus.yaml``: a list of :class:`GpuSpec` rows.
- ``models.yaml``: a list of :class:`ModelConfig` rows (model presets, no weights).
- ``offers/<cloud>.csv``: :class:`Offer` rows, one file per cloud (see :mod:`catalog.offers_io`).
- ``support.yaml``: a :class:`StackSupport`: what the workers run, and per (vendor, architecture)
  which precision and quantization paths run there (the planner offers nothing else).

A user directory (``~/.gpuplan/catalog`` by default, see :func:`default_user_dir`) may hold the
same files: ``offers/<cloud>.csv`` there *replaces* the packaged file of that cloud (that is where
``gpuplan catalog refresh aws`` writes), and rows of ``gpus.yaml``/``models.yaml`` there add to or
replace packaged rows with the same id. Nothing is cached globally: callers keep the Catalog.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from catalog.freshness import refresh_commands
from catalog.hf_config import model_from_hf_config
from catalog.offers_io import read_offers
from catalog.schema import GpuSpec, ModelConfig, Offer, StackSupport
from errors import CatalogError, InvalidInput, UnknownName

PACKAGED_DATA_DIR = Path(__file__).resolve().parent / "data"
# libyaml's loader is ~10x faster than the pure-Python one; both are "safe" (no arbitrary objects).
_YamlLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
USER_DIR_ENV = "GPUPLAN_CATALOG_DIR"

__all__ = [
    "PACKAGED_DATA_DIR",
    "Catalog",
    "default_user_dir",
    "load_catalog",
    "load_support",
    "model_from_hf_config",
    "resolve_model",
    "stale_offer_warning",
]


def normalize_name(name: str) -> str:
    """Lookup key: case-, space-, dash- and underscore-insensitive ("h100 sxm" == "H100-SXM")."""
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch == ".")


@dataclass(frozen=True)
class Catalog:
    """GPU specs, priced offers and model presets, with dict indexes built once."""

    gpus: tuple[GpuSpec, ...]
    offers: tuple[Offer, ...]
    models: tuple[ModelConfig, ...]
    support: StackSupport = field(default_factory=lambda: _packaged_support(), compare=False)
    _gpu_index: dict[str, GpuSpec] = field(init=False, repr=False, compare=False)
    _model_index: dict[str, ModelConfig] = field(init=False, repr=False, compare=False)
    _offers_by_gpu: dict[str, tuple[Offer, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        gpu_index: dict[str, GpuSpec] = {}
        owner: dict[str, str] = {}
        for gpu in self.gpus:
            for name in (gpu.id, *gpu.aliases):
                key = normalize_name(name)
                if key in owner and owner[key] != gpu.id:
                    raise CatalogError(
                        f"GPU name {name!r} is used by both {owner[key]} and {gpu.id}",
                        hint="make every GPU id and alias unique in gpus.yaml",
                    )
                if key in owner and name == gpu.id:
                    raise CatalogError(f"duplicate GPU id {gpu.id!r}", hint="remove one of the rows")
                owner[key] = gpu.id
                gpu_index[key] = gpu
        model_index: dict[str, ModelConfig] = {}
        for model in self.models:
            key = normalize_name(model.id)
            if key in model_index:
                raise CatalogError(f"duplicate model preset id {model.id!r}", hint="remove one of the rows")
            model_index[key] = model
        by_gpu: dict[str, list[Offer]] = {gpu.id: [] for gpu in self.gpus}
        for offer in self.offers:
            if offer.gpu not in by_gpu:
                raise CatalogError(
                    f"offer {offer.cloud}/{offer.instance_type} in {offer.region} names unknown GPU "
                    f"{offer.gpu!r}",
                    hint="use a GPU id from gpus.yaml (not an alias)",
                )
            by_gpu[offer.gpu].append(offer)
        object.__setattr__(self, "_gpu_index", gpu_index)
        object.__setattr__(self, "_model_index", model_index)
        object.__setattr__(self, "_offers_by_gpu", {k: tuple(v) for k, v in by_gpu.items()})

    def gpu(self, name: str) -> GpuSpec:
        """The GPU with this id or alias (case-insensitive); UnknownName with close matches."""
        found = self._gpu_index.get(normalize_name(name))
        if found is None:
            choices = [n for g in self.gpus for n in (g.id, *g.aliases)]
            raise UnknownName("GPU", name, choices)
        return found

    def has_gpu(self, name: str) -> bool:
        return normalize_name(name) in self._gpu_index

    def model(self, name: str) -> ModelConfig:
        """The model preset with this id (case-insensitive); UnknownName with close matches."""
        found = self._model_index.get(normalize_name(name))
        if found is None:
            raise UnknownName("model", name, [m.id for m in self.models])
        return found

    def has_model(self, name: str) -> bool:
        return normalize_name(name) in self._model_index

    def offers_for(self, gpu_id: str) -> list[Offer]:
        """Every offer of this GPU (id or alias)."""
        return list(self._offers_by_gpu.get(self.gpu(gpu_id).id, ()))

    def with_offers(self, offers: Iterable[Offer]) -> Catalog:
        """A new catalog with these offers added (e.g. the local machine's zero-cost offer)."""
        return Catalog(gpus=self.gpus, offers=(*self.offers, *offers), models=self.models, support=self.support)

    def with_gpus(self, gpus: Iterable[GpuSpec], offers: Iterable[Offer] = ()) -> Catalog:
        """A new catalog with these parts (e.g. this machine's CPU) and their offers added."""
        return Catalog(gpus=(*self.gpus, *gpus), offers=(*self.offers, *offers), models=self.models)

    def stale_offers(self, today: date, max_age_days: int = 30) -> list[Offer]:
        """Priced cloud offers whose source is older than ``max_age_days`` (the local offer never is)."""
        return [
            o
            for o in self.offers
            if o.cloud != "local" and (today - o.source.as_of).days > max_age_days
        ]


def stale_offer_warning(stale: Iterable[Offer], today: date, max_age_days: int = 30) -> str | None:
    """One human line about stale prices, or None when every price is fresh."""
    rows = list(stale)
    if not rows:
        return None
    oldest = min(o.source.as_of for o in rows)
    clouds = sorted({o.cloud for o in rows})
    return (
        f"{len(rows)} offer price(s) from {', '.join(clouds)} are older than {max_age_days} days "
        f"(oldest as of {oldest.isoformat()}, {(today - oldest).days} days ago); prices move, so treat "
        f"costs as indicative or run {refresh_commands(clouds)}"
    )


def default_user_dir() -> Path:
    """Where user catalog overrides live: $GPUPLAN_CATALOG_DIR, else the gpuplan home's catalog folder
    ($GPUPLAN_HOME/catalog, ~/.gpuplan/catalog), where everything else of the user's is."""
    env = os.environ.get(USER_DIR_ENV)
    if env:
        return Path(env).expanduser()
    home = os.environ.get("GPUPLAN_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".gpuplan") / "catalog"


def _packaged_support() -> StackSupport:
    return load_support(PACKAGED_DATA_DIR)


@functools.cache
def load_support(data_dir: Path = PACKAGED_DATA_DIR) -> StackSupport:
    """``support.yaml`` of ``data_dir``: what the workers run (read once; the value is immutable)."""
    path = data_dir / "support.yaml"
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_YamlLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", hint="reinstall gpuplan") from None
    try:
        return StackSupport.model_validate(loaded)
    except ValidationError as exc:
        raise CatalogError(f"{path} is not a valid support record: {exc}", hint="fix the file") from None


RecordT = TypeVar("RecordT", bound=BaseModel)


def read_data_record(path: Path, kind: type[RecordT], schema: str) -> RecordT:
    """A packaged YAML data file validated as ``kind``; unreadable or invalid is a CatalogError naming the first
    bad field and ``schema`` (where its schema lives, e.g. "catalog/schema.py CloudNames")."""
    try:
        return kind.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"cannot read {path}: {exc}", hint="reinstall gpuplan") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"{path}: {where}: {first['msg']}", hint=f"fix the row; schema: {schema}") from None


def _read_yaml_list(path: Path) -> list[Mapping[str, Any]]:
    try:
        loaded = yaml.load(path.read_text(encoding="utf-8"), Loader=_YamlLoader)
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"cannot read catalog file {path}: {exc}", hint="fix or delete the file") from exc
    if not isinstance(loaded, list) or not all(isinstance(row, dict) for row in loaded):
        raise CatalogError(f"{path} must be a YAML list of mappings", hint="see catalog/data for the format")
    return loaded


def _validate_rows(path: Path, rows: list[Mapping[str, Any]], kind: type[GpuSpec] | type[ModelConfig]) -> list[Any]:
    out: list[Any] = []
    for i, row in enumerate(rows):
        try:
            out.append(kind.model_validate(row))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise CatalogError(
                f"{path} row {i} ({row.get('id', '?')}): {where}: {first['msg']}",
                hint="fix the row; the schema is catalog/schema.py",
            ) from exc
    return out


def _merge_by_id(base: list[Any], extra: list[Any]) -> list[Any]:
    by_id = {row.id: row for row in base}
    for row in extra:
        by_id[row.id] = row
    return list(by_id.values())


def _offer_files(directory: Path) -> dict[str, Path]:
    offers_dir = directory / "offers"
    if not offers_dir.is_dir():
        return {}
    return {p.stem: p for p in sorted(offers_dir.glob("*.csv"))}


def load_catalog(data_dir: Path | None = None, *, user_dir: Path | None = None) -> Catalog:
    """Read and validate the catalog.

    ``data_dir`` defaults to the packaged data. ``user_dir`` overlays user files (refreshed
    offers, extra GPUs or models); when both are None, :func:`default_user_dir` is used if it
    exists, so a ``gpuplan catalog refresh`` is picked up everywhere. Pass an explicit
    ``data_dir`` (and no ``user_dir``) to read exactly one directory.
    """
    if data_dir is None:
        base_dir = PACKAGED_DATA_DIR
        if user_dir is None:
            candidate = default_user_dir()
            user_dir = candidate if candidate.is_dir() else None
    else:
        base_dir = data_dir
    if not (base_dir / "gpus.yaml").is_file():
        raise CatalogError(f"no gpus.yaml in catalog directory {base_dir}", hint="reinstall gpuplan")

    gpus: list[GpuSpec] = _validate_rows(base_dir / "gpus.yaml", _read_yaml_list(base_dir / "gpus.yaml"), GpuSpec)
    models_path = base_dir / "models.yaml"
    models: list[ModelConfig] = (
        _validate_rows(models_path, _read_yaml_list(models_path), ModelConfig) if models_path.is_file() else []
    )
    offer_files = _offer_files(base_dir)
    if user_dir is not None:
        for name, kind, target in (("gpus.yaml", GpuSpec, gpus), ("models.yaml", ModelConfig, models)):
            path = user_dir / name
            if path.is_file():
                merged = _merge_by_id(target, _validate_rows(path, _read_yaml_list(path), kind))
                target[:] = merged
        offer_files.update(_offer_files(user_dir))
    offers: list[Offer] = []
    for path in offer_files.values():
        offers.extend(read_offers(path))
    support = load_support(base_dir) if (base_dir / "support.yaml").is_file() else load_support()
    return Catalog(gpus=tuple(gpus), offers=tuple(offers), models=tuple(models), support=support)


def resolve_model(catalog: Catalog, ref: str | Path | Mapping[str, object]) -> ModelConfig:
    """A model from a preset id, a path to an HF ``config.json`` (or its folder), or ``{config: path}``.

    A string that names no preset but points at an existing file or folder is read as a config.
    """
    if isinstance(ref, Mapping):
        cfg = ref.get("config")
        if not isinstance(cfg, str | Path):
            raise InvalidInput("expected {config: path/to/config.json}", path="model")
        return _from_path(Path(cfg))
    if isinstance(ref, Path):
        return _from_path(ref)
    if catalog.has_model(ref):
        return catalog.model(ref)
    path = Path(ref).expanduser()
    if path.suffix == ".json" or path.exists() or "/" in ref:
        return _from_path(path)
    return catalog.model(ref)  # raises UnknownName with suggestions


def _from_path(path: Path) -> ModelConfig:
    path = path.expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InvalidInput(f"model config file {str(path)!r} does not exist", path="model",
                           hint="give a preset id (gpuplan catalog models) or a path to an HF config.json")
    return model_from_hf_config(path)
