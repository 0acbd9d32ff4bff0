"""bf16 weights that do not drop updates (issue 46): a step below bf16's half-ulp leaves round-to-nearest
weights where they were, while the stochastically rounded step follows an fp32 reference in expectation."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch

import workers.train.sr_adamw as sr
from planner.numerics import stochastic_rounding
from workers.train.setup import make_optimizer
from workers.train.sr_adamw import StochasticRoundAdamW, noise_seed, random_bits, round_bf16

LR = 1e-5  # Adam's step is ~LR: 1/6 of the half-ulp (6.1e-5) of weights in [2^-6, 2^-5)
STEPS = 120
CHECK_AT = (30, 60, 120)
TOLERANCE = 0.05  # of the reference's mean movement; the rounding noise's standard error is ~1% here
CPU = torch.device("cpu")


def _tiny_model(dtype: torch.dtype) -> torch.nn.Linear:
    """A 64x64 linear layer whose weights all lie in one binade, [0.016, 0.031): bf16's ulp there is 2^-13."""
    model = torch.nn.Linear(64, 64, bias=False)
    with torch.no_grad():
        start = torch.empty(64, 64).uniform_(0.016, 0.031, generator=torch.Generator().manual_seed(3))
        model.weight.copy_(start.bfloat16().float())  # the same start for every copy, exact in bf16
    return model.to(dtype)


def _train(make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer], dtype: torch.dtype) -> list[float]:
    """Mean movement of the weights (from their start) after each step in CHECK_AT: the loss is the sum of
    the outputs over positive inputs, so every gradient is positive and every update points the same way."""
    model = _tiny_model(dtype)
    start = model.weight.detach().float().clone()
    optimizer = make(list(model.parameters()))
    data = torch.Generator().manual_seed(7)
    moved = []
    for step in range(1, STEPS + 1):
        x = torch.rand(8, 64, generator=data) + 0.5
        model(x.to(dtype)).float().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step in CHECK_AT:
            moved.append(float((model.weight.detach().float() - start).mean()))
    return moved


def _adamw(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)


def _sr(stochastic: bool) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
    return lambda params: StochasticRoundAdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0, seed=11,
                                               stochastic=stochastic)


def test_updates_below_half_an_ulp_move_bf16_weights_only_with_stochastic_rounding() -> None:
    reference = _train(_adamw, torch.float32)
    assert all(r < -STEPS * LR * 0.5 * k / STEPS for r, k in zip(reference, CHECK_AT, strict=True))  # it moves

    assert _train(_adamw, torch.bfloat16) == [0.0, 0.0, 0.0]  # pure bf16: every update rounds to nothing
    assert _train(_sr(stochastic=False), torch.bfloat16) == [0.0, 0.0, 0.0]  # the same step, rounded to nearest

    followed = _train(_sr(stochastic=True), torch.bfloat16)
    for got, want in zip(followed, reference, strict=True):
        assert got == pytest.approx(want, rel=TOLERANCE)


def test_stochastic_rounding_is_unbiased_and_keeps_bf16_values() -> None:
    low = torch.tensor(0.0234375)  # a bf16 value; the next one up is low + 2^-13
    ulp = 2.0 ** -13
    x = torch.full((200_000,), float(low) + 0.3 * ulp)
    bits = torch.randint(-32768, 32768, x.shape, dtype=torch.int16, generator=torch.Generator().manual_seed(0))
    rounded = round_bf16(x, bits).float()
    assert set(rounded.tolist()) == {float(low), float(low) + ulp}
    assert float(rounded.mean()) == pytest.approx(float(x[0]), abs=0.01 * ulp)
    exact = torch.randn(1000).bfloat16().float()
    assert torch.equal(round_bf16(exact, bits[:1000]).float(), exact)  # nothing to round: nothing changes
    assert torch.equal(round_bf16(-x, bits).float(), -rounded)  # the magnitude rounds, whatever the sign


def _lowbias32(x: int) -> int:
    for shift, mul in ((16, 0x21F0AAAD), (15, 0x735A2D97), (15, 1)):
        x = ((x ^ (x >> shift)) * mul) & 0xFFFFFFFF
    return x


def _expected_bits(key: int, offset: int) -> int:
    lo, hi = sr.split_key(key)
    return (_lowbias32(_lowbias32((offset >> 1) ^ lo) ^ hi) >> (16 * (offset & 1))) & 0xFFFF


