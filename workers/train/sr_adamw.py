"""AdamW for bf16 weights that does not drop small updates: each step is computed in fp32 and rounded into the
bf16 weights stochastically (up with the probability of the discarded fraction), so a weight follows the fp32
trajectory in expectation instead of staying where round-to-nearest leaves it.

Why: a fine-tuning update (lr 1e-5 times Adam's ~unit step) is ~1e-3 of a weight, below bf16's half-ulp (~2e-3
of the value), so ``torch.optim.AdamW`` on bf16 parameters rounds most of them to nothing (docs/NUMERICS.md).

The step of one tensor reads its bf16 weight, gradient and moments once and writes them once: on CUDA one Triton
kernel a tensor (``fused_update``: 14 bytes a parameter, where torch's foreach AdamW passes over ~46), elsewhere
the same arithmetic in eager torch ops over pieces (``eager_update``). Both do the same fp32 operations in the
same order with no fused multiply-adds, so they give the same bits. The random bits are a hash of the element's
offset keyed by (job seed, rank, parameter index, step) (``random_bits``): no generator, no state, no extra
memory traffic; a resumed run continues the stream with nothing saved but the optimizer's own ``step`` count,
and the bits do not depend on how the tensor is cut into pieces or which path runs it.

Why not torch.compile (this module's first version, and torchao's ``_AdamW(bf16_stochastic_round=True)``): one
compiled call a parameter cost ~100 us of host time each (guards, a generator reseed, a random-bits launch), so
the step was bound by the host: +16 ms a step on llama-3.2-1b (docs/NUMERICS.md). The Triton kernel takes its
scalars as arguments (no recompiles, no host-to-device copy) and is compiled once per specialisation.

The state (``step``, ``exp_avg``, ``exp_avg_sq``, the moments in the parameter's dtype) is torch AdamW's, so
checkpoints, FSDP2 state dicts and the interval planner read it as they read AdamW's.
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.optim.optimizer import ParamsT

logger = logging.getLogger(__name__)

# Elements per piece of the eager step: bounds its fp32 and int64 temporaries to ~100 MB.
CHUNK = 1 << 22
BLOCK = 1024  # elements per program of the fused kernel (8 a thread at 4 warps: 16-byte loads of bf16)
# no fused multiply-adds: the kernel rounds every operation, as the eager step's separate torch ops do
LAUNCH_OPTIONS: dict[str, Any] = {"num_warps": 4, "enable_fp_fusion": False}
_LOW16 = 0xFFFF
_HIGH16 = -65536  # 0xFFFF0000 as int32: the bits a bf16 keeps of an fp32
_M32 = 0xFFFFFFFF
_M31 = 0x7FFFFFFF
# lowbias32's multipliers (Wellons' hash prospector); both < 2^31, so int64 products of 32-bit values never overflow
_MIX1, _MIX2 = 0x21F0AAAD, 0x735A2D97
_MASK64 = (1 << 64) - 1


def _f32(x: float) -> float:
    """``x`` rounded to the nearest fp32 value: every scalar of the step is one, so both paths use the same."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


class Hyper(NamedTuple):
    """One step's scalars, each exactly an fp32 value."""

    w1: float  # 1 - beta1
    beta2: float
    c2: float  # 1 - beta2
    inv_bias2_sqrt: float  # 1 / sqrt(1 - beta2^step): a product, not a quotient, on every device
    eps: float
    decay: float  # 1 - lr * weight_decay
    step_size: float  # lr / (1 - beta1^step)


def hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float, step: int) -> Hyper:
    beta1, beta2 = betas
    return Hyper(w1=_f32(1 - beta1), beta2=_f32(beta2), c2=_f32(1 - beta2),
                 inv_bias2_sqrt=_f32(1 / math.sqrt(1 - beta2 ** step)), eps=_f32(eps),
                 decay=_f32(1 - lr * weight_decay), step_size=_f32(lr / (1 - beta1 ** step)))


def noise_seed(seed: int, rank: int, index: int, step: int) -> int:
    """The key of one parameter's random bits at one step: a function of where the run is, not of history
    (splitmix64's finalizer over the four, so nearby steps and parameters get unrelated streams)."""
    x = (seed * 0x9E3779B97F4A7C15 + rank * 0xD1B54A32D192ED03 + index * 0xBF58476D1CE4E5B9 + step) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1  # 63 bits


def split_key(key: int) -> tuple[int, int]:
    """Two 31-bit halves of ``key`` (kernel arguments that stay int32 whatever the key)."""
    return key & _M31, (key >> 31) & _M31


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> None:
    """lowbias32 in place on int32 ``x``, as the fused kernel's uint32 arithmetic: the products wrap (two's
    complement, on every device torch runs on) and the right shifts are made logical by masking."""
    for shift, mul in ((16, _MIX1), (15, _MIX2), (15, None)):
        torch.bitwise_right_shift(x, shift, out=tmp)
        x.bitwise_xor_(tmp.bitwise_and_((1 << (32 - shift)) - 1))
        if mul is not None:
            x.mul_(mul)


