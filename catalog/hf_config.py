"""Turn any Hugging Face ``config.json`` (llama, mistral, mixtral, qwen2/3, their MoEs, DeepSeek, gpt2 key names)
into a ModelConfig.

Different model families name the same shape differently (``n_embd`` vs ``hidden_size``,
``num_local_experts`` vs ``num_experts``); this module is the one place that knows the synonyms.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from catalog.schema import (
    AttentionShape,
    MlaShape,
    ModelConfig,
    MoeShape,
    QkNorm,
    QuantizedWeights,
    Source,
    StoredQuantization,
)
from errors import InvalidInput

# First key present wins. Order matters: the HF-standard name first.
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"),
    "experts_per_token": ("num_experts_per_tok", "moe_top_k", "top_k_experts", "experts_per_token"),
}

# Defaults of the transformers config classes where a config.json may omit the key.
_FAMILY_TIE_DEFAULT = {"gpt2": True, "llama": False, "mistral": False, "mixtral": False, "qwen2": False,
                       "gemma3_text": True, "gpt_oss": False, "phi3": False, "olmo2": False}
# Families whose every parameter the counter models; others are counted as a llama-style decoder, with a warning.
MODELED_FAMILIES = frozenset({"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                              "deepseek_v2", "deepseek_v3", "gpt2", "gpt_oss", "gemma3_text", "phi3", "olmo2"})
# How transformers builds each family's layers beyond the Llama default (the modeling_*.py files of
# transformers 5): which apply sliding_window to every layer, which gate it by use_sliding_window
# (layers >= max_window_layers), their q/k norms and norms per layer.
_WINDOW_ALL_LAYERS = frozenset({"mistral", "mixtral", "phi3", "starcoder2"})
_WINDOW_GATED = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
_QK_NORM: dict[str, QkNorm] = {"qwen3": "head", "qwen3_moe": "head", "gemma3_text": "head", "olmo2": "full"}
_NORMS_PER_LAYER = {"gemma2": 4, "gemma3_text": 4}
# Architectures whose transformers class has no SDPA path (_supports_sdpa = False): the workers build them
# with attn_implementation="eager", which materialises the attention scores.
EAGER_ONLY_FAMILIES = frozenset({"gpt_oss"})
_SINKS = frozenset({"gpt_oss"})
# MoE classes that loop over the experts in Python in the reference stack (measured: gpt-oss, issue 12).
_EXPERT_LOOP = frozenset({"gpt_oss"})
# Multimodal configs whose text decoder gpuplan plans (transformers builds it from text_config).
_TEXT_CONFIG_FAMILIES = {"gemma3": "gemma3_text"}
# Defaults of the transformers config class where published configs omit the key (Gemma 3's text_config
# lists only what differs from Gemma3TextConfig()).
_FAMILY_DEFAULTS: dict[str, dict[str, object]] = {
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                    "max_position_embeddings": 131072, "sliding_window": 4096},
}
# Quantized checkpoints the planner models (quantization_config.quant_method): bits per stored weight with its
# block scales, which weights, and the families transformers' quantizer converts. MXFP4: e2m1 values in blocks
# of 32 sharing one e8m0 scale (4 + 8/32 bits); transformers' Mxfp4HfQuantizer replaces gpt-oss's experts only.
_STORED_QUANT: dict[str, tuple[float, QuantizedWeights, frozenset[str]]] = {
    "mxfp4": (4 + 8 / 32, "experts", frozenset({"gpt_oss"})),
}
# Keys that would change the shape if the reader ignored them (experts, low-rank attention, extra layers)...
_SHAPE_KEY = re.compile(r"expert|moe|lora_rank|nextn|shared|sparse|dense|router|altup|laurel|mamba|ssm")
# ...minus those it reads, and routing/loss knobs that change no weight. num_nextn_predict_layers: transformers
# does not build DeepSeek's multi-token-prediction layer (its weights are skipped on load), so neither do we.
_READ_OR_SHAPELESS = frozenset({
    "num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok", "moe_top_k",
    "top_k_experts", "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size",
    "first_k_dense_replace", "decoder_sparse_step", "mlp_only_layers", "kv_lora_rank",
    "q_lora_rank", "output_router_logits", "router_aux_loss_coef", "norm_topk_prob", "routed_scaling_factor",
    "topk_method", "n_group", "topk_group", "scoring_func", "aux_loss_alpha", "seq_aux", "ep_size",
    "router_jitter_noise", "num_nextn_predict_layers", "experts_per_token",
})
_ARCH_TO_FAMILY = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "GPT2LMHeadModel": "gpt2",
    "GptOssForCausalLM": "gpt_oss",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
    "Olmo2ForCausalLM": "olmo2",
}


def _pick(cfg: Mapping[str, object], canonical: str) -> tuple[str, object] | None:
    for key in _SYNONYMS[canonical]:
        if key in cfg and cfg[key] is not None:
            return key, cfg[key]
    return None


def _pos_int(cfg: Mapping[str, object], canonical: str, where: str, default: int | None = None) -> int:
    found = _pick(cfg, canonical)
    if found is None:
        if default is not None:
            return default
        names = " / ".join(_SYNONYMS[canonical])
        raise InvalidInput(f"config has no {names}", path=where, hint=f"add the key {_SYNONYMS[canonical][0]!r}")
    key, value = found
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"{key} must be a positive integer, got {value!r}", path=f"{where}.{key}")
    return value


def _opt_int(cfg: Mapping[str, object], key: str, where: str, minimum: int = 1) -> int | None:
    """An optional integer key; absent or null -> None."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive integer" if minimum > 0 else "a non-negative integer"
        raise InvalidInput(f"{key} must be {kind}, got {value!r}", path=f"{where}.{key}")
    return value


