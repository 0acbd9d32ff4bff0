"""JobSpec: the one job description every package shares (YAML or JSON).

Validated at construction: unknown fields, impossible numbers and malformed values are refused
with the field's path. Names that need the catalog (GPU, model preset, cloud) are checked by the
planner, which knows the catalog, and suggest the closest valid names.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from catalog.schema import ModelConfig
from errors import InvalidInput
from planner.strategies import AUTO, FinetuneName, SpecPrecision, SpecSharding, finetune_kind, precision_kind

Task = Literal["train", "infer"]
Precision = SpecPrecision  # 'auto' or a kind of planner.strategies
Optimizer = Literal["adamw", "adamw-8bit", "sgd", "adafactor"]
Sharding = SpecSharding
Finetune = FinetuneName
Weights = Literal["auto", "bf16", "fp16", "fp8", "int8", "int4", "mxfp4"]
SpotMode = Literal["auto", "always", "never"]
AutoBool = bool | Literal["auto"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_HOURS = {"s": 1 / 3600, "m": 1 / 60, "h": 1.0, "d": 24.0, "w": 168.0}


def parse_hours(value: object) -> float:
    """'24h', '90m', '2d', 36 (hours) -> hours as a float."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like '24h', '90m' or '2d'")
    if isinstance(value, int | float):
        hours = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration; write e.g. '24h', '90m' or '2d'")
        hours = float(match.group(1)) * _UNIT_HOURS[match.group(2) or "h"]
    else:
        raise ValueError("expected a duration like '24h', '90m' or '2d'")
    if hours <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}; write e.g. '24h', '90m' or '2d'")
    return hours