def test_random_bits_are_a_keyed_hash_of_the_element_uniform_and_independent() -> None:
    key = noise_seed(5, 1, 17, 300)
    bits = random_bits(key, 0, 1 << 20, CPU)
    # the int32 tensor arithmetic is the kernel's uint32 lowbias32, element by element, past 2^32 too
    for offset in (0, 1, 4097, (1 << 20) - 1):
        assert int(bits[offset]) & 0xFFFF == _expected_bits(key, offset)
    for offset in ((1 << 32) + 5, (1 << 32) + 6):
        assert int(random_bits(key, offset, 1, CPU)) & 0xFFFF == _expected_bits(key, offset)
    # a piece's bits are the whole tensor's, pieces of odd offsets and lengths included
    pieces = [random_bits(key, a, b - a, CPU) for a, b in ((0, 999), (999, 1000), (1000, 3001), (3001, 4000))]
    assert torch.equal(torch.cat(pieces), bits[:4000])
    # every bit is set half the time (standard error 0.0005), and the next step's bits are unrelated
    shares = torch.stack([(bits >> b) & 1 for b in range(16)]).float().mean(dim=1)
    assert torch.all((shares - 0.5).abs() < 0.005), shares
    later = random_bits(noise_seed(5, 1, 17, 301), 0, 1 << 20, CPU)
    assert abs(float(torch.corrcoef(torch.stack([bits.float(), later.float()]))[0, 1])) < 0.01
    for gap in (1, 2):  # the two halves of a pair, and neighbouring pairs
        assert abs(float(torch.corrcoef(torch.stack([bits[:-gap].float(), bits[gap:].float()]))[0, 1])) < 0.01


