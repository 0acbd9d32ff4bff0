"""Resolving a spec against the catalog: its model, the GPUs it allows (and pinned counts), the names it
uses, and the memory headroom it asks for."""

from __future__ import annotations

from catalog.loader import Catalog
from catalog.schema import GpuSpec, ModelConfig
from errors import InvalidInput, UnknownName
from planner.calibration import Calibration
from planner.spec import JobSpec, check_model, invalid_spec, model_problems


def resolve_spec_model(spec: JobSpec, catalog: Catalog, model: ModelConfig | None) -> ModelConfig:
    """The spec's model, refused if the spec asks more of it than it can do (a context too long)."""
    if model is None:
        model = _catalog_model(spec, catalog)
    check_model(spec, model)
    return model


def _catalog_model(spec: JobSpec, catalog: Catalog) -> ModelConfig:
    if not isinstance(spec.model, str):
        # Reading the config.json is I/O, which the planner leaves to its callers (the CLI, the service).
        raise InvalidInput(f"the model is given as a config file ({spec.model.config}), which is not read here",
                           path="model", hint="use a preset (gpuplan catalog models), or plan and run the spec file "
                           "on this machine: gpuplan plan SPEC, gpuplan run SPEC")
    try:
        return catalog.model(spec.model)
    except UnknownName as exc:
        raise UnknownName("model", spec.model, [m.id for m in catalog.models], path="model") from exc


def memory_headroom(spec: JobSpec, cal: Calibration) -> float:
    """The fraction of usable memory a plan of ``spec`` must leave free: the spec's, else the default."""
    chosen = spec.resources.memory_headroom
    return cal.memory.plan_headroom if chosen is None else chosen


def allowed_gpus(spec: JobSpec, catalog: Catalog) -> tuple[list[GpuSpec], dict[str, int | None]]:
    pins = spec.resources.accelerator_pins()
    if not pins:
        return list(catalog.gpus), {}
    gpus: list[GpuSpec] = []
    counts: dict[str, int | None] = {}
    choices = [n for g in catalog.gpus for n in (g.id, *g.aliases)]
    for i, (name, count) in enumerate(pins.items()):
        try:
            gpu = catalog.gpu(name)
        except UnknownName:
            raise UnknownName("GPU", name, choices, path=f"resources.accelerators[{i}]") from None
        if gpu.id not in counts:
            gpus.append(gpu)
        counts[gpu.id] = count
    return gpus, counts


def check_names(spec: JobSpec, catalog: Catalog) -> None:
    clouds = sorted({o.cloud for o in catalog.offers})
    for i, cloud in enumerate(spec.resources.clouds or []):
        if cloud.lower() not in {c.lower() for c in clouds}:
            raise UnknownName("cloud", cloud, clouds, path=f"resources.clouds[{i}]")
    regions = sorted({o.region for o in catalog.offers} | {o.zone for o in catalog.offers if o.zone})
    for i, region in enumerate(spec.resources.regions or []):
        if region not in regions:
            raise UnknownName("region", region, regions, path=f"resources.regions[{i}]")


def resolve_for_plan(spec: JobSpec, catalog: Catalog,
                     model: ModelConfig | None) -> tuple[ModelConfig, list[GpuSpec], dict[str, int | None]]:
    """(model, allowed GPUs, pinned counts) for planning ``spec``; every problem with its model, clouds, regions
    and GPUs in one error, so one is never hidden behind another (an unknown GPU behind a sequence too long)."""
    problems: list[tuple[str, str]] = []
    errors: list[InvalidInput] = []
    gpus: list[GpuSpec] = []
    counts: dict[str, int | None] = {}
    try:
        model = model if model is not None else _catalog_model(spec, catalog)
        problems += model_problems(spec, model)
    except InvalidInput as exc:
        errors.append(exc)
    try:
        check_names(spec, catalog)
    except InvalidInput as exc:
        errors.append(exc)
    try:
        gpus, counts = allowed_gpus(spec, catalog)
    except InvalidInput as exc:
        errors.append(exc)
    if len(errors) == 1 and not problems:
        raise errors[0]  # as it is: an unknown name keeps its kind and suggestions
    problems += [(e.path or "(spec)", _said(e)) for e in errors]
    if problems or model is None:
        raise invalid_spec(problems)
    return model, gpus, counts


def _said(error: InvalidInput) -> str:
    """The error's words without the field path it starts with (the problem list names the path)."""
    return str(error).removeprefix(f"{error.path}: ") if error.path else str(error)
