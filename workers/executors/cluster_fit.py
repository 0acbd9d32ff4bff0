"""What a run needs from a cluster, and whether any set of nodes could ever give it.

Ray lets a request that no node can satisfy pend forever without a word; both executors check
here first and fail fast with the reason instead.

On a cluster made by ``gpuplan cluster config`` (workers.cluster.config) every GPU worker node type carries
three custom resources, each equal to its GPU count, and every worker of a run asks for one of each:

    gpuplan-gpu:<catalog GPU id>       gpuplan-gpu:A100-40GB
    gpuplan-market:<spot|on-demand>    gpuplan-market:spot
    gpuplan-zone:<AWS zone id>         gpuplan-zone:use1-az1   (zone ids, not names: prices are per id)

A worker therefore fits exactly one node type, the (GPU, market, zone) the plan priced, and a
multi-node run stays in one zone: the generator makes one node type per (GPU, market, zone)
(workers.cluster.config.launch_places), and a run whose plan priced a regional offer (no zone) is pinned
to the zone of its first node type (``first_zone``; the Ray executor's ``pinned``). Ray's ``accelerator_type``
is not asked for there: Ray derives it from the GPU's name (``A100`` for both A100s), so it cannot tell the
catalog's GPUs apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from planner.types import Strategy

ACCELERATOR_PREFIX = "accelerator_type:"
GPU_PREFIX = "gpuplan-gpu:"
MARKET_PREFIX = "gpuplan-market:"
ZONE_PREFIX = "gpuplan-zone:"
MARKETS = ("spot", "on-demand")


def pin_resources(gpu: str, market: str, zone: str | None, amount: float = 1.0) -> dict[str, float]:
    """The custom resources of the (GPU, market, zone) scheme above: ``amount`` of each.

    A worker asks for 1 of each; a node type of ``n`` GPUs has ``n`` of each. No zone: any zone.
    """
    if market not in MARKETS:
        raise ValueError(f"market {market!r} is not one of {MARKETS}")
    out = {GPU_PREFIX + gpu: amount, MARKET_PREFIX + market: amount}
    if zone:
        out[ZONE_PREFIX + zone] = amount
    return out


def first_zone(gpu: str, market: str, nodes: Sequence[Mapping[str, float]]) -> str | None:
    """The zone of the first of ``nodes`` (or node types) with ``gpu`` and ``market`` in the scheme above; None:
    none has them. A run that names no zone (its plan priced a regional offer) is pinned there, since asking
    for no zone fits a node type in every zone, and a multi-node run would start its nodes in several."""
    wanted = pin_resources(gpu, market, None)
    for node in nodes:
        if all(node.get(key, 0) > 0 for key in wanted):
            zones = sorted(key[len(ZONE_PREFIX):] for key in node if key.startswith(ZONE_PREFIX))
            if zones:
                return zones[0]
    return None


def pins_markets(nodes: Sequence[Mapping[str, float]]) -> bool:
    """Whether these nodes (or node types) follow the scheme: then every GPU run must ask for its pins."""
    return any(key.startswith(MARKET_PREFIX) for node in nodes for key in node)


@dataclass(frozen=True)
class WorkerLayout:
    num_workers: int
    use_gpu: bool
    nodes: int
    accelerator: str | None  # Ray accelerator_type label, e.g. "H100"; None on CPU
    # per GPU worker: the (GPU, market, zone) resources on a gpuplan cluster; empty elsewhere
    pins: Mapping[str, float] = field(default_factory=dict)

    @property
    def accelerator_request(self) -> str | None:
        """The ``accelerator_type`` to ask Ray for: none where the pins already name the GPU."""
        return None if self.pins else self.accelerator

    def worker_resources(self) -> dict[str, float]:
        """``resources_per_worker`` of one training worker (one GPU or one CPU)."""
        return {"CPU": 1, **({"GPU": 1} if self.use_gpu else {}), **(self.pins if self.use_gpu else {})}

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


def placement_for(strategy: Strategy, available_labels: Sequence[str] = (), *,
                  pins: Mapping[str, float] | None = None) -> WorkerLayout:
    """``pins``: the per-worker (GPU, market, zone) resources on a gpuplan cluster (``pin_resources``)."""
    use_gpu = strategy.gpu.lower() not in ("cpu", "local-cpu")
    return WorkerLayout(
        num_workers=strategy.gpu_count,
        use_gpu=use_gpu,
        nodes=strategy.nodes,
        accelerator=accelerator_label(strategy.gpu, available_labels) if use_gpu else None,
        pins=dict(pins or {}) if use_gpu else {},
    )


def node_labels(nodes: Sequence[Mapping[str, float]]) -> list[str]:
    labels = {key[len(ACCELERATOR_PREFIX):] for node in nodes for key in node if key.startswith(ACCELERATOR_PREFIX)}
    return sorted(labels)


def launchable_nodes(node_types: Sequence[tuple[Mapping[str, float], int]]) -> list[dict[str, float]]:
    """Every node the autoscaler could start: each node type's resources, ``max_workers`` times."""
    return [dict(resources) for resources, count in node_types for _ in range(max(count, 0))]


