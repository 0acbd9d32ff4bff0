"""Where a compiled decode step's time goes, kernel group by kernel group, on the workers' own decoder.

Why: the plan prices a decode step (workers/infer/decode.py's CUDA graph) as the bytes it reads (weights, the KV
cache) at
one bandwidth plus a fitted time per layer; at batch 32 the GPU acceptance's llama-3.2-1b step ran 2.12 ms against
1.77 planned, and DeepSeek-V2-Lite's (latent attention) 20.3 against 16.6, while small batches run faster
than planned. This builds each case as workers.infer.generate does (random init, ``load_model``, ``GraphDecoder``),
decodes once (the compile), times a second decode with CUDA events (the decoder's own ``step_s``) and profiles a third,
summing the kernels of its steps by group (matmuls, attention, the compiled elementwise kernels, the rest): what grows
with the rows and the context, and whether the GPU idles between kernels.

    python3 bench/workers/decode_step_profile.py --cases llama-3.2-1b:1x512x64,llama-3.2-1b:32x512x64 --out $OUT/p.json
    .venv/bin/python bench/workers/decode_step_profile.py \
        --fit-keys bench/results/workers/decode_step_profile_2026-12-04/decode_profile_a.json \
        --fit-keys bench/results/workers/decode_step_profile_2026-12-04/decode_profile_b.json   # graph_decode_key_s
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.loader import load_catalog, resolve_model
from workers.infer.decode import GraphDecoder
from workers.infer.model_load import load_model

GROUPS = (("attention", ("flash", "fmha", "attention", "sdpa", "efficient")),
          ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "matmul", "sm90_", "splitk")),
          ("compiled", ("triton",)))


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def profile_case(spec: str, model: torch.nn.Module, decoder: GraphDecoder, profiled: bool = True) -> dict[str, Any]:
    b, p, o = (int(x) for x in spec.split(":")[1].split("x"))
    vocab = int(getattr(model, "config").vocab_size)  # noqa: B009
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (b, p), generator=gen).cuda()
    mask = torch.ones_like(ids)
    decoder.decode(ids, mask, max_new_tokens=o, eos=set())  # the compile
    timed = []
    for _ in range(2):
        decoder.decode(ids, mask, max_new_tokens=o, eos=set())
        t = decoder.timing()
        assert t is not None
        timed.append({"prefill_s": t.prefill_s, "step_s": t.steps_s / t.steps})
    if not profiled:
        return {"case": spec, "batch": b, "prompt": p, "output": o, "timed": timed}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decoder.decode(ids, mask, max_new_tokens=o, eos=set())
        torch.cuda.synchronize()
    t = decoder.timing()
    assert t is not None
    kernels: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            kernels[ev.name] += ev.device_time_total / 1e3  # ms
            counts[ev.name] += 1
    # the prefill's kernels are in the profile too: subtract the prefill's share by its measured time instead of
    # guessing which kernels were its; the per-step groups below are (all kernels - prefill) / steps
    total_ms = sum(kernels.values())
    steps = t.steps
    by_group: dict[str, float] = defaultdict(float)
    for name, ms in kernels.items():
        by_group[group_of(name)] += ms
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:20]
    return {"case": spec, "batch": b, "prompt": p, "output": o, "timed": timed,
            "profiled_prefill_s": t.prefill_s, "profiled_step_s": t.steps_s / steps, "steps": steps,
            "kernel_ms_total": total_ms, "kernel_ms_by_group": dict(by_group),
            "kernels_per_step": sum(counts.values()) / (steps + 1),
            "top_kernels": [{"name": n[:160], "ms": ms, "count": counts[n], "group": group_of(n)} for n, ms in top]}


# the acceptance's inference shape (llama-3.2-1b at 32 x 512) stays out of every fit, at any output length
HELD_OUT = ("llama-3.2-1b:32x512x",)
MIN_FIT_ROWS = 16  # below this the kernel's per-layer floor, not its keys, sets its time (graph_decode_layer_s's)


def attention_s(case: dict[str, Any]) -> float:
    """Seconds a decode step spends in the attention kernels (those called at least once a step; the prompt pass's
    one call each is in the sum, a small share)."""
    steps = case["steps"]
    ms = sum(k["ms"] for k in case["top_kernels"] if k["group"] == "attention" and k["count"] >= steps)
    return float(ms / (steps + 1) / 1e3)


def fit_keys(records: list[dict[str, Any]]) -> tuple[float, list[str]]:
    """ThroughputCalibration.graph_decode_key_s: least squares (seconds) of the attention kernels' time beyond the
    static cache's bytes at decode_bw_efficiency, on planner.throughput.graph_decode_keys, over the profiled cases
    of at least MIN_FIT_ROWS rows whose kernel reads each KV head once (packed or one query head per KV head; not
    MLA, eager attention or a single KV head re-read by every query head); the acceptance shape held out. Returns
    the constant and one line per case."""
    import numpy as np

    from planner.calibration import load_calibration
    from planner.memory import kv_cache_bytes
    from planner.throughput import graph_decode_keys

    cal, catalog = load_calibration().throughput, load_catalog()
    bw = catalog.gpu("H200").memory_bandwidth_gbps * 1e9 * cal.decode_bw_efficiency
    xs, ys, lines = [], [], []
    for record in records:
        for c in record["cases"]:
            if "top_kernels" not in c:
                continue
            model = resolve_model(catalog, c["case"].rsplit(":", 1)[0])
            ctx = c["prompt"] + c["output"]
            keys = graph_decode_keys(model, c["batch"], ctx)
            excess = attention_s(c) - kv_cache_bytes(model, c["batch"], ctx, full_length=True) / bw
            rereads = model.num_kv_heads == 1 < model.num_attention_heads
            used = (keys > 0 and not rereads and c["batch"] >= MIN_FIT_ROWS
                    and not any(c["case"].startswith(h) for h in HELD_OUT))
            per_key = f"{excess * 1e9 / keys:.3f} ns a key" if keys else "no keys priced"
            lines.append(f"{c['case']}: attention {attention_s(c) * 1e3:.3f} ms a step, beyond the bytes {per_key} "
                         f"({'fit' if used else 'not fit'})")
            if used:
                xs.append(keys)
                ys.append(excess)
    (key_s,), *_ = np.linalg.lstsq(np.array(xs, dtype=float)[:, None], np.array(ys), rcond=None)
    return float(key_s), lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit-keys", type=Path, action="append", metavar="RECORD",
                        help="print graph_decode_key_s fitted on profile records of this script (no GPU)")
    parser.add_argument("--cases", help="model:BATCHxPROMPTxOUTPUT, comma-separated (one model's "
                        "cases together share its load)")
    parser.add_argument("--backends", default="default",
                        help="SDPA backends to decode under, comma-separated: default (PyTorch's choice), cudnn, "
                        "efficient, math, flash; each case once per backend")
    parser.add_argument("--no-profile", action="store_true", help="time the steps only")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.fit_keys:
        key_s, lines = fit_keys([json.loads(p.read_text()) for p in args.fit_keys])
        print("\n".join(lines))
        print(f"graph_decode_key_s = {key_s:.3e} s")
        return 0
    if not args.cases:
        parser.error("--cases (or --fit-keys RECORD) is required")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}
    catalog = load_catalog()
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cases": []}
    by_model: dict[str, list[str]] = defaultdict(list)
    for spec in args.cases.split(","):
        by_model[spec.split(":")[0]].append(spec)
    for model_id, specs in by_model.items():
        try:
            model = load_model(resolve_model(catalog, model_id), weights="bf16", seed=0, device="cuda")
        except Exception as exc:  # one model's failure keeps the others
            out["cases"] += [{"case": s, "error": f"{type(exc).__name__}: {str(exc)[:300]}"} for s in specs]
            continue
        for spec, backend in ((s, b) for s in specs for b in args.backends.split(",")):
            decoder = GraphDecoder(model, compile=True)
            try:
                # the compile traces under the context, so the captured step keeps the backend
                with sdpa_kernel(backends[backend]) if backend in backends else contextlib.nullcontext():
                    rec = profile_case(spec, model, decoder, profiled=not args.no_profile)
            except Exception as exc:
                rec = {"case": spec, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            rec["backend"] = backend
            decoder.release()
            out["cases"].append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "top_kernels"}), flush=True)
            if args.out:
                args.out.write_text(json.dumps(out, indent=1))
            torch.compiler.reset()
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
