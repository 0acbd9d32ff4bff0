"""What ``gpuplan cluster config`` looks up in the AWS account before it writes any YAML.

- the AMI of every node type: the current Deep Learning Base AMI of its CPU architecture through
  AWS's public SSM parameter (``workers.cluster.config.DLAMI_PARAMETERS``), or the ``--ami`` given, checked
  to exist in the region and to match each instance type's architecture;
- a subnet for each zone id the plan priced (``--subnet ZONE=SUBNET`` first, else the account's
  subnets: available ones that map public IPs, all in one VPC as Ray requires); a regional offer
  (no zone) gets the first zone, by id, that offers its instance type and has a subnet;
- the IAM instance profile of the nodes, and the S3 bucket of the checkpoint root;
- for multi-node worker types with EFA: the network facts of each instance type, the cluster's
  security group and a cluster placement group per type (made here: ``workers.cluster.aws_net``).

Each missing piece is an InvalidInput naming it and how to fix it. boto3 honours
``AWS_ENDPOINT_URL``, so tests point it at moto's server.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from errors import InvalidInput
from workers.cluster.aws_net import Ec2PlacementGroups, PlacementGroups, cluster_security_group
from workers.cluster.config import AwsFacts, ClusterNeeds, ClusterOptions, efa_of, kind_key, launch_places
from workers.cluster.net import EFA_MODES, NetworkFacts, network_facts, placement_group_name
from workers.cluster.notes import iam_policy
from workers.cluster.secrets import check_ref, check_secret


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def resolve_aws(needs: ClusterNeeds, opts: ClusterOptions, session: Any | None = None,
                placement_groups: PlacementGroups | None = None) -> AwsFacts:
    """Everything the YAML needs from the account; ``placement_groups`` defaults to EC2's own."""
    import boto3

    if opts.efa not in EFA_MODES:
        raise InvalidInput(f"--efa {opts.efa!r} is not one of {', '.join(EFA_MODES)}", path="efa",
                           hint="auto: every card where the subnet has a NAT gateway, else one; all; one; off")
    session = session or boto3.session.Session(region_name=needs.region)
    ec2 = session.client("ec2", region_name=needs.region)
    sources: dict[str, str] = {}
    arch, networks = _instance_types(ec2, needs.instance_types, needs.region)
    images = _images(session, ec2, arch, opts, needs.region, sources)
    subnets, vpc = _subnets(ec2, opts, needs, sources)
    zones, fallback = _zones(ec2, needs, subnets)
    used = set(zones.values()) | {z for more in fallback.values() for z in more}
    for zone in used:
        sources.setdefault(f"subnet {zone}", subnets[zone])
    profile = _instance_profile(session, opts, sources)
    bucket_region = _check_bucket(session, opts.checkpoint_root, sources) if opts.checkpoint_root else None
    for what, ref in (("admin token secret", opts.admin_token_secret),
                      ("database url secret", opts.database_url_secret)):
        if ref:  # that it exists, not its value: the head reads that
            sources[what] = check_secret(session, check_ref(ref, what), needs.region)
    facts = AwsFacts(images=images, subnets={z: subnets[z] for z in used}, zones=zones, fallback_zones=fallback,
                     instance_profile=profile, sources=sources, bucket_region=bucket_region, networks=networks)
    return _with_efa(facts, needs, opts, ec2, vpc, placement_groups or Ec2PlacementGroups(ec2, needs.cluster_name))


def _with_efa(facts: AwsFacts, needs: ClusterNeeds, opts: ClusterOptions, ec2: Any, vpc: str | None,
              placement_groups: PlacementGroups) -> AwsFacts:
    """The security group and placement groups of the EFA worker types, made now (none: ``facts``)."""
    mapping: frozenset[str] = frozenset()
    if vpc is not None:
        facts, mapping = _with_nat(facts, needs, ec2, vpc)
    efa_types = [name for kind, zone, name in launch_places(needs, facts) if efa_of(kind, opts, facts, zone)]
    if not efa_types:
        return facts
    assert vpc is not None, "an EFA worker type has a subnet, so a VPC"
    _check_ray_accepts(needs, opts, facts, mapping)
    sources = dict(facts.sources)
    groups: dict[str, str] = {}
    try:
        group, how = cluster_security_group(ec2, vpc, needs.cluster_name)
        for name in sorted(set(efa_types)):
            groups[name] = placement_group_name(needs.cluster_name, name)
            sources[f"placement group {groups[name]}"] = placement_groups.ensure_cluster(groups[name])
    except Exception as exc:
        if _code(exc) not in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
            raise
        raise InvalidInput(f"cannot make the EFA node types' security group or placement group: {exc}",
                           path="efa", hint="grant ec2:CreateSecurityGroup, ec2:AuthorizeSecurityGroupIngress, "
                           "ec2:AuthorizeSecurityGroupEgress, ec2:CreatePlacementGroup and "
                           "ec2:DescribePlacementGroups to whoever runs `gpuplan cluster config`, or pass "
                           "--efa off") from None
    sources["security group"] = f"{group} ({how}; EFA interfaces name it)"
    return dataclasses.replace(facts, sources=sources, security_group=group, placement_groups=groups)


