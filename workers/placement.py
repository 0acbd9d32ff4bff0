"""What a run needs from a cluster, and whether any set of nodes could ever give it.

Ray lets a request that no node can satisfy pend forever without a word; both executors check
here first and fail fast with the reason instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from planner.types import Strategy

ACCELERATOR_PREFIX = "accelerator_type:"


@dataclass(frozen=True)
class Placement:
    num_workers: int
    use_gpu: bool
    nodes: int
    accelerator: str | None  # Ray accelerator_type label, e.g. "H100"; None on CPU

    @property
    def workers_per_node(self) -> int:
        return math.ceil(self.num_workers / self.nodes)

    def describe(self) -> str:
        unit = f"{self.accelerator} GPU" if self.use_gpu else "CPU worker"
        spread = f" on each of {self.nodes} nodes" if self.nodes > 1 else " on one node"
        return f"{self.workers_per_node} x {unit}{spread}"


def accelerator_label(gpu: str, available: Sequence[str] = ()) -> str:
    """Ray's accelerator_type for a catalog GPU id: an exact match on the cluster, else its family.

    Ray labels an H100 node ``accelerator_type:H100`` while the catalog says ``H100-SXM``.
    """
    if gpu in available:
        return gpu
    family = gpu.split("-", 1)[0]
    for label in available:
        if label.split("-", 1)[0] == family:
            return label
    return family


def placement_for(strategy: Strategy, available_labels: Sequence[str] = ()) -> Placement:
    use_gpu = strategy.gpu.lower() not in ("cpu", "local-cpu")
    return Placement(
        num_workers=strategy.gpu_count,
        use_gpu=use_gpu,
        nodes=strategy.nodes,
        accelerator=accelerator_label(strategy.gpu, available_labels) if use_gpu else None,
    )


def node_labels(nodes: Sequence[Mapping[str, float]]) -> list[str]:
    labels = {key[len(ACCELERATOR_PREFIX):] for node in nodes for key in node if key.startswith(ACCELERATOR_PREFIX)}
    return sorted(labels)


def infeasibility(strategy: Strategy, nodes: Sequence[Mapping[str, float]], cpus_per_worker: float = 1.0) -> str | None:
    """None if ``nodes`` (each a Ray resource dict of a live node) could ever run it, else why not."""
    placement = placement_for(strategy, node_labels(nodes))
    per_node = placement.workers_per_node
    if not nodes:
        return "the cluster has no live nodes"
    if placement.use_gpu:
        key = ACCELERATOR_PREFIX + str(placement.accelerator)
        typed = [n for n in nodes if n.get(key, 0) > 0]
        if not typed:
            have = ", ".join(node_labels(nodes)) or "no GPUs"
            return (f"needs {per_node} x {placement.accelerator} per node, but no node has {key} "
                    f"(the cluster has: {have})")
        able = [n for n in typed if n.get("GPU", 0) >= per_node and n.get("CPU", 0) >= per_node * cpus_per_worker]
        if len(able) < placement.nodes:
            biggest = max(int(n.get("GPU", 0)) for n in typed)
            if biggest < per_node:
                return (f"needs {per_node} x {key} per node; the biggest node has {biggest}")
            if not able:
                most_cpu = max(n.get("CPU", 0) for n in typed)
                return (f"needs {per_node * cpus_per_worker:g} CPUs next to {per_node} GPUs on one node; "
                        f"the {placement.accelerator} nodes have at most {most_cpu:g}")
            return (f"needs {placement.nodes} nodes with {per_node} x {placement.accelerator} each; "
                    f"the cluster has {len(able)}")
        return None
    able = [n for n in nodes if n.get("CPU", 0) >= per_node * cpus_per_worker]
    if len(able) < placement.nodes:
        most = max(n.get("CPU", 0) for n in nodes)
        return (f"needs {per_node * cpus_per_worker:g} CPUs per node on {placement.nodes} node(s); "
                f"the biggest node has {most:g}")
    return None
