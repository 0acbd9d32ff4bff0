"""A LoRA run's adapter, written straight from its checkpoint, and where an export builds the base it merges into.

A LoRA checkpoint holds the adapters only, and a peft adapter folder is exactly those tensors (their names
without the adapter's name) plus the LoraConfig: writing it needs no base model. Rebuilding the base (an 8B
random init took over a minute on the CPU) is only for ``--merge``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from errors import InvalidInput

_ADAPTER = "default"  # the adapter name apply_lora's get_peft_model gives
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def adapter_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors as peft saves them: its LoRA weights, named without the adapter name."""
    tensors = {name.replace(f".{_ADAPTER}.", "."): tensor.detach().to("cpu").contiguous()
               for name, tensor in state.items() if ".lora_" in name}
    if not tensors:
        raise InvalidInput("the checkpoint of this LoRA run holds no LoRA weights",
                           hint="export a checkpoint written by this gpuplan")
    return tensors


def target_modules(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The module names the adapters sit on (q_proj, ...): what training's all-linear chose, spelled out,
    so a loader needs no rule to find them."""
    return sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in tensors})


def write_adapter(state: dict[str, torch.Tensor], out: Path, *, rank: int, base: str | None) -> None:
    """A peft adapter folder (adapter_config.json + adapter_model.safetensors) from a LoRA checkpoint's state.
    ``base``: its base_model_name_or_path (None for a base that was a random init: no folder holds it)."""
    from safetensors.torch import save_file

    from workers.model.build import lora_config

    tensors = adapter_tensors(state)
    config = lora_config(rank)
    config.target_modules = target_modules(tensors)
    config.base_model_name_or_path = base
    config.inference_mode = True
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config.save_pretrained(str(out))


def base_device(drawn_on: str | None, *, random_init: bool, cuda_available: bool,
                fits_gpu: bool = True) -> torch.device:
    """Where ``--merge`` builds the base: the GPU when there is one and the whole base fits it (``fits_gpu``:
    train_setup.build_device's rule, which training built by; an 8B init is seconds there, minutes on a CPU),
    except that a random-init base must be drawn again on the device type training drew it on (``drawn_on``,
    from the checkpoint): the same seed draws different weights on a CPU and on a GPU."""
    if random_init and drawn_on is not None:
        if drawn_on == "cuda" and not cuda_available:
            raise InvalidInput("this run's base was a random init drawn on a GPU, and this machine has none: "
                               "drawn on the CPU it would not be the base the adapters were trained on",
                               path="merge", hint="run the --merge export on a machine with a GPU, or export "
                               "without --merge (the adapter needs no base)")
        return torch.device(drawn_on)
    return torch.device("cuda" if cuda_available and fits_gpu else "cpu")