def random_bits(key: int, start: int, count: int, device: torch.device) -> torch.Tensor:
    """16 uniform random bits (int16) for elements ``start`` .. ``start + count`` of a tensor: two keyed rounds
    of lowbias32 over the offset of each pair of elements, whose low 16 bits go to the even element and high 16
    to the odd one (an int32 tensor viewed as int16: half the hashing). A piece's bits are those of the whole."""
    lo, hi = split_key(key)
    first, last = start >> 1, (start + count + 1) >> 1
    if last <= 1 << 31:
        x = torch.arange(first, last, dtype=torch.int32, device=device)
    else:  # the offset's low 32 bits, as the kernel's
        x = torch.arange(first, last, dtype=torch.int64, device=device).bitwise_and_(_M32).to(torch.int32)
    tmp = torch.empty_like(x)
    x.bitwise_xor_(lo)
    _mix32_(x, tmp)
    x.bitwise_xor_(hi)
    _mix32_(x, tmp)
    skip = start - 2 * first
    return x.view(torch.int16)[skip:skip + count]  # little-endian: element 2k is the low half of pair k


def round_bf16(x: torch.Tensor, bits: torch.Tensor | None) -> torch.Tensor:
    """``x`` (fp32) in bf16: stochastically when ``bits`` (integers whose low 16 bits are uniform) is given,
    else to nearest.

    Adding a uniform 16-bit integer below bf16's mantissa and truncating rounds the magnitude up with
    probability equal to the fraction truncated away: unbiased, E[round(x)] = x."""
    if bits is None:
        return x.to(torch.bfloat16)
    raw = x.view(torch.int32) + (bits.to(torch.int32) & _LOW16)
    return (raw & _HIGH16).view(torch.float32).to(torch.bfloat16)


Update = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Hyper, int | None], None]


def eager_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, h: Hyper,
                 key: int | None) -> None:
    """One AdamW step of a tensor in eager torch ops, piece by piece; rounded stochastically when ``key``."""
    flat = [t.view(-1) for t in (p, g, m, v)]  # a non-contiguous tensor fails here rather than being copied
    n = flat[0].numel()
    for start in range(0, n, CHUNK):
        end = min(start + CHUNK, n)
        bits = random_bits(key, start, end - start, p.device) if key is not None else None
        _eager_piece(flat[0][start:end], flat[1][start:end], flat[2][start:end], flat[3][start:end], h, bits)


def _eager_piece(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, h: Hyper,
                 bits: torch.Tensor | None) -> None:
    """The fused kernel's operations, one rounding each, in its order (its comments are the formulas)."""
    g32 = g.float()
    m32 = torch.sub(g32, m).mul_(h.w1).add_(m)  # m + (1 - beta1) (g - m)
    v32 = v.float().mul(h.beta2).add_(torch.mul(g32, h.c2).mul_(g32))  # v beta2 + ((1 - beta2) g) g
    m.copy_(m32)
    v.copy_(v32)
    # torch's fp32 square root on the CPU is not correctly rounded (SLEEF); fp64's is, and so is its fp32 rounding
    denom = v32.double().sqrt_().to(torch.float32).mul_(h.inv_bias2_sqrt).add_(h.eps)
    p32 = p.to(torch.float32, copy=True).mul_(h.decay).sub_(m32.mul_(h.step_size).div_(denom))  # p decay - (ss m) / d
    if bits is not None and p.dtype == torch.bfloat16:  # round_bf16 in place: p32 then holds a bf16 value exactly
        p32.view(torch.int32).add_(bits.to(torch.int32).bitwise_and_(_LOW16)).bitwise_and_(_HIGH16)
    p.copy_(p32)