def test_on_fp32_parameters_it_is_torch_adamw() -> None:
    ours, theirs = _tiny_model(torch.float32), _tiny_model(torch.float32)
    a = StochasticRoundAdamW(ours.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    b = torch.optim.AdamW(theirs.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(5):
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(step))
        for model, opt in ((ours, a), (theirs, b)):
            model(x).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------- against a straightforward reference

BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1


def _reference(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, lr: float,
               step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AdamW of one tensor as its formula reads, in fp32: the fp32 weight before rounding, and the moments
    stored to nearest in their dtype. Square root in fp64 (then fp32): exactly rounded, as the kernel's."""
    b1, b2 = BETAS
    g32, m32, v32, p32 = (t.float() for t in (g, m, v, p))
    m32 = m32 + (1 - b1) * (g32 - m32)
    v32 = v32 * b2 + ((1 - b2) * g32) * g32
    denom = v32.double().sqrt().float() / ((1 - b2 ** step) ** 0.5) + EPS
    p32 = p32 * (1 - lr * WD) - (lr / (1 - b1 ** step)) * m32 / denom
    return p32, m32.to(m.dtype), v32.to(v.dtype)


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """bf16's unit in the last place at each element of ``x`` (normal numbers)."""
    exponent = torch.floor(torch.log2(x.abs().double()))
    return torch.pow(2.0, exponent - 7)


def test_one_step_of_many_tensors_is_the_reference_rounded_to_a_neighbour(monkeypatch: pytest.MonkeyPatch) -> None:
    """Moments bit for bit; each weight one of the two bf16 values around the reference's fp32 weight (one
    fp32 ulp of slack for the reference's division by the bias correction where the step multiplies)."""
    monkeypatch.setattr(sr, "CHUNK", 1000)  # the 64 x 70 weight in five pieces, the last one shorter
    gen = torch.Generator().manual_seed(1)
    shapes = [(64, 70), (3,), (128,)]
    params = [torch.nn.Parameter((torch.randn(s, generator=gen) * 0.02).bfloat16()) for s in shapes]
    opt = StochasticRoundAdamW(params, lr=1e-3, betas=BETAS, eps=EPS, weight_decay=WD, seed=4)
    for step in range(1, 4):
        before = [(p.detach().clone(), *((opt.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq"))
                                        if opt.state[p] else (torch.zeros_like(p), torch.zeros_like(p))))
                  for p in params]
        for p in params:
            p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).bfloat16()
        opt.step()
        for p, (p0, m0, v0) in zip(params, before, strict=True):
            assert p.grad is not None
            p32, m_ref, v_ref = _reference(p0, p.grad, m0, v0, 1e-3, step)
            assert torch.equal(opt.state[p]["exp_avg"], m_ref) and torch.equal(opt.state[p]["exp_avg_sq"], v_ref)
            distance = (p.detach().float() - p32).abs().double()
            assert torch.all(distance < _bf16_ulp(p32) * (1 + 2.0 ** -16)), step
            assert torch.all(p.detach().float().double() * p32.double() >= 0)  # no sign flips for small steps


def test_the_rounding_is_unbiased_over_many_draws() -> None:
    """One step of 65,536 weights whose updates are spread over (0, 1.3) ulp, drawn with 8 seeds: the mean
    rounding error is 0 (standard error ~0.0006 ulp; bound 0.005), and in each fifth of the discarded
    fraction the weights round up as often as that fraction says (bound 0.02)."""
    gen = torch.Generator().manual_seed(2)
    n = 1 << 16
    start = (torch.rand(n, generator=gen) * 0.015 + 0.016).bfloat16()  # ulp 2^-13 = 1.2e-4
    grad = (torch.rand(n, generator=gen) * 2e-3).bfloat16()
    m0 = (torch.rand(n, generator=gen) * 1e-3 + 1e-4).bfloat16()  # Adam's ratio m / sqrt(v): 0.1 .. 1.1
    v0 = torch.full((n,), 1e-6).bfloat16()
    p32, _, _ = _reference(start, grad, m0, v0, 1e-4, 6)
    ulp = _bf16_ulp(p32)
    down = (p32.view(torch.int32) & -65536).view(torch.float32)  # p32 > 0: truncation rounds down
    fraction = (p32 - down).double() / ulp
    errors, ups = [], []
    for seed in range(8):
        p = torch.nn.Parameter(start.clone())
        p.grad = grad.clone()
        opt = StochasticRoundAdamW([p], lr=1e-4, betas=BETAS, eps=EPS, weight_decay=WD, seed=seed)
        opt.state[p] = {"step": torch.tensor(5.0), "exp_avg": m0.clone(), "exp_avg_sq": v0.clone()}
        opt.step()
        errors.append((p.detach().double() - p32.double()) / ulp)
        ups.append((p.detach().float() > down).double())
    error, up, fractions = torch.cat(errors), torch.cat(ups), fraction.repeat(8)
    fifths = torch.clamp((fractions * 5).long(), max=4)
    assert all(int((fifths == k).sum()) > 20_000 for k in range(5))  # the fractions cover (0, 1)
    assert abs(float(error.mean())) < 0.005
    for k in range(5):
        chosen = fifths == k
        assert abs(float(up[chosen].mean() - fractions[chosen].mean())) < 0.02, k


# ------------------------------------------------------------------------------ the fused kernel is the step

def _fused_or_skip(monkeypatch: pytest.MonkeyPatch) -> tuple[sr.Update, torch.device, bool]:
    """The Triton step on CUDA, else in Triton's interpreter on the CPU (where Triton is installed); True with
    it when its bf16 stores are exact (the interpreter truncates fp32 -> bf16 casts instead of rounding)."""
    if torch.cuda.is_available():
        return sr.fused_update(sr._build_kernel()), torch.device("cuda"), True
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return sr.fused_update(sr._build_kernel()), CPU, False


def test_the_fused_kernel_gives_the_eager_steps_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    fused, device, exact_casts = _fused_or_skip(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    cases = [(torch.bfloat16, torch.float32, True), (torch.float32, torch.float32, False)]
    if exact_casts:
        cases += [(torch.bfloat16, torch.bfloat16, True), (torch.bfloat16, torch.bfloat16, False)]
    for weights, moments, stochastic in cases:
        w0 = (torch.randn(64, 70, generator=gen) * 0.02).to(weights)  # 4480: a last block of 384
        runs = []
        for update in (sr.eager_update, fused):
            p, m, v = w0.clone().to(device), torch.zeros(64, 70, dtype=moments, device=device), \
                torch.zeros(64, 70, dtype=moments, device=device)
            for step in range(1, 4):
                g = (torch.randn(64, 70, generator=torch.Generator().manual_seed(step)) * 1e-3).to(weights)
                key = noise_seed(3, 0, 1, step) if stochastic else None
                update(p, g.to(device), m, v, sr.hyper(1e-4, BETAS, EPS, WD, step), key)
            runs.append([t.cpu() for t in (p, m, v)])
        for got, want in zip(runs[1], runs[0], strict=True):
            assert torch.equal(got, want), (weights, moments, stochastic)


# ---------------------------------------------------------------------------------------------------- resume

def test_a_restored_optimizer_continues_the_same_random_stream() -> None:
    """The bits of a step are a function of (seed, rank, parameter, step): an optimizer rebuilt from a saved
    state dict mid-run takes exactly the steps the uninterrupted one takes, across two parameter groups and a
    parameter that has no gradient at some steps (its step count lags the others')."""
    def run(restart_at: int | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 16)).to(torch.bfloat16)
        groups: list[dict[str, Any]] = [{"params": list(model[0].parameters())},
                                        {"params": list(model[1].parameters()), "lr": 3e-4}]

        def make() -> torch.optim.Optimizer:
            return StochasticRoundAdamW(groups, lr=1e-4, betas=BETAS, weight_decay=WD, seed=5)

        opt = make()
        for step in range(10):
            if step == restart_at:
                saved = io.BytesIO()
                torch.save(opt.state_dict(), saved)
                saved.seek(0)
                opt = make()
                opt.load_state_dict(torch.load(saved, weights_only=True))
            x = torch.rand(4, 32, generator=torch.Generator().manual_seed(step))
            model(x.bfloat16()).float().sum().backward()
            if step % 3 == 1:
                model[1].bias.grad = None  # skipped this step
            opt.step()
            opt.zero_grad()
        state = [t for p in model.parameters() for t in (opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]
        return [p.detach().clone() for p in model.parameters()] + state

    uninterrupted = run(None)
    for restart in (4, 5):
        assert all(torch.equal(a, b) for a, b in zip(run(restart), uninterrupted, strict=True)), restart
    assert len({noise_seed(5, 0, 1, 3), noise_seed(6, 0, 1, 3), noise_seed(5, 1, 1, 3), noise_seed(5, 0, 2, 3),
                noise_seed(5, 0, 1, 4)}) == 5  # seed, rank, parameter and step each change the stream


# -------------------------------------------------------------------------------- which optimizer runs

def test_the_planners_numerics_choose_the_optimizer() -> None:
    params = list(_tiny_model(torch.bfloat16).parameters())
    for precision in ("fp32", "amp-bf16", "bf16", "bf16-plain", "fp8"):
        for finetune in ("full", "lora"):
            opt = make_optimizer("adamw", params, 1e-4, precision=precision, finetune=finetune)
            want = StochasticRoundAdamW if stochastic_rounding(precision, finetune, "adamw") else torch.optim.AdamW
            assert type(opt) is want, (precision, finetune)
    assert isinstance(make_optimizer("adamw", params, 1e-4, precision="bf16"), StochasticRoundAdamW)
    assert type(make_optimizer("adamw", params, 1e-4, precision="bf16-plain")) is torch.optim.AdamW
    assert type(make_optimizer("adamw", params, 1e-4, precision="bf16", finetune="lora")) is torch.optim.AdamW


def test_the_kernel_compiles_for_the_h100_without_fused_multiply_adds() -> None:
    """Compiled ahead of time for sm_90 with the launch's options (no GPU needed): the PTX rounds every operation
    as the eager step does (no fma, correctly rounded division and square root), shifts the hash logically and
    loads 16 bytes at a time where the tensors are aligned, as Triton specialises them at launch."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    pointers = {f"{t}_ptr": "*bf16" for t in "pgmv"}
    scalars = {name: "fp32" for name in sr.Hyper._fields}
    signature = {**pointers, "n": "i32", **scalars, "key_lo": "i32", "key_hi": "i32",
                 "STOCHASTIC": "constexpr", "BLOCK": "constexpr"}
    source = ASTSource(sr._build_kernel(), signature, constexprs={"STOCHASTIC": True, "BLOCK": sr.BLOCK},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(5)})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=sr.LAUNCH_OPTIONS).asm["ptx"]
    assert "fma." not in ptx and "div.rn.f32" in ptx and "sqrt.rn.f32" in ptx
    assert "shr.u32" in ptx and "shr.s32" not in ptx
    assert ptx.count("ld.global.v4.b32") == 4 and ptx.count("st.global.v4.b32") == 3