def infeasibility(strategy: Strategy, nodes: Sequence[Mapping[str, float]], cpus_per_worker: float = 1.0, *,
                  pins: Mapping[str, float] | None = None,
                  launchable: Sequence[Mapping[str, float]] = ()) -> str | None:
    """None if ``nodes`` (each a Ray resource dict of a live node) could ever run it, else why not.

    ``launchable``: nodes the autoscaler can still start (``launchable_nodes`` of its node types):
    a run that fits them is feasible though no such node is up yet. ``pins``: see ``placement_for``.
    """
    live = _infeasibility(strategy, nodes, cpus_per_worker, pins)
    if live is None or not launchable:
        return live
    later = _infeasibility(strategy, launchable, cpus_per_worker, pins)
    if later is None:
        return None
    return f"{later} (counting the nodes the autoscaler can start)" if nodes else later


def _infeasibility(strategy: Strategy, nodes: Sequence[Mapping[str, float]], cpus_per_worker: float,
                   pins: Mapping[str, float] | None) -> str | None:
    placement = placement_for(strategy, node_labels(nodes), pins=pins)
    per_node = placement.workers_per_node
    if not nodes:
        return "the cluster has no live nodes"
    if placement.use_gpu:
        keys = sorted(placement.pins) if placement.pins else [ACCELERATOR_PREFIX + str(placement.accelerator)]
        want = " + ".join(keys)
        typed = [n for n in nodes if all(n.get(k, 0) > 0 for k in keys)]
        if not typed:
            have = ", ".join(node_labels(nodes) + _pinned_kinds(nodes)) or "no GPUs"
            return (f"needs {per_node} x {placement.accelerator} per node, but no node has {want} "
                    f"(the cluster has: {have})")
        able = [n for n in typed if n.get("GPU", 0) >= per_node and n.get("CPU", 0) >= per_node * cpus_per_worker
                and all(n.get(k, 0) >= per_node * v for k, v in placement.pins.items())]
        if len(able) < placement.nodes:
            biggest = max(int(n.get("GPU", 0)) for n in typed)
            if biggest < per_node:
                return (f"needs {per_node} x {want} per node; the biggest node has {biggest}")
            if not able:
                most_cpu = max(n.get("CPU", 0) for n in typed)
                return (f"needs {per_node * cpus_per_worker:g} CPUs next to {per_node} GPUs on one node; "
                        f"the {placement.accelerator} nodes have at most {most_cpu:g}")
            return (f"needs {placement.nodes} nodes with {per_node} x {want} each; "
                    f"the cluster has {len(able)}")
        return None
    able = [n for n in nodes if n.get("CPU", 0) >= per_node * cpus_per_worker]
    if len(able) < placement.nodes:
        most = max(n.get("CPU", 0) for n in nodes)
        return (f"needs {per_node * cpus_per_worker:g} CPUs per node on {placement.nodes} node(s); "
                f"the biggest node has {most:g}")
    return None


def _pinned_kinds(nodes: Sequence[Mapping[str, float]]) -> list[str]:
    """The (GPU, market, zone) kinds among ``nodes``, e.g. ``A100-40GB/spot/use1-az1``."""
    kinds = set()
    for node in nodes:
        part = {prefix: key[len(prefix):] for key in node for prefix in (GPU_PREFIX, MARKET_PREFIX, ZONE_PREFIX)
                if key.startswith(prefix)}
        if part:
            kinds.add("/".join(part.get(p, "any") for p in (GPU_PREFIX, MARKET_PREFIX, ZONE_PREFIX)))
    return sorted(kinds)
