"""The planner's CPU throughput against measured `gpuplan run` on the machine this runs on.

    .venv/bin/python bench/accuracy/cpu_accuracy.py --measure --fit   # run the cases, fit, write the report
    .venv/bin/python bench/accuracy/cpu_accuracy.py                   # re-predict the stored measurements only

Reads bench/accuracy/cpu_cases.yaml. ``--measure`` runs every case through ``workers.executors.local_runner.run_local``
(what ``gpuplan run`` does: in-process, fp32, the executor's thread count) and measures the CPU probe
(catalog.local_cpu: fp32 matmul GFLOP/s and copy GB/s) right before and after each run, so a
prediction uses the rates the machine had while that case ran (a shared box's load moves them);
results go to bench/results/cpu/<host>.json. ``--fit`` fits the CPU efficiency factor (the fraction
of the probe's matmul rate a training step's matmuls reach, ``mfu_max.fp32``) on the non-holdout
cases only and writes planner/calibration_cpu.json. The report replaces the CPU section of
docs/lab-notes/accuracy-report.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from catalog.local_cpu import (  # noqa: E402
    CpuProbe,
    cpu_model_name,
    machine_key,
    measure_cpu,
    ram_bytes,
    training_threads,
)
from commands.specfile import load_spec  # noqa: E402
from planner.calibration import (  # noqa: E402
    CPU_CALIBRATION_NAME,
    DEFAULT_CALIBRATION_PATH,
    CpuCalibration,
    load_calibration,
)
from planner.spec import JobSpec, spec_from_dict  # noqa: E402

CASES = ROOT / "bench" / "accuracy" / "cpu_cases.yaml"
SECTION = "<!-- cpu-accuracy: written by bench/accuracy/cpu_accuracy.py -->"
GOAL = 0.25  # every case, fitted or held out, within 25% of measured tokens/s


def load_cases(workdir: Path) -> list[tuple[dict[str, Any], JobSpec]]:
    out = []
    for case in yaml.safe_load(CASES.read_text())["cases"]:
        if "spec" in case:
            spec = load_spec(str(ROOT / case["spec"]))
        else:
            model: Any = case.get("model")
            if "config" in case:
                path = workdir / f"{case['id']}.json"
                path.write_text(json.dumps(case["config"]))
                model = {"config": str(path)}
            spec = spec_from_dict({"name": case["id"], "task": "train", "model": model, "train": case["train"]})
        out.append((case, spec))
    return out


def probe_now(threads: int) -> CpuProbe:
    cores = os.cpu_count() or 1
    gflops, gbps = measure_cpu(threads)
    return CpuProbe(machine=machine_key(cores, cpu_model_name()), model_name=cpu_model_name(), cores=cores,
                    threads=threads, ram_bytes=ram_bytes()[0], fp32_gflops=round(gflops, 2),
                    memory_gbps=round(gbps, 2), measured_s=0.0)


def mean_probe(a: CpuProbe, b: CpuProbe) -> CpuProbe:
    return CpuProbe(**{**a.__dict__, "fp32_gflops": round((a.fp32_gflops + b.fp32_gflops) / 2, 2),
                       "memory_gbps": round((a.memory_gbps + b.memory_gbps) / 2, 2)})


class TrainingClock:
    """The training thread's own CPU clock at each new step ``run_local`` reports: tokens per CPU
    second of that thread are what the run does while it has its core, whatever else runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[int, int, int, float]] = []  # (step, total steps, tokens, thread CPU s)

    def __call__(self, status: Any) -> None:
        thread = next((t for t in threading.enumerate() if t.name.startswith("gpuplan-")), None)
        p = status.progress
        if thread is None or thread.ident is None or (self.samples and self.samples[-1][0] == p.step):
            return
        with contextlib.suppress(OSError, ProcessLookupError):  # the thread ended between the two calls
            cpu = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
            self.samples.append((p.step, p.total_steps, p.tokens, cpu))

    def tokens_per_cpu_s(self) -> float | None:
        """Over the steps after the first and before the last (the final checkpoint blocks)."""
        inner = [s for s in self.samples if 1 <= s[0] < s[1]]
        if len(inner) < 2 or inner[-1][3] <= inner[0][3]:
            return None
        return (inner[-1][2] - inner[0][2]) / (inner[-1][3] - inner[0][3])


