"""What bench/probes/memory_peak_probe.py and bench/probes/train_profile_probe.py share: a training step built from a
case the way bench/accuracy/measure_h200.py builds it, and the loop over the cases a probe is asked for (one GPU)."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "accuracy"))

import measure_h200 as mh


def training_step(case: dict[str, Any], models: dict[str, Any]) -> Callable[[], None]:
    """One optimizer step of ``case`` on CUDA: model, activation checkpointing, adapters and optimizer as
    bench/accuracy/measure_h200.py sets them up."""
    import torch

    prec = case["precision"]
    weight_dtype = torch.float32 if prec in ("fp32", "amp-bf16") else torch.bfloat16
    cfg = mh.hf_config(models, case, tiny=False)
    model = mh.build_model(cfg, weight_dtype, "cuda", train=True)
    if case["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case["finetune"] in ("lora", "qlora"):
        if case["activation_checkpointing"]:
            model.enable_input_require_grads()
        model = mh.apply_lora(model, int(case["lora_rank"]))
    opt = mh.make_optimizer(case["optimizer"], [p for p in model.parameters() if p.requires_grad])
    x = torch.randint(0, int(cfg.vocab_size), (int(case["micro_batch"]), int(case["seq_len"])), device="cuda")

    def step() -> None:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


Probe = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def run_cases(cases_path: str, only: str, out_path: str, probe: Probe, listed: str) -> None:
    """``probe(case, models)`` for every case id in ``only`` (comma-separated); one failing case keeps the
    others. Prints each result but its ``listed`` key, writes them all to ``out_path``."""
    import torch

    models, cases = mh.load_cases(Path(cases_path))
    wanted = only.split(",")
    out: dict[str, Any] = {"versions": mh.library_versions(), "results": {}}
    for case in cases:
        if case["id"] not in wanted:
            continue
        print("probing", case["id"], flush=True)
        try:
            out["results"][case["id"]] = probe(case, models)
        except Exception as exc:
            out["results"][case["id"]] = {"error": repr(exc)}
        gc.collect()  # the case's model and optimizer went with its probe's frame
        torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in out["results"][case["id"]].items() if k != listed}), flush=True)
    Path(out_path).write_text(json.dumps(out, indent=1))
