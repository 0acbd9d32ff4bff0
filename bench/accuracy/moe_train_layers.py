"""What one decoder layer of a mixture of experts costs a training step, on the workers' own build.

Why: the plan's training step prices every matmul FLOP of a layer at one efficiency (the dense models'), the
routed experts' grouped GEMMs included. On one H200 (GPU acceptance run 19) Qwen3-30B-A3B LoRA (128 experts
768 wide) ran 14% slower than planned and Mixtral-8x7B QLoRA (8 experts 14,336 wide) 20% faster; DeepSeek-V2-Lite
(64 experts 1,408 wide) matched. This measures, per case, the step at two depths of the published shape (the
difference is the per-layer time, free of the embedding, the LM head and the loss) and the kernels of one step
at each depth by group (grouped GEMM, other GEMM, attention, routing, copies, the rest), so a term for the
experts has numbers to stand on.

Each case is ``model/finetune/ckpt|nockpt/MICRO_BATCH`` (bf16, sequence --seq, 2,048 by default): the model is
a catalog preset or a published config under tests/data/hf_configs; it is built, quantized (QLoRA), adapted
(LoRA: peft's all-linear), checkpointed and stepped (AdamW) exactly as workers/train_setup.prepare_model does.

    python3 bench/accuracy/moe_train_layers.py --cases qwen3-30b-a3b/lora/ckpt/16,mixtral-8x7b/qlora/ckpt/16 \
        --layers 2,6 --out $OUT/moe_train_layers.json
    .venv/bin/python bench/accuracy/moe_train_layers.py \
        --compare bench/results/workers/moe_train_layers_2026-12-04/moe_train_layers.json   # the planner vs a record
    .venv/bin/python bench/accuracy/moe_train_layers.py \
        --fit bench/results/workers/moe_train_layers_2026-12-04/moe_train_layers.json   # its three constants
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "workers"))  # moe_step_profile

from catalog.hf_config import model_from_hf_config  # noqa: E402
from catalog.loader import load_catalog  # noqa: E402
from catalog.schema import ModelConfig  # noqa: E402
from planner.types import Strategy  # noqa: E402
from workers.model.build import ModelSource  # noqa: E402
from workers.train.setup import make_optimizer, prepare_model  # noqa: E402


def group_of(name: str) -> str:
    from moe_step_profile import group_of as grouped

    return grouped(name)


def cut(model_id: str, layers: int) -> ModelConfig:
    """The published shape with its first ``layers`` decoder layers (dense-first layers kept as published)."""
    published = ROOT / "tests" / "data" / "hf_configs" / f"{model_id}.json"
    hf: dict[str, Any] = (json.loads(published.read_text()) if published.is_file()
                          else dict(load_catalog().model(model_id).hf_config))
    hf["num_hidden_layers"] = layers
    if isinstance(hf.get("layer_types"), list):
        hf["layer_types"] = hf["layer_types"][:layers]
    return model_from_hf_config(hf, f"{model_id}-l{layers}")


def timed_steps(step: Any, repeat: int, cuda: bool) -> list[float]:
    for _ in range(2):
        step()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return times


def kernel_groups(step: Any) -> dict[str, float]:
    """GPU ms of one step's kernels by group."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    groups: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if ev.device_time_total > 0:
            groups[group_of(ev.key)] += ev.device_time_total / 1e3
    return dict(groups)


