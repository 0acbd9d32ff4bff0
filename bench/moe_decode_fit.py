"""Fit and check the planner's decode step of a mixture of experts under both of generate()'s expert kernels.

Reads ``bench/moe_decode_probe.py impl`` records (each batch timed with transformers' batched_mm and with grouped_mm
kept as the workers keep it, alternating) and prints, per model and batch, the measured and predicted step of each
kernel, the kernel the workers' rule picks (planner.decoder.moe_decode_kernel) and the faster one measured.

``--fit-model``: the model whose grouped_mm rows fit ``decode_grouped_layer_s`` (the median of measured step minus
the step predicted without the term, per sparse layer); every other model's rows are held out. The constant is
planner/calibration.py's default; this script prints it, it does not write it.

    python bench/moe_decode_fit.py bench/results/workers/moe_decode_impl_oss_2026-12-03b.json \\
        bench/results/workers/moe_decode_impl_qwen3_2026-12-03b.json --fit-model gpt-oss-20b
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from catalog.loader import load_catalog  # noqa: E402
from catalog.schema import GpuSpec, ModelConfig  # noqa: E402
from planner.calibration import ThroughputCalibration, load_calibration  # noqa: E402
from planner.decoder import moe_decode_kernel  # noqa: E402
from planner.memory import sparse_layer_count  # noqa: E402
from planner.throughput import infer_throughput  # noqa: E402
from planner.types import Strategy  # noqa: E402


def step_ms(model: ModelConfig, batch: int, prompt: int, output: int, gpu: GpuSpec, cal: ThroughputCalibration,
            kernel: str) -> float:
    est = infer_throughput(model, Strategy(task="infer", gpu=gpu.id, gpu_count=1, weights="bf16", batch=batch),
                           prompt, output, gpu, cal, decoder="generate", moe_kernel=kernel)
    return est.breakdown_s["decode"] / output * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("records", nargs="+")
    p.add_argument("--fit-model", default="gpt-oss-20b")
    p.add_argument("--output", type=int, default=32, help="new tokens per timed generate() of the records")
    a = p.parse_args()
    catalog = load_catalog()
    gpu = catalog.gpu("H200")
    cal = load_calibration().throughput
    rows: list[dict[str, Any]] = [r for path in a.records for r in json.loads(Path(path).read_text())["rows"]]
    without = cal.model_copy(update={"decode_grouped_layer_s": 0.0})
    residual = [(statistics.median(r["grouped_mm_step_ms"])
                 - step_ms(catalog.model(r["model"]), r["batch"], r["prompt"], a.output, gpu, without, "grouped_mm"))
                / 1e3 / sparse_layer_count(catalog.model(r["model"]))
                for r in rows if r["model"] == a.fit_model and r["grouped_mm_step_ms"]]
    fitted = statistics.median(residual)
    print(f"decode_grouped_layer_s fitted on {len(residual)} {a.fit_model} rows: {fitted:.3g} "
          f"(in use: {cal.decode_grouped_layer_s:.3g})\n")
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
    for held, errs in errors.items():
        if errs:
            print(f"\n{'held-out' if held else 'fitting'} rows: |error| median {statistics.median(errs):.1%}, "
                  f"max {max(errs):.1%} ({len(errs)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