def _check_ray_accepts(needs: ClusterNeeds, opts: ClusterOptions, facts: AwsFacts, mapping: frozenset[str]) -> None:
    """Ray's bootstrap takes only subnets that map public IPs (without ``use_internal_ips``), also for
    nodes with several interfaces, which get none either way."""
    for kind, zone, _ in launch_places(needs, facts):
        subnet = facts.subnets[zone]
        if efa_of(kind, opts, facts, zone) > 1 and subnet not in mapping:
            raise InvalidInput(
                f"subnet {subnet} of the EFA node type {kind.instance_type} does not map public IPs, so Ray's "
                "bootstrap refuses it", path="subnet",
                hint=f"aws ec2 modify-subnet-attribute --subnet-id {subnet} --map-public-ip-on-launch (a node "
                "with several interfaces still gets no public IP; it goes out through the NAT gateway), or "
                "--efa one")


def _with_nat(facts: AwsFacts, needs: ClusterNeeds, ec2: Any, vpc: str) -> tuple[AwsFacts, frozenset[str]]:
    """(``facts`` with the VPC's NAT-routed subnets, and a public subnet for the head when its zone's
    worker subnet is one of them (``ray up`` reaches the head by its public IP); the subnets that map
    public IPs)."""
    subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]
    nat = _nat_subnets(ec2, vpc, [s["SubnetId"] for s in subnets])
    mapping = frozenset(s["SubnetId"] for s in subnets if s.get("MapPublicIpOnLaunch"))
    head_zone = facts.zones[kind_key(needs.kinds[0])]
    if facts.subnets[head_zone] not in nat:
        return dataclasses.replace(facts, nat_subnets=nat), mapping
    public = sorted(s["SubnetId"] for s in subnets if s.get("AvailabilityZoneId") == head_zone
                    and s.get("MapPublicIpOnLaunch") and s.get("State") == "available" and s["SubnetId"] not in nat)
    sources = {**facts.sources, "head subnet": f"{public[0]} (public; the workers' is behind a NAT)"} if public else (
        {**facts.sources, "head subnet": f"{facts.subnets[head_zone]}: behind a NAT, no public subnet in {head_zone}"
         " (ray up needs provider.use_internal_ips and a way in)"})
    return dataclasses.replace(facts, nat_subnets=nat, head_subnet=public[0] if public else None,
                               sources=sources), mapping


def _nat_subnets(ec2: Any, vpc: str, subnets: list[str]) -> frozenset[str]:
    """Those of ``subnets`` whose route table sends 0.0.0.0/0 to a NAT gateway (explicit association,
    else the VPC's main table)."""
    tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"]
    nat_tables = {t["RouteTableId"] for t in tables if any(
        r.get("DestinationCidrBlock") == "0.0.0.0/0" and r.get("NatGatewayId") for r in t.get("Routes", []))}
    table_of: dict[str, str] = {}
    main: str | None = None
    for table in tables:
        for assoc in table.get("Associations", []):
            if assoc.get("Main"):
                main = table["RouteTableId"]
            elif assoc.get("SubnetId"):
                table_of[assoc["SubnetId"]] = table["RouteTableId"]
    return frozenset(s for s in subnets if table_of.get(s, main) in nat_tables)


def _instance_types(ec2: Any, instance_types: list[str], region: str) -> tuple[dict[str, str], dict[str, NetworkFacts]]:
    """(instance type -> CPU architecture, instance type -> its network) from describe_instance_types."""
    try:
        found = ec2.describe_instance_types(InstanceTypes=instance_types)["InstanceTypes"]
    except Exception as exc:
        if _code(exc).startswith("InvalidInstanceType"):
            raise InvalidInput(f"an instance type of the plan is not offered in {region}: {exc}",
                               hint="refresh the catalog (gpuplan catalog refresh aws) and plan again") from None
        raise
    arch: dict[str, str] = {}
    networks: dict[str, NetworkFacts] = {}
    for item in found:
        supported = item.get("ProcessorInfo", {}).get("SupportedArchitectures", ["x86_64"])
        arch[item["InstanceType"]] = "x86_64" if "x86_64" in supported else supported[0]
        networks[item["InstanceType"]] = network_facts(item)
    missing = sorted(set(instance_types) - set(arch))
    if missing:
        raise InvalidInput(f"instance type(s) {', '.join(missing)} are not offered in {region}",
                           hint="refresh the catalog (gpuplan catalog refresh aws) and plan again")
    return arch, networks


