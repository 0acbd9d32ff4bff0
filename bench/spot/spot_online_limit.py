"""How close to the omniscient bound can an online spot policy get? The spot benchmark on traces drawn from a model.

On the real traces nothing computable says what the best policy that does not know the future would pay. On
traces *drawn from a known model* something does: the online policy of least expected cost is the dynamic program
on that model, and gpuplan's slack-value program (scheduler/spot/slack_value.py) is that program for its own model of
a zone (runs of capacity and outages young for 30 minutes, then old, with the zone's mean run and mean outage).
So, per zone of each family, three worlds of the zone's length:

- ``real``: the zone's own trace; gpuplan estimates the rates online (as in bench/spot/spot.py).
- ``model``: drawn from the program's own chain with the zone's whole-trace mean run and mean outage, and gpuplan
  is told those two means: its model is then exactly the world's, so its program is the expected-cost-optimal
  online policy (up to the replay's honest costs, which the program prices at their expectation).
- ``shuffled``: the zone's own runs of capacity and outages, drawn with replacement in random order (the zone's
  exact spell lengths without its regimes or time of day); gpuplan is told the means. Its two-phase model is
  then close to, not exactly, the world's.

Same jobs (bench/spot/spot.py's grid), honest costs and omniscient bound in every world; greedy beside gpuplan. If
the expected-cost-optimal online policy stays well above 1.02 x the bound at the median in the ``model`` world,
the issue's goal is out of reach of a policy that minimises what a team pays, and the real traces' gap is not a
defect of the program's estimates.

    .venv/bin/python bench/spot/spot_online_limit.py --traces /work/spot-traces-full [--draws 2] [--seed 0]
    .venv/bin/python bench/spot/spot_online_limit.py --plot docs/img/spot-online-limit.png \
        --record bench/results/spot/online-limit-2026-12-04.md

Prints the tables (Markdown); docs/lab-notes/2026-12-04-spot-online-limit.md quotes them with this command. Minutes on a
2-core machine (the bounds of the real traces are cached by bench/spot/spot.py's cache).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spot import PRICES, bound, hindsight_rates, job_grid, options, spell_lengths  # noqa: E402
from spot_cells import JUDGED_SLACK, RESTARTS  # noqa: E402
from spot_families import Family, families, find_traces, role  # noqa: E402

from scheduler.sim.simulate import run_policy  # noqa: E402
from scheduler.sim.traces import Zones  # noqa: E402
from scheduler.spot.slack_value import DOWN_OLD, UP_OLD, UP_YOUNG, market_chain  # noqa: E402

WORLDS = ("real", "model", "shuffled")
POLICIES = ("gpuplan", "greedy")


def draw_model(mean_run_h: float, mean_outage_h: float, ticks: int, gap_h: float, start_up: bool,
               rng: np.random.Generator) -> np.ndarray:
    """Availability per tick drawn from the slack-value program's own four-state chain (young/old runs and
    outages), starting in an old spell of the real trace's first state."""
    one = market_chain(np.array([mean_run_h]), np.array([mean_outage_h]), np.array([gap_h]))[0]
    cum = np.cumsum(one, axis=1)
    cum[:, -1] = 1.0
    u = rng.random(ticks)
    state = UP_OLD if start_up else DOWN_OLD
    out = np.empty(ticks, dtype=bool)
    for t in range(ticks):
        out[t] = state <= UP_OLD
        state = int(np.searchsorted(cum[state], u[t], side="right"))
    assert UP_YOUNG < UP_OLD < DOWN_OLD  # the up states come first
    return out


def draw_shuffled(available: np.ndarray, gap_h: float, rng: np.random.Generator) -> np.ndarray:
    """The zone's own runs and outages (in ticks), drawn with replacement and alternated, to the trace's length."""
    runs = np.rint(spell_lengths(available, gap_h, True) / gap_h).astype(np.int64)
    outs = np.rint(spell_lengths(available, gap_h, False) / gap_h).astype(np.int64)
    runs, outs = runs[runs > 0], outs[outs > 0]
    up = bool(available[0])
    pieces: list[np.ndarray] = []
    n = 0
    while n < len(available):
        pool = runs if up else outs
        length = int(rng.choice(pool)) if len(pool) else len(available) - n
        pieces.append(np.full(length, up))
        n += length
        up = not up if (len(runs) and len(outs)) else up
    return np.concatenate(pieces)[: len(available)]