def measure(model_id: str, finetune: str, ckpt: bool, micro: int, layers: int, repeat: int, seq: int,
            device: torch.device) -> dict[str, Any]:
    config = cut(model_id, layers)
    strategy = Strategy(gpu="H200", gpu_count=1, precision="bf16-plain", micro_batch=micro, finetune=finetune,
                        activation_checkpointing=ckpt)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model = prepare_model(strategy, 0, ModelSource(config=config, weights_dir=None), device, 1).model
    opt = make_optimizer("adamw", [p for p in model.parameters() if p.requires_grad], 1e-5)
    ids = torch.randint(0, config.vocab_size, (micro, seq), device=device)

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = timed_steps(step, repeat, cuda)
    groups = kernel_groups(step) if cuda else {}
    rec = {"layers": layers, "step_s": statistics.median(times), "steps_s": times,
           "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None, "kernel_ms": groups}
    return rec  # the model and its optimizer go with this frame; the caller empties the cache


KERNELS_MATMUL = ("gemm", "grouped_gemm", "attention")


def planned_parts(case: dict[str, Any], seq: int, gpu: Any, cal: Any) -> tuple[float, float]:
    """The planner's (layer, fixed) seconds for a record's case on ``gpu`` under calibration ``cal``: the step's
    difference between the record's two depths, as the script measures it."""
    from planner.throughput_train import train_step_parts

    strategy = Strategy(gpu="H200", gpu_count=1, precision="bf16-plain", micro_batch=case["micro_batch"],
                        finetune=case["finetune"], activation_checkpointing=case["ckpt"])
    low, high = (run["layers"] for run in case["runs"])
    step = {n: train_step_parts(cut(case["model"], n), strategy, seq, gpu, cal)[1] for n in (low, high)}
    layer = (step[high] - step[low]) / (high - low)
    return layer, step[low] - low * layer


# What each constant was fitted on (docs/lab-notes/2026-12-04-sparse-layer-training-cost.md): the routing and merge
# terms on two shapes' layers, the loss's traffic on those shapes' and one dense model's fixed parts; Qwen3-30B-A3B
# and Mixtral-8x7B held out.
FIT_LAYERS_ON = ("deepseek-v2-lite", "qwen1.5-moe-a2.7b")
FIT_FIXED_ON = ("deepseek-v2-lite", "qwen1.5-moe-a2.7b", "llama-3-8b")
FITTED = {"layer": ("moe_dispatch_bytes", "lora_merged_expert_bytes"), "fixed": ("loss_bytes_per_logit",)}


def fit(record: dict[str, Any]) -> str:
    """Least squares, in seconds, of the three constants the layer record fixes, the calibration's other
    values held: the layers' time is linear in the routing and merge bytes, the fixed part's in the loss's bytes,
    so one linear solve each (slopes by differences). Prints them beside planner/calibration.json's."""
    import numpy as np

    from planner.calibration import load_calibration

    cal, gpu = load_calibration().throughput, load_catalog().gpu("H200")
    measured = [c for c in record["cases"] if "runs" in c]
    lines = ["| constant | fitted on | least squares (this record) | planner/calibration.json |", "|---|---|---|---|"]
    for part, names in FITTED.items():
        on = FIT_LAYERS_ON if part == "layer" else FIT_FIXED_ON
        cases = [c for c in measured if c["model"] in on]
        index = 0 if part == "layer" else 1
        target = np.array([c["per_layer_s" if part == "layer" else "fixed_s"] for c in cases])
        zero = cal.model_copy(update=dict.fromkeys(names, 0.0))
        base = np.array([planned_parts(c, record["seq"], gpu, zero)[index] for c in cases])
        slopes = np.stack([np.array([planned_parts(c, record["seq"], gpu, zero.model_copy(update={n: 1.0}))[index]
                                     for c in cases]) - base for n in names], axis=1)
        # in seconds, as the constants were first fitted (a relative fit gives 33.5, 53.5 and 65.2: the big
        # checkpointed micro-batch-16 cases' few percent weigh as much as the small ones')
        solution, *_ = np.linalg.lstsq(slopes, target - base, rcond=None)
        for n, v in zip(names, solution, strict=True):
            lines.append(f"| {n} | {', '.join(c['case'] for c in cases)} | {v:.1f} | {getattr(cal, n):g} |")
    return "\n".join(lines)


def compare(record: dict[str, Any]) -> str:
    """The planner's layer and fixed times (planner.throughput.train_step_parts at the same two depths) against a
    record of this script, as the Markdown table docs/lab-notes/2026-12-04-sparse-layer-training-cost.md keeps (no GPU
    needed)."""
    from planner.calibration import load_calibration

    cal, gpu = load_calibration().throughput, load_catalog().gpu("H200")
    rows = ["| case (model/finetune/checkpointing/micro-batch) | layer ms measured | matmul / memory-bound kernels ms "
            "| layer planned | fixed ms measured | fixed planned |", "|---|---|---|---|---|---|"]
    for case in record["cases"]:
        if "runs" not in case:
            rows.append(f"| {case['case']} | {case.get('error', 'not measured')} | | | | |")
            continue
        layer, fixed = planned_parts(case, record["seq"], gpu, cal)
        kernels = case["per_layer_kernel_ms"]
        matmul = sum(v for k, v in kernels.items() if k in KERNELS_MATMUL)
        memory = sum(v for k, v in kernels.items() if k not in KERNELS_MATMUL)
        rows.append(f"| {case['case']} | {case['per_layer_s'] * 1e3:.1f} | {matmul:.1f} / {memory:.1f} "
                    f"| {layer * 1e3:.1f} ({layer / case['per_layer_s'] - 1:+.1%}) | {case['fixed_s'] * 1e3:.1f} "
                    f"| {fixed * 1e3:.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", help="model/finetune/ckpt|nockpt/MICRO_BATCH, comma-separated")
    parser.add_argument("--compare", type=Path, metavar="RECORD",
                        help="print the planner's layer and fixed times against a record of this script (no GPU)")
    parser.add_argument("--fit", type=Path, metavar="RECORD",
                        help="print the least-squares routing, merge and loss constants from a record (no GPU)")
    parser.add_argument("--layers", default="2,6", help="the two depths, e.g. 2,6")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of the script")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.compare:
        print(compare(json.loads(args.compare.read_text())))
        return 0
    if args.fit:
        print(fit(json.loads(args.fit.read_text())))
        return 0
    if not args.cases:
        parser.error("--cases (or --compare RECORD) is required")
    device = torch.device(args.device)
    import peft
    import transformers

    low, high = (int(x) for x in args.layers.split(","))
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                           "torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__, "seq": args.seq,
                           "cases": []}
    for spec in args.cases.split(","):
        model_id, finetune, ckpt, micro = spec.split("/")
        case: dict[str, Any] = {"case": spec, "model": model_id, "finetune": finetune, "ckpt": ckpt == "ckpt",
                                "micro_batch": int(micro)}
        try:
            runs = []
            for n in (low, high):
                runs.append(measure(model_id, finetune, ckpt == "ckpt", int(micro), n, args.repeat, args.seq, device))
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        except Exception as exc:  # one case's failure (an OOM, a build error) keeps the others
            case["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            per_layer = (runs[1]["step_s"] - runs[0]["step_s"]) / (high - low)
            case.update(runs=runs, per_layer_s=per_layer, fixed_s=runs[0]["step_s"] - low * per_layer,
                        per_layer_kernel_ms={k: (runs[1]["kernel_ms"].get(k, 0.0) - runs[0]["kernel_ms"].get(k, 0.0))
                                             / (high - low) for k in runs[1]["kernel_ms"]})
        out["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "runs"}), flush=True)
        if args.out:
            args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
