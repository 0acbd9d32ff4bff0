"""Typed records of the catalog: what a GPU is, what an offer costs, what a model looks like.

These are the data files' schema: every row in ``catalog/data`` validates against one of these
models (extra keys are refused), and every other package consumes only these types.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Dtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"]
Vendor = Literal["nvidia", "amd", "google", "apple", "intel", "aws", "cpu"]  # cpu: a machine's CPU (catalog.local_cpu)
LinkKind = Literal["nvlink", "infinity-fabric", "pcie", "ici", "ethernet", "neuronlink", "unified", "none"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Record):
    """Where a number came from and when it was true."""

    url: str
    as_of: date
    note: str = ""


class Interconnect(_Record):
    kind: LinkKind
    gbps_per_gpu: float = Field(ge=0, description="bidirectional GB/s per GPU on the GPU-GPU link")
    pcie_gen: int | None = Field(default=None, ge=3, le=6)


class GpuSpec(_Record):
    """One accelerator model (per GPU, dense throughput, no sparsity)."""

    id: str = Field(description="canonical id, e.g. H100-SXM")
    aliases: list[str] = Field(default_factory=list, description="other names users type, e.g. H100")
    vendor: Vendor
    architecture: str
    memory_gib: float = Field(gt=0, description="device memory as the driver reports it, GiB")
    torch_total_gib: float | None = Field(
        default=None, gt=0,
        description="torch.cuda.get_device_properties().total_memory / 2**30 where measured: the most PyTorch "
        "can allocate (below memory_gib, which is nvidia-smi's total)",
    )
    memory_bandwidth_gbps: float = Field(gt=0, description="GB/s")
    tflops: dict[Dtype, float] = Field(description="dense TFLOPS per dtype the part supports")
    interconnect: Interconnect
    tdp_w: float | None = Field(default=None, gt=0, description="W; None where the vendor publishes none")
    compute_capability: str | None = None
    dtypes: list[Dtype]
    source: Source


class Offer(_Record):
    """One priced way to rent GPUs: an instance type in a region (or zone) of a cloud."""

    cloud: str
    instance_type: str
    gpu: str = Field(description="GpuSpec.id")
    gpu_count: int = Field(ge=1)
    vcpus: int = Field(ge=1)
    ram_gib: float = Field(gt=0)
    region: str
    zone: str | None = None
    on_demand_usd_per_h: float | None = Field(default=None, gt=0)
    spot_usd_per_h: float | None = Field(default=None, gt=0)
    network_gbps: float = Field(default=25, gt=0, description="node-to-node network, Gbit/s")
    source: Source


class CloudSku(_Record):
    """One VM size of a cloud whose price API names the size but not its hardware (Azure's Retail
    Prices API): the GPUs, vCPUs and RAM an offer of that size carries, or why it is not offered."""

    sku: str = Field(description="the cloud's VM size name, e.g. Standard_ND96isr_H100_v5")
    gpu: str | None = Field(default=None, description="GpuSpec.id")
    gpu_count: int | None = Field(default=None, ge=1)
    vcpus: int | None = Field(default=None, ge=1)
    ram_gib: float | None = Field(default=None, gt=0)
    network_gbps: float = Field(default=25, gt=0, description="node-to-node network, Gbit/s")
    skip: str = Field(default="", description="why this size gives no offer (a fractional GPU, a GPU not in "
                      "the catalog); '' when it does")
    source: Source

    @model_validator(mode="after")
    def _offer_or_reason(self) -> CloudSku:
        hardware = (self.gpu, self.gpu_count, self.vcpus, self.ram_gib)
        if not self.skip and any(v is None for v in hardware):
            raise ValueError(f"{self.sku}: give gpu, gpu_count, vcpus and ram_gib, or skip with the reason")
        return self


class CloudNames(_Record):
    """catalog/data/cloud_names.yaml: how price sources name hardware, mapped to catalog ids."""

    azure_skus: list[CloudSku]
    skypilot_accelerators: dict[str, str] = Field(
        default_factory=dict,
        description="skypilot-catalog AcceleratorName -> GpuSpec.id where the catalog's own aliases would "
        "pick another part (skypilot's 'A100' is the 40 GB one)")
    skypilot_instances: dict[str, str] = Field(
        default_factory=dict,
        description="skypilot-catalog InstanceType -> GpuSpec.id where the row's AcceleratorName names the part "
        "too loosely (Lambda's gpu_1x_h100_pcie says 'H100', which is the SXM part); before the accelerator names")


class MoeShape(_Record):
    """Fine-grained MoE (Qwen2/3-MoE, DeepSeek): experts narrower than the dense MLP, shared experts,
    and dense layers. Mixtral-style models (experts as wide as ``intermediate_size``) leave it None."""

    expert_intermediate_size: int = Field(gt=0, description="moe_intermediate_size: one routed expert's width")
    shared_intermediate_size: int = Field(default=0, ge=0, description="total width of the always-on shared experts")
    shared_expert_gate: bool = Field(default=False, description="Qwen2-MoE's gate (hidden -> 1) on the shared expert")
    dense_layers: int = Field(default=0, ge=0, description="layers with a dense MLP of intermediate_size instead")
    expert_bias: bool = Field(default=False, description="gpt-oss: biases on every expert's gate_up and down")
    router_bias: bool = Field(default=False, description="gpt-oss: a bias on the router")
    expert_loop: bool = Field(
        default=False,
        description="transformers runs the experts one by one in a Python loop (gpt-oss), not as grouped GEMMs: "
        "a fixed cost per expert hit, per layer and step")


class MlaShape(_Record):
    """DeepSeek-V2/V3 multi-head latent attention: low-rank q and kv projections."""

    q_lora_rank: int | None = Field(default=None, gt=0, description="None: a full-rank q_proj")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


QkNorm = Literal["none", "head", "full"]


class AttentionShape(_Record):
    """Attention beyond plain causal SDPA over every layer: sliding-window layers, attention sinks,
    q/k norms, and architectures transformers runs only with eager attention."""

    sliding_window: int | None = Field(default=None, gt=0, description="tokens a sliding-window layer attends to")
    sliding_layers: int = Field(default=0, ge=0, description="layers that use the window (the rest attend to all)")
    sinks: bool = Field(default=False, description="gpt-oss: a learned sink logit per head, one extra score column")
    eager: bool = Field(
        default=False,
        description="transformers has no SDPA path for the architecture, so it runs eager attention: the "
        "scores (batch x heads x seq x seq) are materialised and saved for backward")
    qk_norm: QkNorm = Field(
        default="none",
        description="RMSNorm on q and k: 'head' over each head (Qwen3, Gemma 3), 'full' over the whole "
        "projection (OLMo 2)")
    norms_per_layer: int = Field(default=2, ge=1, le=4, description="RMSNorms of width hidden per layer (Gemma: 4)")


QuantMethod = Literal["mxfp4"]
QuantizedWeights = Literal["experts"]


class StoredQuantization(_Record):
    """Weights a published checkpoint stores quantized (its config.json ``quantization_config``), which
    transformers keeps quantized on load where it has the kernels, and dequantizes elsewhere.

    MXFP4 (OCP microscaling): 4-bit e2m1 values in blocks of 32 sharing one 8-bit e8m0 scale, 4 + 8/32 =
    4.25 bits per weight. gpt-oss stores its routed experts' gate_up and down projection weights so; their
    biases, attention, router, embeddings, lm_head and norms stay bf16 (``modules_to_not_convert``)."""

    method: QuantMethod = Field(description="quantization_config.quant_method")
    bits_per_param: float = Field(gt=0, le=16, description="bits per quantized weight, block scales included")
    weights: QuantizedWeights = Field(
        description="which weights are stored quantized: 'experts' = every routed expert's gate_up and down "
        "projection weights (not their biases)")
    not_converted: list[str] = Field(default_factory=list,
                                     description="quantization_config.modules_to_not_convert as published")


class ModelConfig(_Record):
    """A decoder-only transformer's shape: enough to count bytes and FLOPs and to build it."""

    id: str
    family: str = Field(description="HF model_type: llama, mistral, mixtral, qwen2, qwen3(_moe), deepseek_v3, gpt2...")
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    max_position_embeddings: int = Field(gt=0)
    tie_word_embeddings: bool = False
    num_experts: int = Field(default=1, ge=1)
    experts_per_token: int = Field(default=1, ge=1)
    head_dim: int | None = None
    moe: MoeShape | None = None
    mla: MlaShape | None = None
    attention: AttentionShape | None = Field(
        default=None, description="None: causal SDPA on every layer, no q/k norm, two norms per layer")
    quantization: StoredQuantization | None = Field(
        default=None, description="None: the checkpoint's weights are 16-bit (what the planner's weights knob "
        "starts from); else how the published checkpoint stores them (inference only)")
    assumptions: list[str] = Field(
        default_factory=list,
        description="what was guessed reading a config the planner does not model exactly; shown as warnings")
    hf_config: dict[str, object] = Field(default_factory=dict, description="the HF config.json keys")
    source: Source | None = None

    @property
    def head_size(self) -> int:
        """Width of one query/key head (MLA: the no-RoPE part plus the RoPE part)."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def attn(self) -> AttentionShape:
        """The attention record, the plain default when the model has none."""
        return self.attention or _PLAIN_ATTENTION

    @property
    def expert_width(self) -> int:
        """One routed expert's intermediate width (a model without MoE shapes: its intermediate_size)."""
        return self.moe.expert_intermediate_size if self.moe else self.intermediate_size


