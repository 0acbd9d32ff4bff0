"""Trace families of bench/spot/spot.py: one folder of skypilot-org/spot-traces (one cloud, one date, one node count),
its zones on one 5-minute grid and each zone alone."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scheduler.sim.traces import Zones

ROOT = Path(__file__).resolve().parents[2]
TICK_S = 300.0
NOTICE_S = {"aws": 120.0, "gcp": 30.0}
# The family RATE_HALF_LIFE_H was chosen on; every other family is held out.
TUNING_FAMILY = "aws-02-15-2023 1-node availability"


def role(name: str) -> str:
    return f"{name} (tuning)" if name == TUNING_FAMILY else f"{name} (held out)"


def find_traces() -> Path | None:
    for parent in ROOT.parents:
        cand = parent / "shared" / "data" / "spot-traces"
        if cand.is_dir():
            return cand
    return None


@dataclass(frozen=True)
class Family:
    name: str  # e.g. "aws-02-15-2023 1-node availability"
    cloud: str
    nodes: int
    zones: Zones  # every zone of the family on one 5-minute grid (cut to the shortest)
    singles: tuple[Zones, ...]  # each zone alone, at its full length

    @property
    def notice_s(self) -> float:
        return NOTICE_S.get(self.cloud, 0.0)


def resample(name: str, counts: np.ndarray, gap_s: float, nodes: int) -> tuple[np.ndarray, float]:
    """Availability on a ``TICK_S`` grid: a tick is available when all N nodes were for all of it."""
    avail = counts >= nodes
    if gap_s >= TICK_S:
        return avail, gap_s
    idx = np.floor(np.arange(len(avail)) * gap_s / TICK_S).astype(np.int64)
    n_out = int(idx[-1])  # drop the last, partial tick
    out = np.ones(n_out, dtype=bool)
    np.logical_and.at(out, idx[idx < n_out], avail[idx < n_out])
    return out, TICK_S


def load_family(folder: Path) -> Family:
    kind, node_dir, label = folder.parts[-3:]
    nodes = int(node_dir.split("-")[0])
    traces: list[tuple[str, np.ndarray, float]] = []
    for path in sorted(folder.glob("*.json")):
        doc = json.loads(path.read_text())
        avail, gap = resample(path.stem, np.asarray(doc["data"], dtype=np.float64),
                              float(doc["metadata"]["gap_seconds"]), nodes)
        traces.append((path.stem, avail, gap))
    gap = traces[0][2]

    def zones_of(items: list[tuple[str, np.ndarray, float]]) -> Zones:
        ticks = min(len(t[1]) for t in items)
        av = np.stack([t[1][:ticks] for t in items])
        return Zones(names=tuple(t[0] for t in items), gap_seconds=gap, available=av,
                     prices=np.full(av.shape, np.nan))

    return Family(name=f"{label} {node_dir} {kind}", cloud=label.split("-")[0], nodes=nodes,
                  zones=zones_of(traces), singles=tuple(zones_of([t]) for t in traces))


def families(root: Path) -> list[Family]:
    return [load_family(d) for d in sorted(root.glob("*/*-node/*")) if any(d.glob("*.json"))]