def means(z: Zones) -> tuple[float, float]:
    """One zone's whole-trace mean run of capacity and mean outage, hours."""
    (run,), (outage,) = hindsight_rates(z)
    return run, outage


def one_zone(z: Zones, available: np.ndarray) -> Zones:
    return Zones(names=z.names, gap_seconds=z.gap_seconds, available=available[None, :],
                 prices=np.full((1, len(available)), np.nan))


def worlds_of(fam: Family, draws: int, rng: np.random.Generator) -> dict[str, list[tuple[Zones, bool]]]:
    """Per world, the single-zone traces and whether gpuplan is told their means (the model's, or the drawn
    trace's own for ``shuffled``)."""
    out: dict[str, list[tuple[Zones, bool]]] = {w: [] for w in WORLDS}
    for z in fam.singles:
        out["real"].append((z, False))
        run, outage = means(z)
        av = z.available[0]
        for _ in range(draws):
            out["model"].append((one_zone(z, draw_model(run, outage, len(av), z.gap_h, bool(av[0]), rng)), True))
            out["shuffled"].append((one_zone(z, draw_shuffled(av, z.gap_h, rng)), True))
    return out


def run_world(fam: Family, traces: list[tuple[Zones, bool]],
              told: dict[int, tuple[float, float]]) -> dict[str, dict[str, np.ndarray]]:
    """Each policy's cost x bound, and the jobs' slack and restart, over every trace of one world."""
    keys = ("ratio", "slack", "restart")
    acc: dict[str, dict[str, list[np.ndarray]]] = {p: {k: [] for k in keys} for p in POLICIES}
    base = options(fam)
    for i, (zones, tell) in enumerate(traces):
        jobs = job_grid(zones)
        if jobs is None:
            continue
        omni = bound(zones, jobs, base.make_before_break)
        ok = np.isfinite(omni)
        slack = np.round(jobs.deadline_h / jobs.work_h - 1, 2)
        opts = base
        if tell:
            run, outage = told.get(i) or means(zones)
            opts = replace(base, mttp_h=(run,), mean_outage_h=(outage,))
        for p in POLICIES:
            o = run_policy(zones, jobs, p, PRICES, opts)
            assert o.deadline_met[ok].all(), f"{p} missed a deadline on {fam.name}"
            acc[p]["ratio"].append((o.cost_usd / omni)[ok])
            acc[p]["slack"].append(slack[ok])
            acc[p]["restart"].append(jobs.restart_h[ok])
    return {p: {k: np.concatenate(v) if v else np.zeros(0) for k, v in d.items()} for p, d in acc.items()}


def summary(res: dict[str, dict[str, np.ndarray]]) -> dict[str, float]:
    """Over the judged jobs (slack >= 20%): gpuplan's and greedy's median and mean x bound, each restart's
    median, and the share of (slack, restart) cells where gpuplan's median is within 1.02 / below greedy's."""
    g, gr = res["gpuplan"], res["greedy"]
    judged = g["slack"] >= JUDGED_SLACK
    out = {"jobs": float(judged.sum()),
           "g_med": float(np.median(g["ratio"][judged])), "gr_med": float(np.median(gr["ratio"][judged])),
           "g_mean": float(np.mean(g["ratio"][judged])), "gr_mean": float(np.mean(gr["ratio"][judged]))}
    within = below = cells = 0
    for r in RESTARTS:
        m = judged & (g["restart"] == r)
        out[f"g_{r:g}"] = float(np.median(g["ratio"][m])) if m.any() else float("nan")
        out[f"gr_{r:g}"] = float(np.median(gr["ratio"][m])) if m.any() else float("nan")
        for s in np.unique(g["slack"][m]):
            c = m & (g["slack"] == s)
            a, b = float(np.median(g["ratio"][c])), float(np.median(gr["ratio"][c]))
            cells += 1
            within += a <= 1.02
            below += a < b - 1e-12
    out.update(cells=cells, within=within, below=below)
    return out


HEADER = ["| family | world | jobs (slack >= 20%) | gpuplan / greedy median x bound | "
          + " | ".join(f"restart {r:g} h: gpuplan / greedy median" for r in RESTARTS)
          + " | gpuplan / greedy mean x bound | cells within 1.02 | cells below greedy |",
          "|---|---|---|---|" + "---|" * len(RESTARTS) + "---|---|---|"]


