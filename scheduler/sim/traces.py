"""Spot availability traces: load, validate and align them (one file = one zone).

Format (the one published with "Can't Be Late", Wu et al., NSDI'24, skypilot-org/spot-traces)::

    {"metadata": {"gap_seconds": 195}, "data": [0, 1, 1, ...], "prices": [0.918, ...]}

``data[i] > 0`` means spot capacity was available during tick i (which starts at i * gap_seconds);
``prices`` (optional) is the spot price in $/h per tick.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from errors import InvalidInput


@dataclass(frozen=True)
class Trace:
    name: str
    gap_seconds: float
    available: npt.NDArray[np.bool_]
    prices: npt.NDArray[np.float64] | None = None

    @property
    def gap_h(self) -> float:
        return self.gap_seconds / 3600.0

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_h


@dataclass(frozen=True)
class Zones:
    """Several traces on one tick grid: ``available[z, t]``, ``prices[z, t]`` (nan where unknown)."""

    names: tuple[str, ...]
    gap_seconds: float
    available: npt.NDArray[np.bool_]
    prices: npt.NDArray[np.float64]

    @property
    def gap_h(self) -> float:
        return self.gap_seconds / 3600.0

    @property
    def ticks(self) -> int:
        return int(self.available.shape[1])

    @property
    def hours(self) -> float:
        return self.ticks * self.gap_h


def trace_from_dict(doc: object, name: str) -> Trace:
    """Validate one parsed trace document; errors say which field is wrong and what it should be."""
    if not isinstance(doc, dict):
        raise InvalidInput("a trace must be a JSON object with 'metadata' and 'data'", path=name)
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise InvalidInput("missing metadata.gap_seconds (seconds per tick), e.g. {\"gap_seconds\": 195}", path=name)
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap <= 0:
        raise InvalidInput(f"metadata.gap_seconds must be a positive number, got {gap!r}", path=name)
    data = doc.get("data")
    if not isinstance(data, list) or not data:
        raise InvalidInput("'data' must be a non-empty list of available-instance counts per tick", path=name)
    if any(isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x) for x in data):
        raise InvalidInput("'data' must hold only numbers (a tick's value > 0 means spot is available)", path=name)
    prices_arr: npt.NDArray[np.float64] | None = None
    prices = doc.get("prices")
    if prices is not None:
        if not isinstance(prices, list) or len(prices) != len(data):
            raise InvalidInput(f"'prices' must be a list as long as 'data' ({len(data)} ticks)", path=name)
        if any(isinstance(x, bool) or not isinstance(x, int | float) or not x >= 0 for x in prices):
            raise InvalidInput("'prices' must hold non-negative numbers ($/h per tick)", path=name)
        prices_arr = np.asarray(prices, dtype=np.float64)
    return Trace(name=name, gap_seconds=float(gap), available=np.asarray(data, dtype=np.float64) > 0, prices=prices_arr)


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"trace file {str(path)!r} does not exist", hint="pass a JSON spot trace (see docs/SPOT.md)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"not valid JSON ({exc})", path=str(path)) from None
    return trace_from_dict(doc, path.stem)


def align(traces: Sequence[Trace]) -> Zones:
    """Put traces on one grid. They must share gap_seconds; the longer ones are cut to the shortest."""
    if not traces:
        raise InvalidInput("give at least one trace file")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) > 1:
        raise InvalidInput(
            f"traces have different tick lengths {sorted(gaps)} s; simulate zones from one collection together"
        )
    ticks = min(len(t.available) for t in traces)
    avail = np.stack([t.available[:ticks] for t in traces])
    prices = np.stack(
        [t.prices[:ticks] if t.prices is not None else np.full(ticks, np.nan) for t in traces]
    )
    names = tuple(_unique_names([t.name for t in traces]))
    return Zones(names=names, gap_seconds=traces[0].gap_seconds, available=avail, prices=prices)


def _unique_names(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def load_zones(paths: Sequence[str | Path]) -> Zones:
    return align([load_trace(p) for p in paths])
