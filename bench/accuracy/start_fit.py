"""A job's start, from the GPU acceptance records: what `gpuplan run` spends beyond its steady work.

For every successful case of bench/results/acceptance/*.json (kill-resume left out: two attempts):

  training   wall (the CLI, end to end) - tokens / steady tokens/s - the plan's state terms (the checkpoint
             buffer pinned, the last checkpoint written: planner.placement.train_start_s less its fixed part)
  inference  wall (the CLI) - (the run's wall - the model's load)   (the run's wall less the load is what the
             plan already prices: the requests and the compiled decoder's capture)

The medians over the runs up to --fit-until (a run number) are the calibration's train_start_s and
infer_start_s; later runs are held out and printed against the plan's start.

    .venv/bin/python bench/accuracy/start_fit.py                 # fit on runs <= 25, check the rest
    .venv/bin/python bench/accuracy/start_fit.py --fit-until 99  # every run
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def run_number(path: Path) -> int:
    found = re.search(r"_run(\d+)", path.name)
    return int(found.group(1)) if found else -1


def residuals(folder: Path) -> list[dict[str, Any]]:
    """One row per successful case: its run, task and the start seconds it shows."""
    from catalog.params import count_params
    from catalog.schema import ModelConfig
    from planner.calibration import load_calibration
    from planner.placement import train_start_s
    from planner.types import Strategy

    cal = load_calibration()
    rows: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*_run*.json"), key=run_number):
        for case in json.loads(path.read_text()).get("cases", []):
            run = case.get("run") or {}
            if (run.get("status") != "succeeded" or case["case"] == "kill-resume" or not case.get("wall_s")
                    or "planner_inputs" not in run):  # records before 2026-12-03 lack what the plan was made from
                continue
            row = {"run": run_number(path), "case": case["case"], "task": run.get("task")}
            if run.get("task") == "infer":
                log = " ".join((case.get("extra") or {}).get("log_tail", []))
                load = re.search(r"model load ([\d.]+) s", log)
                if load is None:
                    continue
                row["start_s"] = case["wall_s"] - (run["wall_s"] - float(load.group(1)))
            else:
                measured = run["measured"]
                model = ModelConfig.model_validate(run["planner_inputs"]["model"])
                planned = train_start_s(count_params(model), Strategy.model_validate(run["strategy"]), cal)
                steady = run["tokens"] / measured["tokens_per_s"]
                row["start_s"] = case["wall_s"] - steady - (planned - cal.cost.train_start_s)
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=ROOT / "bench" / "results" / "acceptance")
    parser.add_argument("--fit-until", type=int, default=25, help="runs up to this number are fitted on")
    args = parser.parse_args()
    from planner.calibration import load_calibration

    cost = load_calibration().cost
    rows = residuals(args.records)
    for task, shipped in (("train", cost.train_start_s), ("infer", cost.infer_start_s)):
        fit = [r for r in rows if (r["task"] == "infer") == (task == "infer") and r["run"] <= args.fit_until]
        held = [r for r in rows if (r["task"] == "infer") == (task == "infer") and r["run"] > args.fit_until]
        median = statistics.median(r["start_s"] for r in fit)
        cases = len({r["case"] for r in fit})
        print(f"{task}: median start {median:.1f} s over {len(fit)} case runs ({cases} cases) "
              f"(range {min(r['start_s'] for r in fit):.1f}-{max(r['start_s'] for r in fit):.1f}); "
              f"calibration.json has {shipped:.1f}")
        for r in held:
            print(f"  held out: run {r['run']} {r['case']}: {r['start_s']:.1f} s (planned {shipped:.1f}, "
                  f"{r['start_s'] - shipped:+.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
