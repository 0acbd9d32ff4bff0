"""AdamW for bf16 weights that does not drop small updates: each step is computed in fp32 and rounded into the
bf16 weights stochastically (up with the probability of the discarded fraction), so a weight follows the fp32
trajectory in expectation instead of staying where round-to-nearest leaves it.

Why: a fine-tuning update (lr 1e-5 times Adam's ~unit step) is ~1e-3 of a weight, below bf16's half-ulp (~2e-3
of the value), so ``torch.optim.AdamW`` on bf16 parameters rounds most of them to nothing (docs/NUMERICS.md).

Why not torchao's ``_AdamW(bf16_stochastic_round=True)``: its step is a ``torch.compile``d kernel on every
device (on this project's 2-core CPU box, 21 s of compile per parameter shape before the first step), and its
random bits come from the global RNG inside the kernel. Here the bits come from a generator seeded by
(job seed, rank, parameter index, step), so the stream is reproducible and a resumed run continues it with
nothing saved but the optimizer's own ``step`` count. On CUDA the elementwise step is compiled into one kernel
(the bits are drawn beforehand, 2 bytes a parameter); on CPU it runs eagerly.

The state (``step``, ``exp_avg``, ``exp_avg_sq``, the moments in the parameter's dtype) is torch AdamW's, so
checkpoints, FSDP2 state dicts and the interval planner read it as they read AdamW's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

# Elements per piece of a large tensor: bounds the fp32 temporaries and the random bits to ~100 MB.
CHUNK = 1 << 24
_LOW16 = 0xFFFF
_HIGH16 = -65536  # 0xFFFF0000 as int32: the bits a bf16 keeps of an fp32


def round_bf16(x: torch.Tensor, bits: torch.Tensor | None) -> torch.Tensor:
    """``x`` (fp32) in bf16: stochastically when ``bits`` (int16, uniform) is given, else to nearest.

    Adding a uniform 16-bit integer below bf16's mantissa and truncating rounds the magnitude up with
    probability equal to the fraction truncated away: unbiased, E[round(x)] = x."""
    if bits is None:
        return x.to(torch.bfloat16)
    raw = x.view(torch.int32) + (bits.to(torch.int32) & _LOW16)
    return (raw & _HIGH16).view(torch.float32).to(torch.bfloat16)


def _step_piece(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, bits: torch.Tensor | None,
                lr: torch.Tensor, bias1: torch.Tensor, bias2_sqrt: torch.Tensor,
                beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """One AdamW update of a flat piece, in fp32, written back into the bf16 ``p``, ``m`` and ``v``."""
    g32 = g.float()
    m32 = m.float().lerp(g32, 1 - beta1)
    v32 = v.float().mul(beta2).addcmul(g32, g32, value=1 - beta2)
    p32 = p.float() * (1 - lr * weight_decay)
    p32 = p32 - (lr / bias1) * m32 / (v32.sqrt() / bias2_sqrt + eps)
    m.copy_(m32)
    v.copy_(v32)
    p.copy_(round_bf16(p32, bits) if p.dtype == torch.bfloat16 else p32)


logger = logging.getLogger(__name__)
Piece = Callable[..., None]
_COMPILED: dict[str, Piece] = {}


def _kernel(device: torch.device) -> Piece:
    """The elementwise step for ``device``: one fused kernel on CUDA (compiled once, any length), eager elsewhere."""
    if device.type != "cuda":
        return _step_piece
    if "cuda" not in _COMPILED:
        compiled = torch.compile(_step_piece, dynamic=True, fullgraph=True)

        def first(*args: Any) -> None:
            # compiling fails before anything runs, so the eager step can take over the same call
            try:
                compiled(*args)
                _COMPILED["cuda"] = compiled
            except Exception as exc:  # a toolchain without Triton or a C compiler: same numbers, more passes
                logger.warning("the stochastic-rounding AdamW step runs eagerly: torch.compile failed (%s)", exc)
                _COMPILED["cuda"] = _step_piece
                _step_piece(*args)

        _COMPILED["cuda"] = first
    return _COMPILED["cuda"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s local data (FSDP2 parameters and gradients are DTensors)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


_MASK64 = (1 << 64) - 1


def noise_seed(seed: int, rank: int, index: int, step: int) -> int:
    """The seed of one parameter's random bits at one step: a function of where the run is, not of history
    (splitmix64's finalizer over the four, so nearby steps and parameters get unrelated streams)."""
    x = (seed * 0x9E3779B97F4A7C15 + rank * 0xD1B54A32D192ED03 + index * 0xBF58476D1CE4E5B9 + step) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1  # a 63-bit seed: torch takes it as a non-negative int64


class StochasticRoundAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's update) whose bf16 parameters are rounded stochastically.

    ``stochastic=False`` rounds to nearest instead (the mechanism's control in tests); fp32 parameters
    are updated as torch AdamW would."""

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, seed: int = 0, rank: int = 0,
                 stochastic: bool = True) -> None:
        defaults: dict[str, Any] = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.seed, self.rank, self.stochastic = seed, rank, stochastic
        self._generators: dict[torch.device, torch.Generator] = {}  # reseeded per parameter and step

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0
        scalars: dict[tuple[Any, ...], torch.Tensor] = {}  # one host-to-device copy per step, not per parameter
        for group in self.param_groups:
            for p in group["params"]:
                index += 1
                if p.grad is None:
                    continue
                self._update(p, group, index, scalars)
        return loss

    def _update(self, p: torch.nn.Parameter, group: dict[str, Any], index: int,
                scalars: dict[tuple[Any, ...], torch.Tensor]) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        step = int(state["step"].item())
        beta1, beta2 = group["betas"]
        data = _local(p).view(-1)
        assert p.grad is not None  # step() skips parameters without one
        grad, m, v = (_local(t).view(-1) for t in (p.grad, state["exp_avg"], state["exp_avg_sq"]))
        device = data.device
        key = (device, float(group["lr"]), beta1, beta2, step)
        if key not in scalars:
            scalars[key] = torch.tensor([float(group["lr"]), 1 - beta1 ** step, (1 - beta2 ** step) ** 0.5],
                                        dtype=torch.float32, device=device)
        lr, bias1, bias2_sqrt = scalars[key][0], scalars[key][1], scalars[key][2]
        draw = self.stochastic and data.dtype == torch.bfloat16
        generator = None
        if draw:
            generator = self._generators.get(device) or self._generators.setdefault(device, torch.Generator(device))
            generator.manual_seed(noise_seed(self.seed, self.rank, index, step))
        kernel = _kernel(device)
        for start in range(0, data.numel(), CHUNK):
            end = min(start + CHUNK, data.numel())
            bits = torch.randint(-32768, 32768, (end - start,), dtype=torch.int16, device=device,
                                 generator=generator) if draw else None
            kernel(data[start:end], grad[start:end], m[start:end], v[start:end], bits, lr, bias1, bias2_sqrt,
                   beta1, beta2, float(group["eps"]), float(group["weight_decay"]))