def _images(session: Any, ec2: Any, arch: dict[str, str], opts: ClusterOptions, region: str,
            sources: dict[str, str]) -> dict[str, str]:
    if opts.ami:
        try:
            images = ec2.describe_images(ImageIds=[opts.ami])["Images"]
        except Exception as exc:
            if not _code(exc).startswith("InvalidAMIID"):
                raise
            images = []
        if not images:
            raise InvalidInput(f"AMI {opts.ami} does not exist in {region}", path="ami",
                               hint="AMIs are per region: give one of this region, or leave --ami out for the "
                               "Deep Learning Base AMI")
        image_arch = images[0].get("Architecture") or "x86_64"
        wrong = sorted(t for t, a in arch.items() if a != image_arch)
        if wrong:
            raise InvalidInput(f"AMI {opts.ami} is {image_arch}, but {', '.join(wrong)} need {arch[wrong[0]]}",
                               path="ami", hint="leave --ami out: each architecture then gets its own DLAMI")
        sources["AMI"] = f"{opts.ami} (--ami, {images[0].get('Name', '')})"
        return dict.fromkeys(arch, opts.ami)
    ssm = session.client("ssm", region_name=region)
    by_arch: dict[str, str] = {}
    for name in sorted(set(arch.values())):
        parameter = opts.ami_parameters.get(name)
        if parameter is None:
            raise InvalidInput(f"no AMI parameter for {name} instances", path="ami", hint="give --ami ami-...")
        try:
            by_arch[name] = str(ssm.get_parameter(Name=parameter)["Parameter"]["Value"])
        except Exception as exc:
            if _code(exc) != "ParameterNotFound":
                raise
            raise InvalidInput(
                f"region {region} has no GPU AMI for {name}: SSM parameter {parameter} does not exist there",
                path="ami", hint="give --ami with an image of this region that has an NVIDIA driver for these "
                "GPUs and Python >= 3.11, or plan the job in another region") from None
        sources[f"AMI {name}"] = f"{by_arch[name]} (SSM {parameter})"
    return {itype: by_arch[a] for itype, a in arch.items()}


