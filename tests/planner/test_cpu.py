"""gpuplan run on a CPU-only machine refuses a model whose weights cannot fit in its memory (planner.cpu)."""

from __future__ import annotations

import pytest

from catalog.loader import load_catalog
from errors import InvalidInput
from planner.cpu import check_fits_in_ram
from planner.types import Strategy

GIB = 2**30


def test_an_8b_model_is_refused_with_what_it_needs_and_what_there_is() -> None:
    model = load_catalog().model("llama-3-8b")
    with pytest.raises(InvalidInput) as info:
        check_fits_in_ram(model, Strategy(gpu="cpu", gpu_count=1, precision="fp32"), 16 * GIB)
    message = str(info.value)
    assert message.startswith("llama-3-8b has 8.0B parameters: 29.9 GiB for its fp32 weights alone, more than "
                              "the 16.0 GiB of memory available")
    assert "gpuplan submit" in message and "\n" not in message


def test_a_small_model_or_unknown_memory_passes() -> None:
    catalog = load_catalog()
    fp32 = Strategy(gpu="cpu", gpu_count=1, precision="fp32")
    check_fits_in_ram(catalog.model("tiny-llama"), fp32, 1 * GIB)
    check_fits_in_ram(catalog.model("llama-3-8b"), fp32, None)  # cannot read it: let the run try
    # bf16 weights take half: 8B in 16 GiB of bf16 (14.9 GiB) passes where fp32 did not
    check_fits_in_ram(catalog.model("llama-3-8b"), Strategy(gpu="cpu", gpu_count=1, precision="bf16"), 16 * GIB)