def measure(workdir: Path) -> list[dict[str, Any]]:
    from workers.executors.local_runner import plan_locally, run_local

    threads = training_threads()
    rows = []
    for case, spec in load_cases(workdir):
        before = probe_now(threads)
        load_before = os.getloadavg()[0]
        clock = TrainingClock()
        run = run_local(spec, checkpoint_dir=workdir / "ckpt" / case["id"], home=workdir / "home", on_status=clock,
                        poll_s=0.1)
        after = probe_now(threads)
        m = run.status.metrics
        plan = plan_locally(spec, home=workdir / "home")
        rows.append({"id": case["id"], "holdout": bool(case.get("holdout")), "status": run.status.state.value,
                     "steps": run.status.progress.step, "wall_s": round(run.wall_s, 2),
                     "measured_tokens_per_s": clock.tokens_per_cpu_s(),
                     "measured_wall_tokens_per_s": m.get("measured_tokens_per_s"),
                     "strategy": plan.strategy.model_dump(mode="json"),
                     "probe_before": before.__dict__, "probe_after": after.__dict__,
                     "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]})
        print(f"{case['id']}: {m.get('measured_tokens_per_s')} tokens/s measured, probe "
              f"{before.fp32_gflops}->{after.fp32_gflops} GFLOP/s, load {rows[-1]['load_avg_1m']}", flush=True)
    return rows


def predict(row: dict[str, Any], spec: JobSpec, cal: CpuCalibration) -> float:
    from catalog.local_cpu import cpu_spec
    from planner.throughput_train import train_throughput
    from planner.types import Strategy
    from workers.model.build import resolve_model_source

    probe = mean_probe(CpuProbe(**row["probe_before"]), CpuProbe(**row["probe_after"]))
    gpu = cpu_spec(probe, today=date.today())
    model = resolve_model_source(spec).config
    assert spec.train is not None
    strategy = Strategy.model_validate(row["strategy"])
    return train_throughput(model, strategy, spec.train.seq_len, gpu, cal.throughput).tokens_per_s


def fit(rows: list[dict[str, Any]], specs: dict[str, JobSpec], base: CpuCalibration) -> CpuCalibration:
    """The efficiency factor minimising the squared log error over the non-holdout cases."""
    fitting = [r for r in rows if not r["holdout"] and r["measured_tokens_per_s"]]

    def with_eff(e: float) -> CpuCalibration:
        thr = base.throughput.model_copy(update={"mfu_max": {**base.throughput.mfu_max, "fp32": e}})
        return base.model_copy(update={"throughput": thr})

    def loss(e: float) -> float:
        cal = with_eff(e)
        return sum(math.log(predict(r, specs[r["id"]], cal) / r["measured_tokens_per_s"]) ** 2 for r in fitting)

    lo, hi = 0.02, 1.5  # golden-section search: the loss is unimodal in the factor
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if loss(a) < loss(b):
            hi = b
        else:
            lo = a
    eff = round((lo + hi) / 2, 4)
    return with_eff(eff).model_copy(update={
        "source": f"bench/accuracy/cpu_accuracy.py --fit on {len(fitting)} non-holdout cases measured on "
                  f"{rows[0]['probe_before']['model_name']} ({date.today()}); results bench/results/cpu/",
        "fitted_on": sorted(r["id"] for r in fitting)})


def report(rows: list[dict[str, Any]], specs: dict[str, JobSpec], cal: CpuCalibration, results: Path) -> str:
    lines = [SECTION, "", "## This machine's CPU (the $0 local placement)", "",
             "Produced by `python bench/accuracy/cpu_accuracy.py --measure --fit` on "
             f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC "
             f"on {socket.gethostname()}: measurements in `{results.relative_to(ROOT)}`, calibration in "
             f"`planner/{CPU_CALIBRATION_NAME}` (efficiency factor {cal.throughput.mfu_max['fp32']:.3f} of the "
             f"probe's fp32 matmul rate, fitted on {', '.join(cal.fitted_on) or 'nothing'}; holdout cases "
             "never fitted).",
             "",
             "Each case is a real `gpuplan run` (in-process, fp32, the executor's thread count). This machine is "
             "shared by several engineers' test runs (the 1-minute load average before / after each case is shown; "
             "it has 2 cores), so wall-clock rates swing with their load. Both sides are therefore taken per CPU "
             "second, the rate the part has while it runs, like a datasheet's: the probe (catalog/local_cpu.py) "
             "times its matmuls and copies by CPU time, and measured tokens/s is tokens per CPU second of the "
             "training thread between the first and the last step (its wall-clock rate, shown too, is what the "
             "load left it). The prediction is the planner's for the same strategy on the CPU spec of the probes "
             "taken right before and after that case.", "",
             "| case | holdout | strategy | probe GFLOP/s | probe GB/s | load | wall tok/s | measured tok/s "
             "| predicted tok/s | err |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for r in rows:
        measured = r["measured_tokens_per_s"]
        if not measured:
            lines.append(f"| {r['id']} | {'yes' if r['holdout'] else ''} | - | - | - | - | - | {r['status']} | - | - |")
            continue
        pred = predict(r, specs[r["id"]], cal)
        err = (pred - measured) / measured
        worst = max(worst, abs(err))
        before, after = r["probe_before"], r["probe_after"]
        s = r["strategy"]
        lines.append(f"| {r['id']} | {'yes' if r['holdout'] else ''} | fp32 mb={s['micro_batch']} "
                     f"| {before['fp32_gflops']:.1f} / {after['fp32_gflops']:.1f} "
                     f"| {before['memory_gbps']:.1f} / {after['memory_gbps']:.1f} "
                     f"| {r['load_avg_1m'][0]:.1f} / {r['load_avg_1m'][1]:.1f} "
                     f"| {r['measured_wall_tokens_per_s'] or 0:,.0f} | {measured:,.0f} | {pred:,.0f} | {err:+.1%} |")
    lines += ["", f"Goal: every case within {GOAL:.0%} of measured: worst {worst:.1%} "
              f"({'met' if worst <= GOAL else 'NOT met'}).", ""]
    return "\n".join(lines)


def write_section(path: Path, section: str) -> None:
    old = path.read_text() if path.is_file() else ""
    head = old[:old.index(SECTION)].rstrip("\n") if SECTION in old else old.rstrip("\n")
    path.write_text((head + "\n\n" if head else "") + section)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measure", action="store_true", help="run every case here (minutes) before predicting")
    ap.add_argument("--fit", action="store_true", help="fit planner/calibration_cpu.json on non-holdout cases")
    ap.add_argument("--results", default=str(ROOT / "bench" / "results" / "cpu" / f"{socket.gethostname()}.json"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "lab-notes" / "accuracy-report.md"))
    args = ap.parse_args()
    results = Path(args.results)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        specs = {case["id"]: spec for case, spec in load_cases(workdir)}
        if args.measure:
            rows = measure(workdir)
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps(rows, indent=1) + "\n")
        rows = json.loads(results.read_text())
        cal = load_calibration().cpu
        if args.fit:
            cal = fit(rows, specs, cal)
            path = DEFAULT_CALIBRATION_PATH.with_name(CPU_CALIBRATION_NAME)
            path.write_text(json.dumps(cal.model_dump(mode="json"), indent=1) + "\n")
        text = report(rows, specs, cal, results)
    write_section(Path(args.out), text)
    print(text)


if __name__ == "__main__":
    main()
