"""Refit the planner's calibration from finished runs: values in, values out (no I/O).

``gpuplan calibrate`` turns recorded attempts (what each run measured, and the strategy, model and
part it ran) into :class:`Observation` values and calls :func:`refit`. The records are split in a
fixed way (by a hash of each record's id, within each kind of run): the constants are fitted on
one part and judged on the held-out rest, so the table the user sees is an honest forecast of
what the refit does to runs it has not seen.

What is fitted is deliberately small, a few constants per predicted quantity, each by a 1-D search
that minimises the mean |log(predicted / measured)| over the fit records it affects:

- peak allocated (training): ``memory.activation_scale``;
- peak reserved: the allocator's cache overhead of each execution mode (``expandable_overhead`` or
  ``reserved_overhead``, whichever allocator the calibration predicts);
- training tokens/s: ``throughput.mfu_max[precision]`` and ``throughput.layer_overhead_s``;
- inference tokens/s: ``throughput.decode_bw_efficiency`` and ``throughput.decode_layer_overhead_s``.

A CPU run refits the CPU section (``cpu.memory`` / ``cpu.throughput``), a GPU run the GPU one. A
quantity whose held-out error would grow keeps the shipped constants (said in the result).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from catalog.schema import GpuSpec, ModelConfig
from errors import InvalidInput
from planner.calibration import Calibration, apply_overrides
from planner.memory import infer_memory
from planner.memory_train import train_memory, train_moments
from planner.numerics import storage_precision
from planner.throughput import infer_throughput
from planner.throughput_train import train_throughput
from planner.types import Strategy

QUANTITIES = ("peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s")
MIN_FIT = 4  # records to fit on
MIN_HELD_OUT = 2  # records to judge the fit on
MIN_RECORDS = MIN_FIT + MIN_HELD_OUT
DEFAULT_HOLDOUT = 1 / 3
_GRID = [2 ** (k / 4) for k in range(-12, 13)]  # multipliers 1/8 .. 8 of the shipped value
_FINE = [2 ** (k / 64) for k in range(-8, 9)]  # then +-9% around the best, in 1% steps


@dataclass(frozen=True)
class Observation:
    """One finished attempt, as the planner sees it: what ran where, and what it measured."""

    id: str
    gpu: GpuSpec
    model: ModelConfig
    strategy: Strategy  # as it ran (after any OOM back-off)
    measured: Mapping[str, float]  # quantity (QUANTITIES) -> positive measured value
    seq_len: int = 0  # training
    prompt_tokens: int = 0  # inference
    output_tokens: int = 0

    @property
    def section(self) -> str:
        """Which part of the calibration predicts this run: 'cpu' or 'gpu'."""
        return "cpu" if self.gpu.vendor == "cpu" else "gpu"

    @property
    def group(self) -> str:
        return f"{self.section}-{self.strategy.task}"


def predict(obs: Observation, cal: Calibration) -> dict[str, float]:
    """The planner's predictions for the strategy the run had, under ``cal``."""
    c = cal.for_vendor(obs.gpu.vendor)
    s = obs.strategy
    if s.task == "train":
        mem = train_memory(obs.model, s, obs.seq_len, obs.gpu, c.memory)
        thr = train_throughput(obs.model, s, obs.seq_len, obs.gpu, c.throughput, gpus_per_node=min(s.gpu_count, 8))
    else:
        mem = infer_memory(obs.model, s, obs.prompt_tokens, obs.output_tokens, obs.gpu, c.memory)
        thr = infer_throughput(obs.model, s, obs.prompt_tokens, obs.output_tokens, obs.gpu, c.throughput)
    return {"peak_allocated_bytes": float(mem.peak_allocated_bytes),
            "peak_reserved_bytes": float(mem.peak_reserved_bytes), "tokens_per_s": float(thr.tokens_per_s)}


# ------------------------------------------------------------------------------------ knobs


