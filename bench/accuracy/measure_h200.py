"""Measure real peak memory and speed of the cases in bench/accuracy/cases.yaml on NVIDIA GPUs.

Standalone on purpose: it runs with the device machine's plain ``python3`` (torch, transformers,
peft, pyyaml; torchao and bitsandbytes when importable) and imports nothing from gpuplan.

    python3 bench/accuracy/measure_h200.py sweep --group single --gpus 0,1 --out $OUT/h200.json
    python3 bench/accuracy/measure_h200.py sweep --group multi --out $OUT/h200_x2.json
    python3 bench/accuracy/measure_h200.py sweep --device cpu --tiny --out /tmp/dry.json   # dry run

Every case runs in its own process (``case`` subcommand; two-GPU cases through torchrun), so an
OOM or allocator state never leaks into the next case. docs/lab-notes/2026-11-30-h200-measurements.md describes the
record.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import gc
import json
import os
import platform
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = HERE / "cases.yaml"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GIB = 1024**3

# Tiny stand-in shapes for the CPU dry run: same model types, so every code path is exercised.
TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512},
    "llama": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
    },
    "qwen2": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
    },
}
# The architectures of bench/accuracy/cases_models.yaml (issue 12), shrunk the same way; windows and MoE kept.
_TINY_DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "vocab_size": 512}
TINY.update({
    "qwen3": {**_TINY_DECODER, "num_hidden_layers": 2},
    "olmo2": {**_TINY_DECODER, "num_hidden_layers": 2},
    "phi3": {**_TINY_DECODER, "num_hidden_layers": 2},
    "gemma3_text": {**_TINY_DECODER, "num_hidden_layers": 6, "sliding_window": 16},
    "qwen3_moe": {**_TINY_DECODER, "num_hidden_layers": 2, "num_experts": 8, "moe_intermediate_size": 32},
    "gpt_oss": {**_TINY_DECODER, "intermediate_size": 32, "num_hidden_layers": 2, "num_local_experts": 4,
                "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"], "pad_token_id": 0,
                "eos_token_id": 1},
})
# Architectures transformers has no SDPA path for (catalog.hf_config.EAGER_ONLY_FAMILIES; this script runs
# without the repository on its path)
EAGER_ONLY = frozenset({"gpt_oss"})


# ----------------------------------------------------------------------------- cases


def load_cases(path: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    import yaml

    data = yaml.safe_load(path.read_text())
    defaults = data.get("defaults", {})
    cases = [{**defaults, **c} for c in data["cases"]]
    return data["models"], cases


def tiny_case(case: dict[str, Any]) -> dict[str, Any]:
    """Shrink a case so it runs in seconds on a CPU (dry run of every code path)."""
    c = dict(case)
    c["seq_len"] = min(int(c["seq_len"]), 64)
    c["micro_batch"] = min(int(c["micro_batch"]), 2)
    if c["task"] == "infer":
        c["batch"] = min(int(c["batch"]), 2)
        c["prompt_tokens"] = min(int(c["prompt_tokens"]), 32)
        c["output_tokens"] = min(int(c["output_tokens"]), 8)
    return c


# ----------------------------------------------------------------------------- memory probes


def nvml_used_bytes(physical_index: int) -> int | None:
    """Device memory in use as the driver sees it, read without creating a CUDA context."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(physical_index)
        used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
        pynvml.nvmlShutdown()
        return used
    except Exception:
        return None