def row(name: str, world: str, s: dict[str, float]) -> str:
    per = " | ".join(f"{s[f'g_{r:g}']:.3f} / {s[f'gr_{r:g}']:.3f}" for r in RESTARTS)
    return (f"| {name} | {world} | {int(s['jobs'])} | {s['g_med']:.3f} / {s['gr_med']:.3f} | {per} | "
            f"{s['g_mean']:.3f} / {s['gr_mean']:.3f} | {int(s['within'])} / {int(s['cells'])} | "
            f"{int(s['below'])} / {int(s['cells'])} |")


def read_record(path: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """family -> world -> (gpuplan, greedy) median x bound, from a Markdown record of this script."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or cells[1] not in WORLDS or "/" not in cells[3]:
            continue
        g, gr = (float(x) for x in cells[3].split("/"))
        name = cells[0].replace("**", "").replace(" (tuning)", "").replace(" (held out)", "")
        out.setdefault(name, {})[cells[1]] = (g, gr)
    return out


def plot(record: dict[str, dict[str, tuple[float, float]]], path: Path) -> None:
    """Per family, gpuplan's median x bound in each world beside greedy's, and the issue's 1.02."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(record)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.13
    colors = {"real": "#1f77b4", "model": "#d62728", "shuffled": "#9467bd"}
    for i, world in enumerate(WORLDS):
        xs = [j + (i - 1) * 2 * width for j in range(len(names))]
        ax.bar([x - width / 2 for x in xs], [record[n][world][0] - 1 for n in names], width, color=colors[world],
               label=f"gpuplan, {world}" + (" (the expected-cost optimum)" if world == "model" else ""))
        ax.bar([x + width / 2 for x in xs], [record[n][world][1] - 1 for n in names], width, color=colors[world],
               alpha=0.35, label=f"greedy, {world}")
    ax.axhline(0.02, color="black", linestyle="--", linewidth=1, label="issue 13's goal: 1.02 x bound")
    labels = [n.replace(" ", "\n", 1).replace(" availability", " avail.").replace(" preemption", " preempt.")
              for n in names]
    ax.set_xticks(range(len(names)), labels, fontsize=7)
    ax.set_ylabel("median cost x omniscient bound - 1")
    ax.set_title("Jobs with slack >= 20%: real traces, traces drawn from the policy's own model, shuffled spells")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", help="the spot-traces collection (default: shared/data/spot-traces above)")
    parser.add_argument("--holdout-family", action="append", default=[],
                        help="run only families whose name contains this (repeatable)")
    parser.add_argument("--draws", type=int, default=2, help="synthetic traces per zone and world (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw a record (--record) as a bar chart; no run")
    parser.add_argument("--record", type=Path, help="a Markdown record of this script, for --plot")
    args = parser.parse_args()
    if args.plot:
        if not args.record:
            parser.error("--plot needs --record RECORD.md")
        plot(read_record(args.record), args.plot)
        print(f"wrote {args.plot}")
        return 0
    root = Path(args.traces) if args.traces else find_traces()
    if root is None or not root.is_dir():
        print("spot traces not found (shared/data/spot-traces); skipping")
        return 0
    fams = [f for f in families(root) if not args.holdout_family or any(h in f.name for h in args.holdout_family)]
    rng = np.random.default_rng(args.seed)
    print("\n".join(HEADER), flush=True)
    pooled: dict[str, list[dict[str, dict[str, np.ndarray]]]] = {w: [] for w in WORLDS}
    for fam in fams:
        worlds = worlds_of(fam, args.draws, rng)
        # the model world's policy is told the chain's own means, not the drawn trace's estimate of them
        told = {i: means(fam.singles[i // args.draws]) for i in range(len(worlds["model"]))}
        for w in WORLDS:
            res = run_world(fam, worlds[w], told if w == "model" else {})
            pooled[w].append(res)
            print(row(role(fam.name), w, summary(res)), flush=True)
    for w in WORLDS:
        res = {p: {k: np.concatenate([r[p][k] for r in pooled[w]]) for k in ("ratio", "slack", "restart")}
               for p in POLICIES}
        print(row("**all families**", w, summary(res)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
