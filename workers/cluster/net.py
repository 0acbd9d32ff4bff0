"""The network of a multi-node worker type: EFA interfaces, its cluster placement group, and the link
speed the YAML really provides (pure; the AWS lookups are in ``workers.cluster.aws_net``).

A run spread over several nodes of an instance type with EFA (p4d, p5, p5en, p6, ...) gets EFA
interfaces in the priced zone's subnet and the cluster's security group, as Ray's AWS provider
requires them (``NetworkInterfaces`` with ``SubnetId`` and ``Groups``; no ``SubnetIds`` or
``SecurityGroupIds`` beside them), and a cluster placement group (``Placement: {GroupName}``) so its
nodes share one spine. How many (``--efa``, ``EFA_MODES``):

- ``all``: one per network card, the link speed the catalog states and the plan assumed. AWS gives an
  instance with several interfaces no public IP, so the subnet must reach the internet through a NAT
  gateway (the setup commands install from PyPI);
- ``one``: card 0 only, with a public IP: it works in a public subnet, at one card's share;
- ``auto`` (default): ``all`` where the subnet's default route goes to a NAT gateway, else ``one``;
- ``off``: none; NCCL runs over TCP on the primary interface, at that one card's speed.

Each type's ``gpuplan/network-gbps`` label carries the speed it provides, and the server on the head
plans with it (``link_speeds`` / ``with_link_speeds``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NETWORK_LABEL = "gpuplan/network-gbps"
EFA_MODES = ("auto", "all", "one", "off")


@dataclass(frozen=True)
class NetworkFacts:
    """What ``describe_instance_types`` says about an instance type's network."""

    efa_interfaces: int = 0  # EfaInfo.MaximumEfaInterfaces, 0 when EfaSupported is false
    network_cards: int = 1  # MaximumNetworkCards
    primary_gbps: float | None = None  # the peak bandwidth of network card 0: one TCP interface


def network_facts(info: Mapping[str, Any]) -> NetworkFacts:
    """``NetworkFacts`` of one ``describe_instance_types`` item."""
    net = info.get("NetworkInfo", {}) or {}
    efa = int(net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 1)) if net.get("EfaSupported") else 0
    cards = [c for c in net.get("NetworkCards", []) if c.get("NetworkCardIndex", 0) == 0]
    primary = cards[0].get("PeakBandwidthInGbps") or cards[0].get("BaselineBandwidthInGbps") if cards else None
    return NetworkFacts(efa_interfaces=efa, network_cards=int(net.get("MaximumNetworkCards", 1) or 1),
                        primary_gbps=float(primary) if primary else None)


def efa_count(nodes: int, facts: NetworkFacts | None, mode: str, nat: bool) -> int:
    """EFA interfaces per node of a worker type (multi-node runs only) under ``mode``; ``nat``: its
    subnet reaches the internet through a NAT gateway."""
    if mode not in EFA_MODES:
        raise ValueError(f"EFA mode {mode!r} is not one of {EFA_MODES}")
    if mode == "off" or nodes < 2 or facts is None or facts.efa_interfaces < 1:
        return 0
    if mode == "one" or (mode == "auto" and not nat):
        return 1
    return min(facts.efa_interfaces, facts.network_cards)


def provided_gbps(catalog_gbps: float, efa: int, facts: NetworkFacts | None) -> float:
    """Node-to-node Gbit/s of a worker type as configured: the catalog's (what the plan assumed) with
    EFA on every network card, the cards' share of it with EFA on fewer, one card's speed without."""
    if facts is None:
        return catalog_gbps
    if efa:
        return catalog_gbps * min(1.0, efa / max(1, facts.network_cards))
    if facts.primary_gbps is None or facts.network_cards <= 1:
        return catalog_gbps
    return min(catalog_gbps, facts.primary_gbps)


def efa_interfaces(count: int, subnet: str, security_group: str) -> list[dict[str, Any]]:
    """Ray's ``NetworkInterfaces`` for ``count`` EFA interfaces: card 0 is the primary (device 0); a lone
    interface asks for a public IP (AWS refuses one when there are several)."""
    interfaces: list[dict[str, Any]] = [
        {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
         "SubnetId": subnet, "Groups": [security_group], "DeleteOnTermination": True} for card in range(count)]
    if count == 1:
        interfaces[0]["AssociatePublicIpAddress"] = True
    return interfaces


def placement_group_name(cluster: str, node_type: str) -> str:
    """A cluster placement group per worker type (one zone each): ``<cluster>-<node type>``."""
    return re.sub(r"[^A-Za-z0-9-]", "-", f"{cluster}-{node_type}")[:255]


def gbps_label(gbps: float) -> str:
    """A Ray label value (alphanumerics, '.', '-', '_'): 400 -> "400", 12.5 -> "12.5"."""
    return f"{gbps:g}"


def link_speeds(config: Mapping[str, Any]) -> dict[str, float]:
    """instance type -> the Gbit/s its multi-node worker types provide, from their ``gpuplan/network-gbps``
    labels (the fastest, when several). Types of at most one node are left out: no run of theirs crosses
    a network, and a multi-node run cannot use them."""
    speeds: dict[str, float] = {}
    head = config.get("head_node_type")
    for name, node_type in (config.get("available_node_types") or {}).items():
        label = (node_type.get("labels") or {}).get(NETWORK_LABEL)
        itype = (node_type.get("node_config") or {}).get("InstanceType")
        if name == head or label is None or not itype or int(node_type.get("max_workers", 0)) < 2:
            continue
        speeds[itype] = max(float(label), speeds.get(itype, 0.0))
    return speeds


def with_link_speeds(catalog: Any, config_path: str | Path) -> Any:
    """``catalog`` with the AWS offers of the cluster's instance types at the link speed its YAML
    provides (``gpuplan server --ray-cluster-config``): the planner then prices what will run."""
    import yaml

    from errors import InvalidInput

    file = Path(config_path).expanduser()
    try:
        config = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cannot read the Ray cluster config {str(file)!r}: {exc}", path="ray_cluster_config",
                           hint="give the YAML the autoscaler runs (~/ray_bootstrap_config.yaml on the head)") from None
    speeds = link_speeds(config if isinstance(config, dict) else {})
    if not speeds:
        return catalog
    offers = tuple(o.model_copy(update={"network_gbps": speeds[o.instance_type]})
                   if o.cloud.lower() == "aws" and o.instance_type in speeds else o for o in catalog.offers)
    return dataclasses.replace(catalog, offers=offers)