_PLAIN_ATTENTION = AttentionShape()

# ----------------------------------------------------------------------------- what the workers run

TrainKnob = Literal["sharding", "precision", "optimizer", "finetune"]
PlatformKnob = Literal["precision", "optimizer", "finetune", "weights"]


class KnobSupport(_Record):
    """The values of one knob the reference workers run, and why each other value is not run."""

    run: list[str] = Field(min_length=1)
    not_run: dict[str, str] = Field(default_factory=dict, description="value -> why the workers do not run it")

    def problem(self, knob: str, value: str) -> str | None:
        if value in self.run:
            return None
        why = self.not_run.get(value, "the workers have no code path for it")
        return f"{knob} {value} is not run by the workers: {why}"


class DegreeSupport(_Record):
    """An integer knob (a parallel degree, a GPU count): the largest value the workers run."""

    max: int = Field(ge=1)
    why: str = Field(description="why a larger value is not run")

    def problem(self, knob: str, value: int) -> str | None:
        if value <= self.max:
            return None
        return f"{knob}={value} is not run by the workers (at most {self.max}): {self.why}"


class TrainSupport(_Record):
    sharding: KnobSupport
    precision: KnobSupport
    optimizer: KnobSupport
    finetune: KnobSupport
    tensor_parallel: DegreeSupport
    pipeline_parallel: DegreeSupport


