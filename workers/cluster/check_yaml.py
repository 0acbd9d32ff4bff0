"""``gpuplan cluster check CLUSTER_YAML``: the account checked against a cluster config as written (the
one `gpuplan cluster config` generated, perhaps edited since), before ``ray up``.

The same items as for a plan (workers.cluster.check), read from the YAML instead of looked up: each node
type's instance type, market, AMI, subnet(s) and EFA interfaces, its ``max_workers`` (the nodes one run
holds), the head's instance profile, and the checkpoint root of the head's server command.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from errors import InvalidInput
from workers.cluster import aws as cluster_aws
from workers.cluster.aws_errors import error_code
from workers.cluster.check import (
    FIX,
    OK,
    Item,
    Launch,
    bucket_items,
    credentials,
    guarded,
    instance_vcpus,
    launch_vcpus,
    profile_items,
    quota_items,
    spot_role_items,
)
from workers.cluster.config import ClusterOptions


def is_cluster_config(doc: object) -> bool:
    return isinstance(doc, dict) and "available_node_types" in doc and "provider" in doc


def check_cluster_config(config: Mapping[str, Any], session: Any | None = None) -> list[Item]:
    region = str(config["provider"].get("region", ""))
    if not region:
        raise InvalidInput("the cluster config names no provider.region", path="provider.region")
    node_types = config["available_node_types"]
    types: dict[str, Mapping[str, Any]] = {n: t.get("node_config", {}) for n, t in node_types.items()}
    head = str(config.get("head_node_type", "head"))
    workers = [n for n in types if n != head]
    session, first = credentials(session, region, "the cluster config's provider.region")
    ec2 = session.client("ec2", region_name=region)
    itypes = sorted({str(nc.get("InstanceType")) for nc in types.values()})
    launches: list[Launch] = [(str(types[n].get("InstanceType")), _market(types[n]),
                               max(int(node_types[n].get("max_workers", 1)), 1)) for n in workers]
    profile = types.get(head, {}).get("IamInstanceProfile", {})
    opts = ClusterOptions(instance_profile=str(profile.get("Name") or profile.get("Arn") or "gpuplan-node"),
                          checkpoint_root=checkpoint_root_of(config))
    items = [first]
    items += guarded("instance types", lambda: _instance_types(ec2, itypes, region))
    items += guarded("AMIs", lambda: _images(ec2, types, region))
    items += guarded("spot service-linked role", lambda: spot_role_items(session, any(m == "spot" for _, m, _ in
                                                                                          launches)))
    items += guarded("vCPU quotas", lambda: quota_items(session, region, launch_vcpus(
        launches, str(types.get(head, {}).get("InstanceType")), instance_vcpus(ec2, itypes))))
    items += guarded("subnets", lambda: _subnets(ec2, types, region))
    items += guarded("instance profile", lambda: profile_items(session, opts))
    items += guarded("checkpoint bucket", lambda: bucket_items(session, opts.checkpoint_root, region))
    return items


def checkpoint_root_of(config: Mapping[str, Any]) -> str | None:
    """The ``--checkpoint-root`` of the head's gpuplan server command, if any."""
    commands = " ".join(str(c) for c in config.get("head_start_ray_commands", []))
    found = re.search(r"--checkpoint-root[= ]+['\"]?([^\s'\"]+)", commands)
    return found.group(1) if found else None


def _market(node_config: Mapping[str, Any]) -> str:
    return "spot" if node_config.get("InstanceMarketOptions", {}).get("MarketType") == "spot" else "on-demand"


def _instance_types(ec2: Any, itypes: list[str], region: str) -> list[Item]:
    cluster_aws._instance_types(ec2, itypes, region)
    return [Item("instance types", OK, f"{', '.join(itypes)} offered in {region}")]


def _images(ec2: Any, types: Mapping[str, Mapping[str, Any]], region: str) -> list[Item]:
    wanted = sorted({str(nc["ImageId"]) for nc in types.values() if nc.get("ImageId")})
    found: set[str] = set()
    for image in wanted:  # one by one: EC2 refuses the whole call for one unknown id
        try:
            found |= {i["ImageId"] for i in ec2.describe_images(ImageIds=[image])["Images"]}
        except Exception as exc:
            if not error_code(exc).startswith("InvalidAMIID"):
                raise
    missing = [i for i in wanted if i not in found]
    if missing:
        users = sorted(n for n, nc in types.items() if nc.get("ImageId") in missing)
        return [Item("AMIs", FIX, f"AMI(s) {', '.join(missing)} of node type(s) {', '.join(users)} do not exist in "
                     f"{region}: regenerate the YAML (`gpuplan cluster config`: the region's DLAMI) or fix ImageId")]
    return [Item("AMIs", OK, ", ".join(wanted) or "none given (Ray's default)")]


def _subnets(ec2: Any, types: Mapping[str, Mapping[str, Any]], region: str) -> list[Item]:
    """Every subnet a node type launches in exists; a type with several EFA interfaces has a NAT route."""
    by_type = {n: sorted({*nc.get("SubnetIds", []), *(i.get("SubnetId") for i in nc.get("NetworkInterfaces", [])
                                                         if i.get("SubnetId"))}) for n, nc in types.items()}
    wanted = sorted({s for subnets in by_type.values() for s in subnets})
    if not wanted:
        return [Item("subnets", OK, "none given (Ray picks)")]
    known = {s["SubnetId"]: s for s in ec2.describe_subnets()["Subnets"]}
    missing = [s for s in wanted if s not in known]
    if missing:
        return [Item("subnets", FIX, f"subnet(s) {', '.join(missing)} do not exist in {region}: regenerate the YAML "
                     "(gpuplan cluster config --subnet ZONE=SUBNET) or fix SubnetIds")]
    items = [Item("subnets", OK, ", ".join(f"{s} ({known[s].get('AvailabilityZoneId')})" for s in wanted))]
    efa = {s for n, nc in types.items() if len(nc.get("NetworkInterfaces", [])) > 1 for s in by_type[n]}
    if efa:
        vpc = str(known[sorted(efa)[0]]["VpcId"])
        lacking = sorted(efa - cluster_aws._nat_subnets(ec2, vpc, sorted(efa)))
        items.append(Item("EFA subnets", FIX, f"subnet(s) {', '.join(lacking)} of node types with several EFA "
                          "interfaces (no public IP) have no NAT gateway route: their setup cannot download; "
                          "regenerate with --efa auto or --subnet ZONE=a NAT subnet") if lacking else
                     Item("EFA subnets", OK, f"{', '.join(sorted(efa))} reach the internet through a NAT gateway"))
    return items