@dataclass(frozen=True)
class Knob:
    """One constant the refit may move: where it is in the calibration file, what it predicts,
    and which runs it touches (those of its section and task, and precision or allocator mode)."""

    path: tuple[str, ...]  # e.g. ("cpu", "throughput", "mfu_max", "fp32") or ("memory", "activation_scale")
    quantity: str
    section: str
    task: str | None = None
    precision: str | None = None
    mode: str | None = None
    upper: float | None = None  # a physical bound (an efficiency is at most 1)

    @property
    def name(self) -> str:
        return ".".join(self.path)

    def applies(self, o: Observation, modes: Mapping[str, str]) -> bool:
        return (o.section == self.section and (self.task is None or o.strategy.task == self.task)
                and (self.precision is None or storage_precision(o.strategy.precision) == self.precision)
                and (self.mode is None or modes[o.id] == self.mode))


def _get(cal: Calibration, path: Sequence[str]) -> float:
    node: Any = cal.model_dump(mode="json")
    for key in path:
        node = node[key]
    return float(node)


def _nested(path: Sequence[str], value: float) -> dict[str, Any]:
    out: dict[str, Any] = {path[-1]: value}
    for key in reversed(path[:-1]):
        out = {key: out}
    return out


def _merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def allocator_mode(obs: Observation, cal: Calibration) -> str:
    """The execution mode whose reserved overhead applies to ``obs`` (single, ddp, fsdp, infer...)."""
    if obs.strategy.task == "infer":
        return "infer"
    return train_moments(obs.model, obs.strategy, obs.seq_len, cal.for_vendor(obs.gpu.vendor).memory)[1]


def knobs_for(observations: Iterable[Observation], cal: Calibration, modes: Mapping[str, str]) -> list[Knob]:
    """The constants the records can inform, in fitting order (allocated before reserved, since
    reserved is predicted from allocated)."""
    obs = list(observations)
    knobs: list[Knob] = []
    for section in sorted({o.section for o in obs}):
        pre: tuple[str, ...] = ("cpu",) if section == "cpu" else ()
        mine = [o for o in obs if o.section == section]
        memory = cal.for_vendor("cpu" if section == "cpu" else "gpu").memory
        table = "expandable_overhead" if memory.allocator == "expandable-segments" else "reserved_overhead"
        tasks = {o.strategy.task for o in mine}
        if "train" in tasks:
            knobs.append(Knob((*pre, "memory", "activation_scale"), "peak_allocated_bytes", section, "train"))
        for mode in sorted({modes[o.id] for o in mine}):
            knobs.append(Knob((*pre, "memory", table, mode), "peak_reserved_bytes", section, mode=mode))
        # bf16-plain runs bf16's kernels: its runs fit bf16's constant (planner/numerics.py)
        for precision in sorted({storage_precision(o.strategy.precision) for o in mine if o.strategy.task == "train"}):
            knobs.append(Knob((*pre, "throughput", "mfu_max", precision), "tokens_per_s", section, "train",
                              precision=precision, upper=1.0))
        if "train" in tasks:
            knobs.append(Knob((*pre, "throughput", "layer_overhead_s"), "tokens_per_s", section, "train"))
        if "infer" in tasks:
            knobs.append(Knob((*pre, "throughput", "decode_bw_efficiency"), "tokens_per_s", section, "infer",
                              upper=1.0))
            knobs.append(Knob((*pre, "throughput", "decode_layer_overhead_s"), "tokens_per_s", section, "infer"))
    return knobs


# ------------------------------------------------------------------------------------ split


def split(observations: Sequence[Observation], holdout: float = DEFAULT_HOLDOUT
          ) -> tuple[list[Observation], list[Observation]]:
    """(fit, held out): within each kind of run (cpu/gpu x train/infer), records in the order of
    a hash of their id, every ``round(1/holdout)``-th held out. Fixed for a given set of ids, so a
    rerun on the same records judges on the same ones."""
    if not 0 < holdout < 1:
        raise InvalidInput(f"the held-out share must be between 0 and 1, got {holdout}", path="--holdout")
    every = max(2, round(1 / holdout))
    fit: list[Observation] = []
    held: list[Observation] = []
    for group in sorted({o.group for o in observations}):
        ordered = sorted((o for o in observations if o.group == group),
                         key=lambda o: hashlib.sha256(o.id.encode()).hexdigest())
        for i, o in enumerate(ordered):
            (held if i % every == every - 1 else fit).append(o)
    return fit, held