Hours = Annotated[float, BeforeValidator(parse_hours)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRef(_Section):
    """A model given by the path of a Hugging Face config.json instead of a preset id."""

    config: str = Field(min_length=1)


class TrainSpec(_Section):
    tokens: float = Field(gt=0, le=1e15, description="total tokens to process")
    seq_len: int = Field(default=2048, ge=8, le=1_048_576)
    micro_batch: int | None = Field(default=None, ge=1, le=4096, description="per GPU; None: planner")
    global_batch: int | None = Field(default=None, ge=1, le=1_000_000, description="sequences per step")
    precision: Precision = "auto"
    optimizer: Optimizer = "adamw"
    activation_checkpointing: AutoBool = "auto"
    sharding: Sharding = "auto"
    tensor_parallel: int | Literal["auto"] = 1
    pipeline_parallel: int | Literal["auto"] = 1
    finetune: Finetune = "full"
    lora_rank: int = Field(default=16, ge=1, le=4096)
    learning_rate: float = Field(default=3e-4, gt=0, le=1.0)
    seed: int = 0
    data: str | None = Field(default=None, description="token ids (.npy/.bin) or JSONL text/chat; None: synthetic")
    tokenizer: str | None = Field(default=None, description="tokenizer directory for JSONL data")
    checkpoint_interval_steps: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> TrainSpec:
        problems: list[str] = []  # all of them in one error
        for name in ("tensor_parallel", "pipeline_parallel"):
            value = getattr(self, name)
            if isinstance(value, int) and not 1 <= value <= 512:
                problems.append(f"{name} must be between 1 and 512 (or 'auto'), got {value}")
        if (finetune_kind(self.finetune).quantized_base and self.precision != AUTO
                and not precision_kind(self.precision).sixteen_bit_compute):
            problems.append(f"{self.finetune} trains bf16/fp16 adapters on int4 weights; precision {self.precision}"
                            " is not possible with it (use auto, bf16 or amp-bf16)")
        gb, mb = self.global_batch, self.micro_batch
        if gb is not None and mb is not None and gb % mb:
            # Gradient accumulation runs whole micro-batches: anything else silently changes the batch.
            lower, upper = gb - gb % mb, gb - gb % mb + mb
            problems.append(f"global_batch {gb} is not a multiple of micro_batch {mb} (it would run {upper}); "
                            f"write global_batch {f'{lower} or ' if lower else ''}{upper}, or a micro_batch "
                            f"that divides {gb}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class InferSpec(_Section):
    batch: int = Field(default=32, ge=1, le=65536, description="concurrent sequences")
    prompt_tokens: int = Field(default=1024, ge=1, le=1_048_576)
    output_tokens: int = Field(default=256, ge=1, le=1_048_576)
    requests: float = Field(default=1000, gt=0, le=1e13)
    weights: Weights = "auto"
    prompts: str | None = Field(default=None, description="JSONL prompts file; None: synthetic")
    tokenizer: str | None = Field(default=None, description="tokenizer directory for text prompts")


class Resources(_Section):
    accelerators: list[str] | None = Field(default=None, description='allow-list; "H100:8" pins the count')
    clouds: list[str] | None = None
    regions: list[str] | None = None
    spot: SpotMode = "auto"
    deadline: Hours | None = Field(default=None, description="hours from submission")
    budget_usd: float | None = Field(default=None, gt=0)
    max_gpus: int = Field(default=64, ge=1, le=100_000)
    memory_headroom: float | None = Field(
        default=None, ge=0.0, le=0.5,
        description="fraction of each GPU's usable memory a plan must leave free; None: the planner's default (0.05)")

    @model_validator(mode="before")
    @classmethod
    def _listify(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("accelerators", "clouds", "regions"):
                if isinstance(data.get(key), str):
                    data = {**data, key: [data[key]]}
        return data

    def accelerator_pins(self) -> dict[str, int | None]:
        """{'H100': 8, 'A100-80GB': None}: name -> pinned count, from the allow-list."""
        pins: dict[str, int | None] = {}
        for item in self.accelerators or []:
            name, _, count = item.partition(":")
            pins[name.strip()] = int(count) if count else None
        return pins

    @field_validator("accelerators")
    @classmethod
    def _check_pins(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            name, sep, count = item.partition(":")
            if not name.strip():
                raise ValueError(f"accelerator {item!r} has no name; write e.g. 'H100' or 'H100:8'")
            if sep and (not count.isdigit() or int(count) < 1):
                raise ValueError(f"accelerator {item!r}: the count after ':' must be a whole number >= 1")
        return value


class JobSpec(_Section):
    name: str = Field(default="job", min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    task: Task
    model: str | ModelRef
    train: TrainSpec | None = None
    infer: InferSpec | None = None
    resources: Resources = Field(default_factory=Resources)

    @model_validator(mode="after")
    def _task_section(self) -> JobSpec:
        if self.task == "train" and self.train is None:
            raise ValueError("task is 'train' but the 'train' section is missing (it needs at least tokens)")
        if self.task == "infer" and self.infer is None:
            if self.train is not None:
                raise ValueError("task is 'infer' but the spec has only a 'train' section; add an 'infer' "
                                 "section (requests, batch, prompt_tokens, output_tokens) or set task: train")
            object.__setattr__(self, "infer", InferSpec())
        return self

    @property
    def model_id(self) -> str:
        return self.model if isinstance(self.model, str) else self.model.config


# The file paths a spec may hold besides its model: (section, field).
PATH_FIELDS = (("train", "data"), ("train", "tokenizer"), ("infer", "prompts"), ("infer", "tokenizer"))


def model_is_path(model: str | ModelRef) -> bool:
    """Whether the spec's model names a file or folder (a config.json, a weights folder), not a preset id:
    ``{config: path}``, or a string with a '/' or ending in '.json' (preset ids have neither)."""
    return isinstance(model, ModelRef) or "/" in model or model.endswith(".json") or model.startswith("~")


def spec_paths(spec: JobSpec) -> list[tuple[str, str]]:
    """(field path, value) of every file path in ``spec``, the model's included where it is one."""
    found: list[tuple[str, str]] = []
    if model_is_path(spec.model):
        found.append(("model.config" if isinstance(spec.model, ModelRef) else "model", spec.model_id))
    for section, name in PATH_FIELDS:
        value = getattr(getattr(spec, section), name, None)
        if value:
            found.append((f"{section}.{name}", value))
    return found


def _format_loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item.startswith(("function-", "literal[", "str", "int", "float", "bool", "ModelRef")):
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(spec)"


def _problem(error: Any) -> tuple[str, str]:
    """(field path, what is wrong and what to write) for one pydantic error."""
    path = _format_loc(tuple(error["loc"]))
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        message = ("unknown field; check the spelling (the fields are in the README's 'Job spec'; examples/ has "
                   "complete specs)")
    if error["type"] == "literal_error":
        message = f"{message}, got {error.get('input')!r}"
    value = error.get("input")
    if isinstance(value, float) and not math.isfinite(value):  # YAML's .nan and .inf pass as floats
        message = f"{'not a number' if math.isnan(value) else 'infinite'} ({value}); write a finite number"
    return path, message


def invalid_spec(problems: list[tuple[str, str]]) -> InvalidInput:
    """One error naming every problem: a user fixes a spec in one pass, not one error per run."""
    if len(problems) == 1:
        path, message = problems[0]
        return InvalidInput(message, path=path)
    lines = "".join(f"\n  {path}: {message}" for path, message in problems)
    return InvalidInput(f"{len(problems)} problems in the spec:{lines}")


def model_problems(spec: JobSpec, model: ModelConfig) -> list[tuple[str, str]]:
    """What the spec asks of the model that the model cannot do (its context length)."""
    limit = model.max_position_embeddings
    problems: list[tuple[str, str]] = []
    fix = (f"use at most {limit:,} tokens, or a model with a longer context (`gpuplan catalog models` lists "
           "each preset's context); gpuplan does not model RoPE scaling")
    if spec.train is not None and spec.task == "train" and spec.train.seq_len > limit:
        tokens = f"{spec.train.seq_len:,} tokens" if "seq_len" in spec.train.model_fields_set else (
            f"not set, and its default of {spec.train.seq_len:,} tokens")
        problems.append(("train.seq_len", f"{tokens} is longer than {model.id}'s context of "
                                          f"{limit:,} (max_position_embeddings); {fix}"))
    problems += _stored_quantization_problems(spec, model)
    if spec.infer is not None and spec.task == "infer":
        total = spec.infer.prompt_tokens + spec.infer.output_tokens
        unset = sorted({"prompt_tokens", "output_tokens"} - spec.infer.model_fields_set)
        defaults = f" (the default{'s' if len(unset) > 1 else ''} of {' and '.join(unset)})" if unset else ""
        if total > limit:
            problems.append(("infer.prompt_tokens", f"prompt_tokens + output_tokens = {total:,} tokens{defaults} "
                                                    "is longer "
                                                    f"than {model.id}'s context of {limit:,} "
                                                    f"(max_position_embeddings); {fix}"))
    return problems


def fit_defaults(spec: JobSpec, model: ModelConfig) -> JobSpec:
    """The spec with the lengths it leaves to their defaults fitted to the model's context: a default the user
    never wrote is not an error (tiny-llama's 1,024 tokens against the default seq_len of 2,048). What the spec
    sets stays as written, and model_problems refuses it if it is too long."""
    limit = model.max_position_embeddings
    train, infer = spec.train, spec.infer
    if train is not None and "seq_len" not in train.model_fields_set and train.seq_len > limit:
        return spec.model_copy(update={"train": train.model_copy(update={"seq_len": max(8, limit)})})
    if (infer is not None and "prompt_tokens" not in infer.model_fields_set
            and infer.prompt_tokens + infer.output_tokens > limit > infer.output_tokens):
        prompt = limit - infer.output_tokens
        return spec.model_copy(update={"infer": infer.model_copy(update={"prompt_tokens": prompt})})
    return spec


def check_model(spec: JobSpec, model: ModelConfig) -> None:
    """Refuse a spec the model cannot run (every problem at once)."""
    problems = model_problems(spec, model)
    if problems:
        raise invalid_spec(problems)


def spec_from_dict(data: Any) -> JobSpec:
    """Validate a parsed document; errors name the field path and what to write instead.

    Reading a spec file (and making its paths relative to it) is the edge's: commands.specfile."""
    if not isinstance(data, dict):
        raise InvalidInput("a job spec must be a mapping with at least 'task' and 'model'")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise invalid_spec([_problem(e) for e in exc.errors()]) from None


# What a checkpoint stored quantized (ModelConfig.quantization) may be planned with: its own format where the
# GPU runs it (weights auto chooses), or the 16-bit weights transformers dequantizes it to.
STORED_QUANT_WEIGHTS = ("auto", "bf16", "fp16")


def _bf16_form(model: ModelConfig) -> str:
    """How to name the 16-bit form of a quantized checkpoint: the preset without '-<method>', else the config."""
    q = model.quantization
    suffix = f"-{q.method}" if q is not None else ""
    if suffix and model.id.endswith(suffix):
        return f"the bf16 preset {model.id.removesuffix(suffix)}"
    return "the same config.json without its quantization_config"


def _stored_quantization_problems(spec: JobSpec, model: ModelConfig) -> list[tuple[str, str]]:
    """A checkpoint stored quantized (gpt-oss's MXFP4 experts) is inference only, and only in its own format or
    dequantized; the mxfp4 weights value is only that format."""
    q = model.quantization
    weights = spec.infer.weights if spec.infer is not None and spec.task == "infer" else None
    if q is None:
        if weights == "mxfp4":
            return [("infer.weights", f"weights mxfp4 is the format a checkpoint ships in (e.g. the presets "
                                      f"gpt-oss-20b-mxfp4, gpt-oss-120b-mxfp4, or a config.json whose "
                                      f"quantization_config has quant_method mxfp4); {model.id} has none: use such "
                                      "a model, or weights auto, int8 or fp8")]
        return []
    method = q.method.upper()
    if spec.task == "train":
        return [("task", f"{model.id} stores its experts' weights in {method} ({q.bits_per_param:g} bits), which "
                         f"transformers runs for inference only (no backward through its {method} kernels); "
                         f"to train, plan {_bf16_form(model)} (transformers loads these weights dequantized with "
                         "Mxfp4Config(dequantize=True)), e.g. with finetune: lora to save memory; or set task: "
                         "infer")]
    if weights is not None and weights not in (*STORED_QUANT_WEIGHTS, q.method):
        return [("infer.weights", f"{model.id} ships {method} expert weights; weights {weights} would re-quantize "
                                  f"a dequantized copy, which the workers do not run: use weights auto ({method} "
                                  f"where the GPU runs it, else bf16), {q.method} or bf16, or plan "
                                  f"{_bf16_form(model)} with weights {weights}")]
    return []