def _dense_layer_count(cfg: Mapping[str, object], layers: int, where: str) -> int:
    """Layers that keep a dense MLP in an MoE model: DeepSeek's first_k_dense_replace, Qwen-MoE's
    mlp_only_layers / decoder_sparse_step (the rules the transformers classes apply; they ignore moe_layer_freq)."""
    first_dense = _opt_int(cfg, "first_k_dense_replace", where, minimum=0) or 0
    step = _opt_int(cfg, "decoder_sparse_step", where) or 1
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise InvalidInput(f"mlp_only_layers must be a list of layer indices, got {only!r}",
                           path=f"{where}.mlp_only_layers")
    dense_set = set(only)
    sparse = [i for i in range(layers)
              if i >= first_dense and (i + 1) % step == 0 and i not in dense_set]
    return layers - len(sparse)


def _moe_shape(cfg: Mapping[str, object], family: str, intermediate: int, layers: int, where: str) -> MoeShape | None:
    """None for Mixtral-style MoE (every layer sparse, experts as wide as intermediate_size, nothing shared)."""
    expert = _opt_int(cfg, "moe_intermediate_size", where) or intermediate
    n_shared = _opt_int(cfg, "n_shared_experts", where, minimum=0) or 0
    shared = n_shared * expert + (_opt_int(cfg, "shared_expert_intermediate_size", where, minimum=0) or 0)
    dense = _dense_layer_count(cfg, layers, where)
    biased = family == "gpt_oss"
    loop = family in _EXPERT_LOOP
    if expert == intermediate and shared == 0 and dense == 0 and not biased and not loop:
        return None
    return MoeShape(expert_intermediate_size=expert, shared_intermediate_size=shared,
                    shared_expert_gate=family == "qwen2_moe" and shared > 0, dense_layers=dense,
                    expert_bias=biased, router_bias=biased, expert_loop=loop)


def _sliding_layers(cfg: Mapping[str, object], family: str, layers: int, where: str) -> int:
    """How many layers attend through the window, by the rule transformers' config class applies."""
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, str) for t in types):
            raise InvalidInput(f"layer_types must list one attention type per layer ({layers}), got {types!r}",
                               path=f"{where}.layer_types")
        return sum(t == "sliding_attention" for t in types)
    if family == "gemma3_text":
        pattern = _opt_int(cfg, "sliding_window_pattern", where) or 6
        return sum(1 for i in range(layers) if (i + 1) % pattern)
    if family == "gemma2":
        return sum(1 for i in range(layers) if (i + 1) % 2)
    if family in _WINDOW_GATED:
        if cfg.get("use_sliding_window") is not True:
            return 0
        first = _opt_int(cfg, "max_window_layers", where, minimum=0) or 0
        return max(0, layers - first)
    if family in _WINDOW_ALL_LAYERS:
        return layers
    return 0


def _attention_shape(cfg: Mapping[str, object], family: str, layers: int, max_pos: int,
                     where: str) -> AttentionShape | None:
    """None when the model is plain causal attention (the Llama layout)."""
    window = _opt_int(cfg, "sliding_window", where)
    sliding = _sliding_layers(cfg, family, layers, where) if window is not None else 0
    if window is not None and (sliding == 0 or window >= max_pos):
        window, sliding = None, 0  # a window no sequence reaches is full attention
    shape = AttentionShape(sliding_window=window, sliding_layers=sliding, sinks=family in _SINKS,
                           eager=family in EAGER_ONLY_FAMILIES, qk_norm=_QK_NORM.get(family, "none"),
                           norms_per_layer=_NORMS_PER_LAYER.get(family, 2))
    return None if shape == AttentionShape() else shape