# ------------------------------------------------------------------------------------ fit


def _loss(knob: Knob, obs: Sequence[Observation], cal: Calibration) -> float:
    errs = [abs(math.log(predict(o, cal)[knob.quantity] / o.measured[knob.quantity])) for o in obs]
    return sum(errs) / len(errs)


def _search(knob: Knob, obs: Sequence[Observation], cal: Calibration) -> float:
    """The knob's value that minimises the fit loss; the current one unless another is strictly better."""
    v0 = _get(cal, knob.path)
    base = v0 if v0 > 0 else 1e-3  # an overhead fitted as 0 can come back
    best_v, best_loss = v0, _loss(knob, obs, cal)

    def trial(values: Iterable[float]) -> None:
        nonlocal best_v, best_loss
        for v in values:
            if knob.upper is not None:
                v = min(v, knob.upper)
            loss = _loss(knob, obs, apply_overrides(cal, _nested(knob.path, v)))
            if loss < best_loss - 1e-9:
                best_v, best_loss = v, loss

    trial(([0.0] if "overhead" in knob.name else []) + [base * m for m in _GRID])
    if best_v > 0:
        trial([best_v * m for m in _FINE])
    return best_v


@dataclass(frozen=True)
class Change:
    name: str
    quantity: str
    before: float
    after: float
    records: int  # fit records it was fitted on


@dataclass(frozen=True)
class QuantityReport:
    quantity: str
    held_out: int  # held-out records that measured it
    median_before: float | None  # median |relative error| on them, shipped constants
    median_after: float | None  # ... refitted constants
    max_before: float | None
    max_after: float | None
    kept: bool  # the refit of this quantity is kept (it does not make held-out worse)
    note: str = ""


@dataclass(frozen=True)
class HeldOutRow:
    id: str
    quantity: str
    measured: float
    before: float  # predicted with the shipped constants
    after: float  # predicted with the refit


@dataclass(frozen=True)
class Refit:
    calibration: Calibration  # the base with the kept changes
    overrides: dict[str, Any]  # the kept changes, in the calibration file's layout
    changes: list[Change]  # kept changes only
    reverted: list[Change]  # fitted, then dropped: held-out error grew
    report: list[QuantityReport]
    rows: list[HeldOutRow]
    fit_ids: list[str]
    held_out_ids: list[str]
    skipped: list[str] = field(default_factory=list)  # knobs with too few fit records


