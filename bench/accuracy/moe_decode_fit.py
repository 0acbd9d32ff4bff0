"""Fit and check the planner's decode step of a mixture of experts under both of generate()'s expert kernels.

Reads ``bench/probes/moe_decode_probe.py impl`` records (each batch timed with transformers' batched_mm and with
grouped_mm kept as the workers keep it, alternating) and prints, per model and batch, the measured and predicted step of
each kernel, the kernel the workers' rule picks (planner.decoder.moe_decode_kernel) and the faster one measured.

``--runs``: ``bench/accuracy/gpu_acceptance.py`` records; their MoE inference cases that kept grouped_mm are the
workers' own timings through ``gpuplan run`` (steady tokens/s, prefill included).

``--fit-model``: the model whose grouped_mm timings fit ``decode_grouped_layer_s``: the median, over every timing
(each alternation of the probe, each worker run), of the host cost per sparse layer that closes the gap to the
prediction without it. A decode step there is host-bound, and the host's speed moved 2x between calls
(``host_python_loop_2m_s``), hence one median over every timing. Every other model is held out. The constant is
planner/calibration.py's default; this script prints it, it does not write it.

    python bench/accuracy/moe_decode_fit.py bench/results/workers/moe_decode_impl_oss_2026-12-03b.json \\
        bench/results/workers/moe_decode_impl_qwen3_2026-12-03b.json --fit-model gpt-oss-20b \\
        --runs bench/results/acceptance/2026-12-03_run13_a.json bench/results/acceptance/2026-12-03_run13_c.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN_PROMPT, RUN_OUTPUT = 512, 64  # bench/accuracy/gpu_acceptance.py's MoE inference cases
sys.path.insert(0, str(ROOT))

from catalog.loader import load_catalog  # noqa: E402
from catalog.schema import GpuSpec, ModelConfig  # noqa: E402
from planner.calibration import ThroughputCalibration, load_calibration  # noqa: E402
from planner.decoder import moe_decode_kernel  # noqa: E402
from planner.memory import sparse_layer_count  # noqa: E402
from planner.throughput import infer_throughput  # noqa: E402
from planner.types import Strategy, ThroughputEstimate  # noqa: E402


def _estimate(model: ModelConfig, batch: int, prompt: int, output: int, gpu: GpuSpec, cal: ThroughputCalibration,
              kernel: str | None = None) -> ThroughputEstimate:
    """The planner's bf16 generate() estimate; ``kernel`` None: the workers' rule."""
    return infer_throughput(model, Strategy(task="infer", gpu=gpu.id, gpu_count=1, weights="bf16", batch=batch),
                            prompt, output, gpu, cal, decoder="generate", moe_kernel=kernel)


def step_ms(model: ModelConfig, batch: int, prompt: int, output: int, gpu: GpuSpec, cal: ThroughputCalibration,
            kernel: str) -> float:
    return _estimate(model, batch, prompt, output, gpu, cal, kernel).breakdown_s["decode"] / output * 1e3


def run_tokens_per_s(model: ModelConfig, batch: int, gpu: GpuSpec, cal: ThroughputCalibration) -> float:
    return _estimate(model, batch, RUN_PROMPT, RUN_OUTPUT, gpu, cal).tokens_per_s


def layer_cost_closing(cal: ThroughputCalibration, measured: float,
                       predict: Callable[[ThroughputCalibration], float]) -> float:
    """The decode_grouped_layer_s at which ``predict(cal)`` equals ``measured`` (a rate: falls as the cost rises;
    0 when even no cost predicts too slow)."""
    lo, hi = 0.0, 1e-2
    for _ in range(60):
        mid = (lo + hi) / 2
        if predict(cal.model_copy(update={"decode_grouped_layer_s": mid})) > measured:
            lo = mid
        else:
            hi = mid
    return lo


def worker_runs(paths: list[str]) -> list[dict[str, Any]]:
    """The acceptance records' MoE inference cases that decoded with grouped_mm kept."""
    runs = []
    for path in paths:
        for case in json.loads(Path(path).read_text())["cases"]:
            run = case.get("run") or {}
            log = " ".join(case.get("extra", {}).get("log_tail", []))
            if run.get("task") == "infer" and "grouped_mm experts" in log and case.get("measured_tokens_per_s"):
                inputs = run["planner_inputs"]
                runs.append({"case": case["case"], "model": inputs["model"]["id"],
                             "batch": int(case["strategy"].split("batch=")[1].split()[0]),
                             "measured": float(case["measured_tokens_per_s"]), "source": Path(path).name})
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", nargs="+")
    p.add_argument("--runs", nargs="*", default=[], help="bench/accuracy/gpu_acceptance.py records (workers' own runs)")
    p.add_argument("--fit-model", default="gpt-oss-20b")
    p.add_argument("--output", type=int, default=32, help="new tokens per timed generate() of the records")
    a = p.parse_args()
    catalog = load_catalog()
    gpu = catalog.gpu("H200")
    cal = load_calibration().throughput
    rows: list[dict[str, Any]] = [r for path in a.records for r in json.loads(Path(path).read_text())["rows"]]
    runs = worker_runs(a.runs)
    without = cal.model_copy(update={"decode_grouped_layer_s": 0.0})
    costs = [(t - step_ms(catalog.model(r["model"]), r["batch"], r["prompt"], a.output, gpu, without, "grouped_mm"))
             / 1e3 / sparse_layer_count(catalog.model(r["model"]))
             for r in rows if r["model"] == a.fit_model for t in r["grouped_mm_step_ms"]]
    for run in runs:
        model = catalog.model(run["model"])
        run["closing"] = layer_cost_closing(cal, run["measured"],
                                            lambda c, m=model, b=run["batch"]: run_tokens_per_s(m, b, gpu, c))
        if run["model"] == a.fit_model:
            costs.append(run["closing"])
    fitted = statistics.median(costs)
    print(f"decode_grouped_layer_s fitted on {len(costs)} {a.fit_model} timings: {fitted:.3g} s "
          f"(spread {min(costs):.3g}-{max(costs):.3g}; in use: {cal.decode_grouped_layer_s:.3g})\n")
    print("| model | batch | held out | batched_mm ms measured / predicted | err | grouped_mm ms measured / predicted "
          "| err | faster measured | rule |")
    print("|---|---:|---|---|---:|---|---:|---|---|")
    errors: dict[bool, list[float]] = {True: [], False: []}
    for r in rows:
        model = catalog.model(r["model"])
        line = [r["model"], str(r["batch"]), "yes" if r["model"] != a.fit_model else "no"]
        measured = {}
        for kernel in ("batched_mm", "grouped_mm"):
            got = r[f"{kernel}_step_ms"]
            measured[kernel] = statistics.median(got)
            pred = step_ms(model, r["batch"], r["prompt"], a.output, gpu, cal, kernel)
            err = pred / measured[kernel] - 1  # against the median of the alternated timings
            errors[r["model"] != a.fit_model].append(abs(err))
            line += [", ".join(f"{x:.1f}" for x in got) + f" / {pred:.1f}", f"{err:+.1%}"]
        line += [min(measured, key=lambda k: measured[k]), str(moe_decode_kernel(model, "nvidia", "bf16", r["batch"]))]
        print("| " + " | ".join(line) + " |")
    if runs:
        print("\n| workers' run (gpuplan run) | model | batch | held out | tok/s measured / predicted | err | "
              "closing layer cost s |")
        print("|---|---|---:|---|---|---:|---:|")
        for run in runs:
            pred = run_tokens_per_s(catalog.model(run["model"]), run["batch"], gpu, cal)
            err = pred / run["measured"] - 1
            errors[run["model"] != a.fit_model].append(abs(err))
            print(f"| {run['case']} ({run['source']}) | {run['model']} | {run['batch']} | "
                  f"{'yes' if run['model'] != a.fit_model else 'no'} | {run['measured']:,.0f} / {pred:,.0f} | "
                  f"{err:+.1%} | {run['closing']:.3g} |")
    for held, errs in errors.items():
        if errs:
            print(f"\n{'held-out' if held else 'fitting'} timings: |error| median {statistics.median(errs):.1%}, "
                  f"max {max(errs):.1%} ({len(errs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
