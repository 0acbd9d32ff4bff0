"""What LoRA of a mixture of experts keeps for backward, and what it costs, on the worker's stack.

transformers 5 keeps routed experts in fused 3-D parameters; peft's ``target_modules="all-linear"`` (the
workers' LoRA, workers/model/build.py) adapts them through ``target_parameters`` (a ParamWrapper that adds B @ A to
the whole expert weight each forward). This probe builds a few layers of a published MoE shape with random
weights and, per mode, counts the bytes autograd saves per token in one dense and one sparse layer (parameters'
own storage left out), the peak allocated above the weights for one forward + backward, and the step time:

  full         every weight trains
  lora         the workers' LoRA (all-linear: attention, dense and shared MLPs, and the routed experts)
  lora-linear  LoRA on the nn.Linear layers only (the routed experts frozen, not adapted)

Standalone (the device's python3 with torch, transformers, peft):

    python3 bench/probes/moe_lora_probe.py --model deepseek-v2-lite --layers 3 --batch 4 --seq 2048 --out $OUT/p.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import yaml

HERE = Path(__file__).resolve().parent


def shape(name: str) -> dict[str, Any]:
    published = HERE.parents[1] / "tests" / "data" / "hf_configs" / f"{name}.json"
    if published.is_file():
        loaded: dict[str, Any] = json.loads(published.read_text())
        return loaded
    models = yaml.safe_load((HERE.parent / "accuracy" / "cases_models.yaml").read_text())["models"]
    return dict(models[name])


def build(cfg_d: dict[str, Any], layers: int, mode: str, device: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {k: v for k, v in cfg_d.items() if k != "architectures"}
    kw["num_hidden_layers"] = layers
    if "layer_types" in kw:
        kw["layer_types"] = kw["layer_types"][:layers]
    cfg = AutoConfig.for_model(**kw)
    torch.manual_seed(0)
    with torch.device(device):
        model: torch.nn.Module = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
    if mode == "full":
        return model
    from peft import LoraConfig, get_peft_model

    if mode == "lora":
        targets: Any = "all-linear"
    else:  # a regex of the nn.Linear modules' full names: a list of short names also catches the experts'
        # parameters of the same names in some peft versions
        names = sorted(n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n)
        targets = "^(" + "|".join(n.replace(".", r"\.") for n in names) + ")$"
    wrapped: torch.nn.Module = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                                target_modules=targets, task_type="CAUSAL_LM"))
    return wrapped


def run(cfg_d: dict[str, Any], args: argparse.Namespace, mode: str) -> dict[str, Any]:
    model = build(cfg_d, args.layers, mode, args.device)
    trainable = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    layers: torch.nn.ModuleList = next(m.layers for m in model.modules()
                                       if isinstance(getattr(m, "layers", None), torch.nn.ModuleList))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    where = {"layer": -1}
    saved: dict[int, int] = defaultdict(int)
    seen: set[int] = set()
    top: dict[int, list[tuple[tuple[int, ...], str, int]]] = defaultdict(list)

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and ptr not in params:
            seen.add(ptr)
            nbytes = t.untyped_storage().nbytes()
            saved[where["layer"]] += nbytes
            top[where["layer"]].append((tuple(t.shape), str(t.dtype).replace("torch.", ""), nbytes))
        return t

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda mod, a, i=i: where.__setitem__("layer", i))
        layer.register_forward_hook(lambda mod, a, o: where.__setitem__("layer", 999))
    tokens = args.batch * args.seq
    ids = torch.randint(0, int(cfg_d["vocab_size"]), (args.batch, args.seq), device=args.device)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    peak = (torch.cuda.max_memory_allocated() - base) if cuda else None
    times = []
    for _ in range(args.repeat + 2):
        model.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    kernels: list[tuple[str, float, int]] = []
    if args.profile and cuda:
        from torch.profiler import ProfilerActivity, profile

        model.zero_grad(set_to_none=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(input_ids=ids, labels=ids).loss.backward()
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:args.profile]
        kernels = [(e.key[:90], e.device_time_total / 1e3, e.count) for e in rows]  # ms over the step
    dense = min(saved) if saved else 0
    sparse = args.layers - 1
    out = {
        "mode": mode, "trainable_tensors": len(trainable),
        "trainable_params": sum(int(torch.Size(s).numel()) for s in trainable.values()),
        "expert_adapters": sorted({n for n in trainable if "experts" in n})[:6],
        "saved_bytes_per_token": {str(k): v / tokens for k, v in sorted(saved.items()) if k < 999},
        "dense_layer": dense, "sparse_layer": sparse,
        "largest_saved_in_sparse_layer": sorted(top[sparse], key=lambda x: -x[2])[:12],
        "saved_in_first_layer": top[0] if args.all_saved else None,  # in the order autograd saved them
        "saved_in_sparse_layer": top[sparse] if args.all_saved else None,
        "peak_allocated_above_weights_gib": None if peak is None else peak / 2**30,
        "step_s_median": statistics.median(times[2:]),
        "top_kernels_ms": kernels,
    }
    del model, loss
    if cuda:
        torch.cuda.empty_cache()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="deepseek-v2-lite")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--modes", default="full,lora,lora-linear")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also list the N CUDA kernels that took longest in one step (torch.profiler)")
    parser.add_argument("--all-saved", action="store_true",
                        help="record every tensor saved in the first and the last layer, in order")
    parser.add_argument("--out")
    args = parser.parse_args()
    import peft
    import transformers

    rec: dict[str, Any] = {"model": args.model, "layers": args.layers, "batch": args.batch, "seq": args.seq,
                           "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                           "torch": torch.__version__, "transformers": transformers.__version__,
                           "peft": peft.__version__, "modes": []}
    cfg_d = shape(args.model)
    for mode in args.modes.split(","):
        res = run(cfg_d, args, mode)
        rec["modes"].append(res)
        print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
