"""The model of an inference job, built as the planner sized it: the planned weights dtype on the target device.

fp32, bf16 and fp16 are built in that dtype; int8 and fp8 are quantized after the build through torchao
``quantize_`` on the decoder's linear layers (the LM head stays as built); mxfp4 is a published
checkpoint's own and loads as it is stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from catalog.schema import ModelConfig
from errors import InvalidInput
from workers.capabilities import supported
from workers.model.isolation import load_libraries, seeded_build

# mxfp4: a checkpoint stored so (gpt-oss's MXFP4 experts): loaded as it is, transformers' quantizer keeps the
# experts 4-bit where it has the kernels; the rest of the model is bf16
WEIGHT_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "fp8", "int4", "mxfp4")


def _base_dtype(weights: str, device: str) -> torch.dtype:
    on_cuda = device.startswith("cuda")
    if weights == "auto":
        return torch.bfloat16 if on_cuda else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(weights, torch.bfloat16)


def check_weights(weights: str, device: str, weights_dir: Path | None = None) -> None:
    if weights == "mxfp4" and weights_dir is None:
        raise InvalidInput(
            "mxfp4 weights are a published checkpoint's own (gpt-oss's MXFP4 experts); a random init builds the "
            "bf16 experts, which the plan did not size",
            path="model",
            hint="give the downloaded checkpoint folder as the model (huggingface-cli download openai/gpt-oss-20b "
            "--local-dir gpt-oss-20b; model: gpt-oss-20b), or plan and run with weights bf16",
        )
    if weights not in WEIGHT_DTYPES:
        raise InvalidInput(
            f"unknown weights dtype {weights!r}", path="infer.weights", hint="use one of " + ", ".join(WEIGHT_DTYPES)
        )
    refused = supported().workers.infer.weights.not_run.get(weights)
    if refused is not None:
        raise InvalidInput(f"{weights} weights are not run by this worker: {refused}", path="infer.weights")
    if weights == "mxfp4" and not device.startswith("cuda"):
        raise InvalidInput(
            "mxfp4 weights stay 4-bit only on a CUDA GPU with transformers' MXFP4 kernels (Hopper, Blackwell)",
            path="infer.weights",
            hint="use weights bf16 on this device (transformers dequantizes the checkpoint on load)",
        )
    if weights == "fp8" and not device.startswith("cuda"):
        raise InvalidInput(
            "fp8 weights need a CUDA GPU with fp8 support (sm89+)",
            path="infer.weights",
            hint="use int8 or bf16 on this device",
        )


def quantize_weights(model: torch.nn.Module, weights: str) -> None:
    """torchao weight quantization of the decoder's linear layers; the LM head is left as is."""
    if weights not in ("int8", "fp8"):
        return
    try:
        load_libraries("torchao")  # resolved once, under the lock: another job may be importing it
        from torchao.quantization import quantize_
    except ImportError as exc:
        raise InvalidInput(
            f"{weights} weights need torchao, which is not installed ({exc})",
            path="infer.weights",
            hint="pip install torchao, or use bf16",
        ) from None

    def decoder_linear(module: torch.nn.Module, fqn: str) -> bool:
        return isinstance(module, torch.nn.Linear) and "lm_head" not in fqn

    if weights == "int8":
        from torchao.quantization import Int8WeightOnlyConfig

        quantize_(model, Int8WeightOnlyConfig(), filter_fn=decoder_linear)
    else:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig

        quantize_(model, Float8DynamicActivationFloat8WeightConfig(), filter_fn=decoder_linear)


def load_model(
    model_cfg: ModelConfig, *, weights: str, seed: int, device: str, weights_dir: Path | None = None
) -> torch.nn.Module:
    from workers.model.build import ModelSource, build_model

    check_weights(weights, device, weights_dir)
    source = ModelSource(config=model_cfg, weights_dir=weights_dir)
    # Random init directly on the target device: initialising an 8B model on CPU first takes minutes.
    # (build_model's own device wins over an enclosing `with torch.device(...)`, so it is passed.)
    # seeded from the job's seed alone, whatever runs beside it in this process (workers.model.isolation)
    with seeded_build(seed, torch.device(device)):
        model = build_model(source, seed=seed, weights_dtype=_base_dtype(weights, device),
                            device=torch.device(device) if weights_dir is None else None)
    config: Any = getattr(model, "config", None)
    if config is not None:
        config.use_cache = True  # the builder turns the KV cache off for training
    model.to(device)
    quantize_weights(model, weights)
    model.eval()
    return model
