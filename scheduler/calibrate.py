"""``gpuplan calibrate``'s edge: recorded runs in, the user's calibration file out.

Reads what :mod:`scheduler.loop.accuracy` keeps (``gpuplan run`` results under ``<home>/runs`` and the
team's attempts), turns each into a :class:`planner.refit.Observation` (the strategy as it ran, the
model, the part and what it measured), leaves the fitting to :func:`planner.refit.refit`, and writes
the kept changes to ``<home>/calibration.json``, which ``plan``, ``estimate``, ``run`` and the server
load over the shipped calibration (:func:`planner.calibration.load_calibration`'s ``overlay``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from catalog.loader import Catalog
from catalog.schema import GpuSpec, ModelConfig
from errors import GpuplanError
from planner.prediction import Prediction
from planner.refit import QUANTITIES, Observation, Refit
from planner.types import Strategy
from scheduler.store.models import JobDetail


@dataclass
class Gathered:
    observations: list[Observation] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # record -> why it cannot be used


def _measured(measured: Mapping[str, Any]) -> dict[str, float]:
    return {q: float(v) for q in QUANTITIES if isinstance(v := measured.get(q), int | float) and v > 0}


def _as_run(strategy: Strategy, measured: Mapping[str, Any]) -> Strategy:
    """The strategy as it ran: an OOM back-off changed its micro-batch and accumulation."""
    update = {k: int(v) for k in ("micro_batch", "grad_accum")
              if isinstance(v := measured.get(k), int | float) and v >= 1}
    return strategy.model_copy(update=update) if update and strategy.task == "train" else strategy


def local_observations(home: Path) -> Gathered:
    """Every ``gpuplan run`` result under ``home/runs`` that measured something the planner predicted."""
    out = Gathered()
    for path in sorted((home / "runs").glob("*/result.json")):
        name = path.parent.name
        try:
            run = json.loads(path.read_text())
            inputs = run.get("planner_inputs") or {}
            measured = _measured(run.get("measured") or {})
            if not Prediction.model_validate(run.get("predicted") or {}).predicts_anything:
                out.skipped[name] = "the planner made no prediction for it (inference on a CPU)"
                continue
            if not inputs:
                out.skipped[name] = "its result predates the planner inputs calibrate needs (rerun it)"
                continue
            if not measured:
                out.skipped[name] = "it measured nothing the planner predicts (it failed before its first steps)"
                continue
            strategy = _as_run(Strategy.model_validate(run["strategy"]), run.get("measured") or {})
            out.observations.append(Observation(
                id=f"local/{name}", gpu=GpuSpec.model_validate(inputs["gpu"]),
                model=ModelConfig.model_validate(inputs["model"]), strategy=strategy, measured=measured,
                seq_len=int(inputs.get("seq_len", 0)), prompt_tokens=int(inputs.get("prompt_tokens", 0)),
                output_tokens=int(inputs.get("output_tokens", 0))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            out.skipped[name] = f"unreadable result ({str(exc).splitlines()[0][:120]})"
    return out


def team_observations(jobs: Iterable[JobDetail], catalog: Catalog,
                      gpu_of: Callable[[str], GpuSpec | None] | None = None) -> Gathered:
    """Every closed attempt with measured values, from job details (``spec``, ``plan``, ``attempt_list``).

    ``gpu_of``: the part of a strategy's ``gpu`` the catalog does not name (this machine's CPU)."""
    from catalog.loader import resolve_model
    from planner.spec import spec_from_dict

    out = Gathered()
    for job in jobs:
        attempts = [a for a in job.attempt_list if a.metrics]
        if not attempts:
            continue
        try:
            spec = spec_from_dict(dict(job.spec))
            strategy = job.planned_run().strategy
            model = resolve_model(catalog, spec.model if isinstance(spec.model, str) else {"config": spec.model.config})
            gpu = catalog.gpu(strategy.gpu) if catalog.has_gpu(strategy.gpu) else (gpu_of and gpu_of(strategy.gpu))
            if gpu is None:
                raise ValueError(f"the part {strategy.gpu!r} is not in the catalog")
        except (GpuplanError, ValueError, KeyError, TypeError) as exc:
            for a in attempts:
                out.skipped[f"{job.id}/{a.number}"] = f"cannot be predicted again: {str(exc).splitlines()[0][:160]}"
            continue
        for a in attempts:
            ran = (a.metrics or {}).get("measured") or {}
            measured = _measured(ran)
            key = f"{job.id}/{a.number}"
            if not measured:
                out.skipped[key] = "it measured nothing the planner predicts"
                continue
            out.observations.append(Observation(
                id=f"team/{key}", gpu=gpu, model=model, strategy=_as_run(strategy, ran),
                measured=measured, seq_len=spec.train.seq_len if spec.train else 0,
                prompt_tokens=spec.infer.prompt_tokens if spec.infer and spec.task == "infer" else 0,
                output_tokens=spec.infer.output_tokens if spec.infer and spec.task == "infer" else 0))
    return out


def overlay_document(result: Refit, *, sources: list[str], now: datetime | None = None) -> dict[str, Any]:
    """The user calibration file: the kept overrides, and how they were fitted and judged."""
    at = (now or datetime.now(UTC)).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "source": f"gpuplan calibrate {at}: fitted on {len(result.fit_ids)} recorded runs "
                  f"({', '.join(sources)}), judged on {len(result.held_out_ids)} held out",
        "overrides": result.overrides,
        "changes": [asdict(c) for c in result.changes],
        "held_out": [asdict(r) for r in result.report],
        "fitted_on": result.fit_ids,
        "held_out_ids": result.held_out_ids,
    }


def write_overlay(path: Path, document: Mapping[str, Any]) -> None:
    """Write atomically: a planner reading it meanwhile sees the old file or the new, never half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(document, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise GpuplanError(f"could not write the calibration file {path}: {exc}",
                           hint="check that the gpuplan home (GPUPLAN_HOME) is writable") from exc


def calibrate(home: Path, *, source: str, holdout: float, write: bool,
              team_jobs: Callable[[], Iterable[JobDetail]] | None, catalog: Catalog | None = None,
              now: datetime | None = None) -> dict[str, Any]:
    """Gather the records of ``source`` (local, team or all), refit the shipped calibration on part
    of them, judge it on the rest, and (``write``) keep it in ``<home>/calibration.json``.

    Returns the whole outcome as JSON-ready values (the CLI prints it as tables or ``--json``)."""
    from catalog.loader import load_catalog
    from errors import InvalidInput
    from planner.calibration import load_calibration, user_calibration_path
    from planner.refit import MIN_RECORDS, not_enough, refit

    if source not in ("local", "team", "all"):
        raise InvalidInput(f"--source must be local, team or all, got {source!r}", path="--source")
    gathered: list[tuple[str, Gathered]] = []
    if source in ("local", "all"):
        gathered.append((f"local runs under {home / 'runs'}", local_observations(home)))
    if source in ("team", "all"):
        assert team_jobs is not None
        cat = catalog or load_catalog()
        gathered.append(("team attempts", team_observations(team_jobs(), cat, _this_cpu(home))))
    observations = [o for _, g in gathered for o in g.observations]
    skipped = {k: v for _, g in gathered for k, v in g.skipped.items()}
    if len(observations) < MIN_RECORDS:
        found = ", ".join(f"{len(g.observations)} from {name}" for name, g in gathered)
        why = f"; {len(skipped)} more could not be used ({next(iter(skipped.values()))}...)" if skipped else ""
        raise not_enough(len(observations), f" ({found}{why})")
    base = load_calibration()  # always refit the shipped constants: a new refit replaces the last one
    result = refit(observations, base, holdout=holdout)
    path = user_calibration_path(home)
    document = overlay_document(result, sources=[name for name, _ in gathered], now=now)
    wrote = bool(write and result.changes)
    if wrote:
        write_overlay(path, document)
    return {
        "records": len(observations), "fit": len(result.fit_ids), "held_out": len(result.held_out_ids),
        "changes": [asdict(c) for c in result.changes], "reverted": [asdict(c) for c in result.reverted],
        "report": [asdict(r) for r in result.report], "rows": [asdict(r) for r in result.rows],
        "not_fitted": result.skipped, "skipped_records": skipped, "overrides": result.overrides,
        "path": str(path), "written": wrote, "source": document["source"],
    }


def _this_cpu(home: Path) -> Callable[[str], GpuSpec | None]:
    def gpu_of(name: str) -> GpuSpec | None:
        from datetime import date

        from catalog.local_cpu import CPU_ID, local_cpu

        return local_cpu(home, today=date.today())[0] if name == CPU_ID else None

    return gpu_of


def reset(home: Path) -> bool:
    """Delete the user's calibration file; whether there was one."""
    from planner.calibration import user_calibration_path

    path = user_calibration_path(home)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise GpuplanError(f"could not delete {path}: {exc}") from exc
    return True
