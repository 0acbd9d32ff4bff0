"""Build the Hugging Face model a job trains: shape from the catalog, then the plan's precision and LoRA.

The model's shape comes from a catalog ``ModelConfig`` (a preset, or a ``config.json``); weights
are either a seeded random init or a local directory written by ``save_pretrained``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from catalog.schema import ModelConfig
from errors import InvalidInput
from planner.spec import JobSpec, ModelRef
from workers.model.isolation import library_lock, load_libraries
from workers.spec_files import weights_folder

# Keys a config.json may carry that describe the checkpoint, not the architecture.
_NON_ARCH_KEYS = {"architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype"}


@dataclass(frozen=True)
class ModelSource:
    config: ModelConfig
    weights_dir: Path | None  # None: random init from the seed


def resolve_model_source(spec: JobSpec) -> ModelSource:
    """The model's shape (catalog preset or config.json) and where its weights are, if anywhere."""
    from catalog.loader import load_catalog, resolve_model

    ref: str | Path = Path(spec.model.config) if isinstance(spec.model, ModelRef) else spec.model
    return ModelSource(config=resolve_model(load_catalog(), ref), weights_dir=weights_folder(spec))


def hf_config(config: ModelConfig) -> Any:
    """The transformers ``PretrainedConfig`` for a catalog model (its HF keys, else its shape fields)."""
    load_libraries("transformers")
    from transformers import AutoConfig

    keys: dict[str, Any] = {k: v for k, v in config.hf_config.items() if k not in _NON_ARCH_KEYS}
    keys.pop("model_type", None)
    if not keys:
        keys = {
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_kv_heads,
            "intermediate_size": config.intermediate_size,
            "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings,
            "tie_word_embeddings": config.tie_word_embeddings,
        }
        if config.head_dim is not None:
            keys["head_dim"] = config.head_dim
        if config.num_experts > 1:
            keys["num_local_experts"] = config.num_experts
            keys["num_experts_per_tok"] = config.experts_per_token
    keys["use_cache"] = False
    try:
        with library_lock():  # the family's configuration module is imported on first use
            return AutoConfig.for_model(config.family, **keys)
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"cannot build a {config.family!r} model from {config.id!r}: {exc}", path="model",
                           hint="use a transformers model_type such as llama, mistral, qwen2 or gpt2") from None


def attn_implementation(config: ModelConfig) -> str:
    """SDPA, except for architectures transformers has no SDPA path for (gpt-oss's attention sinks): eager.
    The planner prices the same choice (AttentionShape.eager)."""
    return "eager" if config.attn.eager else "sdpa"


def build_model(source: ModelSource, *, seed: int, weights_dtype: torch.dtype,
                device: torch.device | None = None) -> torch.nn.Module:
    """A causal LM with seeded random weights (or the local weights), in ``weights_dtype``.

    Random weights are drawn on ``device`` (default CPU): initialising a billion parameters on a
    GPU takes a second instead of tens of seconds on CPU. The same device always draws the same ones.
    Beside other jobs in one process, build inside ``workers.model.isolation.seeded_build`` (the lock is taken here
    too, so the draws never interleave with another build's, but only that scope restores the global state).
    """
    with library_lock():  # the family's modeling module is imported on first use
        return _build_model(source, seed, weights_dtype, device)


def _build_model(source: ModelSource, seed: int, weights_dtype: torch.dtype,
                 device: torch.device | None) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    config = hf_config(source.config)
    if source.weights_dir is not None:
        try:
            model = AutoModelForCausalLM.from_pretrained(source.weights_dir, config=config, dtype=weights_dtype,
                                                         attn_implementation=attn_implementation(source.config))
        except (OSError, ValueError, RuntimeError) as exc:
            raise InvalidInput(f"cannot load weights from {source.weights_dir}: {exc}", path="model",
                               hint="the folder must hold save_pretrained output matching its config.json") from None
    else:
        torch.manual_seed(seed)
        try:
            with torch.device(device or "cpu"):
                model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                    config, dtype=weights_dtype, attn_implementation=attn_implementation(source.config))
        except (ValueError, RuntimeError, TypeError) as exc:
            raise InvalidInput(f"cannot build model {source.config.id!r}: {exc}", path="model") from None
    model.config.use_cache = False
    result: torch.nn.Module = model
    return result


# torchao NF4: blocks of 64 weights share an absmax, and those absmaxes are quantised again in
# blocks of 256, so a weight quantises only when its size is a multiple of 64 * 256.
NF4_BLOCK, NF4_SCALER_BLOCK = 64, 256


def quantize_base_nf4(model: torch.nn.Module, shards: int = 1) -> int:
    """QLoRA's frozen base: the decoder's linear weights in 4-bit NF4 (torchao); the LM head and any
    weight whose blocks do not split evenly over ``shards`` FSDP ranks stay 16-bit (on real models
    that is none). Returns how many were quantised."""
    load_libraries("torchao")
    from torchao.prototype._nf4tensor_api import NF4WeightOnlyConfig
    from torchao.quantization import quantize_

    def nf4_able(module: torch.nn.Module, fqn: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and "lm_head" not in fqn
                and module.weight.numel() % (NF4_BLOCK * NF4_SCALER_BLOCK * shards) == 0)

    count = sum(1 for fqn, module in model.named_modules() if nf4_able(module, fqn))
    quantize_(model, NF4WeightOnlyConfig(), filter_fn=nf4_able)
    return count


def apply_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """Wrap with peft LoRA on every linear layer but the LM head; only the adapters train (their init draws from
    torch's global generator: build inside ``workers.model.isolation.seeded_build``)."""
    load_libraries("peft")
    from peft import get_peft_model

    with library_lock():
        wrapped: torch.nn.Module = get_peft_model(model, lora_config(rank))
    return wrapped


def lora_config(rank: int) -> Any:
    """The peft LoraConfig training uses (`gpuplan export` writes the same one beside the adapter)."""
    load_libraries("peft")
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks (what FSDP shards and activation checkpointing wraps)."""
    for module in model.modules():
        for name in ("layers", "h", "blocks"):
            child = getattr(module, name, None)
            if isinstance(child, torch.nn.ModuleList) and len(child) > 0:
                return list(child)
    raise InvalidInput(f"cannot find the decoder layers of {type(model).__name__}", path="model")


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    # Non-reentrant: works with frozen inputs (LoRA) and with FSDP2. Newer transformers renamed the
    # method (the old name warns that it goes in v6); older ones, as on the H200 host, have only the old.
    kwargs = {"use_reentrant": False}
    if callable(enable := getattr(model, "activation_checkpointing_enable", None)):
        enable(activation_checkpointing_kwargs=kwargs)
    elif callable(enable := getattr(model, "gradient_checkpointing_enable", None)):
        enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise InvalidInput(f"{type(model).__name__} does not support activation checkpointing",
                           path="train.activation_checkpointing")
    require_grads = getattr(model, "enable_input_require_grads", None)
    if require_grads is not None:
        require_grads()
