"""The compiled decoder's prompt pass on one GPU, timed alone over many shapes, against the plan's prefill.

Why: the plan prices a served batch as one prefill plus its decode steps. The prefill's efficiency curve
(``prefill_mfu`` and ``tokens_half``) was fitted on transformers' generate() (bench/accuracy/accuracy.py), yet the
workers run their own static-cache decoder (workers/infer/decode.py), whose prompt pass is eager and reads a cache
as long as prompt + new tokens. Fitting its steps on end-to-end tokens/s minus the *planned* prefill put any error
of that prefill into the step's constants (2026-12-03: the 8B models' prefill planned 25-34% long, their steps 12-16%).
Here each prefill is the decoder's own, timed by its CUDA events (``GraphDecoder.timing``), with nothing compiled:
a decode whose every token counts as an end of sequence stops after the prompt pass, with the cache of the real
job's length.

    python3 bench/probes/prefill_probe.py --out $OUT/prefill.json
    python3 bench/probes/prefill_probe.py --cases llama-3.2-1b:32x512x128 --out /tmp/p.json
    .venv/bin/python bench/probes/prefill_probe.py --report bench/results/workers/prefill_probe_2026-12-03.json

Per case: the median of ``--repeat`` timed prompt passes after one untimed one (cuBLAS picks its kernels, the
allocator grows).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from planner.calibration import load_calibration
from planner.throughput import infer_throughput
from planner.types import Strategy

DEFAULT_CASES = (
    "llama-3.2-1b:1x32x128,llama-3.2-1b:1x512x128,llama-3.2-1b:8x1024x128,llama-3.2-1b:32x512x128,"
    "llama-3.2-1b:32x1024x128,llama-3.2-1b:64x512x128,"
    "qwen3-1.7b:16x256x128,qwen3-1.7b:32x512x128,qwen3-1.7b:8x2048x128,"
    "gemma-3-1b:8x512x128,gemma-3-1b:32x512x128,gemma-3-1b:32x1024x128,"
    "gemma-3-4b:8x1024x128,gemma-3-4b:32x512x128,"
    "qwen3-8b:4x512x128,qwen3-8b:16x1024x128,qwen3-8b:32x512x128,"
    "llama-3-8b:1x512x128,llama-3-8b:8x2048x128,llama-3-8b:32x512x128,"
    "gemma-3-12b:32x512x128,"
    "qwen3-30b-a3b:8x512x128,qwen3-30b-a3b:16x1024x128,qwen3-30b-a3b:32x512x128,"
    "gpt-oss-20b:8x512x128,gpt-oss-20b:32x512x128,gpt-oss-20b:64x512x128"
)


def prefill_seconds(decoder: Any, ids: torch.Tensor, new: int, vocab: int) -> float:
    """One prompt pass of ``decoder`` with a static cache of prompt + ``new`` tokens, by its own events."""
    everything = set(range(vocab))
    decoder.decode(ids, torch.ones_like(ids), max_new_tokens=max(2, new), eos=everything)
    timing = decoder.timing()
    assert timing is not None
    return float(timing.prefill_s)


def measure(cases: list[str], repeat: int, save: Any = None) -> list[dict[str, Any]]:
    """The records of ``cases``; ``save(records)`` after each (a run cut short keeps what it measured)."""
    from workers.infer.decode import GraphDecoder
    from workers.infer.model_load import load_model

    catalog = load_catalog()
    by_model: dict[str, list[tuple[int, int, int]]] = {}
    for spec in cases:
        model_id, shape = spec.split(":")
        b, p, o = (int(x) for x in shape.split("x"))
        by_model.setdefault(model_id, []).append((b, p, o))
    out: list[dict[str, Any]] = []
    for model_id, shapes in by_model.items():
        cfg = resolve_model(catalog, model_id)
        t0 = time.perf_counter()
        model = load_model(cfg, weights="bf16", seed=0, device="cuda")
        load_s = time.perf_counter() - t0
        # check_every=1: the first step's check ends the decode (every token is an "end"), so only the prompt runs
        decoder = GraphDecoder(model, compile=False, check_every=1)
        gen = torch.Generator().manual_seed(0)
        for b, p, o in shapes:
            ids = torch.randint(1, cfg.vocab_size, (b, p), generator=gen).cuda()
            rec: dict[str, Any] = {"case": f"{model_id}:{b}x{p}x{o}", "model": model_id, "batch": b, "prompt": p,
                                   "output": o, "load_s": load_s}
            try:
                prefill_seconds(decoder, ids, o, cfg.vocab_size)
                times = [prefill_seconds(decoder, ids, o, cfg.vocab_size) for _ in range(repeat)]
                rec.update(prefill_s=statistics.median(times), prefill_s_all=times,
                           peak_allocated_bytes=int(torch.cuda.max_memory_allocated()))
            except torch.cuda.OutOfMemoryError as exc:
                rec["error"] = repr(exc)[:300]
            print(json.dumps({k: v for k, v in rec.items() if k != "prefill_s_all"}), flush=True)
            out.append(rec)
            if save is not None:
                save(out)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        decoder.release()
        del decoder, model
        torch.cuda.empty_cache()
    return out


@functools.cache
def _catalog() -> Any:
    return load_catalog()


def planned_prefill_s(case: dict[str, Any], cal: Any) -> float:
    catalog = _catalog()
    model = resolve_model(catalog, case["model"])
    est = infer_throughput(model, Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=case["batch"]),
                           case["prompt"], case["output"], catalog.gpu("H200"), cal, decoder="graph")
    return float(est.breakdown_s["prefill"])


def _rms_error(cases: list[dict[str, Any]], cal: Any) -> float:
    errors = [planned_prefill_s(c, cal) / c["prefill_s"] - 1 for c in cases]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def fit(records: list[Path], holdout: set[str], calibration: Path) -> None:
    """Grid search of the relative error's root mean square: the dense terms (``graph_prefill_mfu``,
    ``graph_prefill_hidden_half``, ``graph_prefill_layer_s``) on the dense non-holdout cases, then
    ``graph_prefill_expert_mfu`` on the mixtures' non-holdout cases with the dense terms fixed. A holdout entry is a
    model id (every shape of it) or a case."""
    from planner.calibration import Calibration

    cal = Calibration.model_validate_json(calibration.read_text())
    catalog = load_catalog()
    cases = [c for r in records for c in json.loads(r.read_text())["cases"]
             if "prefill_s" in c and c["model"] not in holdout and c["case"] not in holdout]
    dense = [c for c in cases if resolve_model(catalog, c["model"]).num_experts <= 1]
    moe = [c for c in cases if resolve_model(catalog, c["model"]).num_experts > 1]
    best: tuple[float, dict[str, float]] | None = None
    for mfu in (0.30 + 0.01 * i for i in range(61)):
        for half in (0.0, 250.0, 500.0, 750.0, 1000.0, 1500.0, 2000.0, 3000.0):
            for layer in (5e-5 * i for i in range(41)):
                update = {"graph_prefill_mfu": round(mfu, 2), "graph_prefill_hidden_half": half,
                          "graph_prefill_layer_s": round(layer, 6)}
                err = _rms_error(dense, cal.throughput.model_copy(update=update))
                if best is None or err < best[0]:
                    best = (err, update)
    assert best is not None
    dense_err, update = best
    fitted = cal.throughput.model_copy(update=update)
    moe_err = float("nan")
    if moe:
        # the experts' efficiency curve: its ceiling, and half-saturation points in expert width and rows per expert
        grid = [{"graph_prefill_expert_mfu": round(0.1 + 0.02 * i, 2), "graph_prefill_expert_width_half": wh,
                 "graph_prefill_expert_rows_half": rh}
                for i in range(46) for wh in (0.0, 250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 6000.0)
                for rh in (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0)]
        moe_err, expert = min(((_rms_error(moe, fitted.model_copy(update=g)), g) for g in grid),
                              key=lambda pair: pair[0])
        update.update(expert)
    data = json.loads(calibration.read_text())
    data["throughput"].update(update)
    calibration.write_text(json.dumps(data, indent=1) + "\n")
    print(f"fitted on {len(dense)} dense cases (rms {dense_err:.1%}) and {len(moe)} MoE cases (rms {moe_err:.1%}), "
          f"held out {sorted(holdout)}: {update} -> {calibration}")


def report(records: list[Path]) -> None:
    cal = load_calibration().throughput
    print("| case | prompt tokens | planned prefill ms | measured ms | error |")
    print("|---|---|---|---|---|")
    for record in records:
        for c in json.loads(record.read_text())["cases"]:
            if "prefill_s" not in c:
                continue
            plan = planned_prefill_s(c, cal)
            print(f"| {c['case']} | {c['batch'] * c['prompt']:,} | {plan * 1e3:,.1f} | {c['prefill_s'] * 1e3:,.1f} "
                  f"| {(plan - c['prefill_s']) / c['prefill_s']:+.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:BATCHxPROMPTxOUTPUT, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--report", type=Path, action="append", help="planned against measured for this record")
    parser.add_argument("--fit", type=Path, action="append",
                        help="fit the planner's graph_prefill_* constants on this record (repeatable)")
    parser.add_argument("--holdout", default="", help="models or cases left out of --fit, comma-separated")
    parser.add_argument("--calibration", type=Path, default=Path(__file__).resolve().parents[2] / "planner"
                        / "calibration.json")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.fit:
        fit(args.fit, set(filter(None, args.holdout.split(","))), args.calibration)
        return
    if args.report:
        report(args.report)
        return
    if args.out is None:
        parser.error("--out is required to measure")
    record: dict[str, Any] = {"command": " ".join(["python3", *sys.argv]), "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name(0),
                              "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}

    def save(cases: list[dict[str, Any]]) -> None:
        args.out.write_text(json.dumps({**record, "cases": cases}, indent=1) + "\n")

    save(measure(args.cases.split(","), args.repeat, save))


if __name__ == "__main__":
    main()
