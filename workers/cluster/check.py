"""``gpuplan cluster check``: whether the AWS account can launch a plan's cluster, item by item.

A launch that passes ``ray up`` can still fail on every worker for reasons the account holds: no
spot service-linked role, a vCPU quota below one node, no subnet in a planned zone, a bucket the
nodes' role may not reach. Each item here is ``ok``, ``fix`` (with what to do), ``warn`` (it runs,
but worse than planned) or ``could not check`` (AWS would not say, and why). Nothing is created or
changed in the account, except a probe object put and deleted under the checkpoint prefix.

Missing or rejected credentials and an unreachable endpoint are not items: they stop the check with
the error tree's CloudCredentialsMissing (exit 8) or CloudUnreachable (exit 9).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from catalog.aws_quotas import load_aws_quotas
from errors import CloudCredentialsMissing, CloudUnreachable, GpuplanError, InvalidInput
from planner.types import Plan
from workers.cluster import aws as cluster_aws
from workers.cluster.aws_errors import aws_errors, error_code, translate
from workers.cluster.config import ClusterNeeds, ClusterOptions, cluster_needs, kind_key
from workers.cluster.net import efa_count
from workers.cluster.notes import iam_policy
from workers.cluster.policy import as_set, missing_statements

OK, FIX, WARN, UNKNOWN = "ok", "fix", "warn", "could not check"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"


@dataclass(frozen=True)
class Item:
    name: str
    status: str
    detail: str


@dataclass
class _Account:
    """What the checks share: the clients, and what an earlier check found (None: it failed)."""

    needs: ClusterNeeds
    opts: ClusterOptions
    session: Any
    ec2: Any
    arch: dict[str, str] | None = None
    networks: dict[str, Any] = field(default_factory=dict)
    subnets: dict[str, str] | None = None
    vpc: str | None = None
    zones: dict[str, str] = field(default_factory=dict)


def check_account(plan: Plan, opts: ClusterOptions, session: Any | None = None) -> list[Item]:
    """Every prerequisite of launching ``plan``'s cluster, in the order a launch needs them."""
    needs = cluster_needs(plan, opts)
    session, first = credentials(session, needs.region, "where the plan priced its offers")
    account = _Account(needs, opts, session, session.client("ec2", region_name=needs.region))
    items = [first]
    steps: list[tuple[str, Callable[[_Account], list[Item]]]] = [
        ("instance types", _instance_types), ("GPU AMI", _ami), ("spot service-linked role", _spot_role),
        ("vCPU quotas", _quotas), ("subnets", _subnets), ("EFA subnets", _efa), ("instance profile", _profile),
        ("checkpoint bucket", _bucket)]
    for name, step in steps:
        items += _guarded(name, step, account)
    return items


def credentials(session: Any | None, region: str, why: str) -> tuple[Any, Item]:
    """A session in ``region`` and the item saying whose credentials it has (none: the check stops)."""
    import boto3

    with aws_errors("the credentials check (sts get-caller-identity)"):
        session = session or boto3.session.Session(region_name=region)
        who = session.client("sts", region_name=region).get_caller_identity()
    return session, Item("credentials and region", OK, f"account {who['Account']} as {who['Arn']}; region {region} "
                         f"({why})")


def guarded(name: str, step: Callable[[], list[Item]]) -> list[Item]:
    return _guarded(name, lambda _: step(), None)


def _guarded(name: str, step: Callable[[Any], list[Item]], account: Any) -> list[Item]:
    """A step's items; what it raised as one item (credentials and endpoint errors stop the check)."""
    try:
        return step(account)
    except InvalidInput as exc:
        return [Item(name, FIX, str(exc))]
    except (CloudCredentialsMissing, CloudUnreachable):
        raise
    except GpuplanError as exc:
        return [Item(name, UNKNOWN, str(exc))]
    except Exception as exc:
        mapped = translate(exc, name)
        if mapped is None:
            raise
        if isinstance(mapped, CloudCredentialsMissing | CloudUnreachable):
            raise mapped from exc
        return [Item(name, UNKNOWN, str(mapped))]


def _instance_types(acc: _Account) -> list[Item]:
    acc.arch, acc.networks = cluster_aws._instance_types(acc.ec2, acc.needs.instance_types, acc.needs.region)
    return [Item("instance types", OK, f"{', '.join(acc.needs.instance_types)} offered in {acc.needs.region}")]


def _ami(acc: _Account) -> list[Item]:
    if acc.arch is None:
        return [Item("GPU AMI", UNKNOWN, "needs the instance types (above)")]
    sources: dict[str, str] = {}
    cluster_aws._images(acc.session, acc.ec2, acc.arch, acc.opts, acc.needs.region, sources)
    return [Item("GPU AMI", OK, "; ".join(f"{k}: {v}" for k, v in sorted(sources.items())))]