class Mem:
    """Peak-memory bookkeeping for one process and one device."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"

    def stats(self) -> dict[str, int]:
        import torch

        if not self.cuda:
            return {"allocated": 0, "reserved": 0, "max_allocated": 0, "max_reserved": 0}
        return {
            "allocated": int(torch.cuda.memory_allocated()),
            "reserved": int(torch.cuda.memory_reserved()),
            "max_allocated": int(torch.cuda.max_memory_allocated()),
            "max_reserved": int(torch.cuda.max_memory_reserved()),
        }

    def reset_peak(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def used_by_driver(self) -> int | None:
        import torch

        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    def sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()


# ----------------------------------------------------------------------------- model building


def hf_config(models: dict[str, dict[str, Any]], case: dict[str, Any], tiny: bool) -> Any:
    from transformers import AutoConfig

    raw = dict(models[case["model"]])
    model_type = raw.pop("model_type")
    if tiny:
        raw.update(TINY[model_type])
    cfg = AutoConfig.for_model(model_type, **raw)
    cfg._attn_implementation = attn_for(model_type)
    return cfg


def attn_for(model_type: str) -> str:
    """The attention the workers run: eager where transformers has no SDPA path (gpt-oss)."""
    return "eager" if model_type in EAGER_ONLY else "sdpa"


def build_model(cfg: Any, dtype: Any, device: str, train: bool) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    cfg.use_cache = not train
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=cfg._attn_implementation)  # type: ignore[no-untyped-call]
    model.to(device)
    model.train(train)
    return model


def quantize_linear_4bit(model: Any) -> int:
    """Replace the decoder's nn.Linear layers (not lm_head) by bitsandbytes NF4 layers.

    QLoRA normally quantizes while loading a checkpoint; with random weights we build in bf16 on
    the GPU and swap each projection for its 4-bit copy, freeing the bf16 weight as we go.
    """
    import bitsandbytes as bnb
    import torch
    from torch import nn

    count = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if not isinstance(child, nn.Linear) or full.endswith("lm_head"):
                continue
            new = bnb.nn.Linear4bit(
                child.in_features,
                child.out_features,
                bias=child.bias is not None,
                compute_dtype=torch.bfloat16,
                compress_statistics=True,
                quant_type="nf4",
                device="meta",
            )
            w = bnb.nn.Params4bit(
                child.weight.data, requires_grad=False, compress_statistics=True, quant_type="nf4"
            ).to(child.weight.device)
            new.weight = w
            if child.bias is not None:
                new.bias = nn.Parameter(child.bias.data, requires_grad=False)
            setattr(parent, name, new)
            del child, w
            count += 1
    gc.collect()
    return count


def apply_lora(model: Any, rank: int) -> Any:
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


def make_optimizer(name: str, params: list[Any]) -> Any:
    import torch

    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-5)
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-4, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-3)
    if name == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=1e-5)
    raise ValueError(f"unknown optimizer {name!r}")


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for mod in ("torch", "transformers", "peft", "torchao", "bitsandbytes", "accelerate"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # absent or broken: say which
            out[mod] = f"unavailable: {type(e).__name__}: {e}"[:200]
    return out


# ----------------------------------------------------------------------------- one case, one process


def mark(rec: dict[str, Any], phase: str) -> None:
    """Record the phase reached and write the record now, so a hung or killed case shows where it stopped."""
    rec["phase"] = phase
    path = rec.get("_out")
    if path:
        Path(path).write_text(json.dumps({k: v for k, v in rec.items() if k != "_out"}, default=str))


def timed_steps(
    step: Callable[[], None], mem: Mem, warmup: int, timed: int, cap_s: float
) -> tuple[list[float], list[dict[str, int]]]:
    """Run warmup + timed steps; returns the timed steps' seconds and the memory after each step."""
    per_step_mem: list[dict[str, int]] = []
    times: list[float] = []
    start = time.perf_counter()
    for i in range(warmup + timed):
        mem.sync()
        t0 = time.perf_counter()
        step()
        mem.sync()
        dt = time.perf_counter() - t0
        per_step_mem.append(mem.stats())
        if i >= warmup:
            times.append(dt)
            if time.perf_counter() - start > cap_s and len(times) >= 2:
                break
    return times, per_step_mem


