"""Predicted vs measured, kept: what each finished attempt measured next to what its plan predicted.

The loop stores :func:`attempt_metrics` on every attempt it closes with a status (``attempt.metrics``),
``gpuplan run`` writes the same blocks into ``~/.gpuplan/runs/<job>/result.json``, and
:func:`accuracy_rows` turns either into rows of predicted vs measured for ``gpuplan report accuracy``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from planner.plan_record import PlannedRun
from workers.executors.protocol import RunStatus

# measured value -> its key in RunStatus.metrics (workers.train.progress.result_metrics)
MEASURED_KEYS = {
    "peak_allocated_bytes": "measured_peak_allocated_bytes",
    "peak_reserved_bytes": "measured_peak_reserved_bytes",
    "tokens_per_s": "measured_tokens_per_s",
    "checkpoint_save_s": "checkpoint_save_s",
    "steps": "steps",
    "wall_s": "wall_s",
    "micro_batch": "micro_batch",
    "grad_accum": "grad_accum",
    "prefill_s": "measured_prefill_s",
    "decode_step_s": "measured_decode_step_s",
    "nccl_link_gbps": "nccl_link_gbps",  # the link NCCL really had (workers.cluster.nccl_net), when it logged one
    "nccl_on_sockets": "nccl_on_sockets",
}
# prefill_s / decode_step_s: a served batch's prompt pass and one decode step, as the compiled decoder times them
# (workers/decode.DecodeTiming) and the plan prices them apart (planner.throughput.infer_throughput)
COMPARED = ("peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s", "prefill_s", "decode_step_s")


def attempt_metrics(status: RunStatus, plan: PlannedRun) -> dict[str, Any]:
    """What ``attempt.metrics`` holds: the measured block (None where the run did not get that far),
    the plan's predicted block (planner.prediction), and the OOM back-offs."""
    measured = {key: status.metrics.get(source) for key, source in MEASURED_KEYS.items()}
    return {"measured": measured, "predicted": plan.prediction().record(),
            "oom_backoffs": list(status.oom_backoffs)}


def error(predicted: object, measured: object) -> float | None:
    """(predicted - measured) / measured; None unless both are positive numbers."""
    if not isinstance(predicted, int | float) or not isinstance(measured, int | float) or measured <= 0:
        return None
    return (float(predicted) - float(measured)) / float(measured)


def accuracy_rows(records: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """(job, outcome, metrics) -> one row per record with both blocks and the relative errors."""
    rows: list[dict[str, Any]] = []
    for job, outcome, metrics in records:
        measured = metrics.get("measured") or {}
        predicted = metrics.get("predicted") or {}
        row: dict[str, Any] = {"job": job, "outcome": outcome, "strategy": predicted.get("label"),
                               "oom_backoffs": len(metrics.get("oom_backoffs") or [])}
        for key in COMPARED:
            row[f"predicted_{key}"] = predicted.get(key)
            row[f"measured_{key}"] = measured.get(key)
            row[f"error_{key}"] = error(predicted.get(key), measured.get(key))
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | int | None]]:
    """Per compared value: how many rows have both numbers, median and worst absolute error."""
    out: dict[str, dict[str, float | int | None]] = {}
    for key in COMPARED:
        errors = sorted(abs(r[f"error_{key}"]) for r in rows if r[f"error_{key}"] is not None)
        n = len(errors)
        median = None if not n else (errors[n // 2] if n % 2 else (errors[n // 2 - 1] + errors[n // 2]) / 2)
        out[key] = {"n": n, "median_abs_error": median, "max_abs_error": errors[-1] if n else None}
    return out


Record = tuple[str, str, dict[str, Any]]


def local_records(home: Path) -> list[Record]:
    """(job, status, metrics) of every ``gpuplan run`` result under ``home/runs``; unreadable files are skipped."""
    records: list[Record] = []
    for path in sorted((home / "runs").glob("*/result.json")):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(run, dict):
            continue
        predicted = run.get("predicted") or {}  # results before the predicted block named its strategy: their label
        predicted = {**predicted, "label": predicted.get("label") or run.get("strategy_label")}
        records.append((str(run.get("job", path.parent.name)), str(run.get("status", "?")),
                        {"measured": run.get("measured") or {}, "predicted": predicted,
                         "oom_backoffs": run.get("oom_backoffs") or []}))
    return records


def team_records(jobs: Iterable[Any]) -> list[Record]:
    """(job id/attempt, outcome, metrics) of every closed attempt with metrics, from job details."""
    records: list[Record] = []
    for job in jobs:
        for attempt in getattr(job, "attempt_list", []):
            if attempt.metrics:
                records.append((f"{job.id}/{attempt.number}", str(attempt.outcome), dict(attempt.metrics)))
    return records


def accuracy_png(rows: list[dict[str, Any]]) -> bytes:
    """Predicted vs measured, peak allocated and tokens/s, with the y = x line (PNG bytes)."""
    from scheduler.sim.plots import _png, _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, key, unit, scale in ((axes[0], "peak_allocated_bytes", "GiB", 1 / (1 << 30)),
                                 (axes[1], "tokens_per_s", "tokens/s", 1.0)):
        pairs = [(r[f"predicted_{key}"] * scale, r[f"measured_{key}"] * scale) for r in rows
                 if r[f"error_{key}"] is not None]
        if pairs:
            xs, ys = zip(*pairs, strict=True)
            ax.scatter(xs, ys, s=18)
            top = max(*xs, *ys) * 1.05
            ax.plot([0, top], [0, top], color="grey", linewidth=1, linestyle="--", label="predicted = measured")
            ax.set_xlim(0, top)
            ax.set_ylim(0, top)
            ax.legend(loc="upper left")
        ax.set_xlabel(f"predicted {unit}")
        ax.set_ylabel(f"measured {unit}")
        ax.set_title(f"{key.replace('_', ' ')} ({len(pairs)} runs)")
    return _png(fig)