def _spot_role(acc: _Account) -> list[Item]:
    return spot_role_items(acc.session, any(k.market == "spot" for k in acc.needs.kinds))


def spot_role_items(session: Any, spot: bool) -> list[Item]:
    if not spot:
        return [Item("spot service-linked role", OK, "not needed: no spot node type")]
    try:
        session.client("iam").get_role(RoleName=SPOT_ROLE)
    except Exception as exc:
        if error_code(exc) != "NoSuchEntity":
            raise
        return [Item("spot service-linked role", FIX, f"{SPOT_ROLE} does not exist, so every spot launch fails: "
                     "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com")]
    return [Item("spot service-linked role", OK, f"{SPOT_ROLE} exists")]


Launch = tuple[str, str, int]  # (instance type, market, nodes a run holds at once)


def vcpu_needs(needs: ClusterNeeds, vcpus: Mapping[str, int]) -> dict[tuple[str, str], tuple[int, str]]:
    """(quota class, market) -> (the most vCPUs one run of the plan holds there, which node type)."""
    return launch_vcpus([(k.instance_type, k.market, k.candidate.nodes) for k in needs.kinds], needs.head_instance,
                        vcpus)


def launch_vcpus(launches: list[Launch], head: str, vcpus: Mapping[str, int]) -> dict[tuple[str, str], tuple[int, str]]:
    """(quota class, market) -> (the most vCPUs one run holds there, which node type): a run uses one
    worker type at a time, all its nodes at once; the on-demand head counts too."""
    quotas = load_aws_quotas()
    out: dict[tuple[str, str], tuple[int, str]] = {}

    def add(itype: str, market: str, nodes: int, extra: int = 0) -> None:
        cls = quotas.of(itype)
        name = cls.name if cls else f"family {itype.split('.')[0]}"
        need = nodes * vcpus.get(itype, 0) + extra
        if need > out.get((name, market), (-1, ""))[0]:
            out[(name, market)] = (need, f"{nodes} x {itype}")

    for itype, market, nodes in launches:
        same = quotas.of(itype) == quotas.of(head) and market == "on-demand"
        add(itype, market, nodes, vcpus.get(head, 0) if same else 0)
    add(head, "on-demand", 1)
    return out


def instance_vcpus(ec2: Any, instance_types: list[str]) -> dict[str, int]:
    found = ec2.describe_instance_types(InstanceTypes=instance_types)["InstanceTypes"]
    return {t["InstanceType"]: int(t.get("VCpuInfo", {}).get("DefaultVCpus", 0)) for t in found}


def _quotas(acc: _Account) -> list[Item]:
    vcpus = instance_vcpus(acc.ec2, acc.needs.instance_types)
    vcpus |= {k.instance_type: k.candidate.offer.vcpus for k in acc.needs.kinds if k.instance_type not in vcpus}
    return quota_items(acc.session, acc.needs.region, vcpu_needs(acc.needs, vcpus))


