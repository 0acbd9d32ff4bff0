"""Typed records of the catalog: what a GPU is, what an offer costs, what a model looks like.

These are the data files' schema: every row in ``catalog/data`` validates against one of these
models (extra keys are refused), and every other package consumes only these types.
"""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Dtype = Literal["fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"]
Vendor = Literal["nvidia", "amd", "google", "apple"]
LinkKind = Literal["nvlink", "infinity-fabric", "pcie", "ici", "unified", "none"]


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


class MoeShape(_Record):
    """Fine-grained MoE (Qwen2/3-MoE, DeepSeek): experts narrower than the dense MLP, shared experts,
    and dense layers. Mixtral-style models (experts as wide as ``intermediate_size``) leave it None."""

    expert_intermediate_size: int = Field(gt=0, description="moe_intermediate_size: one routed expert's width")
    shared_intermediate_size: int = Field(default=0, ge=0, description="total width of the always-on shared experts")
    shared_expert_gate: bool = Field(default=False, description="Qwen2-MoE's gate (hidden -> 1) on the shared expert")
    dense_layers: int = Field(default=0, ge=0, description="layers with a dense MLP of intermediate_size instead")


class MlaShape(_Record):
    """DeepSeek-V2/V3 multi-head latent attention: low-rank q and kv projections."""

    q_lora_rank: int | None = Field(default=None, gt=0, description="None: a full-rank q_proj")
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(gt=0)
    v_head_dim: int = Field(gt=0)


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
