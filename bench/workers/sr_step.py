"""The optimizer step alone on a model's parameter list: torch AdamW on bf16 weights (bf16-plain), the first
stochastic-rounding AdamW (one torch.compile'd call and one random-bits draw a parameter, kept here as
``OldStochasticRoundAdamW``), workers/train/sr_adamw.py's (one Triton kernel a tensor on CUDA, eager elsewhere; on CUDA
its eager path too) and, on CUDA, torchao's ``_AdamW(bf16_stochastic_round=True)`` where torchao imports.

No model is built: the parameters are random bf16 tensors of the catalog preset's shapes (their count is checked
against catalog.params), each with a random gradient. Each optimizer gets its own states, takes ``--warmup``
steps (the first, which compiles, timed apart) and ``--steps`` timed ones: on CUDA between CUDA events, with the
host's time to return from ``step()`` (a step whose host time reaches its device time is bound by the host) and
the step's transient memory (peak allocated during the steps above what was allocated before them).

On CUDA it also checks that the Triton kernel gives the eager step's bits (weights and moments, one step from
the same state, on the first ``--check-tensors`` tensors).

    python3 bench/workers/sr_step.py --device cuda --json $OUT/sr_step.json      # on the GPU machine
    python3 bench/workers/sr_step.py --device cpu --layers 2 --steps 2           # a CPU run: 2 decoder layers
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402 - after the path set-up above

from catalog.loader import load_catalog  # noqa: E402
from catalog.params import count_params  # noqa: E402
from catalog.schema import ModelConfig  # noqa: E402
from workers.train.loop import sr_adamw  # noqa: E402

BETAS = (0.9, 0.95)
LR = 1e-5
WEIGHT_DECAY = 0.1


# ----------------------------------------------------------------------------------------------- the parameters

def param_shapes(config: ModelConfig, layers: int | None = None, embedding: bool = True) -> list[tuple[int, ...]]:
    """The parameter shapes transformers builds for a dense Llama-like preset (no MoE, MLA or biases), in
    model order; ``layers`` keeps that many decoder layers, ``embedding=False`` drops the embedding and head."""
    if config.num_experts > 1 or config.mla is not None:
        raise SystemExit(f"{config.id}: only dense attention presets are laid out here")
    h, inner, hd = config.hidden_size, config.intermediate_size, config.head_size
    q, kv = config.num_attention_heads * hd, config.num_kv_heads * hd
    layer = [(q, h), (kv, h), (kv, h), (h, q), (inner, h), (inner, h), (h, inner), (h,), (h,)]
    count = config.num_layers if layers is None else min(layers, config.num_layers)
    shapes: list[tuple[int, ...]] = [(config.vocab_size, h)] if embedding else []
    for _ in range(count):
        shapes += layer
    shapes.append((h,))
    if embedding and not config.tie_word_embeddings:
        shapes.append((config.vocab_size, h))
    if layers is None and embedding:
        total = sum(_numel(s) for s in shapes)
        assert total == count_params(config).total, (total, count_params(config).total)
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def make_params(shapes: list[tuple[int, ...]], device: torch.device, seed: int = 0) -> list[torch.nn.Parameter]:
    """bf16 weights ~N(0, 0.02) with bf16 gradients ~N(0, 1e-3), drawn on ``device``."""
    gen = torch.Generator(device).manual_seed(seed)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=gen, device=device).mul_(0.02).bfloat16())
        p.grad = torch.randn(shape, generator=gen, device=device).mul_(1e-3).bfloat16()
        params.append(p)
    return params


# ------------------------------------------------------------------------- the first implementation, for reference

class OldStochasticRoundAdamW(torch.optim.Optimizer):
    """workers/train/sr_adamw.py as first merged (1bd5712): per parameter a generator reseed, an int16 random-bits
    draw and one torch.compile(dynamic=True) call per 2^24-element piece (eager on CPU)."""

    CHUNK = 1 << 24
    _compiled: ClassVar[dict[str, Callable[..., None]]] = {}

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, seed: int = 0, rank: int = 0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.seed, self.rank = seed, rank
        self._generators: dict[torch.device, torch.Generator] = {}

    @staticmethod
    def piece(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, bits: torch.Tensor | None,
              lr: torch.Tensor, bias1: torch.Tensor, bias2_sqrt: torch.Tensor,
              beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
        g32 = g.float()
        m32 = m.float().lerp(g32, 1 - beta1)
        v32 = v.float().mul(beta2).addcmul(g32, g32, value=1 - beta2)
        p32 = p.float() * (1 - lr * weight_decay)
        p32 = p32 - (lr / bias1) * m32 / (v32.sqrt() / bias2_sqrt + eps)
        m.copy_(m32)
        v.copy_(v32)
        p.copy_(sr_adamw.round_bf16(p32, bits) if p.dtype == torch.bfloat16 else p32)

    def kernel(self, device: torch.device) -> Callable[..., None]:
        if device.type != "cuda":
            return self.piece
        if "cuda" not in self._compiled:
            self._compiled["cuda"] = torch.compile(self.piece, dynamic=True, fullgraph=True)
        return self._compiled["cuda"]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        index = 0
        scalars: dict[tuple[Any, ...], torch.Tensor] = {}
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is not None:
                    self._update(p, group, index, scalars)

    def _update(self, p: torch.nn.Parameter, group: dict[str, Any], index: int,
                scalars: dict[tuple[Any, ...], torch.Tensor]) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        step = int(state["step"].item())
        beta1, beta2 = group["betas"]
        data = p.view(-1)
        assert p.grad is not None
        grad, m, v = (t.view(-1) for t in (p.grad, state["exp_avg"], state["exp_avg_sq"]))
        key = (data.device, float(group["lr"]), beta1, beta2, step)
        if key not in scalars:  # a synchronous host-to-device copy, once a step
            scalars[key] = torch.tensor([float(group["lr"]), 1 - beta1 ** step, (1 - beta2 ** step) ** 0.5],
                                        dtype=torch.float32, device=data.device)
        lr, bias1, bias2_sqrt = scalars[key][0], scalars[key][1], scalars[key][2]
        generator = self._generators.get(data.device) or self._generators.setdefault(
            data.device, torch.Generator(data.device))
        generator.manual_seed(sr_adamw.noise_seed(self.seed, self.rank, index, step))
        kernel = self.kernel(data.device)
        for start in range(0, data.numel(), self.CHUNK):
            end = min(start + self.CHUNK, data.numel())
            bits = torch.randint(-32768, 32768, (end - start,), dtype=torch.int16, device=data.device,
                                 generator=generator)
            kernel(data[start:end], grad[start:end], m[start:end], v[start:end], bits, lr, bias1, bias2_sqrt,
                   beta1, beta2, float(group["eps"]), float(group["weight_decay"]))


# ------------------------------------------------------------------------------------------------------ timing

def optimizers(device: torch.device) -> dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]]:
    """The optimizers timed on ``device``, by name."""
    def sr_new(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return sr_adamw.StochasticRoundAdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, seed=0)

    makers: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
        "torch AdamW (bf16-plain)": lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS,
                                                                 weight_decay=WEIGHT_DECAY),
        "torch AdamW fused=True": lambda ps: torch.optim.AdamW(ps, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY,
                                                               fused=True),
        "SR old (compile per parameter)": lambda ps: OldStochasticRoundAdamW(ps, lr=LR, betas=BETAS,
                                                                           weight_decay=WEIGHT_DECAY, seed=0),
        "SR new" + (" (Triton)" if device.type == "cuda" else " (eager)"): sr_new,
    }
    if device.type == "cuda":
        makers["SR new, eager path"] = _eager_sr
        try:  # compiled per parameter shape: seconds of first step, and the global RNG's bits
            from torchao.optim import _AdamW

            makers["torchao _AdamW bf16_stochastic_round"] = lambda ps: _AdamW(
                ps, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, bf16_stochastic_round=True)
        except Exception as exc:
            print(f"torchao: {exc}", flush=True)
    return makers


def _eager_sr(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The new optimizer with its eager path on every device (what runs on a GPU without Triton)."""
    opt = sr_adamw.StochasticRoundAdamW(params, lr=LR, betas=BETAS, weight_decay=WEIGHT_DECAY, seed=0)
    opt.update_for = lambda _device: sr_adamw.eager_update
    return opt


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_one(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], params: list[torch.nn.Parameter],
             device: torch.device, warmup: int, steps: int) -> dict[str, Any]:
    """First step, then ``steps`` timed steps after ``warmup`` in all: device and host milliseconds a step."""
    opt = make(params)
    _sync(device)
    t0 = time.perf_counter()
    opt.step()
    _sync(device)
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        opt.step()
    _sync(device)
    before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_ms, host_ms = [], []
    for _ in range(steps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            h0 = time.perf_counter()
            opt.step()
            host_ms.append((time.perf_counter() - h0) * 1e3)
            end.record()
            end.synchronize()
            step_ms.append(start.elapsed_time(end))
        else:
            h0 = time.perf_counter()
            opt.step()
            host_ms.append((time.perf_counter() - h0) * 1e3)
            step_ms.append(host_ms[-1])
    out: dict[str, Any] = {"first_ms": first * 1e3, "step_ms": statistics.median(step_ms),
                           "step_ms_mean": statistics.fmean(step_ms), "step_ms_min": min(step_ms),
                           "host_ms": statistics.median(host_ms), "steps": steps}
    if device.type == "cuda":
        out["transient_bytes"] = torch.cuda.max_memory_allocated(device) - before
    del opt
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def check_fused(params: list[torch.nn.Parameter], tensors: int) -> dict[str, Any]:
    """One step of the Triton kernel and of the eager path from the same state on the first ``tensors``
    parameters: elements whose weight, first or second moment differ (0 expected everywhere)."""
    h = sr_adamw.hyper(LR, BETAS, 1e-8, WEIGHT_DECAY, 3)
    fused = sr_adamw.fused_update(sr_adamw._build_kernel())
    diffs = {"p": 0, "m": 0, "v": 0, "elements": 0}
    for i, p in enumerate(params[:tensors]):
        assert p.grad is not None
        g = p.grad
        m = (g.float() * 0.3).bfloat16()
        v = (g.float() ** 2 * 0.5).bfloat16()
        a = [p.detach().clone(), m.clone(), v.clone()]
        b = [p.detach().clone(), m.clone(), v.clone()]
        key = sr_adamw.noise_seed(0, 0, i + 1, 3)
        sr_adamw.eager_update(a[0], g, a[1], a[2], h, key)
        fused(b[0], g, b[1], b[2], h, key)
        for name, x, y in zip("pmv", a, b, strict=True):
            diffs[name] += int((x.view(torch.int16) != y.view(torch.int16)).sum())
        diffs["elements"] += p.numel()
    return diffs


# ------------------------------------------------------------------------------------------------------ output

def table(record: dict[str, Any]) -> str:
    rows = record["optimizers"]
    base = rows.get("torch AdamW (bf16-plain)", {}).get("step_ms")
    lines = [f"{record['model']} ({record['params'] / 1e9:.3f}B parameters in {record['tensors']} tensors), "
             f"{record['device']}, torch {record['torch']}",
             "| optimizer | step ms (median) | min | host ms | first step ms | vs torch AdamW | transient MiB |",
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error'][:80]} | | | | | |")
            continue
        vs = f"{r['step_ms'] / base - 1:+.1%}" if base else "-"
        transient = f"{r['transient_bytes'] / 2**20:,.0f}" if "transient_bytes" in r else "-"
        lines.append(f"| {name} | {r['step_ms']:.2f} | {r['step_ms_min']:.2f} | {r['host_ms']:.2f} | "
                     f"{r['first_ms']:.0f} | {vs} | "
                     f"{transient} |")
    if "fused_check" in record:
        lines.append(f"Triton vs eager, one step: {record['fused_check']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers to keep (default: all)")
    ap.add_argument("--no-embedding", dest="embedding", action="store_false",
                    help="leave out the embedding (and head): a smaller CPU run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 20 on CUDA, 3 on CPU)")
    ap.add_argument("--only", default=None, help="comma-separated substrings of the optimizers to time")
    ap.add_argument("--check-tensors", type=int, default=12)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (torch.set_num_threads)")
    ap.add_argument("--json", type=Path, default=None, help="write the record here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps if args.steps is not None else (20 if use_cuda else 3)
    config = load_catalog().model(args.model)
    shapes = param_shapes(config, args.layers, args.embedding)
    params = make_params(shapes, device)
    record: dict[str, Any] = {
        "model": args.model, "layers": args.layers if args.layers is not None else config.num_layers,
        "embedding": args.embedding,
        "params": sum(p.numel() for p in params), "tensors": len(params),
        "device": torch.cuda.get_device_name(device) if use_cuda else f"cpu ({torch.get_num_threads()} threads)",
        "torch": torch.__version__, "warmup": args.warmup, "steps": steps, "optimizers": {},
        "command": "python3 bench/workers/sr_step.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for name, make in optimizers(device).items():
        if args.only and not any(s.strip() in name for s in args.only.split(",")):
            continue
        try:
            record["optimizers"][name] = time_one(make, params, device, args.warmup, steps)
        except Exception as exc:  # one optimizer that cannot run here (fused on an old torch) leaves the others
            record["optimizers"][name] = {"error": repr(exc)[:300]}
        print(f"{name}: {record['optimizers'][name]}", flush=True)
        _write(args.json, record)
    if use_cuda and args.check_tensors:
        try:
            record["fused_check"] = check_fused(params, args.check_tensors)
        except Exception as exc:
            record["fused_check"] = {"error": repr(exc)[:300]}
    _write(args.json, record)
    print(table(record))
    return 0


def _write(path: Path | None, record: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
