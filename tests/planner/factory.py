"""Small hand-built catalog values for planner tests (independent of the shipped data files)."""

from __future__ import annotations

from datetime import date

from catalog.loader import Catalog
from catalog.schema import GpuSpec, Interconnect, ModelConfig, Offer, Source
from planner.types import Strategy

SRC = Source(url="https://example.test/datasheet", as_of=date(2026, 11, 1), note="test fixture")


def gpu(gid: str, mem: float, bw: float, tflops: dict[str, float], dtypes: list[str], arch: str,
        link: str = "nvlink", link_gbps: float = 900.0, aliases: list[str] | None = None) -> GpuSpec:
    return GpuSpec.model_validate(dict(
        id=gid, aliases=aliases or [], vendor="nvidia", architecture=arch, memory_gib=mem,
        memory_bandwidth_gbps=bw, tflops=tflops, interconnect=Interconnect(kind=link, gbps_per_gpu=link_gbps),  # type: ignore[arg-type]
        tdp_w=700, compute_capability=None, dtypes=dtypes, source=SRC,
    ))


GPUS = (
    gpu("H200", 140.4, 4800, {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9},
        ["fp32", "tf32", "fp16", "bf16", "fp8", "int8"], "hopper", aliases=["H200-SXM"]),
    gpu("H100-SXM", 79.1, 3350,
        {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "int8": 1978.9},
        ["fp32", "tf32", "fp16", "bf16", "fp8", "int8"], "hopper", aliases=["H100"]),
    gpu("A100-80GB", 79.1, 2039, {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "int8": 624},
        ["fp32", "tf32", "fp16", "bf16", "int8"], "ampere", link_gbps=600),
    gpu("L4", 22.0, 300, {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5, "int8": 242.5},
        ["fp32", "tf32", "fp16", "bf16", "fp8", "int8"], "ada", link="pcie", link_gbps=64),
    gpu("V100-16GB", 15.8, 900, {"fp32": 15.7, "fp16": 125}, ["fp32", "fp16"], "volta", link_gbps=300),
)


def offer(cloud: str, itype: str, g: str, n: int, od: float | None, spot: float | None,
          region: str = "us-east-1") -> Offer:
    return Offer(cloud=cloud, instance_type=itype, gpu=g, gpu_count=n, vcpus=8 * n, ram_gib=64.0 * n, region=region,
                 on_demand_usd_per_h=od, spot_usd_per_h=spot, network_gbps=100 if n >= 8 else 25, source=SRC)


OFFERS = (
    offer("aws", "p5en.48xlarge", "H200", 8, 63.3, 25.0),
    offer("aws", "p5.48xlarge", "H100-SXM", 8, 55.04, 14.25),
    offer("aws", "p4de.24xlarge", "A100-80GB", 8, 40.97, 16.0),
    offer("aws", "g6.xlarge", "L4", 1, 0.805, 0.35),
    offer("aws", "g6.12xlarge", "L4", 4, 4.6, 1.9),
    offer("aws", "p3.2xlarge", "V100-16GB", 1, 3.06, 0.92),
    offer("lambda", "gpu_1x_h100_sxm5", "H100-SXM", 1, 2.99, None, region="us-west-1"),
    offer("lambda", "gpu_8x_h100_sxm5", "H100-SXM", 8, 23.92, None, region="us-west-1"),
)


def llama(mid: str, h: int, layers: int, heads: int, kv: int, inter: int, vocab: int, tied: bool = False,
          head_dim: int | None = None) -> ModelConfig:
    return ModelConfig(id=mid, family="llama", hidden_size=h, num_layers=layers, num_attention_heads=heads,
                       num_kv_heads=kv, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=131072,
                       tie_word_embeddings=tied, head_dim=head_dim)


MODELS = (
    llama("llama-3-8b", 4096, 32, 32, 8, 14336, 128256),
    llama("llama-3.2-1b", 2048, 16, 32, 8, 8192, 128256, tied=True, head_dim=64),
    llama("llama-3.2-3b", 3072, 28, 24, 8, 8192, 128256, tied=True, head_dim=128),
    llama("llama-2-13b", 5120, 40, 40, 40, 13824, 32000),
    llama("llama-3-70b", 8192, 80, 64, 8, 28672, 128256),
    llama("llama-3-405b", 16384, 126, 128, 8, 53248, 128256),
    ModelConfig(id="gpt2", family="gpt2", hidden_size=768, num_layers=12, num_attention_heads=12, num_kv_heads=12,
                intermediate_size=3072, vocab_size=50257, max_position_embeddings=1024, tie_word_embeddings=True),
)


def small_catalog() -> Catalog:
    return Catalog(gpus=GPUS, offers=OFFERS, models=MODELS)


def strat(**kw: object) -> Strategy:
    """A strategy on one H200 with the fields in ``kw``."""
    base: dict[str, object] = {"gpu": "H200", "gpu_count": 1}
    base.update(kw)
    return Strategy.model_validate(base)