def _build_kernel() -> Any:
    """The Triton kernel of one tensor's step (built on first use: CPU-only installs have no Triton)."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["key_lo", "key_hi"])  # type: ignore[untyped-decorator]
    def sr_adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, w1, beta2, c2, inv_bias2_sqrt, eps, decay,  # type: ignore[no-untyped-def]
                        step_size, key_lo, key_hi, STOCHASTIC: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        m = (g - m) * w1 + m
        v = v * beta2 + (g * c2) * g
        denom = tl.sqrt_rn(v) * inv_bias2_sqrt + eps
        p = p * decay - tl.div_rn(m * step_size, denom)
        tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=mask)
        tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=mask)
        if STOCHASTIC:
            x = ((offs >> 1) ^ key_lo).to(tl.uint32)  # a hash a pair of elements, as random_bits
            for r in tl.static_range(2):
                if r == 1:
                    x = x ^ key_hi.to(tl.uint32)
                x = x ^ (x >> 16)
                x = x * 0x21F0AAAD
                x = x ^ (x >> 15)
                x = x * 0x735A2D97
                x = x ^ (x >> 15)
            x = x >> ((offs & 1) * 16).to(tl.uint32)
            raw = p.to(tl.int32, bitcast=True) + (x & 0xFFFF).to(tl.int32)
            p = (raw & -65536).to(tl.float32, bitcast=True)
        tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=mask)

    return sr_adamw_kernel


def fused_update(kernel: Any) -> Update:
    """``kernel``'s step of a tensor: one launch, its scalars as arguments (no host-to-device copy)."""
    def update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, h: Hyper,
               key: int | None) -> None:
        n = p.numel()
        if n == 0:
            return
        if not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
            eager_update(p, g, m, v, h, key)  # fails loudly, as the eager step does
            return
        lo, hi = split_key(key) if key is not None else (0, 0)
        stochastic = key is not None and p.dtype == torch.bfloat16
        kernel[((n + BLOCK - 1) // BLOCK,)](p, g.contiguous(), m, v, n, *h, lo, hi, STOCHASTIC=stochastic,
                                           BLOCK=BLOCK, **LAUNCH_OPTIONS)

    return update


_UPDATES: dict[str, Update] = {}


def update_for(device: torch.device) -> Update:
    """The step for tensors on ``device``: the fused kernel on CUDA where Triton imports, else eager."""
    if device.type != "cuda":
        return eager_update
    if "cuda" not in _UPDATES:
        try:
            fused = fused_update(_build_kernel())
        except Exception as exc:  # no Triton: the same numbers, at many times the memory traffic
            logger.warning("the stochastic-rounding AdamW step runs eagerly: Triton is not usable (%s)", exc)
            fused = eager_update

        def first(*args: Any) -> None:
            # a kernel that fails to compile fails before it writes anything: the eager step takes the call over
            try:
                fused(*args)
                _UPDATES["cuda"] = fused
            except Exception as exc:
                logger.warning("the stochastic-rounding AdamW step runs eagerly: its kernel failed (%s)", exc)
                _UPDATES["cuda"] = eager_update
                eager_update(*args)

        _UPDATES["cuda"] = first
    return _UPDATES["cuda"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s local data (FSDP2 parameters and gradients are DTensors)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _on(device: torch.device) -> Any:
    """Context for launching on ``device``: Triton launches on the current CUDA device."""
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


class StochasticRoundAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay, torch's update) whose bf16 parameters are rounded stochastically.

    ``stochastic=False`` rounds to nearest instead (the mechanism's control in tests); fp32 parameters
    are updated as torch AdamW would."""

    def __init__(self, params: ParamsT, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, seed: int = 0, rank: int = 0,
                 stochastic: bool = True) -> None:
        defaults: dict[str, Any] = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.seed, self.rank, self.stochastic = seed, rank, stochastic
        # the step a device's tensors take (tests and bench/workers/sr_step.py pin one path)
        self.update_for: Callable[[torch.device], Update] = update_for

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        index = 0  # the parameter's place across groups: part of its random bits' key
        for group in self.param_groups:
            live: list[tuple[int, torch.nn.Parameter]] = []
            for p in group["params"]:
                index += 1
                if p.grad is not None:
                    live.append((index, p))
            if live:
                self._step_group(group, live)
        return loss

    def _state(self, p: torch.nn.Parameter) -> dict[str, Any]:
        state: dict[str, Any] = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        step = state["step"]
        if not isinstance(step, torch.Tensor) or step.device.type != "cpu":  # a loaded state's, once
            state["step"] = torch.as_tensor(step, dtype=torch.float32).to("cpu")
        return state

    def _step_group(self, group: dict[str, Any], live: list[tuple[int, torch.nn.Parameter]]) -> None:
        """Every live parameter of ``group`` one step: the step counts on the host (no device sync), then one
        update a tensor, its scalars computed once per distinct step count."""
        states = [self._state(p) for _, p in live]
        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1.0)
        counts = [int(c) for c in torch.stack(steps).tolist()]
        hypers: dict[int, Hyper] = {}
        for (index, p), state, step in zip(live, states, counts, strict=True):
            h = hypers.get(step)
            if h is None:
                h = hypers[step] = hyper(float(group["lr"]), group["betas"], float(group["eps"]),
                                         float(group["weight_decay"]), step)
            data = _local(p)
            key = noise_seed(self.seed, self.rank, index, step) \
                if self.stochastic and data.dtype == torch.bfloat16 else None
            assert p.grad is not None  # step() passes only parameters with one
            with _on(data.device):
                self.update_for(data.device)(data, _local(p.grad), _local(state["exp_avg"]),
                                        _local(state["exp_avg_sq"]), h, key)