def _mla_shape(cfg: Mapping[str, object], where: str) -> MlaShape | None:
    kv_rank = _opt_int(cfg, "kv_lora_rank", where)
    if kv_rank is None:
        return None
    dims = {}
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        dim = _opt_int(cfg, key, where)
        if dim is None:
            raise InvalidInput(f"config has kv_lora_rank (latent attention) but no {key}", path=f"{where}.{key}",
                               hint="copy the key from the model's published config.json")
        dims[key] = dim
    return MlaShape(q_lora_rank=_opt_int(cfg, "q_lora_rank", where), kv_lora_rank=kv_rank, **dims)


def _quantization(cfg: Mapping[str, object], family: str, experts: int,
                  where: str) -> tuple[StoredQuantization | None, list[str]]:
    """The checkpoint's stored quantization (config.json quantization_config), or None and, for a method the
    planner does not model, a note saying the weights are counted at the dtype the plan picks."""
    raw = cfg.get("quantization_config")
    if raw is None:
        return None, []
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"quantization_config must be an object, got {raw!r}", path=f"{where}.quantization_config")
    method = raw.get("quant_method")
    known = _STORED_QUANT.get(method) if isinstance(method, str) else None
    not_converted = raw.get("modules_to_not_convert") or []
    if not isinstance(not_converted, list) or not all(isinstance(m, str) for m in not_converted):
        raise InvalidInput(f"quantization_config.modules_to_not_convert must be a list of module names, got "
                           f"{not_converted!r}", path=f"{where}.quantization_config.modules_to_not_convert")
    if known is None or family not in known[2] or experts <= 1 \
            or any("experts" in m for m in not_converted):
        return None, [f"quantization_config quant_method {method!r} is not modeled for {family!r}: weights are "
                      "counted at the dtype the plan picks (infer.weights), not as the checkpoint stores them"]
    bits, weights, _ = known
    assert isinstance(method, str)
    return StoredQuantization(method=method, bits_per_param=bits, weights=weights,
                              not_converted=list(not_converted)), []


def _assumptions(cfg: Mapping[str, object], family: str) -> list[str]:
    """What a count of this config guesses, in words a user can check; empty for modeled families."""
    notes = []
    if family not in MODELED_FAMILIES:
        notes.append(f"model_type {family!r} is not one gpuplan models exactly; counted as a llama-style decoder "
                     "(q/k/v/o projections, SwiGLU MLP of intermediate_size, RMSNorm), so parameters, memory and "
                     "speed are estimates")
    unread = sorted(k for k in cfg if _SHAPE_KEY.search(k) and k not in _READ_OR_SHAPELESS
                    and cfg[k] not in (None, 0, False, [], {}) and not (k == "moe_layer_freq" and cfg[k] == 1))
    if unread:
        notes.append(f"config keys {', '.join(unread)} are not modeled and were ignored; "
                     "parameters, memory and speed may be off")
    types = cfg.get("layer_types")
    if isinstance(types, list):
        odd = sorted({t for t in types if t not in ("sliding_attention", "full_attention")}, key=str)
        if odd:
            notes.append(f"layer_types {', '.join(map(str, odd))} are not modeled; those layers are counted as "
                         "full attention")
    return notes


def _family(cfg: Mapping[str, object], where: str) -> str:
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type
    archs = cfg.get("architectures")
    if isinstance(archs, list):
        for arch in archs:
            if isinstance(arch, str) and arch in _ARCH_TO_FAMILY:
                return _ARCH_TO_FAMILY[arch]
    raise InvalidInput(
        "config has no model_type (and no known architectures entry)",
        path=f"{where}.model_type",
        hint="add e.g. \"model_type\": \"llama\"",
    )


def read_config_file(path: Path) -> dict[str, object]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror}", path="model.config") from exc
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}", path="model.config") from exc
    if not isinstance(loaded, dict):
        raise InvalidInput(f"{path} must hold a JSON object", path="model.config")
    return loaded