class InferSupport(_Record):
    weights: KnobSupport
    tensor_parallel: DegreeSupport
    gpus: DegreeSupport


class WorkerSupport(_Record):
    """What the workers run, independent of the GPU: the planner offers nothing outside it."""

    train: TrainSupport
    infer: InferSupport


class PlatformSupport(_Record):
    """Which precision and quantization paths the reference stack runs on one (vendor, architecture).

    Every value the workers run is either listed (it runs here) or in ``not_run`` with the reason.
    """

    vendor: Vendor
    architecture: str
    unsupported: str = Field(default="", description="why the workers run nothing on this platform ('' if they do)")
    precision: list[str]
    optimizer: list[str]
    finetune: list[str]
    weights: list[str]
    not_run: dict[str, str] = Field(default_factory=dict, description="'knob value' (e.g. 'finetune qlora') -> why")

    def runs(self, knob: PlatformKnob, value: str) -> bool:
        listed: list[str] = getattr(self, knob)
        return value in listed

    def problem(self, knob: PlatformKnob, value: str) -> str | None:
        if self.runs(knob, value):
            return None
        why = self.not_run.get(f"{knob} {value}", "the reference stack has no path for it there")
        return f"{knob} {value} does not run on {self.vendor} {self.architecture}: {why}"


class StackSupport(_Record):
    """catalog/data/support.yaml: the workers' capabilities and the per-platform record."""

    workers: WorkerSupport
    platforms: list[PlatformSupport]

    def platform(self, vendor: str, architecture: str) -> PlatformSupport | None:
        """The record of (vendor, architecture), else the vendor's "*" record (any architecture)."""
        for p in self.platforms:
            if p.vendor == vendor and p.architecture == architecture:
                return p
        return next((p for p in self.platforms if p.vendor == vendor and p.architecture == "*"), None)