def _rel(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def _median(xs: Sequence[float]) -> float | None:
    s = sorted(xs)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def not_enough(count: int, what: str = "") -> InvalidInput:
    return InvalidInput(
        f"gpuplan calibrate needs at least {MIN_RECORDS} finished runs that measured something ({MIN_FIT} to fit "
        f"on and {MIN_HELD_OUT} held out to check the fit on); found {count}{what}",
        hint="run more jobs (gpuplan run, or the scheduler), then calibrate again; `gpuplan report accuracy` "
        "lists the runs it can use")


def refit(observations: Sequence[Observation], base: Calibration, *, holdout: float = DEFAULT_HOLDOUT) -> Refit:
    """Fit the knobs on part of ``observations`` and judge them on the rest (see the module doc)."""
    usable = [o for o in observations if any(o.measured.get(q, 0) > 0 for q in QUANTITIES)]
    if len(usable) < MIN_RECORDS:
        raise not_enough(len(usable))
    fit, held = split(usable, holdout)
    if len(fit) < MIN_FIT or len(held) < MIN_HELD_OUT:
        raise not_enough(len(usable), f" ({len(fit)} to fit, {len(held)} held out with --holdout {holdout:.2f})")

    cal = base
    fitted: list[Change] = []
    skipped: list[str] = []
    modes = {o.id: allocator_mode(o, base) for o in usable}
    knobs = knobs_for(usable, base, modes)
    # two passes: the throughput knobs of one quantity trade off against each other
    for _ in range(2):
        for knob in knobs:
            obs = [o for o in fit if knob.applies(o, modes) and o.measured.get(knob.quantity, 0) > 0]
            if len(obs) < 2:
                if knob.name not in skipped:
                    skipped.append(knob.name)
                continue
            value = _search(knob, obs, cal)
            cal = apply_overrides(cal, _nested(knob.path, value))
    for knob in knobs:
        if knob.name in skipped:
            continue
        old, new = _get(base, knob.path), _get(cal, knob.path)
        if not math.isclose(old, new, rel_tol=1e-12):
            n = sum(1 for o in fit if knob.applies(o, modes) and o.measured.get(knob.quantity, 0) > 0)
            fitted.append(Change(knob.name, knob.quantity, old, new, n))

    # held-out judgement, quantity by quantity; a refit that makes held-out worse is dropped
    kept = list(fitted)
    reverted: list[Change] = []
    report: list[QuantityReport] = []
    for q in QUANTITIES:
        current = _with(base, kept)
        pairs = _pairs(held, q, base, current)
        if not pairs:
            report.append(QuantityReport(q, 0, None, None, None, None, kept=False,
                                         note="no held-out record measured it: not refit"))
            dropped = [c for c in kept if c.quantity == q]
            reverted += dropped
            kept = [c for c in kept if c.quantity != q]
            continue
        err_before = [abs(_rel(b, m)) for _, m, b, _ in pairs]
        err_after = [abs(_rel(a, m)) for _, m, _, a in pairs]
        mine = [c for c in kept if c.quantity == q]
        worse = sum(err_after) > sum(err_before) + 1e-12
        if worse and mine:
            reverted += mine
            kept = [c for c in kept if c.quantity != q]
        note = ("held-out error would grow: the shipped constants stay" if worse and mine
                else "" if mine else "nothing to refit")
        report.append(QuantityReport(q, len(pairs), _median(err_before), _median(err_after), max(err_before),
                                     max(err_after),
                                     kept=bool(mine) and not worse, note=note))
    final = _with(base, kept)
    rows = [HeldOutRow(i, q, m, b, a) for q in QUANTITIES for i, m, b, a in _pairs(held, q, base, final)]
    # the report's "after" is the calibration actually written
    report = [r if not r.held_out else _rejudge(r, rows) for r in report]
    overrides: dict[str, Any] = {}
    for c in kept:
        overrides = _merge(overrides, _nested(tuple(c.name.split(".")), c.after))
    return Refit(calibration=final, overrides=overrides, changes=kept, reverted=reverted, report=report, rows=rows,
                 fit_ids=[o.id for o in fit], held_out_ids=[o.id for o in held], skipped=skipped)


def _with(base: Calibration, changes: Iterable[Change]) -> Calibration:
    overrides: dict[str, Any] = {}
    for c in changes:
        overrides = _merge(overrides, _nested(tuple(c.name.split(".")), c.after))
    return apply_overrides(base, overrides) if overrides else base


def _pairs(held: Sequence[Observation], q: str, before: Calibration, after: Calibration
           ) -> list[tuple[str, float, float, float]]:
    """(id, measured, predicted before, predicted after) of the held-out records that measured ``q``."""
    return [(o.id, o.measured[q], predict(o, before)[q], predict(o, after)[q])
            for o in held if o.measured.get(q, 0) > 0]


def _rejudge(r: QuantityReport, rows: Sequence[HeldOutRow]) -> QuantityReport:
    after = [abs(_rel(x.after, x.measured)) for x in rows if x.quantity == r.quantity]
    return QuantityReport(r.quantity, r.held_out, r.median_before, _median(after), r.max_before, max(after),
                          kept=r.kept, note=r.note)