def quota_items(session: Any, region: str, needs: Mapping[tuple[str, str], tuple[int, str]]) -> list[Item]:
    quotas = load_aws_quotas()
    service = session.client("service-quotas", region_name=region)
    items: list[Item] = []
    for (name, market), (need, what) in sorted(needs.items()):
        label = f"vCPU quota {name} {market}"
        cls = next((c for c in quotas.classes if c.name == name), None)
        if cls is None:
            items.append(Item(label, UNKNOWN, f"no quota code known for {name} (catalog/data/aws_quotas.yaml)"))
            continue
        code = cls.code(market)
        try:
            value = float(service.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except Exception as exc:
            mapped = translate(exc, f"service-quotas get-service-quota {code}")
            if isinstance(mapped, CloudCredentialsMissing | CloudUnreachable) or mapped is None:
                raise
            items.append(Item(label, UNKNOWN, f"{mapped} (needs {need} vCPUs for {what})"))
            continue
        if value < need:
            items.append(Item(label, FIX, f"{value:g} vCPUs, but {what} needs {need}: request an increase: aws "
                              f"service-quotas request-service-quota-increase --service-code ec2 --quota-code "
                              f"{code} --desired-value {need} --region {region}"))
        else:
            items.append(Item(label, OK, f"{value:g} vCPUs (code {code}); the plan needs at most {need} ({what})"))
    return items


def _subnets(acc: _Account) -> list[Item]:
    acc.subnets, acc.vpc = cluster_aws._subnets(acc.ec2, acc.opts, acc.needs, {})
    acc.zones, fallback = cluster_aws._zones(acc.ec2, acc.needs, acc.subnets)
    used = sorted(set(acc.zones.values()).union(*fallback.values()))
    return [Item("subnets", OK, ", ".join(f"{z}: {acc.subnets[z]}" for z in used) + f" (VPC {acc.vpc})")]


def _efa(acc: _Account) -> list[Item]:
    """A multi-node EFA type with every card's interface has no public IP: its subnet needs a NAT route."""
    multi = [k for k in acc.needs.kinds if efa_count(k.candidate.nodes, acc.networks.get(k.instance_type),
                                                     "all", True) > 1]
    if not multi or acc.opts.efa in ("one", "off"):
        return []
    if acc.subnets is None or acc.vpc is None:
        return [Item("EFA subnets", UNKNOWN, "needs the subnets (above)")]
    subnets = {acc.subnets[acc.zones[kind_key(k)]] for k in multi}
    nat = cluster_aws._nat_subnets(acc.ec2, acc.vpc, sorted(subnets))
    missing = sorted(subnets - nat)
    if not missing:
        return [Item("EFA subnets", OK, f"{', '.join(sorted(subnets))} reach the internet through a NAT gateway")]
    what = (f"subnet(s) {', '.join(missing)} have no NAT gateway route, and an instance with several EFA "
            "interfaces gets no public IP")
    if acc.opts.efa == "all":
        return [Item("EFA subnets", FIX, f"{what}: its setup cannot download; give --subnet ZONE=SUBNET of a "
                     "subnet routing 0.0.0.0/0 through a NAT gateway, or --efa auto")]
    return [Item("EFA subnets", WARN, f"{what}: --efa auto gives those node types one EFA interface (a slower "
                 "link than planned); a NAT subnet (--subnet ZONE=SUBNET) gives them all")]


def _profile(acc: _Account) -> list[Item]:
    return profile_items(acc.session, acc.opts)


def profile_items(session: Any, opts: ClusterOptions) -> list[Item]:
    """The nodes' instance profile exists, and its role's policies, inline and attached (workers.cluster.policy),
    grant what gpuplan needs: the checkpoint bucket's statements among them."""
    sources: dict[str, str] = {}
    profile = cluster_aws._instance_profile(session, opts, sources)
    if profile.startswith("arn:"):
        return [Item("instance profile", OK, f"{profile} (given; its policy is not checked)")]
    iam = session.client("iam")
    role = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"][0]["RoleName"]
    missing = missing_statements(iam, role, iam_policy(opts))
    if missing:
        lacking = "; ".join(f"{', '.join(sorted(as_set(m['Action'])))} on {', '.join(sorted(as_set(m['Resource'])))}"
                            for m in missing)
        return [Item("instance profile", FIX, f"role {role}'s policies (inline and attached) do not grant {lacking}: "
                     f"aws iam put-role-policy --role-name {role} --policy-name gpuplan --policy-document "
                     "file://policy.json (the policy in `gpuplan cluster config`'s header)")]
    return [Item("instance profile", OK, f"{sources['instance profile']}; its policy holds every statement "
                 "gpuplan needs")]


def _bucket(acc: _Account) -> list[Item]:
    return bucket_items(acc.session, acc.opts.checkpoint_root, acc.needs.region)


def bucket_items(session: Any, root: str | None, cluster_region: str) -> list[Item]:
    """The checkpoint bucket exists, where, and a probe object can be put and deleted under the prefix."""
    if not root:
        return [Item("checkpoint bucket", WARN, "no --checkpoint-root: checkpoints stay on each node's disk, so a "
                     "multi-node or preempted run cannot resume")]
    region = cluster_aws._check_bucket(session, root, {})
    bucket, _, prefix = root[len("s3://"):].partition("/")
    key = f"{prefix.strip('/')}/.gpuplan-check-{uuid.uuid4().hex[:8]}".lstrip("/")
    s3 = session.client("s3", region_name=region or cluster_region)
    s3.put_object(Bucket=bucket, Key=key, Body=b"gpuplan cluster check")
    s3.delete_object(Bucket=bucket, Key=key)
    items = [Item("checkpoint bucket", OK, f"{root}: in {region or 'an unknown region'}, writable under the prefix "
                  "(a probe object put and deleted)")]
    if region and region != cluster_region:
        items.append(Item("bucket region", WARN, f"bucket {bucket} is in {region}, the cluster in "
                          f"{cluster_region}: every checkpoint crosses regions (slower, and billed per GB); "
                          f"use a bucket in {cluster_region}"))
    return items
