"""Spot policy benchmark on the real traces of "Can't Be Late" (Wu et al., NSDI 2024).

Reads ../shared/data/spot-traces (never copied into the repo); exits 0 with a message when absent.
Writes docs/SPOT.md and docs/img/spot-*.png.

    .venv/bin/python bench/spot.py                 # full benchmark -> docs/SPOT.md
    .venv/bin/python bench/spot.py --tune          # grid search of the gpuplan policy on the tuning split
    .venv/bin/python bench/spot.py --speed-only    # 45 days x 9 zones x 1000 jobs timing

Split: the policy is tuned on the first half (days 0-22) of the availability traces of five zones
(us-east-1a, us-east-1d, us-east-2b, us-west-2a, us-west-2c). Held out: the second half of the other
four zones' traces, and the whole preemption collection (4 zones, a different week, 32 s ticks).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.policy import DEFAULT_PARAMS, PolicyParams  # noqa: E402
from scheduler.simulate import Jobs, Outcome, Prices, SimOptions, omniscient, run_policy  # noqa: E402
from scheduler.traces import Zones, align, load_trace  # noqa: E402

TRACES = ROOT.parent / "shared" / "data" / "spot-traces"
AVAIL = TRACES / "availability" / "1-node" / "aws-02-15-2023"
PREEMPT = TRACES / "preemption" / "1-node" / "aws-04-22-2023"
TUNE_ZONES = ("us-east-1a", "us-east-1d", "us-east-2b", "us-west-2a", "us-west-2c")
PRICES = Prices(on_demand=3.06, spot=0.92)
WORK_H = 48.0
SLACKS = (0.1, 0.3, 0.5, 0.7, 0.9)
RESTARTS = (0.02, 0.1, 0.2, 0.4)
POLICIES = ("on-demand", "spot-only", "greedy", "uniform-progress", "gpuplan")
CACHE = Path("/tmp/gpuplan-spot-omniscient.json")


@dataclass(frozen=True)
class Case:
    """One zone (or zone set), one set of arrival ticks, one (deadline, restart) grid."""

    name: str
    zones: Zones
    starts: np.ndarray
    split: str  # tune | held-out


def zone_name(path: Path) -> str:
    return path.stem.split("_")[0]


def cases(step_h: float = 24.0) -> list[Case]:
    out: list[Case] = []
    max_deadline = WORK_H * (1 + max(SLACKS)) + 1
    for path in sorted(AVAIL.glob("*.json")):
        zones = align([load_trace(path)])
        half = zones.ticks // 2
        step = int(step_h / zones.gap_h)
        horizon = int(max_deadline / zones.gap_h)
        first = np.arange(0, half - horizon, step)
        second = np.arange(half, zones.ticks - horizon, step)
        if zone_name(path) in TUNE_ZONES:
            out.append(Case(f"{zone_name(path)} days 0-22", zones, first, "tune"))
        else:
            out.append(Case(f"{zone_name(path)} days 23-45", zones, second, "held-out"))
    for path in sorted(PREEMPT.glob("*.json")):
        zones = align([load_trace(path)])
        horizon = int(max_deadline / zones.gap_h)
        step = int(12.0 / zones.gap_h)
        out.append(Case(f"{zone_name(path)} (Apr 2023)", zones, np.arange(0, zones.ticks - horizon, step), "held-out"))
    return out


def job_grid(case: Case) -> Jobs:
    grid = list(itertools.product(case.starts.tolist(), SLACKS, RESTARTS))
    return Jobs.make(
        [g[0] for g in grid], WORK_H, [round(WORK_H * (1 + g[1]), 4) for g in grid], [g[2] for g in grid]
    )


def omniscient_costs(case: Case, jobs: Jobs) -> np.ndarray:
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    key = f"{case.name}|{len(jobs)}|{WORK_H}|{SLACKS}|{RESTARTS}"
    if key not in cache:
        cache[key] = omniscient(case.zones, jobs, PRICES, resolution=1).cost_usd.tolist()
        CACHE.write_text(json.dumps(cache))
    return np.asarray(cache[key])


def evaluate(case: Case, jobs: Jobs, params: PolicyParams, policies: tuple[str, ...] = POLICIES) -> dict[str, Outcome]:
    opts = SimOptions(params=params)
    return {p: run_policy(case.zones, jobs, p, PRICES, opts) for p in policies}


def tune() -> None:
    tune_cases = [c for c in cases() if c.split == "tune"]
    prepared = []
    for case in tune_cases:
        jobs = job_grid(case)
        prepared.append((case, jobs, omniscient_costs(case, jobs)))
    greedy = np.concatenate([run_policy(c.zones, j, "greedy", PRICES).cost_usd / o for c, j, o in prepared])
    print(f"greedy: median {np.median(greedy):.4f} mean {greedy.mean():.4f}")
    results = []
    for beta, margin, min_work in itertools.product((0.0, 0.05, 0.1, 0.2, 0.3), (0.0, 0.5, 1.0, 2.0, 4.0),
                                                    (0.0, 2.0, 4.0, 8.0)):
        params = PolicyParams(reserve_fraction=beta, return_margin_h=margin, min_return_work_h=min_work)
        ratios, met = [], []
        for case, jobs, omni in prepared:
            out = run_policy(case.zones, jobs, "gpuplan", PRICES, SimOptions(params=params))
            ratios.append(out.cost_usd / omni)
            met.append(out.deadline_met)
        r = np.concatenate(ratios)
        results.append((float(np.median(r)), float(r.mean()), bool(np.concatenate(met).all()), beta, margin, min_work))
        print(f"beta={beta} margin={margin} min_work={min_work}: median {results[-1][0]:.4f} mean {results[-1][1]:.4f}"
              f" all met {results[-1][2]}", flush=True)
    results.sort(key=lambda x: (x[1], x[0]))
    print("best (by mean ratio):", results[:5])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true")
    args = parser.parse_args()
    if not AVAIL.is_dir():
        print(f"spot traces not found at {TRACES}; skipping the spot benchmark")
        return 0
    if args.tune:
        tune()
        return 0
    print(DEFAULT_PARAMS, statistics.median([1.0]), time.time())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
