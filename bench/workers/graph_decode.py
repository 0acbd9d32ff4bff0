"""The inference worker's two decoders on one GPU: workers/infer/decode.py's compiled static-cache step
("graph") against transformers' generate() ("generate"), through ``workers.infer.generate.run_inference``
on the same random-init model and prompts, with the planner's prediction for each.

    python3 bench/workers/graph_decode.py --out $OUT/graph_decode.json
    python3 bench/workers/graph_decode.py --cases llama-3.2-1b:32x512x128 --out /tmp/g.json
    .venv/bin/python bench/workers/graph_decode.py --fit bench/results/workers/graph_decode_2026-12-01.json \
        --fit bench/results/workers/graph_decode_gemma_2026-12-02_fixed.json \
        --holdout llama-3.2-1b:32x512x128,gemma-3-1b:32x512x128    # least squares into planner/calibration.json

bench/accuracy/accuracy.py --fit rebuilds planner/calibration.json from planner/calibration.py's defaults, so
the fitted graph_decode_* values are also those defaults' (set them there too after a new fit).

The fit: per decode step, measured time - (the bytes-read roofline the planner predicts) = layers x the layer's
kernels relative to a Llama layer (planner.throughput.layer_kernel_weight: q/k norms, Gemma's extra norms, eager
attention) x graph_decode_layer_s, least squares of the relative error on the non-holdout cases of every --fit
record (graph_decode_row_*, graph_decode_step_s stay 0). The measured step is the decoder's own (CUDA events,
``step_s``) since 2026-12-03 session 6; older records give tokens/s only, less the planned prefill
(bench/probes/prefill_probe.py fits that prefill on its own). The
row term was per layer until the Gemma 3 cases (2026-12-02): rows x layers could not price gemma-3-1b (-28%)
and gemma-3-4b (+23%) at once; rows x matmul weights did, leave-one-out max 14.5%. Since the decoder packs
grouped-query attention (2026-12-03) that term fits to 0: it had been pricing the K/V copy, which grows with the rows.
The packed decoder's fit with its own step times (2026-12-03 session 6): --fit
bench/results/workers/graph_decode_split2_2026-12-03.json --fit bench/results/workers/graph_decode_split_2026-12-03.json
--fit bench/results/workers/graph_decode_moe_2026-12-03.json --holdout llama-3.2-1b:32x512x128,gemma-3-1b:32x512x128,
qwen3-8b:16x1024x128,llama-3-8b:32x512x128,qwen3-30b-a3b:32x512x128 (the MoE record's gpt-oss cases: eager attention,
untouched by the packing; its Qwen3-30B-A3B predates it). The MoE refit on three mixtures (2026-12-04; ``fit_moe``): the
two split records and graph_decode_moefit_{a,b}_2026-12-04.json, with every qwen3-30b-a3b case held out too.

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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from planner.calibration import load_calibration
from planner.throughput import infer_throughput
from planner.types import Strategy
from workers.infer.generate import run_inference

DEFAULT_CASES = ("llama-3.2-1b:32x512x128,llama-3.2-1b:1x32x128,llama-3.2-1b:8x1024x128,"
                 "qwen3-1.7b:16x256x128,gemma-3-1b:32x1024x128")


def _prompts(path: Path, n: int, width: int, vocab: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"r{i}", "input_ids": [rng.randrange(1, vocab) for _ in range(width)]}) + "\n")


def _outputs(path: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_ids"] for r in map(json.loads, path.read_text().splitlines())}


def argmax_gaps(cfg: Any, prompts: Path, outputs: dict[str, Path], rows: int, device: str = "cuda",
                weights: str = "bf16") -> dict[str, Any]:
    """Teacher-forced check of each decoder's tokens: one eager forward (no cache) over prompt + new tokens of
    ``rows`` requests; per new token, the gap between the position's largest logit and the chosen token's, in units
    of the logits' standard deviation. A decoder that computes wrong (a stale cache slot, a broken mask, a misrouted
    expert) picks tokens far from the maximum; bf16 near-ties of a random-weight model stay near 0. Equal token
    sequences are no test here: random weights make near-ties, and one flip changes every later token."""
    from workers.infer.model_load import load_model

    model = load_model(cfg, weights=weights, seed=0, device=device)
    reqs = {r["id"]: r["input_ids"] for r in map(json.loads, prompts.read_text().splitlines())}
    result: dict[str, Any] = {}
    for decoder, path in outputs.items():
        gaps: list[float] = []
        for rid, new in list(_outputs(path).items())[:rows]:
            ids = torch.tensor([reqs[rid] + new], device=device)
            with torch.inference_mode():
                logits = model(input_ids=ids, use_cache=False).logits[0].float()
            p = len(reqs[rid])
            pos = logits[p - 1 : p - 1 + len(new)]
            chosen = pos.gather(1, torch.tensor(new, device=device)[:, None])[:, 0]
            gaps += ((pos.max(-1).values - chosen) / pos.std(-1)).tolist()
        g = torch.tensor(gaps)
        result[decoder] = {"tokens": len(gaps), "median_gap_sd": float(g.median()),
                           "p99_gap_sd": float(g.quantile(0.99)), "max_gap_sd": float(g.max()),
                           "share_within_0.1_sd": float((g <= 0.1).float().mean())}
    del model
    return result


def run_case(spec: str, batches: int, work: Path, decoders: tuple[str, ...] = ("graph", "generate"),
             check_rows: int = 0) -> dict[str, Any]:
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
    for decoder in decoders:
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
        predicted = est = None
        if gpu is not None:
            est = infer_throughput(cfg, Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=b), p, o, gpu,
                                   cal.throughput, decoder=decoder)
            predicted = est.tokens_per_s
        rec[decoder] = {"steady_tokens_per_s": res.steady_tokens_per_s, "first_batch_s": firsts[0] if firsts else None,
                        "batch_s": firsts, "peak_allocated_bytes": res.peak_memory_bytes,
                        "peak_reserved_bytes": int(torch.cuda.max_memory_reserved()), "decoder_used": res.decoder,
                        "packed_gqa": res.packed_gqa,
                        "predicted_tokens_per_s": predicted, "load_s": res.load_seconds,
                        # the compiled decoder's own split (CUDA events, after the first batch) and the plan's
                        "prefill_s": res.steady_prefill_s, "step_s": res.steady_step_s,
                        "predicted_prefill_s": est.breakdown_s["prefill"] if est else None,
                        "predicted_step_s": est.breakdown_s["decode"] / o if est else None}
        print(spec, decoder, json.dumps({k: v for k, v in rec[decoder].items() if k != "batch_s"}), flush=True)
        torch.cuda.empty_cache()
    if len(outs) == 2 and all(outs[d].is_file() for d in outs) and "error" not in rec.get("graph", {}):
        a, g = _outputs(outs["graph"]), _outputs(outs["generate"])
        rec["same_tokens"] = sum(a[k] == g.get(k) for k in a) / max(1, len(a))
        rec["same_first_16"] = sum(a[k][:16] == g.get(k, [])[:16] for k in a) / max(1, len(a))
    torch._dynamo.reset()
    if check_rows:
        import gc

        gc.collect()
        torch.cuda.empty_cache()
        rec["argmax_gaps"] = argmax_gaps(cfg, prompts, {d: o for d, o in outs.items() if o.is_file()}, check_rows)
        print(spec, "argmax gaps", json.dumps(rec["argmax_gaps"]), flush=True)
    return rec


def _decode_step_gap(c: dict[str, Any], cal: Any, gpu: Any, model: Any) -> tuple[float, Any]:
    """(measured decode step - the planner's step under ``cal``, the estimate). The measured step is the decoder's
    own (``step_s``, CUDA events) where the record has it; older records only had tokens/s, from which the planned
    prefill was subtracted (so an error in the prefill's model went into the step's fit)."""
    b, p, o = c["batch"], c["prompt"], c["output"]
    est = infer_throughput(model, Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=b), p, o, gpu, cal,
                           decoder="graph")
    step = c["graph"].get("step_s") or (b * o / c["graph"]["steady_tokens_per_s"] - est.breakdown_s["prefill"]) / o
    return step - est.breakdown_s["decode"] / o, est


MOE_TERMS = ("per sparse layer", "expert bytes", "routed pairs")


def _moe_rows(moe: list[dict[str, Any]], dense: Any, gpu: Any) -> tuple[list[list[float]], list[float], list[str]]:
    """Per MoE case, the step's excess per sparse layer over the dense terms (experts at decode_bw_efficiency),
    and its three candidate terms: 1, the routed experts' bytes per layer / the bandwidth, tokens x top-k;
    each row divided by the measured step per sparse layer (relative least squares)."""
    from planner.memory import sparse_layer_count
    from planner.throughput import decode_expert_weight_params

    catalog = load_catalog()
    bw = gpu.memory_bandwidth_gbps * 1e9
    base = dense.model_copy(update={"graph_moe_layer_s": 0.0, "graph_moe_pair_s": 0.0,
                                    "graph_moe_expert_bw_efficiency": dense.decode_bw_efficiency})
    rows, ys, models = [], [], []
    for c in moe:
        m = resolve_model(catalog, c["model"])
        layers = sparse_layer_count(m)
        gap, est = _decode_step_gap(c, base, gpu, m)
        measured = (gap + est.breakdown_s["decode"] / c["output"]) / layers
        expert_bytes = decode_expert_weight_params(m, c["batch"]) * 2 / layers  # bf16: the compiled MoE's only dtype
        rows.append([1.0 / measured, expert_bytes / bw / measured, c["batch"] * m.experts_per_token / measured])
        ys.append(gap / layers / measured)
        models.append(c["model"])
    return rows, ys, models


def _solve(rows: list[list[float]], ys: list[float], terms: tuple[int, ...]) -> list[float] | None:
    """Least squares on the chosen terms (the others 0); None if a coefficient comes out negative."""
    import numpy as np

    a = np.array([[r[t] for t in terms] for r in rows], dtype=float)
    coef, *_ = np.linalg.lstsq(a, np.array(ys), rcond=None)
    if (coef < 0).any():
        return None
    full = [0.0] * len(MOE_TERMS)
    for t, v in zip(terms, coef, strict=True):
        full[t] = float(v)
    return full


def _error(row: list[float], y: float, coef: list[float]) -> float:
    """A case's relative step error under ``coef`` ((planned - measured) / measured)."""
    return sum(x * k for x, k in zip(row, coef, strict=True)) - y


def _worst_left_out(rows: list[list[float]], ys: list[float], models: list[str], terms: tuple[int, ...]) -> float:
    """The worst step error of a model's cases under the terms fitted without that model (inf: a fit went negative)."""
    worst = 0.0
    for out in sorted(set(models)):
        keep = [i for i, m in enumerate(models) if m != out]
        sub = _solve([rows[i] for i in keep], [ys[i] for i in keep], terms)
        if sub is None:
            return float("inf")
        worst = max([worst] + [abs(_error(rows[i], ys[i], sub)) for i, m in enumerate(models) if m == out])
    return worst


def fit_moe(moe: list[dict[str, Any]], dense: Any, gpu: Any) -> dict[str, float]:
    """The compiled MoE step's terms beyond the dense ones: every nonnegative subset of (a cost per sparse layer, the
    routed experts read below decode_bw_efficiency, a cost per routed (token, expert) pair) fitted by relative least
    squares. Kept: the subset whose worst leave-one-model-out step error is smallest (with one model, whose worst
    error on its own cases is smallest; ties go to fewer terms)."""
    from itertools import combinations

    rows, ys, models = _moe_rows(moe, dense, gpu)
    names = sorted(set(models))
    best: tuple[float, tuple[int, ...], list[float]] | None = None
    for size in (1, 2, 3):
        for terms in combinations(range(len(MOE_TERMS)), size):
            coef = _solve(rows, ys, terms)
            if coef is None:
                continue
            if len(names) == 1:
                worst = max(abs(_error(r, y, coef)) for r, y in zip(rows, ys, strict=True))
            else:
                worst = _worst_left_out(rows, ys, models, terms)
            print(f"  MoE terms {' + '.join(MOE_TERMS[t] for t in terms)}: {', '.join(f'{v:.4g}' for v in coef)}; "
                  f"worst {'leave-one-model-out ' if len(names) > 1 else ''}step error {worst:.1%}")
            if best is None or worst < best[0] - 1e-3:
                best = (worst, terms, coef)
    assert best is not None
    layer_s, inverse_excess, pair_s = best[2]
    return {"graph_moe_layer_s": layer_s, "graph_moe_pair_s": pair_s,
            "graph_moe_expert_bw_efficiency": 1.0 / (1.0 / dense.decode_bw_efficiency + inverse_excess)}


def fit(results: list[Path], holdout: set[str], calibration: Path) -> None:
    """Dense cases: least squares of the step's excess over the bytes read on layers and rows x matmul params.
    Mixtures of experts, after, on their excess over the dense terms (a MoE step pays those too): ``fit_moe``'s
    terms (``graph_moe_layer_s``, ``graph_moe_expert_bw_efficiency``, ``graph_moe_pair_s``)."""
    import numpy as np

    from planner.calibration import Calibration
    from planner.throughput import layer_kernel_weight

    catalog = load_catalog()
    gpu = catalog.gpu("H200")
    cal = Calibration.model_validate_json(calibration.read_text())
    zero = cal.throughput.model_copy(update={"graph_decode_layer_s": 0.0, "graph_decode_row_layer_s": 0.0,
                                             "graph_decode_row_param_s": 0.0, "graph_decode_step_s": 0.0,
                                             "graph_moe_layer_s": 0.0})
    rows, ys, names, moe = [], [], [], []
    for record in results:
        for c in json.loads(record.read_text())["cases"]:
            if c["case"] in holdout or not c.get("graph", {}).get("steady_tokens_per_s"):
                continue
            model = resolve_model(catalog, c["model"])
            if model.num_experts > 1:
                moe.append(c)
                continue
            gap, est = _decode_step_gap(c, zero, gpu, model)
            # relative errors: a plan is judged by its tokens/s error, so each case weighs 1 / its measured step
            measured_step = gap + est.breakdown_s["decode"] / c["output"]
            rows.append([model.num_layers * layer_kernel_weight(model, routing=False) / measured_step])
            ys.append(gap / measured_step)
            names.append(c["case"])
    # only the per-layer term is fitted; the rows x matmul-params term priced the K/V copy and stays 0 without it:
    # fitted too on the decoders' own step times (2026-12-03 session 6) it took 1.0e-14 s from gemma-3-1b's single KV
    # head alone and planned both 8B models' steps 20-34% long
    (layer_s,), *_ = np.linalg.lstsq(np.array(rows, dtype=float), np.array(ys), rcond=None)
    dense = zero.model_copy(update={"graph_decode_layer_s": max(0.0, float(layer_s))})
    moe_terms = fit_moe(moe, dense, gpu) if moe else {}
    # the capture in a fresh process: a record's first case, or every case of a record run one process per case
    # (later cases of a process reuse inductor's caches: 1.1-1.5 s a layer instead of 1.8-3.3)
    compile_per_layer = []
    for record in results:
        data = json.loads(record.read_text())
        for i, c in enumerate(data["cases"]):
            batches = c.get("graph", {}).get("batch_s") or []
            if len(batches) > 1 and (i == 0 or "one process per case" in data.get("command", "")):
                layers = resolve_model(catalog, c["model"]).num_layers
                compile_per_layer.append((batches[0] - float(np.median(batches[1:]))) / layers)
    compile_layer_s = round(float(np.median(compile_per_layer)), 2)
    data = json.loads(calibration.read_text())
    data["throughput"].update({"graph_decode_step_s": 0.0, "graph_decode_layer_s": dense.graph_decode_layer_s,
                               "graph_decode_row_layer_s": 0.0,
                               "graph_decode_row_param_s": dense.graph_decode_row_param_s,
                               "graph_compile_layer_s": compile_layer_s, **moe_terms})
    calibration.write_text(json.dumps(data, indent=1) + "\n")
    print(f"fitted on {len(rows)} dense cases ({', '.join(names)}): graph_decode_layer_s {layer_s * 1e6:.1f} us, "
          f"graph_decode_row_param_s {dense.graph_decode_row_param_s:.3e} s (held); on {len(moe)} MoE cases "
          f"({', '.join(c['case'] for c in moe)}): {moe_terms}; the capture "
          f"{compile_layer_s} s a layer (median of {len(compile_per_layer)} fresh processes) -> {calibration}")


def report(results: list[Path], calibration: Path) -> None:
    """Measured against planned, every graph case of the records (fitted and held out alike)."""
    from planner.calibration import Calibration
    from planner.memory import infer_memory

    catalog = load_catalog()
    gpu = catalog.gpu("H200")
    cal = Calibration.model_validate_json(calibration.read_text())
    print("| case | planned tok/s | measured tok/s | error | prefill ms planned / measured "
          "| step ms planned / measured | planned peak GiB | measured peak GiB | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for record in results:
        for c in json.loads(record.read_text())["cases"]:
            g = c.get("graph", {})
            if not g.get("steady_tokens_per_s"):
                continue
            model = resolve_model(catalog, c["model"])
            s = Strategy(gpu="H200", gpu_count=1, weights="bf16", batch=c["batch"])
            est = infer_throughput(model, s, c["prompt"], c["output"], gpu, cal.throughput, decoder="graph")
            mem = infer_memory(model, s, c["prompt"], c["output"], gpu, cal.memory, decoder="graph")
            tps, peak = g["steady_tokens_per_s"], g.get("peak_allocated_bytes")
            planned_peak = mem.peak_allocated_bytes
            merr = f"{(planned_peak - peak) / peak:+.1%}" if peak else "-"
            split = ["-", "-"]
            if g.get("prefill_s") and g.get("step_s"):  # the decoder's own split (records since 2026-12-03 session 6)
                plan_step = est.breakdown_s["decode"] / c["output"]
                split = [f"{est.breakdown_s['prefill'] * 1e3:,.1f} / {g['prefill_s'] * 1e3:,.1f} "
                         f"({est.breakdown_s['prefill'] / g['prefill_s'] - 1:+.0%})",
                         f"{plan_step * 1e3:.2f} / {g['step_s'] * 1e3:.2f} ({plan_step / g['step_s'] - 1:+.0%})"]
            print(f"| {c['case']} | {est.tokens_per_s:,.0f} | {tps:,.0f} | {(est.tokens_per_s - tps) / tps:+.1%} "
                  f"| {split[0]} | {split[1]} | {planned_peak / 2**30:.1f} "
                  f"| {peak / 2**30 if peak else float('nan'):.1f} | {merr} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", type=Path, action="append",
                        help="fit the planner's graph-decode constants from this record (repeatable)")
    parser.add_argument("--holdout", default="", help="cases left out of --fit, comma-separated")
    parser.add_argument("--report", type=Path, action="append",
                        help="print planned against measured for every graph case of this record (repeatable)")
    parser.add_argument("--calibration", type=Path, default=Path(__file__).resolve().parents[2] / "planner"
                        / "calibration.json")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="model:BATCHxPROMPTxOUTPUT, comma-separated")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--decoders", default="graph,generate",
                        help="which decoders, in order (one per process keeps a compiled model's memory out of "
                        "the next)")
    parser.add_argument("--check-rows", type=int, default=0,
                        help="teacher-force this many requests' tokens through an eager forward (argmax_gaps)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.fit:
        fit(args.fit, set(filter(None, args.holdout.split(","))), args.calibration)
        return
    if args.report:
        report(args.report, args.calibration)
        return
    if args.out is None:
        parser.error("--out is required to measure")
    record: dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                              "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.cases.split(","):
            record["cases"].append(run_case(spec, args.batches, Path(tmp), tuple(args.decoders.split(",")),
                                            args.check_rows))
            args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
