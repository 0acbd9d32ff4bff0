"""The inference worker's two decoders on one GPU: workers/decode.py's compiled static-cache step
("graph") against transformers' generate() ("generate"), through ``workers.infer.run_inference``
on the same random-init model and prompts, with the planner's prediction for each.

    python3 bench/graph_decode.py --out $OUT/graph_decode.json
    python3 bench/graph_decode.py --cases llama-3.2-1b:32x512x128 --out /tmp/g.json
    .venv/bin/python bench/graph_decode.py --fit bench/results/workers/graph_decode_2026-12-01.json \
        --fit bench/results/workers/graph_decode_gemma_2026-12-02_fixed.json \
        --holdout llama-3.2-1b:32x512x128,gemma-3-1b:32x512x128    # least squares into planner/calibration.json

bench/accuracy.py --fit rebuilds planner/calibration.json from planner/calibration.py's defaults, so
the fitted graph_decode_* values are also those defaults' (set them there too after a new fit).

The fit: per decode step, measured time - (prefill and the bytes-read roofline the planner predicts)
= layers x graph_decode_layer_s + batch x (the decoder layers' matmul params) x graph_decode_row_param_s, on
the non-holdout cases of every --fit record (graph_decode_row_layer_s and graph_decode_step_s stay 0). The
row term was per layer until the Gemma 3 cases (2026-12-02): rows x layers could not price gemma-3-1b (-28%)
and gemma-3-4b (+23%) at once; rows x matmul weights (skinny GEMMs) did, leave-one-out max 14.5%.

Steady tokens/s drops the first batch (the compile, for "graph"). ``first_batch_s`` is that batch.
``same_tokens``: the share of requests whose new tokens are identical between the two decoders
(bf16 kernels differ between a static and a growing cache, so a near-tie may flip a late token).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalog.loader import load_catalog, resolve_model
from planner.calibration import load_calibration
from planner.throughput import infer_throughput
from planner.types import Strategy
from workers.infer import run_inference

DEFAULT_CASES = ("llama-3.2-1b:32x512x128,llama-3.2-1b:1x32x128,llama-3.2-1b:8x1024x128,"
                 "qwen3-1.7b:16x256x128,gemma-3-1b:32x1024x128")


def _prompts(path: Path, n: int, width: int, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"r{i}", "input_ids": [rng.randrange(1, vocab) for _ in range(width)]}) + "\n")


def _outputs(path: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_ids"] for r in map(json.loads, path.read_text().splitlines())}


def run_case(spec: str, batches: int, work: Path) -> dict[str, Any]:
    model_id, shape = spec.split(":")
    b, p, o = (int(x) for x in shape.split("x"))
    catalog = load_catalog()
    cfg = resolve_model(catalog, model_id)
    gpu = catalog.gpu("H200") if torch.cuda.get_device_name(0).find("H200") >= 0 else None
    cal = load_calibration()
    prompts = work / f"{model_id}-{shape}.jsonl"
    _prompts(prompts, b * batches, p, cfg.vocab_size, seed=0)
    rec: dict[str, Any] = {"case": spec, "model": model_id, "batch": b, "prompt": p, "output": o}
    outs: dict[str, Path] = {}
    for decoder in ("graph", "generate"):
        outs[decoder] = work / f"{model_id}-{shape}-{decoder}.jsonl"
        firsts: list[float] = []
        last = [time.perf_counter()]

        def progress(done: int, total: int, firsts: list[float] = firsts, last: list[float] = last) -> None:
            now = time.perf_counter()
            firsts.append(now - last[0])
            last[0] = now

        torch.cuda.reset_peak_memory_stats()
        try:
            res = run_inference(cfg, prompts, outs[decoder], batch=b, max_new_tokens=o, dtype="bf16", seed=0,
                                device="cuda", progress=progress, decoder=decoder)
        except Exception as exc:
            rec[decoder] = {"error": repr(exc)[:400]}
            continue
        predicted = None
        if gpu is not None:
            predicted = infer_throughput(cfg, Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=b), p, o, gpu,
                                         cal.throughput, decoder=decoder).tokens_per_s
        rec[decoder] = {"steady_tokens_per_s": res.steady_tokens_per_s, "first_batch_s": firsts[0] if firsts else None,
                        "batch_s": firsts, "peak_allocated_bytes": res.peak_memory_bytes,
                        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()), "decoder_used": res.decoder,
                        "predicted_tokens_per_s": predicted, "load_s": res.load_seconds}
        print(spec, decoder, json.dumps({k: v for k, v in rec[decoder].items() if k != "batch_s"}), flush=True)
        torch.cuda.empty_cache()
    if all(outs[d].is_file() for d in outs) and "error" not in rec.get("graph", {}):
        a, g = _outputs(outs["graph"]), _outputs(outs["generate"])
        rec["same_tokens"] = sum(a[k] == g.get(k) for k in a) / max(1, len(a))
        rec["same_first_16"] = sum(a[k][:16] == g.get(k, [])[:16] for k in a) / max(1, len(a))
    torch._dynamo.reset()
    return rec


def fit(results: list[Path], holdout: set[str], calibration: Path) -> None:
    import numpy as np

    from planner.calibration import Calibration
    from planner.throughput import matmul_params

    catalog = load_catalog()
    gpu = catalog.gpu("H200")
    cal = Calibration.model_validate_json(calibration.read_text())
    zero = cal.throughput.model_copy(update={"graph_decode_layer_s": 0.0, "graph_decode_row_layer_s": 0.0,
                                             "graph_decode_row_param_s": 0.0, "graph_decode_step_s": 0.0})
    rows, ys, names = [], [], []
    for record in results:
        for c in json.loads(record.read_text())["cases"]:
            measured = c.get("graph", {}).get("steady_tokens_per_s")
            if c["case"] in holdout or not measured:
                continue
            model = resolve_model(catalog, c["model"])
            b, p, o = c["batch"], c["prompt"], c["output"]
            est = infer_throughput(model, Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=b), p, o, gpu,
                                   zero, decoder="graph")
            step = (b * o / measured - est.breakdown_s["prefill"]) / o
            n, lm = matmul_params(model)
            rows.append([model.num_layers, b * (n - lm)])
            ys.append(step - est.breakdown_s["decode"] / o)
            names.append(c["case"])
    (layer_s, row_param_s), *_ = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)
    data = json.loads(calibration.read_text())
    data["throughput"].update({"graph_decode_step_s": 0.0, "graph_decode_layer_s": max(0.0, float(layer_s)),
                               "graph_decode_row_layer_s": 0.0,
                               "graph_decode_row_param_s": max(0.0, float(row_param_s))})
    calibration.write_text(json.dumps(data, indent=1) + "\n")
    print(f"fitted on {len(rows)} cases ({', '.join(names)}): graph_decode_layer_s {layer_s * 1e6:.1f} us, "
          f"graph_decode_row_param_s {row_param_s:.3e} s -> {calibration}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, action="append",
                        help="fit the planner's graph-decode constants from this record (repeatable)")
    parser.add_argument("--holdout", default="", help="cases left out of --fit, comma-separated")
    parser.add_argument("--calibration", type=Path, default=Path(__file__).resolve().parents[1] / "planner"
                        / "calibration.json")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:BATCHxPROMPTxOUTPUT, comma-separated")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.fit:
        fit(args.fit, set(filter(None, args.holdout.split(","))), args.calibration)
        return
    if args.out is None:
        parser.error("--out is required to measure")
    record: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                              "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.cases.split(","):
            record["cases"].append(run_case(spec, args.batches, Path(tmp)))
            args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
