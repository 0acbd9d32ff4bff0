"""Cell statistics of bench/spot/spot.py: each policy's cost x the omniscient bound per (slack, restart) cell, against
greedy at the median, on the mean and job by job, and the rows of its tables."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

Result = dict[str, dict[str, np.ndarray]]
RESTARTS = (0.02, 0.1, 0.2, 0.4)
SLACKS = (0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def fmt(x: float | np.floating[Any]) -> str:
    return f"{x:.3f}"


def family_row(name: str, res: Result) -> str:
    g, gr = res["gpuplan"], res["greedy"]
    od = res["on-demand"]["cost"]
    return (f"| {name} | {len(g['ratio'])} | {g['met'].mean():.1%} | {greedy_met(res):.1%} | "
            f"{fmt(np.median(g['ratio']))} | {fmt(np.median(gr['ratio']))} | "
            f"{fmt(np.median(res['uniform-progress']['ratio']))} | {fmt(np.median(g['ratio'] / gr['ratio']))} | "
            f"{fmt(np.mean(g['ratio']))} / {fmt(np.mean(gr['ratio']))} | "
            f"{np.median(1 - g['cost'] / od):.0%} |")


def greedy_met(res: Result) -> float:
    return float(res["greedy"]["met"].mean())


FAMILY_HEADER = ["| family | jobs | gpuplan deadlines met | greedy met | gpuplan median x bound "
                 "| greedy median x bound | uniform-progress median | gpuplan/greedy (median per job) "
                 "| mean x bound gpuplan / greedy | gpuplan saving vs on-demand (median) |",
                 "|---|---|---|---|---|---|---|---|---|---|"]


JUDGED_SLACK = 0.2  # the issue judges cells with at least this much slack


def cell_mask(res: Result, slack: float, restart: float) -> np.ndarray:
    """The jobs of one (slack, restart) cell (the same rows in every policy's arrays)."""
    return (res["gpuplan"]["slack"] == slack) & (res["gpuplan"]["restart"] == restart)


def cell_table(res: Result, stat: Callable[[np.ndarray], Any] = np.median) -> tuple[list[str], int, int, int, int]:
    """``stat`` (median) x bound of gpuplan / greedy per (slack, restart) cell; counts of cells with slack
    >= 20% where gpuplan is below greedy, within 1.02 of the bound, and level with greedy (exactly the same
    value: with the median, both policies did the same thing to the median job)."""
    g, gr = res["gpuplan"], res["greedy"]
    lines = ["| slack \\ restart | " + " | ".join(f"{r:g} h" for r in RESTARTS) + " |",
             "|---|" + "---|" * len(RESTARTS)]
    below = within = cells_20 = level = 0
    for slack in SLACKS:
        cells = []
        for r in RESTARTS:
            m = cell_mask(res, slack, r)
            if not m.any():
                cells.append("-")
                continue
            a, b = float(stat(g["ratio"][m])), float(stat(gr["ratio"][m]))
            if slack >= JUDGED_SLACK:
                cells_20 += 1
                below += a < b - 1e-12
                level += abs(a - b) <= 1e-12
                within += a <= 1.02
            cells.append(f"{a:.3f} / {b:.3f}")
        lines.append(f"| {slack:.0%} | " + " | ".join(cells) + " |")
    return lines, below, within, cells_20, level


def judged_cells(res: Result) -> Iterator[tuple[float, float, np.ndarray]]:
    """(slack, restart, jobs) of every cell the issue judges (slack >= 20%) that has jobs."""
    for slack in SLACKS:
        for r in RESTARTS:
            m = cell_mask(res, slack, r)
            if slack >= JUDGED_SLACK and m.any():
                yield slack, r, m


def job_by_job(res: Result, m: np.ndarray) -> tuple[int, int]:
    """Of the jobs ``m``, how many cost gpuplan less than greedy, and how many more (the same jobs on the
    same traces)."""
    d = res["gpuplan"]["cost"][m] - res["greedy"]["cost"][m]
    return int((d < -1e-9).sum()), int((d > 1e-9).sum())


def paired_cells(res: Result) -> tuple[int, int]:
    """Job by job: cells with slack >= 20% where gpuplan costs less than greedy on more jobs than it costs
    more, and the number of such cells."""
    counts = [job_by_job(res, m) for _, _, m in judged_cells(res)]
    return sum(int(cheaper > dearer) for cheaper, dearer in counts), len(counts)


def median_gap_interval(res: Result, m: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% interval of (gpuplan's median - greedy's median) x bound over the jobs ``m``, by a paired bootstrap:
    the same resampled jobs for both policies (a cell holds 51-801 jobs; the per-cell median judges on them)."""
    g, gr = res["gpuplan"]["ratio"][m], res["greedy"]["ratio"][m]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(g), size=(draws, len(g)))
    gaps = np.median(g[idx], axis=1) - np.median(gr[idx], axis=1)
    lo, hi = np.quantile(gaps, [0.025, 0.975])
    return float(lo), float(hi)


def gap_beyond_noise(res: Result) -> tuple[int, int, int]:
    """Cells with slack >= 20% where gpuplan's median is above greedy's beyond the bootstrap's 95% interval, below
    it beyond that interval, and neither (the cell's jobs cannot tell the two medians apart)."""
    above = below = 0
    cells = 0
    for _, _, m in judged_cells(res):
        cells += 1
        lo, hi = median_gap_interval(res, m)
        above += lo > 1e-12
        below += hi < -1e-12
    return above, below, cells - above - below


ABOVE_HEADER = ["| family | slack | restart | jobs | gpuplan cheaper / dearer / equal (job by job) "
                "| median x bound gpuplan / greedy | 95% interval of the gap (paired bootstrap) "
                "| mean x bound gpuplan / greedy |",
                "|---|---|---|---|---|---|---|---|"]


def above_cells(name: str, res: Result) -> list[str]:
    """Rows of the cells (slack >= 20%) where gpuplan's median is above greedy's, with the same jobs
    compared one by one and the means beside the medians."""
    g, gr = res["gpuplan"], res["greedy"]
    rows = []
    for slack, r, m in judged_cells(res):
        a, b = float(np.median(g["ratio"][m])), float(np.median(gr["ratio"][m]))
        if a <= b + 1e-12:
            continue
        cheaper, dearer = job_by_job(res, m)
        lo, hi = median_gap_interval(res, m)
        rows.append(f"| {name} | {slack:.0%} | {r:g} h | {int(m.sum())} | {cheaper} / {dearer} / "
                    f"{int(m.sum()) - cheaper - dearer} | {a:.3f} / {b:.3f} | {lo:+.3f} .. {hi:+.3f} | "
                    f"{float(np.mean(g['ratio'][m])):.3f} / {float(np.mean(gr['ratio'][m])):.3f} |")
    return rows
