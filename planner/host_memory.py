"""Host memory a training run needs on each node: one rule for the plan (planner.search rejects an offer
whose RAM is short) and for the workers (workers.train.setup builds where this module says).

Two moments, whichever is larger, plus each rank's process:

- **The build.** A model whose whole weights, in the dtype it is built in, would not fit the GPU
  (``GPU_BUILD_SHARE`` of what torch can allocate) is built in host memory. Sharded full and LoRA
  fine-tunes build it once, on rank 0, and every rank receives only its FSDP2 shard (``builds_once``);
  QLoRA (its NF4 quantizer) and fp8 (its module conversion) need the whole model on every rank, so every
  rank on the node builds its own copy. Models that fit are built on the GPU as before (fast random init,
  no host copy).
- **The checkpoint snapshot.** The workers copy the checkpointed state (trainable parameters and optimizer
  states) into host buffers allocated once, pinned on CUDA, and write them in the background
  (workers/train/state_save.py): under FSDP every rank its shard, under DDP rank 0 the whole state.

A 70B full fine-tune with AdamW snapshots ~850 GB per node over 8 GPUs: more than a 560 GiB node holds.
"""

from __future__ import annotations

from catalog.params import ParamCount
from catalog.schema import GpuSpec
from planner.calibration import GIB
from planner.memory import usable_bytes
from planner.strategies import PRECISIONS, finetune_kind, precision_kind, sharding_kind
from planner.types import Strategy

# The whole model is built on the GPU when it takes at most this share of what torch can allocate there (the
# rest: CUDA context, cuBLAS workspaces, the quantizer's temporaries); a model that does not fit this ran out of
# memory at the build before the host build existed, so the rule changes nothing for the models that ran.
GPU_BUILD_SHARE = 0.95
# A training rank's own resident memory besides the model (CUDA context, torch, transformers, the data
# pipeline). Measured: 2.27 GB peak RSS of a rank that built only its FSDP2 shard on the H200 host, before the
# first step (bench/probes/build_once_probe.py, 2026-12-04); the loop adds its data pipeline and allocator caches, so
# the plan keeps ~4 GiB.
HOST_PROCESS_BYTES = 4 * GIB
# The share of a node's RAM a run may count on (the OS, page cache of the data, other daemons keep the rest).
HOST_RAM_SHARE = 0.9
# LoRA/QLoRA checkpoints hold the adapters and their optimizer states: a few percent of the model at most.
ADAPTER_STATE_PER_PARAM = 0.02


def build_bytes(total_params: int, precision: str) -> float:
    """The whole model in the dtype the workers build it in (fp32 master weights under fp32/amp, else 16-bit)."""
    return total_params * PRECISIONS.get(precision, PRECISIONS["bf16"]).bytes.param


def builds_on_host(model_bytes: float, gpu_bytes: float) -> bool:
    return model_bytes > GPU_BUILD_SHARE * gpu_bytes


def shards_state(strategy: Strategy) -> bool:
    """Whether FSDP2 shards the run's weights and optimizer state over its ranks (each node holds its share)."""
    return sharding_kind(strategy.sharding).shards_parameters and strategy.gpu_count > 1


def builds_once(strategy: Strategy) -> bool:
    """Whether a host build is rank 0's alone (the other ranks receive their shards from it), one rule for the
    plan's host memory and for workers.train.setup. Before 2026-12-04 every rank built its own copy: a Llama-3-70B
    full fine-tune in amp-bf16 (fp32 master weights, 280 GB) asked 8 x 280 GB of an 8-GPU node and was refused on
    every offer."""
    return (shards_state(strategy) and not finetune_kind(strategy.finetune).quantized_base
            and not precision_kind(strategy.precision).float8_matmuls)


def checkpoint_state_bytes(pc: ParamCount, strategy: Strategy) -> float:
    """What a checkpoint holds over all ranks: parameters + AdamW's two states (full), or the adapters'."""
    pb = PRECISIONS.get(strategy.precision, PRECISIONS["bf16"]).bytes
    if not finetune_kind(strategy.finetune).adapters:
        return pc.total * (pb.param + 2 * pb.state)
    return pc.total * ADAPTER_STATE_PER_PARAM


def node_state_bytes(pc: ParamCount, strategy: Strategy, ranks_per_node: int) -> float:
    """The checkpointed state one node's ranks hold: under FSDP their share, under DDP rank 0 the whole."""
    state = checkpoint_state_bytes(pc, strategy)
    return state * ranks_per_node / strategy.gpu_count if shards_state(strategy) else state


def host_bytes_per_node(pc: ParamCount, strategy: Strategy, gpu: GpuSpec, ranks_per_node: int) -> float:
    snapshot = node_state_bytes(pc, strategy, ranks_per_node)
    model = build_bytes(pc.total, strategy.precision)
    copies = 1 if builds_once(strategy) else ranks_per_node
    build = copies * model if builds_on_host(model, usable_bytes(gpu)) else 0.0
    return max(snapshot, build) + ranks_per_node * HOST_PROCESS_BYTES


def host_memory_problem(pc: ParamCount, strategy: Strategy, gpu: GpuSpec, ranks_per_node: int,
                        ram_gib: float, instance: str) -> str | None:
    """Why a node with ``ram_gib`` of RAM cannot hold the run's host side (None when it can)."""
    need = host_bytes_per_node(pc, strategy, gpu, ranks_per_node)
    room = HOST_RAM_SHARE * ram_gib * GIB
    if need <= room:
        return None
    builders = "rank 0" if builds_once(strategy) else f"{ranks_per_node} rank(s)"
    return (f"needs {need / GIB:,.0f} GiB of host memory per node (the checkpoint snapshot or the model build of "
            f"{builders}, + {HOST_PROCESS_BYTES / GIB:.0f} GiB per rank) > {room / GIB:,.0f} GiB "
            f"usable of {instance}'s {ram_gib:,.0f} GiB")