def run_train(case: dict[str, Any], models: dict[str, Any], args: argparse.Namespace, rec: dict[str, Any]) -> None:
    import torch

    dist = case["gpu_count"] > 1
    device = args.device
    mem = Mem(device)
    rank, world = 0, 1
    if dist:
        import torch.distributed as tdist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_RANK"])
        if device == "cuda":
            torch.cuda.set_device(local)
        mark(rec, "dist-init")
        tdist.init_process_group("nccl" if device == "cuda" else "gloo")
    prec, ft = case["precision"], case["finetune"]
    weight_dtype = torch.float32 if prec in ("fp32", "amp-bf16") else torch.bfloat16
    cfg = hf_config(models, case, args.tiny)
    mark(rec, "build")
    model = build_model(cfg, weight_dtype, device, train=True)
    rec["n_params"] = int(sum(p.numel() for p in model.parameters()))
    if ft == "qlora":
        rec["quantized_linears"] = quantize_linear_4bit(model)
    if case["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if ft in ("lora", "qlora"):
        if case["activation_checkpointing"]:
            model.enable_input_require_grads()
        model = apply_lora(model, int(case["lora_rank"]))
    if prec == "fp8":
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(model, module_filter_fn=lambda mod, fqn: "lm_head" not in fqn)
    sharding = case["sharding"]
    if sharding in ("fsdp", "fsdp-grad-op"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if prec == "amp-bf16" else None
        )
        kw: dict[str, Any] = {"reshard_after_forward": sharding == "fsdp"}
        if mp is not None:
            kw["mp_policy"] = mp
        for layer in model.model.layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
    elif sharding == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, device_ids=[int(os.environ["LOCAL_RANK"])] if device == "cuda" else None)
    trainable = [p for p in model.parameters() if p.requires_grad]
    rec["n_trainable_params"] = int(sum(p.numel() for p in trainable))
    opt = make_optimizer(case["optimizer"], trainable)
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
    rec["after_build"] = mem.stats()
    rec["after_build_driver_used_bytes"] = mem.used_by_driver()
    mem.reset_peak()

    mb, seq = int(case["micro_batch"]), int(case["seq_len"])
    vocab = int(cfg.vocab_size)
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    x = torch.randint(0, vocab, (mb, seq), device=device, generator=gen)
    use_amp = prec == "amp-bf16" and sharding not in ("fsdp", "fsdp-grad-op")
    amp = torch.autocast(device_type=device, dtype=torch.bfloat16) if use_amp else contextlib.nullcontext()

    def step() -> None:
        with amp:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    mark(rec, "steps")
    times, per_step = timed_steps(step, mem, args.warmup, args.steps, args.step_cap_s)
    mark(rec, "done")
    rec["step_s"] = times
    rec["peak_after_first_step"] = per_step[0]
    step_s = sorted(times)[len(times) // 2]
    rec["median_step_s"] = step_s
    rec["tokens_per_s"] = mb * seq * world / step_s
    rec["tokens_per_s_mean"] = mb * seq * world * len(times) / sum(times)
    if dist:
        import torch.distributed as tdist

        tdist.barrier()
        tdist.destroy_process_group()


def run_infer(case: dict[str, Any], models: dict[str, Any], args: argparse.Namespace, rec: dict[str, Any]) -> None:
    import torch
    from torch import nn

    device = args.device
    mem = Mem(device)
    cfg = hf_config(models, case, args.tiny)
    try:
        rec["host"] = host_probe(device)
    except Exception as e:  # a diagnostic; never the reason a case fails
        rec["host"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    mark(rec, "build")
    model = build_model(cfg, torch.bfloat16, device, train=False)
    rec["n_params"] = int(sum(p.numel() for p in model.parameters()))
    weights = case["weights"]
    if weights in ("int8", "fp8"):
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            Int8WeightOnlyConfig,
            quantize_,
        )

        qcfg = Int8WeightOnlyConfig() if weights == "int8" else Float8DynamicActivationFloat8WeightConfig()
        rec["build_before_quantize"] = mem.stats()
        quantize_(model, qcfg, filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
    rec["after_build"] = mem.stats()
    rec["after_build_driver_used_bytes"] = mem.used_by_driver()
    mem.reset_peak()

    b, p, o = int(case["batch"]), int(case["prompt_tokens"]), int(case["output_tokens"])
    gen = torch.Generator(device=device).manual_seed(1234)
    ids = torch.randint(3, int(cfg.vocab_size), (b, p), device=device, generator=gen)
    mask = torch.ones_like(ids)
    gkw: dict[str, Any] = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    mark(rec, "warmup")
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2, **gkw)
        mark(rec, "prefill")
        pre: list[float] = []
        for _ in range(2):
            mem.sync()
            t0 = time.perf_counter()
            try:
                model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
            except TypeError:  # models without logits_to_keep
                model(input_ids=ids, attention_mask=mask, use_cache=True)
            mem.sync()
            pre.append(time.perf_counter() - t0)
        mark(rec, "generate")
        t_gens: list[float] = []
        steps_ms: list[float] = []
        for _ in range(max(1, args.gen_repeats)):
            stamps = StepStamps()
            mem.sync()
            t0 = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=o,
                min_new_tokens=o,
                stopping_criteria=stopping_list([stamps]),
                **gkw,
            )
            mem.sync()
            t_gens.append(time.perf_counter() - t0)
            steps_ms = stamps.intervals_ms()
        # The record's peak and end-of-run driver use are read here, so the probe below cannot move them.
        rec["peak"] = mem.stats()
        rec["driver_used_end_bytes"] = mem.used_by_driver()
        if args.decode_probe_steps > 0:
            mark(rec, "decode-probe")
            try:
                rec["decode_probe"] = decode_probe(model, ids, mask, args.decode_probe_steps, device)
            except Exception as e:  # a diagnostic; the case's numbers above stand without it
                rec["decode_probe"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    mark(rec, "done")
    rec["generated_tokens_per_seq"] = int(out.shape[1]) - p
    rec["prefill_s"] = pre
    rec["generate_s_all"] = t_gens
    # Decode step as generate() itself paces it: the time between successive stopping-criteria calls
    # (one per generated token, the first after prefill), in the last timed generate().
    if steps_ms:
        rec["decode_step_ms_median"] = sorted(steps_ms)[len(steps_ms) // 2]
        rec["decode_step_ms_p10_p90"] = [
            sorted(steps_ms)[len(steps_ms) // 10],
            sorted(steps_ms)[(9 * len(steps_ms)) // 10],
        ]
    rec.update(infer_rates(rec, b, p))


def infer_rates(rec: dict[str, Any], batch: int, prompt: int) -> dict[str, Any]:
    """Throughput fields of an inference record from its raw timings.

    The first full-length generate() of a process is not steady state: cuDNN's SDPA builds an
    execution plan for every KV length it has not seen (~50-60 ms per decode step on an H200, once;
    docs/lab-notes/2026-11-30-h200-measurements.md). With several timed calls, ``generate_s`` is the median of all but
    the first, i.e. what a worker's later batches of the same shape take; ``generate_first_s`` keeps the
    cold call. A record with one timed call (the first sweeps) keeps that call.
    """
    t_gens = [float(v) for v in rec.get("generate_s_all") or [rec["generate_s"]]]
    warm = sorted(t_gens[1:] or t_gens)
    t_gen = warm[len(warm) // 2] if len(warm) % 2 else (warm[len(warm) // 2 - 1] + warm[len(warm) // 2]) / 2
    t_pre = min(float(v) for v in rec["prefill_s"])
    new_tokens = int(rec["generated_tokens_per_seq"])
    out: dict[str, Any] = {
        "generate_s": t_gen,
        "prefill_tokens_per_s": batch * prompt / t_pre,
        "decode_tokens_per_s": batch * max(new_tokens - 1, 1) / max(t_gen - t_pre, 1e-9),
        "e2e_output_tokens_per_s": batch * new_tokens / t_gen,
    }
    if len(t_gens) > 1:
        out["generate_first_s"] = t_gens[0]
    return out


class StepStamps:
    """A stopping criterion that never stops: it only stamps the host clock once per generated token."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def intervals_ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in zip(self.stamps, self.stamps[1:], strict=False)]


def stopping_list(items: list[Any]) -> Any:
    from transformers import StoppingCriteriaList as _List

    return _List(items)


def decode_probe(model: Any, ids: Any, mask: Any, steps: int, device: str) -> dict[str, Any]:
    """Where a decode step's time goes, outside generate(): greedy steps on the prompt's KV cache.

    ``issue_ms``: host time to enqueue one step (forward + argmax), no sync; ``gpu_ms``: CUDA-event
    time of the same step; ``wall_sync_ms``: one step with a sync after it (what generate() pays);
    ``wall_nosync_ms``: steps back to back without syncs, per step. issue ~= wall >> gpu means the
    host (Python + kernel launches) sets the pace, not the GPU.
    """
    import torch

    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    try:
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
    except TypeError:  # models without logits_to_keep
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    del out
    issue: list[float] = []
    gpu: list[float] = []
    wall_sync: list[float] = []
    for _ in range(steps):
        sync()
        ev0 = torch.cuda.Event(enable_timing=True) if cuda else None  # type: ignore[no-untyped-call]
        ev1 = torch.cuda.Event(enable_timing=True) if cuda else None  # type: ignore[no-untyped-call]
        t0 = time.perf_counter()
        if ev0 is not None:
            ev0.record()
        o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = o.logits[:, -1:].argmax(-1)
        if ev1 is not None:
            ev1.record()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        cache = o.past_key_values
        issue.append((t1 - t0) * 1e3)
        wall_sync.append((t2 - t0) * 1e3)
        if ev0 is not None and ev1 is not None:
            gpu.append(ev0.elapsed_time(ev1))
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
        nxt = o.logits[:, -1:].argmax(-1)
        cache = o.past_key_values
    sync()
    nosync = (time.perf_counter() - t0) * 1e3 / steps
    kernels = None
    if cuda:
        with contextlib.suppress(Exception):
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                o = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                nxt = o.logits[:, -1:].argmax(-1)
                sync()
            kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    del cache, o
    return {
        "steps": steps,
        "issue_ms": med(issue),
        "gpu_ms": med(gpu) if gpu else None,
        "wall_sync_ms": med(wall_sync),
        "wall_nosync_ms": nosync,
        "kernels_per_step": kernels,
    }


def host_probe(device: str) -> dict[str, Any]:
    """The host's side of a launch-bound loop: CPU, load, and what one tiny CUDA launch and one sync cost."""
    import torch

    info: dict[str, Any] = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    with contextlib.suppress(Exception):
        info["loadavg"] = list(os.getloadavg())
    with contextlib.suppress(Exception):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        info["cpu_model"] = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
        mhz = [float(ln.split(":", 1)[1]) for ln in lines if ln.startswith("cpu MHz")]
        info["cpu_mhz_mean"] = sum(mhz) / len(mhz) if mhz else None
    t0 = time.perf_counter()
    acc = 0
    for i in range(2_000_000):  # pure-Python speed, comparable across hosts
        acc += i & 7
    info["python_loop_2m_s"] = time.perf_counter() - t0
    if device == "cuda":
        x = torch.zeros(16, device="cuda")
        for _ in range(200):
            x.add_(1)
        torch.cuda.synchronize()
        n = 5000
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        info["launch_issue_us"] = (t1 - t0) / n * 1e6
        info["launch_total_us"] = (t2 - t0) / n * 1e6
        rt = []
        for _ in range(200):
            x.add_(1)
            t0 = time.perf_counter()
            torch.cuda.synchronize()
            rt.append((time.perf_counter() - t0) * 1e6)
        info["sync_us_median"] = sorted(rt)[len(rt) // 2]
        it = []
        for _ in range(200):
            t0 = time.perf_counter()
            float(x.sum().item())
            it.append((time.perf_counter() - t0) * 1e6)
        info["item_us_median"] = sorted(it)[len(it) // 2]
    return info


def case_main(args: argparse.Namespace) -> int:
    """Child process: run one case and write its JSON record to args.out (per rank when distributed)."""
    models, cases = load_cases(Path(args.cases))
    case = next(c for c in cases if c["id"] == args.case_id)
    if args.tiny:
        case = tiny_case(case)
    rank = int(os.environ.get("RANK", "0"))
    rec: dict[str, Any] = {"id": case["id"], "rank": rank, "case": case, "phase": "init", "oom": False}
    physical = int(os.environ.get("BENCH_PHYSICAL_GPU", os.environ.get("LOCAL_RANK", "0")))
    out = Path(args.out if rank == 0 or case["gpu_count"] == 1 else f"{args.out}.rank{rank}")
    t_start = time.perf_counter()
    rec["_out"] = str(out)
    if args.stack_dump_after_s > 0:
        # A hung case is killed by the sweep; dump every thread's Python stack to the log first.
        faulthandler.dump_traceback_later(args.stack_dump_after_s, exit=False)
    try:
        import torch

        if args.device == "cuda":
            # CUDA context: driver-visible use before vs after init, minus what the allocator holds.
            before = nvml_used_bytes(physical)
            dev = int(os.environ.get("LOCAL_RANK", "0")) if case["gpu_count"] > 1 else 0
            torch.cuda.set_device(dev)
            torch.zeros(1, device="cuda")
            torch.cuda.synchronize()
            free, total = torch.cuda.mem_get_info()
            rec["driver_used_before_init_bytes"] = before
            rec["driver_used_after_init_bytes"] = int(total - free)
            rec["reserved_after_init_bytes"] = int(torch.cuda.memory_reserved())
            if before is not None:
                rec["cuda_context_bytes"] = int(total - free) - before - int(torch.cuda.memory_reserved())
            rec["gpu_total_bytes"] = int(total)
        if case["task"] == "train":
            run_train(case, models, args, rec)
        else:
            run_infer(case, models, args, rec)
    except Exception as e:  # OOM is a result, anything else is an error; both are recorded
        import torch

        is_oom = isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
        rec["oom"] = bool(is_oom)
        rec["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
        if not is_oom:
            rec["traceback"] = traceback.format_exc()[-4000:]
    finally:
        rec["wall_s"] = time.perf_counter() - t_start
        try:
            import torch

            if args.device == "cuda":
                rec.setdefault("peak", Mem("cuda").stats())
                rec.setdefault("driver_used_end_bytes", Mem("cuda").used_by_driver())
        except Exception as e:
            rec["peak_error"] = repr(e)
        rec.pop("_out", None)
        out.write_text(json.dumps(rec, default=str))
    return 0


# ----------------------------------------------------------------------------- summarising records


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One result record per case from its rank records (max memory over ranks, rank 0's speed)."""
    r0 = next((r for r in ranks if r.get("rank", 0) == 0), ranks[0])
    case = r0["case"]
    res: dict[str, Any] = {"id": r0["id"], **{k: case.get(k) for k in case if k != "id"}}
    res["oom"] = any(r.get("oom") for r in ranks)
    errs = [r["error"] for r in ranks if r.get("error")]
    if errs:
        res["error"] = errs[0]
    tb = [r["traceback"] for r in ranks if r.get("traceback")]
    if tb:
        res["traceback"] = tb[0]
    res["failed_phase"] = r0.get("phase") if r0.get("phase") != "done" else None
    res["ranks_reporting"] = len(ranks)

    def mx(key: str, sub: str | None = None) -> int | None:
        vals = []
        for r in ranks:
            v = r.get(key)
            if sub is not None:
                v = v.get(sub) if isinstance(v, dict) else None
            if v is not None:
                vals.append(int(v))
        return max(vals) if vals else None

    # Steps-phase peak (reset once the model is built, wrapped and quantized; weights stay
    # allocated, so they are included) and the process-lifetime peak (build transients included).
    steps_alloc, steps_res = mx("peak", "max_allocated"), mx("peak", "max_reserved")
    build_alloc, build_res = mx("after_build", "max_allocated"), mx("after_build", "max_reserved")
    res["peak_allocated_bytes"] = steps_alloc
    res["peak_reserved_bytes"] = steps_res
    res["process_peak_allocated_bytes"] = max(v for v in (steps_alloc, build_alloc, 0) if v is not None)
    res["process_peak_reserved_bytes"] = max(v for v in (steps_res, build_res, 0) if v is not None)
    res["weights_and_state_after_build_bytes"] = mx("after_build", "allocated")
    res["peak_after_first_step_allocated_bytes"] = mx("peak_after_first_step", "max_allocated")
    res["cuda_context_bytes"] = mx("cuda_context_bytes")
    end_used = mx("driver_used_end_bytes")
    end_reserved = mx("peak", "reserved")
    res["driver_used_end_bytes"] = end_used
    res["outside_allocator_end_bytes"] = (end_used - end_reserved) if end_used and end_reserved is not None else None
    res["gpu_total_bytes"] = mx("gpu_total_bytes")
    for k in (
        "n_params",
        "n_trainable_params",
        "tokens_per_s",
        "tokens_per_s_mean",
        "median_step_s",
        "step_s",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "e2e_output_tokens_per_s",
        "prefill_s",
        "generate_s",
        "generated_tokens_per_seq",
        "generate_s_all",
        "generate_first_s",
        "decode_step_ms_median",
        "decode_step_ms_p10_p90",
        "decode_probe",
        "host",
        "quantized_linears",
    ):
        if k in r0:
            res[k] = r0[k]
    res["wall_s"] = max(float(r.get("wall_s", 0.0)) for r in ranks)
    return res


# ----------------------------------------------------------------------------- the sweep (parent)


def run_one(case: dict[str, Any], args: argparse.Namespace, gpus: list[str], workdir: Path) -> dict[str, Any]:
    out = workdir / f"{case['id']}.json"
    base = [
        "--cases",
        str(args.cases),
        "--case-id",
        case["id"],
        "--out",
        str(out),
        "--device",
        args.device,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--step-cap-s",
        str(args.step_cap_s),
        "--gen-repeats",
        str(args.gen_repeats),
        "--decode-probe-steps",
        str(args.decode_probe_steps),
        "--stack-dump-after-s",
        str(max(1.0, args.case_timeout_s - 15)),
    ] + (["--tiny"] if args.tiny else [])
    env = dict(os.environ)
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "0")
    n = int(case["gpu_count"])
    if n > 1:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={n}",
            str(Path(__file__).resolve()),
            "case",
            *base,
        ]
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[:n])
    else:
        cmd = [sys.executable, str(Path(__file__).resolve()), "case", *base]
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = gpus[0]
            env["BENCH_PHYSICAL_GPU"] = gpus[0]
    t0 = time.perf_counter()
    log = workdir / f"{case['id']}.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=args.case_timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            timed_out = True
    ranks = [json.loads(p.read_text()) for p in sorted(workdir.glob(f"{case['id']}.json*"))]
    if ranks:
        res = summarise(ranks)
    else:
        res = {
            "id": case["id"],
            **{k: v for k, v in case.items() if k != "id"},
            "oom": False,
            "error": "no record written (process crashed or was killed)",
        }
    if timed_out:
        res["error"] = f"timed out after {args.case_timeout_s:.0f} s" + (
            f"; {res['error']}" if res.get("error") else ""
        )
    res["exit_code"] = proc.returncode
    res["runner_wall_s"] = time.perf_counter() - t0
    res["gpus"] = gpus[:n] if args.device == "cuda" else []
    if res.get("error") and not res.get("oom"):
        res["log_tail"] = log.read_text()[-8000:]
    return res


def environment(args: argparse.Namespace) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "libraries": library_versions(),
        "device": args.device,
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "step_cap_s": args.step_cap_s,
        "gpus": args.gpus,
        # Single-GPU cases run one process per listed GPU at once; with one GPU listed, one at a time.
        "concurrency": (
            "one single-GPU case process at a time on the host"
            if len(args.gpus.split(",")) == 1
            else f"{len(args.gpus.split(','))} single-GPU case processes at once (one per GPU)"
        ),
    }
    if args.device == "cuda":
        with contextlib.suppress(Exception):
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                    "--format=csv,noheader",
                ],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            ).stdout.strip()
            env["nvidia_smi"] = out.splitlines()
        with contextlib.suppress(Exception):
            import torch

            env["torch_cuda"] = torch.version.cuda
            env["gpu_count"] = torch.cuda.device_count()
            env["gpu_name"] = torch.cuda.get_device_name(0) if torch.cuda.device_count() else None
    return env


def sweep_main(args: argparse.Namespace) -> int:
    _, cases = load_cases(Path(args.cases))
    if args.group == "single":
        cases = [c for c in cases if c["gpu_count"] == 1]
    elif args.group == "multi":
        cases = [c for c in cases if c["gpu_count"] > 1]
    if args.only:
        # In the order given: a case that may hang can be put last, where its leftovers harm nothing.
        wanted = args.only.split(",")
        by_id = {c["id"]: c for c in cases}
        cases = [by_id[i] for i in wanted if i in by_id]
    gpus = args.gpus.split(",") if args.device == "cuda" else ["cpu"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench_"))
    env = environment(args)
    results: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()
    deadline = time.perf_counter() + args.budget_s

    def save() -> None:
        ordered = [results[c["id"]] for c in cases if c["id"] in results]
        out.write_text(json.dumps({"environment": env, "results": ordered}, indent=1, default=str))

    def report(res: dict[str, Any]) -> None:
        with lock:
            results[res["id"]] = res
            save()
            status = "OOM" if res.get("oom") else ("ERR " + str(res.get("error"))[:150] if res.get("error") else "ok")
            pa = res.get("peak_allocated_bytes") or 0
            pr = res.get("peak_reserved_bytes") or 0
            tps = res.get("tokens_per_s") or res.get("decode_tokens_per_s") or 0
            print(
                f"[{time.strftime('%H:%M:%S')}] {res['id']:<44} alloc {pa / GIB:7.2f} GiB  res {pr / GIB:7.2f} GiB"
                f"  tok/s {tps:10.1f}  {res.get('runner_wall_s', 0):5.1f}s  {status}",
                flush=True,
            )

    multi = [c for c in cases if c["gpu_count"] > 1]
    single = [c for c in cases if c["gpu_count"] == 1]
    # Single-GPU cases: one worker per GPU, each pulling the next case, so both GPUs stay busy.
    q: queue.Queue[dict[str, Any]] = queue.Queue()
    for c in single:
        q.put(c)

    def run_or_skip(c: dict[str, Any], on: list[str]) -> None:
        """Run case ``c`` on the GPUs ``on``, or record it as skipped once the time budget is spent."""
        if time.perf_counter() > deadline:
            report({"id": c["id"], **{k: v for k, v in c.items() if k != "id"}, "oom": False,
                    "error": "skipped: sweep time budget spent"})
        else:
            report(run_one(c, args, on, workdir))

    def worker(gpu: str) -> None:
        while True:
            try:
                c = q.get_nowait()
            except queue.Empty:
                return
            run_or_skip(c, [gpu])

    threads = [threading.Thread(target=worker, args=(g,)) for g in (gpus if args.device == "cuda" else gpus[:1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in multi:
        run_or_skip(c, gpus)
    save()
    print(f"wrote {out} ({len(results)} cases)")
    return 0


def merge_main(args: argparse.Namespace) -> int:
    """Merge sweep outputs into one record per case id, in cases.yaml order.

    Later files win, except that a later "skipped" record never replaces a measured one.
    """
    _, cases = load_cases(Path(args.cases))
    by_id: dict[str, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    for path in args.inputs:
        data = json.loads(Path(path).read_text())
        base = len(runs)
        if "environment" in data:  # a sweep's own output
            runs.append({"file": Path(path).name, **data["environment"]})
        else:  # an earlier merge: keep its runs and each record's run index
            runs.extend(data["runs"])
        for rec in data["results"]:
            i = base + int(rec.get("run", 0))
            if rec.get("generate_s_all"):  # rates from the raw timings, by the current definition
                rec.update(infer_rates(rec, int(rec["batch"]), int(rec["prompt_tokens"])))
            skipped = str(rec.get("error", "")).startswith("skipped")
            if skipped and rec["id"] in by_id:
                continue
            by_id[rec["id"]] = {**rec, "run": i}
    if args.annotate:
        import yaml

        for case_id, note in (yaml.safe_load(Path(args.annotate).read_text()) or {}).items():
            if case_id in by_id:
                by_id[case_id].update(note)
    missing = [c["id"] for c in cases if c["id"] not in by_id]
    results = [by_id[c["id"]] for c in cases if c["id"] in by_id]
    doc = {
        "format": "gpuplan-bench-h200/1 (see docs/lab-notes/2026-11-30-h200-measurements.md)",
        "runs": runs,
        "missing": missing,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {args.out}: {len(results)} records, missing {missing}")
    return 0


def _gib(v: Any) -> str:
    return f"{int(v) / GIB:.2f}" if v is not None else "–"


def table_main(args: argparse.Namespace) -> int:
    """Print the merged results as the markdown tables in docs/lab-notes/2026-11-30-h200-measurements.md."""
    doc = json.loads(Path(args.results).read_text())
    rows = doc["results"]
    print(
        "| id | hold-out | model | precision | optimizer | ckpt | finetune | sharding x GPUs | seq x mb "
        "| peak alloc GiB | peak reserved GiB | tokens/s | status |"
    )
    print("|" + "---|" * 13)
    for r in rows:
        if r["task"] != "train":
            continue
        status = "OOM" if r.get("oom") else ("not measured: " + str(r["error"])[:60] if r.get("error") else "ok")
        tps = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "–"
        if r.get("throughput_suspect"):
            tps += " (suspect: see note)"
        print(
            f"| {r['id']} | {'yes' if r['holdout'] else 'no'} | {r['model']} | {r['precision']} | {r['optimizer']} "
            f"| {'on' if r['activation_checkpointing'] else 'off'} | {r['finetune']} "
            f"| {r['sharding']} x {r['gpu_count']} "
            f"| {r['seq_len']} x {r['micro_batch']} | {_gib(r.get('peak_allocated_bytes'))} "
            f"| {_gib(r.get('peak_reserved_bytes'))} | {tps} | {status} |"
        )
    print()
    print(
        "| id | hold-out | model | weights | batch | prompt | output | peak alloc GiB | peak reserved GiB "
        "| prefill tok/s | decode tok/s | status |"
    )
    print("|" + "---|" * 12)
    for r in rows:
        if r["task"] != "infer":
            continue
        status = "OOM" if r.get("oom") else ("error" if r.get("error") else "ok")
        pre = f"{r['prefill_tokens_per_s']:.0f}" if r.get("prefill_tokens_per_s") else "–"
        dec = f"{r['decode_tokens_per_s']:.0f}" if r.get("decode_tokens_per_s") else "–"
        print(
            f"| {r['id']} | {'yes' if r['holdout'] else 'no'} | {r['model']} | {r['weights']} | {r['batch']} "
            f"| {r['prompt_tokens']} | {r['output_tokens']} | {_gib(r.get('peak_allocated_bytes'))} "
            f"| {_gib(r.get('peak_reserved_bytes'))} | {pre} | {dec} | {status} |"
        )
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge", help="merge sweep outputs into bench/results/h200.json")
    m.add_argument("inputs", nargs="+")
    m.add_argument("--cases", default=str(DEFAULT_CASES))
    m.add_argument("--out", required=True)
    m.add_argument("--annotate", default="", help="YAML {case id: {field: value}} merged into records")
    t = sub.add_parser("table", help="print merged results as markdown tables")
    t.add_argument("results")
    for name in ("sweep", "case"):
        s = sub.add_parser(name)
        s.add_argument("--cases", default=str(DEFAULT_CASES))
        s.add_argument("--out", required=True)
        s.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
        s.add_argument("--tiny", action="store_true", help="tiny model shapes (CPU dry run)")
        s.add_argument("--warmup", type=int, default=2)
        s.add_argument("--steps", type=int, default=5)
        s.add_argument("--step-cap-s", type=float, default=12.0, help="stop timing after this long (>=2 steps)")
        s.add_argument("--gen-repeats", type=int, default=2, help="timed generate() calls per inference case")
        s.add_argument(
            "--decode-probe-steps",
            type=int,
            default=16,
            help="greedy steps of the host/GPU decode probe per inference case (0: off)",
        )
        if name == "sweep":
            s.add_argument("--group", choices=["single", "multi", "all"], default="all")
            s.add_argument("--gpus", default="0,1")
            s.add_argument("--only", default="", help="comma-separated case ids")
            s.add_argument("--budget-s", type=float, default=540.0, help="start no case after this long")
            s.add_argument("--case-timeout-s", type=float, default=150.0)
        else:
            s.add_argument("--case-id", required=True)
            s.add_argument(
                "--stack-dump-after-s",
                type=float,
                default=0.0,
                help="dump all Python stacks to stderr after this long (0: never)",
            )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.cmd == "merge":
        return merge_main(args)
    if args.cmd == "table":
        return table_main(args)
    return case_main(args) if args.cmd == "case" else sweep_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
