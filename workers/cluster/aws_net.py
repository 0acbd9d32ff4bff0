"""What EFA worker types need in the account, made at config time (``workers.cluster.aws.resolve_aws``):

- the cluster's security group, under the name Ray's bootstrap looks for (``ray-autoscaler-<cluster>``)
  in the subnets' VPC, so head and every other node type join that same group: all traffic within the
  group (EFA requires it, in and out), SSH from anywhere (what Ray's default group allows). EFA
  interfaces must name their groups, so the group has to exist before the YAML does;
- a cluster placement group per EFA worker type, behind ``PlacementGroups``: ``Ec2PlacementGroups``
  asks EC2; tests pass a fake, because moto has no placement-group API (CreatePlacementGroup and
  DescribePlacementGroups answer "not implemented").
"""

from __future__ import annotations

from typing import Any, Protocol

from errors import InvalidInput

RAY_GROUP_PREFIX = "ray-autoscaler-"  # ray.autoscaler._private.aws.config.SECURITY_GROUP_TEMPLATE


class PlacementGroups(Protocol):
    def ensure_cluster(self, name: str) -> str:
        """Make the cluster placement group ``name`` exist; say whether it was "created" or "found"."""
        ...


class Ec2PlacementGroups:
    def __init__(self, ec2: Any, cluster: str) -> None:
        self.ec2, self.cluster = ec2, cluster

    def ensure_cluster(self, name: str) -> str:
        found = self.ec2.describe_placement_groups(Filters=[{"Name": "group-name", "Values": [name]}])
        groups = found.get("PlacementGroups", [])
        if groups:
            if groups[0].get("Strategy") != "cluster":
                raise InvalidInput(f"placement group {name!r} exists with strategy {groups[0].get('Strategy')!r}",
                                   path="placement_group", hint=f"delete it (aws ec2 delete-placement-group "
                                   f"--group-name {name}) or give another --cluster-name")
            return "found"
        self.ec2.create_placement_group(GroupName=name, Strategy="cluster", TagSpecifications=[{
            "ResourceType": "placement-group", "Tags": [{"Key": "ray-cluster-name", "Value": self.cluster}]}])
        return "created"


def _code(exc: Exception) -> str:
    return str((getattr(exc, "response", None) or {}).get("Error", {}).get("Code", ""))


def cluster_security_group(ec2: Any, vpc: str, cluster: str) -> tuple[str, str]:
    """(group id, "created" or "found") of ``ray-autoscaler-<cluster>`` in ``vpc``, with the rules EFA
    and Ray need; an existing group gets the within-group rules it lacks."""
    name = RAY_GROUP_PREFIX + cluster
    found = ec2.describe_security_groups(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                  {"Name": "group-name", "Values": [name]}])["SecurityGroups"]
    if found:
        group, how = found[0], "found"
    else:
        made = ec2.create_security_group(GroupName=name, VpcId=vpc, Description=f"gpuplan / Ray cluster {cluster}",
                                         TagSpecifications=[{"ResourceType": "security-group", "Tags": [
                                             {"Key": "ray-cluster-name", "Value": cluster}]}])
        group, how = {"GroupId": made["GroupId"], "IpPermissions": [], "IpPermissionsEgress": []}, "created"
    gid = str(group["GroupId"])
    within: dict[str, Any] = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": gid}]}
    ingress = [] if _has_self_rule(group.get("IpPermissions", []), gid) else [within]
    if how == "created":  # Ray adds its defaults only to a group without rules: SSH for `ray up` too
        ingress.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]})
    if ingress:
        _authorize(ec2.authorize_security_group_ingress, gid, ingress)
    if not _has_self_rule(group.get("IpPermissionsEgress", []), gid):
        _authorize(ec2.authorize_security_group_egress, gid, [within])  # EFA: outbound to the group itself
    return gid, how


def _has_self_rule(rules: list[dict[str, Any]], gid: str) -> bool:
    return any(r.get("IpProtocol") == "-1" and any(p.get("GroupId") == gid for p in r.get("UserIdGroupPairs", []))
               for r in rules)


def _authorize(call: Any, gid: str, rules: list[dict[str, Any]]) -> None:
    try:
        call(GroupId=gid, IpPermissions=rules)
    except Exception as exc:
        if _code(exc) != "InvalidPermission.Duplicate":
            raise