def _text_decoder(cfg: Mapping[str, object], family: str) -> tuple[Mapping[str, object], str, list[str]]:
    """(config, family, notes) of the model gpuplan plans: a multimodal family's text decoder, else the model."""
    text = cfg.get("text_config")
    if family not in _TEXT_CONFIG_FAMILIES or not isinstance(text, Mapping):
        return cfg, family, []
    # e.g. Gemma3ForConditionalGeneration: plan its text decoder (Gemma3ForCausalLM on text_config)
    note = (f"config is a multimodal {family!r} model: gpuplan plans its text decoder only "
            f"({_TEXT_CONFIG_FAMILIES[family]}); the vision tower and projector are not counted")
    decoder = _TEXT_CONFIG_FAMILIES[family]
    return {**{k: v for k, v in text.items()}, "model_type": decoder}, decoder, [note]


def _head_dim(cfg: Mapping[str, object], hidden: int, heads: int, where: str) -> int | None:
    """The config's head_dim if it gives one (None: hidden / heads, which must then divide)."""
    head_dim_raw = cfg.get("head_dim")
    if head_dim_raw is not None:
        if isinstance(head_dim_raw, bool) or not isinstance(head_dim_raw, int) or head_dim_raw <= 0:
            raise InvalidInput(f"head_dim must be a positive integer, got {head_dim_raw!r}", path=f"{where}.head_dim")
        return head_dim_raw
    if hidden % heads:
        raise InvalidInput(
            f"hidden size {hidden} is not divisible by {heads} attention heads",
            path=f"{where}.num_attention_heads",
            hint="set head_dim explicitly or fix the head count",
        )
    return None


def model_from_hf_config(config: Mapping[str, object] | Path, model_id: str | None = None) -> ModelConfig:
    """Parse an HF config (mapping or path to config.json); bad or missing keys -> InvalidInput naming the key."""
    where = "model.config"
    source: Source | None = None
    if isinstance(config, Path):
        cfg: Mapping[str, object] = read_config_file(config)
        model_id = model_id or (config.parent.name if config.name == "config.json" else config.stem)
        where = str(config)
    else:
        cfg = config
    cfg, family, vision_note = _text_decoder(cfg, _family(cfg, where))
    if family in _FAMILY_DEFAULTS:
        cfg = {**_FAMILY_DEFAULTS[family], **cfg}
    hidden = _pos_int(cfg, "hidden_size", where)
    layers = _pos_int(cfg, "num_layers", where)
    heads = _pos_int(cfg, "num_attention_heads", where)
    kv_heads = _pos_int(cfg, "num_kv_heads", where, default=heads)
    intermediate = _pos_int(cfg, "intermediate_size", where, default=4 * hidden if family == "gpt2" else None)
    vocab = _pos_int(cfg, "vocab_size", where)
    max_pos = _pos_int(cfg, "max_position_embeddings", where)
    experts = _pos_int(cfg, "num_experts", where, default=1)
    per_token = _pos_int(cfg, "experts_per_token", where, default=1 if experts == 1 else 2)
    head_dim = _head_dim(cfg, hidden, heads, where)
    if heads % kv_heads:
        raise InvalidInput(
            f"{heads} attention heads are not a multiple of {kv_heads} key/value heads",
            path=f"{where}.num_key_value_heads",
        )
    if per_token > experts:
        raise InvalidInput(
            f"{per_token} experts per token exceeds {experts} experts", path=f"{where}.num_experts_per_tok"
        )
    tie_raw = cfg.get("tie_word_embeddings", _FAMILY_TIE_DEFAULT.get(family, False))
    if not isinstance(tie_raw, bool):
        raise InvalidInput(f"tie_word_embeddings must be true or false, got {tie_raw!r}",
                           path=f"{where}.tie_word_embeddings")
    moe = _moe_shape(cfg, family, intermediate, layers, where) if experts > 1 else None
    mla = _mla_shape(cfg, where)
    attention = _attention_shape(cfg, family, layers, max_pos, where)
    quantization, quant_notes = _quantization(cfg, family, experts, where)
    hf = dict(cfg)
    hf.setdefault("model_type", family)
    try:
        return ModelConfig(
            id=model_id or str(cfg.get("_name_or_path") or family),
            family=family,
            hidden_size=hidden,
            num_layers=layers,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            intermediate_size=intermediate,
            vocab_size=vocab,
            max_position_embeddings=max_pos,
            tie_word_embeddings=tie_raw,
            num_experts=experts,
            experts_per_token=per_token,
            head_dim=head_dim,
            moe=moe,
            mla=mla,
            attention=attention,
            quantization=quantization,
            assumptions=vision_note + _assumptions(cfg, family) + quant_notes,
            hf_config=hf,
            source=source,
        )
    except ValidationError as exc:  # pragma: no cover - every field is checked above
        raise InvalidInput(str(exc), path=where) from exc
