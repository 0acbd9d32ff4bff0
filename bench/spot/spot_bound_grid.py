"""How loose is the omniscient bound of bench/spot/spot.py, and what is left of the gap to it?

bench/spot/spot.py's bound is a dynamic program on a grid of one tick (5 minutes): it rounds every restart
delay down to the grid (0.02 h counts as 0, 0.1 h as 5 minutes, 0.4 h as 20 minutes), so it is a true
lower bound but a loose one where restarts are long. The same program on a grid of gap/K (K = 5: one
minute, every restart of the bench's grid exact but 0.02 h, counted as 1 of its 1.2 minutes) is still a
lower bound, and tighter. This script runs both on the same jobs and reports, per family and per
(slack, restart) cell, the median of

- bound(K) / bound(1): how much of any policy's "x bound" is the grid's rounding alone;
- gpuplan and greedy / bound(K): the ratios against the tighter bound.

    python bench/spot/spot_bound_grid.py --family "aws-04-22-2023 1-node preemption" --resolution 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spot

from scheduler.sim.replay import run_policy
from scheduler.spot.bound import omniscient


def run(fam: spot.Family, resolution: int) -> dict[str, np.ndarray]:
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("b1", "bk", "gpuplan", "greedy", "slack", "restart")}
    for zones in fam.singles:
        jobs = spot.job_grid(zones)
        if jobs is None:
            continue
        b1 = spot.bound(zones, jobs)
        bk = omniscient(zones, jobs, spot.PRICES, resolution=resolution).cost_usd
        ok = np.isfinite(b1) & np.isfinite(bk)
        for p in ("gpuplan", "greedy"):
            cols[p].append(run_policy(zones, jobs, p, spot.PRICES, spot.options(fam)).cost_usd[ok])
        cols["b1"].append(b1[ok])
        cols["bk"].append(bk[ok])
        cols["slack"].append(np.round(jobs.deadline_h / jobs.work_h - 1, 2)[ok])
        cols["restart"].append(jobs.restart_h[ok])
    return {k: np.concatenate(v) for k, v in cols.items()}


def table(name: str, r: dict[str, np.ndarray], resolution: int) -> list[str]:
    k = resolution
    lines = [f"{name}: {len(r['b1'])} jobs", "",
             f"| slack \\ restart | bound({k}) / bound(1) | gpuplan / bound(1) | gpuplan / bound({k}) "
             f"| greedy / bound({k}) |", "|---|---|---|---|---|"]

    def row(label: str, m: np.ndarray) -> str:
        ratios = (("t", r["bk"] / r["b1"]), ("g1", r["gpuplan"] / r["b1"]), ("gk", r["gpuplan"] / r["bk"]),
                  ("rk", r["greedy"] / r["bk"]))
        med = {key: float(np.median(v[m])) for key, v in ratios}
        return f"| {label} | {med['t']:.3f} | {med['g1']:.3f} | {med['gk']:.3f} | {med['rk']:.3f} |"

    lines.append(row("all jobs", np.ones(len(r["b1"]), dtype=bool)))
    for rs in sorted(set(r["restart"].tolist())):
        lines.append(row(f"all slacks, restart {rs} h", r["restart"] == rs))
    for sl in sorted(set(r["slack"].tolist())):
        lines.append(row(f"slack {sl:.0%}, all restarts", r["slack"] == sl))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", help="the spot-traces collection (default: as bench/spot/spot.py)")
    p.add_argument("--family", action="append", default=[], help="family name (default: every family)")
    p.add_argument("--resolution", type=int, default=5, help="grid steps per tick of the tighter bound")
    args = p.parse_args(argv)
    root = Path(args.traces) if args.traces else spot.find_traces()
    if root is None:
        print("no spot-traces collection found; pass --traces", file=sys.stderr)
        return 1
    for fam in spot.families(root):
        if args.family and fam.name not in args.family:
            continue
        began = time.perf_counter()
        r = run(fam, args.resolution)
        print("\n".join(table(spot.role(fam.name), r, args.resolution)))
        print(f"\n({time.perf_counter() - began:.0f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