def _subnets(ec2: Any, opts: ClusterOptions, needs: ClusterNeeds,
             sources: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """(zone id -> subnet id, their VPC): one VPC (Ray's provider uses subnets of one VPC only)."""
    subnets = ec2.describe_subnets()["Subnets"]
    by_id = {s["SubnetId"]: s for s in subnets}
    chosen: dict[str, str] = {}
    vpc: str | None = None
    for zone, subnet_id in opts.subnets.items():
        subnet = by_id.get(subnet_id)
        if subnet is None:
            raise InvalidInput(f"subnet {subnet_id} (for zone {zone}) does not exist in {needs.region}",
                               path="subnet", hint="give a subnet of this region: aws ec2 describe-subnets")
        if subnet.get("AvailabilityZoneId") != zone:
            raise InvalidInput(f"subnet {subnet_id} is in zone {subnet.get('AvailabilityZoneId')}, not {zone}",
                               path="subnet", hint="give ZONE_ID=SUBNET pairs with the subnet's own zone id")
        if vpc not in (None, subnet["VpcId"]):
            raise InvalidInput("the --subnet subnets are in more than one VPC", path="subnet",
                               hint="Ray's AWS provider puts all nodes in one VPC: give subnets of one VPC")
        vpc = subnet["VpcId"]
        chosen[zone] = subnet_id
        sources[f"subnet {zone}"] = f"{subnet_id} (--subnet)"
    usable = [s for s in subnets if s.get("State") == "available" and s.get("MapPublicIpOnLaunch")]
    if vpc is None:  # the default VPC when it has usable subnets, else the VPC with the most of them
        defaults = [s for s in usable if s.get("DefaultForAz")]
        pool = defaults or usable
        if pool:
            counts: dict[str, int] = {}
            for s in pool:
                counts[s["VpcId"]] = counts.get(s["VpcId"], 0) + 1
            vpc = max(sorted(counts), key=lambda v: counts[v])
    for s in sorted(usable, key=lambda s: (not s.get("DefaultForAz"), s["SubnetId"])):
        zone = s.get("AvailabilityZoneId")
        if s["VpcId"] == vpc and zone and zone not in chosen:
            chosen[zone] = s["SubnetId"]
    return chosen, vpc


def _zones(ec2: Any, needs: ClusterNeeds, subnets: dict[str, str]) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(kind key -> the zone it was priced in, or the first usable one of a regional offer; kind key -> the
    other zones with a subnet that offer its instance type, by id: where a run waiting for capacity goes)."""
    zones: dict[str, str] = {}
    fallback: dict[str, tuple[str, ...]] = {}
    offered: dict[str, list[str]] = {}
    for kind in needs.kinds:
        if kind.instance_type not in offered:
            offered[kind.instance_type] = sorted(z for z in _offered_zones(ec2, kind.instance_type) if z in subnets)
        usable = offered[kind.instance_type]
        if kind.zone is not None:
            if kind.zone not in subnets:
                raise InvalidInput(
                    f"zone {kind.zone} (where the plan priced {kind.instance_type} {kind.market}) has no usable "
                    f"subnet in {needs.region}",
                    path="subnet", hint=f"create a subnet there that maps public IPs, or pass --subnet "
                    f"{kind.zone}=subnet-...; zones with one: {', '.join(sorted(subnets)) or 'none'}")
            zones[kind_key(kind)] = kind.zone
        elif not usable:
            raise InvalidInput(f"no zone of {needs.region} with a usable subnet offers {kind.instance_type}",
                               path="subnet", hint="pass --subnet ZONE_ID=subnet-... for a zone that offers it")
        else:
            zones[kind_key(kind)] = usable[0]
        fallback[kind_key(kind)] = tuple(z for z in usable if z != zones[kind_key(kind)])
    return zones, fallback


def _offered_zones(ec2: Any, instance_type: str) -> Iterable[str]:
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": [instance_type]}])
    return [o["Location"] for page in pages for o in page["InstanceTypeOfferings"]]


def _instance_profile(session: Any, opts: ClusterOptions, sources: dict[str, str]) -> str:
    profile = opts.instance_profile
    if profile.startswith("arn:"):
        sources["instance profile"] = f"{profile} (given)"
        return profile
    iam = session.client("iam")
    try:
        found = iam.get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]
    except Exception as exc:
        if _code(exc) != "NoSuchEntity":
            raise
        policy = json.dumps(iam_policy(opts), separators=(",", ":"))
        raise InvalidInput(
            f"IAM instance profile {profile!r} does not exist", path="instance_profile",
            hint=f"create it with a role of the same name (aws iam create-role / create-instance-profile / "
            f"add-role-to-instance-profile) whose policy is {policy}, or give --instance-profile NAME") from None
    if not found.get("Roles"):
        raise InvalidInput(f"IAM instance profile {profile!r} has no role", path="instance_profile",
                           hint=f"aws iam add-role-to-instance-profile --instance-profile-name {profile} "
                           "--role-name ROLE")
    sources["instance profile"] = f"{found['Arn']} (role {found['Roles'][0]['RoleName']})"
    return profile


def _check_bucket(session: Any, root: str, sources: dict[str, str]) -> str | None:
    """The bucket's region (the nodes' S3 clients must use it, or S3 answers with a redirect)."""
    if not root.startswith("s3://"):
        raise InvalidInput(f"checkpoint root {root!r} is not on S3", path="checkpoint_root",
                           hint="the nodes of a cluster share checkpoints through S3: give s3://bucket/prefix")
    bucket = root[len("s3://"):].split("/", 1)[0]
    if not bucket:
        raise InvalidInput(f"checkpoint root {root!r} names no bucket", path="checkpoint_root",
                           hint="use s3://bucket/prefix")
    try:
        found = session.client("s3").head_bucket(Bucket=bucket)
    except Exception as exc:
        code = _code(exc)
        if code in ("404", "NoSuchBucket"):
            raise InvalidInput(f"S3 bucket {bucket!r} of the checkpoint root does not exist",
                               path="checkpoint_root", hint=f"create it (aws s3 mb s3://{bucket}) or fix the name"
                               ) from None
        if code in ("403", "AccessDenied"):
            raise InvalidInput(f"access to S3 bucket {bucket!r} was denied", path="checkpoint_root",
                               hint="use credentials that can read the bucket") from None
        raise
    region = found.get("BucketRegion") or found.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
        "x-amz-bucket-region")
    sources["checkpoints"] = f"{root} (bucket in {region or 'an unknown region'})"
    return str(region) if region else None


def generate(plan: Any, opts: ClusterOptions, session: Any | None = None,
             placement_groups: PlacementGroups | None = None) -> tuple[dict[str, Any], str]:
    """The cluster config of ``plan`` and its YAML text (with notes), after every lookup succeeded."""
    from workers.cluster.config import check_database_url, cluster_config, cluster_needs, install_commands, to_yaml
    from workers.cluster.notes import notes

    needs = cluster_needs(plan, opts)
    install_commands(opts)  # a missing --wheel / --source-dir is refused before AWS is asked anything
    check_database_url(opts.database_url)
    facts = resolve_aws(needs, opts, session, placement_groups)
    config = cluster_config(plan, opts, facts)
    return config, to_yaml(config, notes(opts, facts, needs))
