"""Spot policy benchmark on the real traces of "Can't Be Late" (Wu et al., NSDI 2024).

Reads ../shared/data/spot-traces (never copied into the repo); exits 0 with a message when absent.
Updates the results section of docs/SPOT.md (between its markers) and docs/img/spot-*.png.

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
TUNE_BETA = (0.2, 0.3, 0.5, 0.75, 1.0)
TUNE_CAP = (2.0, 3.0, 4.0, 6.0, 8.0, float("inf"))
TUNE_RETURN = (0.0, 1.0, 2.0)
BEGIN = "<!-- bench/spot.py results: begin -->"
END = "<!-- bench/spot.py results: end -->"
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


def downsample(zones: Zones, factor: int) -> Zones:
    """Merge ``factor`` ticks into one, available only if all of them were (keeps the DP small)."""
    ticks = zones.ticks // factor * factor
    avail = zones.available[:, :ticks].reshape(len(zones.names), -1, factor).all(axis=2)
    prices = zones.prices[:, :ticks].reshape(len(zones.names), -1, factor).mean(axis=2)
    return Zones(names=zones.names, gap_seconds=zones.gap_seconds * factor, available=avail, prices=prices)


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
        zones = downsample(align([load_trace(path)]), 5)
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
    for beta, cap, ret in itertools.product(TUNE_BETA, TUNE_CAP, TUNE_RETURN):
        params = PolicyParams(reserve_fraction=beta, reserve_cap_h=cap, return_restarts=ret)
        ratios, met = [], []
        for case, jobs, omni in prepared:
            out = run_policy(case.zones, jobs, "gpuplan", PRICES, SimOptions(params=params))
            ratios.append(out.cost_usd / omni)
            met.append(out.deadline_met)
        r = np.concatenate(ratios)
        results.append((float(np.median(r)), float(r.mean()), bool(np.concatenate(met).all()), beta, cap, ret))
        print(f"reserve_fraction={beta} reserve_cap_h={cap} return_restarts={ret}: median {results[-1][0]:.4f} "
              f"mean {results[-1][1]:.4f} all met {results[-1][2]}", flush=True)
    results.sort(key=lambda x: x[0] + x[1])
    print("best (by median + mean ratio):", results[:5])



def ratio_stats(ratios: np.ndarray) -> tuple[float, float, float]:
    return float(np.median(ratios)), float(np.mean(ratios)), float(np.percentile(ratios, 90))


def fmt(x: float) -> str:
    return f"{x:.3f}"


def run_split(
    prepared: list[tuple[Case, Jobs, np.ndarray]], opts: SimOptions | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """policy -> {ratio, cost, met, slack, restart, lost, preempt} over every job of the split."""
    out: dict[str, dict[str, list[np.ndarray]]] = {}
    for case, jobs, omni in prepared:
        for policy in POLICIES:
            o = run_policy(case.zones, jobs, policy, PRICES, opts or SimOptions())
            d = out.setdefault(policy, {k: [] for k in ("ratio", "cost", "met", "slack", "restart", "lost", "pre")})
            d["ratio"].append(o.cost_usd / omni)
            d["cost"].append(o.cost_usd)
            d["met"].append(o.deadline_met)
            d["slack"].append(np.round(jobs.deadline_h / jobs.work_h - 1, 2))
            d["restart"].append(jobs.restart_h)
            d["lost"].append(o.work_lost_h)
            d["pre"].append(o.preemptions.astype(float))
        d = out.setdefault("omniscient", {k: [] for k in ("ratio", "cost", "met", "slack", "restart", "lost", "pre")})
        d["ratio"].append(np.ones(len(jobs)))
        d["cost"].append(omni)
        d["met"].append(np.isfinite(omni))
        d["slack"].append(np.round(jobs.deadline_h / jobs.work_h - 1, 2))
        d["restart"].append(jobs.restart_h)
        d["lost"].append(np.zeros(len(jobs)))
        d["pre"].append(np.zeros(len(jobs)))
    return {p: {k: np.concatenate(v) for k, v in d.items()} for p, d in out.items()}


def policy_table(res: dict[str, dict[str, np.ndarray]]) -> list[str]:
    od = res["on-demand"]["cost"]
    lines = ["| policy | jobs | deadlines met | median x bound | mean x bound | p90 x bound | median $ "
             "| saving vs on-demand (median) |", "|---|---|---|---|---|---|---|---|"]
    for policy in ("omniscient", "gpuplan", "greedy", "uniform-progress", "on-demand", "spot-only"):
        d = res[policy]
        med, mean, p90 = ratio_stats(d["ratio"])
        saving = float(np.median(1 - d["cost"] / od))
        lines.append(f"| {policy} | {len(d['ratio'])} | {d['met'].mean():.1%} | {fmt(med)} | {fmt(mean)} "
                     f"| {fmt(p90)} | {np.median(d['cost']):.2f} | {saving:.1%} |")
    return lines


def cell_table(res: dict[str, dict[str, np.ndarray]]) -> tuple[list[str], int, int]:
    """Median x bound of gpuplan and greedy per (slack, restart) cell; counts cells within 1.10 and below greedy."""
    g, gr = res["gpuplan"], res["greedy"]
    lines = ["| slack \\ restart | " + " | ".join(f"{r:g} h" for r in RESTARTS) + " |",
             "|---|" + "---|" * len(RESTARTS)]
    ok_bound = ok_greedy = 0
    for slack in SLACKS:
        cells = []
        for r in RESTARTS:
            m = (g["slack"] == slack) & (g["restart"] == r)
            a, b = float(np.median(g["ratio"][m])), float(np.median(gr["ratio"][m]))
            ok_bound += a <= 1.10
            ok_greedy += a <= b + 1e-12
            cells.append(f"{a:.3f} / {b:.3f}")
        lines.append(f"| {slack:.0%} | " + " | ".join(cells) + " |")
    return lines, ok_bound, ok_greedy


def plot_ratios(res: dict[str, dict[str, np.ndarray]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for policy, color in (("gpuplan", "#1f77b4"), ("greedy", "#ff7f0e"), ("uniform-progress", "#9467bd"),
                          ("on-demand", "#d62728")):
        r = np.sort(res[policy]["ratio"])
        a.plot(r, np.arange(1, len(r) + 1) / len(r), label=policy, color=color)
        meds = [float(np.median(res[policy]["ratio"][res[policy]["slack"] == s])) for s in SLACKS]
        b.plot([s * 100 for s in SLACKS], meds, "o-", label=policy, color=color)
    a.set_xlabel("cost / omniscient bound")
    a.set_ylabel("share of jobs")
    a.set_xlim(0.98, 2.0)
    a.axvline(1.10, color="grey", linestyle=":", linewidth=1)
    a.legend(fontsize=8)
    a.set_title(f"{title}: CDF of cost ratio", fontsize=10)
    b.set_xlabel("slack (% of job length)")
    b.set_ylabel("median cost / bound")
    b.axhline(1.10, color="grey", linestyle=":", linewidth=1)
    b.set_title(f"{title}: median by slack", fontsize=10)
    b.legend(fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


def design_table(all_cases: list[Case]) -> list[str]:
    """The reference setting: 48 h job, deadlines 52/70/92 h, 0.2 h restart, every availability zone (all dates)."""
    lines = ["| zone | availability | greedy median x bound | gpuplan median x bound | gpuplan saving vs on-demand |",
             "|---|---|---|---|---|"]
    for path in sorted(AVAIL.glob("*.json")):
        zones = align([load_trace(path)])
        starts = np.arange(0, zones.ticks - int(93 / zones.gap_h), int(24 / zones.gap_h))
        grid = list(itertools.product(starts.tolist(), (52.0, 70.0, 92.0)))
        jobs = Jobs.make([g[0] for g in grid], WORK_H, [g[1] for g in grid], 0.2)
        cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
        key = f"design|{path.stem}|{len(jobs)}"
        if key not in cache:
            cache[key] = omniscient(zones, jobs, PRICES, resolution=1).cost_usd.tolist()
            CACHE.write_text(json.dumps(cache))
        omni = np.asarray(cache[key])
        greedy = run_policy(zones, jobs, "greedy", PRICES).cost_usd
        ours = run_policy(zones, jobs, "gpuplan", PRICES)
        od = run_policy(zones, jobs, "on-demand", PRICES).cost_usd
        assert ours.deadline_met.all()
        lines.append(f"| {zone_name(path)} | {zones.available.mean():.0%} | {np.median(greedy / omni):.3f} | "
                     f"{np.median(ours.cost_usd / omni):.3f} | {np.median(1 - ours.cost_usd / od):.0%} |")
    return lines


def multi_zone() -> list[str]:
    """All nine zones as one pool to fall back across (starts every 48 h, 70 h deadline)."""
    zones = align([load_trace(p) for p in sorted(AVAIL.glob("*.json"))])
    starts = np.arange(0, zones.ticks - int(93 / zones.gap_h), int(48 / zones.gap_h))
    jobs = Jobs.make(starts, WORK_H, 70.0, 0.2)
    cache = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    key = f"multi|{len(jobs)}"
    if key not in cache:
        cache[key] = omniscient(zones, jobs, PRICES, resolution=1).cost_usd.tolist()
        CACHE.write_text(json.dumps(cache))
    omni = np.asarray(cache[key])
    lines = ["| policy | deadlines met | median x bound | median $ | preemptions (median) |", "|---|---|---|---|---|"]
    for policy in ("gpuplan", "greedy", "uniform-progress", "on-demand", "spot-only"):
        o = run_policy(zones, jobs, policy, PRICES)
        lines.append(f"| {policy} | {o.deadline_met.mean():.0%} | {np.median(o.cost_usd / omni):.3f} | "
                     f"{np.median(o.cost_usd):.2f} | {np.median(o.preemptions):.0f} |")
    lines.append(f"| omniscient | 100% | 1.000 | {np.median(omni):.2f} | 0 |")
    return lines


def speed() -> list[str]:
    zones = align([load_trace(p) for p in sorted(AVAIL.glob("*.json"))])
    rng = np.random.default_rng(0)
    horizon = int(93 / zones.gap_h)
    starts = np.sort(rng.integers(0, zones.ticks - horizon, 1000))
    work = rng.uniform(4.0, 48.0, 1000)
    jobs = Jobs.make(starts, work, work * rng.uniform(1.1, 1.9, 1000), rng.choice(RESTARTS, 1000))
    lines = ["| policy | jobs | zones | trace | wall s |", "|---|---|---|---|---|"]
    for policy in ("gpuplan", "greedy", "uniform-progress", "spot-only"):
        t0 = time.perf_counter()
        o = run_policy(zones, jobs, policy, PRICES)
        wall = time.perf_counter() - t0
        if policy != "spot-only":
            assert o.deadline_met.all()
        lines.append(f"| {policy} | {len(jobs)} | {len(zones.names)} | {zones.hours / 24:.1f} days | {wall:.2f} |")
    return lines


def checkpoint_variant(prepared: list[tuple[Case, Jobs, np.ndarray]]) -> list[str]:
    """Checkpoints that cost 3 minutes, every Young/Daly interval (no free just-in-time checkpoint)."""
    res = run_split(prepared, SimOptions(checkpoint_cost_h=0.05))
    lines = ["| policy | deadlines met | median x bound | mean x bound | work lost h (mean) |", "|---|---|---|---|---|"]
    for policy in ("gpuplan", "greedy", "uniform-progress"):
        d = res[policy]
        med, mean, _ = ratio_stats(d["ratio"])
        lines.append(f"| {policy} | {d['met'].mean():.1%} | {fmt(med)} | {fmt(mean)} | {d['lost'].mean():.2f} |")
    return lines


def benchmark(out_md: Path, img_dir: Path) -> None:
    t_start = time.time()
    all_cases = cases()
    prepared: dict[str, list[tuple[Case, Jobs, np.ndarray]]] = {"tune": [], "held-out": []}
    for case in all_cases:
        jobs = job_grid(case)
        print(f"omniscient bound: {case.name} ({len(jobs)} jobs)", flush=True)
        prepared[case.split].append((case, jobs, omniscient_costs(case, jobs)))
    held_feb = [p for p in prepared["held-out"] if "Apr" not in p[0].name]
    held_apr = [p for p in prepared["held-out"] if "Apr" in p[0].name]
    results = {"tune": run_split(prepared["tune"]), "held-out Feb (other zones, days 23-45)": run_split(held_feb),
               "held-out Apr (other week, 4 zones)": run_split(held_apr)}
    held_all = run_split(prepared["held-out"])
    img_dir.mkdir(parents=True, exist_ok=True)
    plot_ratios(held_all, img_dir / "spot-ratios-heldout.png", "held-out")
    plot_ratios(results["tune"], img_dir / "spot-ratios-tune.png", "tuning split")
    print("design table", flush=True)
    design = design_table(all_cases)
    print("multi-zone", flush=True)
    multi = multi_zone()
    print("speed", flush=True)
    spd = speed()
    print("checkpoint variant", flush=True)
    ckpt = checkpoint_variant(held_feb)
    cells, ok_bound, ok_greedy = cell_table(held_all)
    n_cells = len(SLACKS) * len(RESTARTS)
    p = DEFAULT_PARAMS
    md = [
        "# Spot economics: policies on real spot traces",
        "",
        "Generated by `.venv/bin/python bench/spot.py` "
        f"(wall time {time.time() - t_start:.0f} s on this 2-core machine, shared with other work).",
        "",
        "Traces: the AWS spot availability traces published with *Can't Be Late: Optimizing Spot Instance Savings "
        "under Deadlines* (Zhanghao Wu, Wei-Lin Chiang, Ziming Mao, Zongheng Yang, Eric Friedman, Scott Shenker, "
        "Ion Stoica; NSDI 2024), from skypilot-org/spot-traces: p3.2xlarge (1 x V100) in 9 zones, Feb 2023, "
        "195 s ticks, 45 days; and 4 zones, Apr 2023, 32 s ticks, 7 days (merged here 5 ticks -> 1, available "
        "only if all five were, so the bound's dynamic program stays small). Read from ../shared, not copied.",
        "",
        "Setup: a 48 h job (single node); deadlines with 10/30/50/70/90% slack; restart/changeover delays "
        "0.02/0.1/0.2/0.4 h; on-demand $3.06/h, spot $0.92/h; one arrival every 24 h (Feb) or 12 h (Apr); "
        "checkpoints free (just-in-time on the 2-minute notice) unless said otherwise. Cost is billed for every hour "
        "an instance is held, restarts included. `x bound` = cost / the omniscient lower bound (a dynamic program "
        "over ticks x market x progress that knows the future trace; checked equal to brute force on small cases "
        "in tests/scheduler/test_simulate.py).",
        "",
        f"Policy `gpuplan` = safety net + reserve of {p.reserve_fraction:.0%} of the initial slack (at most "
        f"{p.reserve_cap_h:g} h), shrinking "
        "linearly to the deadline (idle while above it when spot is gone; on-demand below it), stay on spot while "
        f"it lasts, go back from on-demand to spot when the slack covers two changeovers (+{p.return_margin_h} h). "
        "Tuned (grid search, `bench/spot.py --tune`) on the tuning split only: first half (days 0-22) of zones "
        f"{', '.join(TUNE_ZONES)}.",
        "",
        "## Held-out results (the numbers that count)",
        "",
    ]
    for name, res in results.items():
        if name != "tune":
            md += [f"### {name}", "", *policy_table(res), ""]
    md += [
        "![cost ratio on held-out traces](img/spot-ratios-heldout.png)",
        "",
        "### Per deadline slack and restart delay (held-out, both collections)",
        "",
        "Median x bound, `gpuplan / greedy`:",
        "",
        *cells,
        "",
        f"gpuplan's median is within 1.10 x the bound in {ok_bound}/{n_cells} cells and at or below greedy's in "
        f"{ok_greedy}/{n_cells} cells.",
        "",
        "## The reference setting (48 h job, deadlines 52/70/92 h, 0.2 h restart; all 45 days, every zone)",
        "",
        *design,
        "",
        "## Nine zones as one pool (fallback across zones and regions; deadline 70 h, restart 0.2 h)",
        "",
        *multi,
        "",
        "## Checkpoints that cost 3 minutes (Young/Daly interval from each zone's observed mean time to "
        "preemption; held-out Feb)",
        "",
        *ckpt,
        "",
        "## Speed: 45 days x 9 zones x 1000 jobs",
        "",
        "1000 jobs (4-48 h of work, 10-90% slack, restarts 0.02-0.4 h) arriving over the 45 days, 9 zones to fall "
        "back across, one `run_policy` call each (numpy over jobs, jobs advance in lock-step on their own clocks):",
        "",
        *spd,
        "",
        "The omniscient bound is not part of this timing (it is a dynamic program, seconds per group of jobs).",
        "",
        "## Tuning split (for reference; the policy was fitted here)",
        "",
        *policy_table(results["tune"]),
        "",
        "![cost ratio on the tuning split](img/spot-ratios-tune.png)",
        "",
    ]
    text = "\n".join(md[2:])  # the doc has its own title
    doc = out_md.read_text() if out_md.exists() else f"# Spot economics\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc or END not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    out_md.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {out_md}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tune", action="store_true", help="grid search on the tuning split")
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "docs" / "SPOT.md"), help="Markdown to update (between markers)")
    args = parser.parse_args()
    if not AVAIL.is_dir():
        print(f"spot traces not found at {TRACES}; skipping the spot benchmark")
        return 0
    if args.tune:
        tune()
    elif args.speed_only:
        print("\n".join(speed()))
    else:
        benchmark(Path(args.out), ROOT / "docs" / "img")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
