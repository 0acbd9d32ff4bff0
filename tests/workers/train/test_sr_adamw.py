"""bf16 weights that do not drop updates (issue 46): a step below bf16's half-ulp leaves round-to-nearest
weights where they were, while the stochastically rounded step follows an fp32 reference in expectation."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from workers.train.setup import make_optimizer
from workers.train.sr_adamw import StochasticRoundAdamW, noise_seed, round_bf16

LR = 1e-5  # Adam's step is ~LR: 1/6 of the half-ulp (6.1e-5) of weights in [2^-6, 2^-5)
STEPS = 120
CHECK_AT = (30, 60, 120)
TOLERANCE = 0.05  # of the reference's mean movement; the rounding noise's standard error is ~1% here


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


def test_a_restored_optimizer_continues_the_same_random_stream() -> None:
    """The bits of a step are a function of (seed, rank, parameter, step): an optimizer rebuilt from a state
    dict mid-run takes exactly the steps the uninterrupted one takes."""
    def run(restart_at: int | None) -> torch.Tensor:
        model = _tiny_model(torch.bfloat16)
        opt = make_optimizer("adamw", list(model.parameters()), 1e-4, precision="bf16", seed=5)
        assert isinstance(opt, StochasticRoundAdamW)
        for step in range(8):
            if step == restart_at:
                saved = opt.state_dict()
                opt = make_optimizer("adamw", list(model.parameters()), 1e-4, precision="bf16", seed=5)
                opt.load_state_dict(saved)
            x = torch.rand(4, 64, generator=torch.Generator().manual_seed(step))
            model(x.bfloat16()).float().sum().backward()
            opt.step()
            opt.zero_grad()
        return model.weight.detach().clone()

    assert torch.equal(run(None), run(4))
    assert len({noise_seed(5, 0, 1, 3), noise_seed(6, 0, 1, 3), noise_seed(5, 1, 1, 3), noise_seed(5, 0, 2, 3),
                noise_seed(5, 0, 1, 4)}) == 5  # seed, rank, parameter and step each change the stream


def test_bf16_plain_keeps_torch_adamw() -> None:
    params = list(_tiny_model(torch.bfloat16).parameters())
    assert type(make_optimizer("adamw", params, 1e-4, precision="bf16-plain")) is torch.optim.AdamW
    assert isinstance(make_optimizer("adamw", params, 1e-4, precision="bf16"), StochasticRoundAdamW)
    fp32 = list(_tiny_model(torch.float32).parameters())  # LoRA's fp32 adapters under a bf16 base
    assert type(make_optimizer("adamw", fp32, 1e-4, precision="bf16")) is torch.optim.AdamW


def test_the_compiled_step_cuda_runs_is_the_eager_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA runs the step through torch.compile (fullgraph, any length, writing into slices of the parameter):
    compiled here by inductor for the CPU, it traces, compiles once for every piece length and gives the eager
    step's bits exactly, pieces of a 2-D parameter included."""
    import workers.train.sr_adamw as sr

    compiled = torch.compile(sr._step_piece, dynamic=True, fullgraph=True)
    monkeypatch.setattr(sr, "CHUNK", 1000)  # 64 x 70 = 4480: five pieces, the last one shorter

    def run(kernel: Callable[..., None]) -> tuple[torch.Tensor, torch.Tensor]:
        monkeypatch.setattr(sr, "_kernel", lambda _device: kernel)
        w = torch.nn.Parameter((torch.randn(64, 70, generator=torch.Generator().manual_seed(0)) * 0.02).bfloat16())
        opt = StochasticRoundAdamW([w], lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, seed=3)
        for i in range(3):
            w.grad = torch.randn(64, 70, generator=torch.Generator().manual_seed(i)).bfloat16()
            opt.step()
        return w.detach().clone(), opt.state[w]["exp_avg"].clone()

    eager, fused = run(sr._step_piece), run(compiled)
    assert torch.equal(eager[0], fused[0]) and torch.equal(eager[1], fused[1])
