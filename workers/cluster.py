"""Ray cluster-launcher YAML for AWS from a plan: on-demand head running the gpuplan server, GPU
worker node types that are exactly what the plan priced, preemption watcher on every worker.

Worker node types, one per (GPU, market, zone) the plan can run on:

- the chosen offer, in each market the plan considered for it (``spot: auto`` plans price both;
  ``spot: always`` has no on-demand type, ``spot: never`` no spot type);
- as alternatives, the next distinct offers of the same region among the ranked candidates.

Each type is pinned to its zone's subnet (AWS zone ids map to subnets at config time) and carries
the custom resources of ``workers.placement`` (``gpuplan-gpu:<gpu>``, ``gpuplan-market:<market>``,
``gpuplan-zone:<zone id>``, each equal to its GPU count). The executor asks for one of each per GPU
worker, so a run fits exactly the node type it was planned on: an on-demand attempt never lands
on spot, a multi-node run stays in one zone, and Ray's tie-break between node types never decides
the market. Falling back from spot to on-demand is the scheduler's policy (a new attempt with
``market: on-demand``), not the autoscaler's.

A multi-node type whose instance type has EFA gets EFA interfaces (``--efa``: one per network card
where its subnet routes through a NAT gateway, else one with a public IP) and a cluster placement
group (``workers.cluster_net``); every type labels the link speed it provides
(``gpuplan/network-gbps``), which the head's server plans with.

Node types start at ``min_workers: 0`` (no idle GPUs billed) and the autoscaler stops idle nodes
after ``idle_timeout_minutes``. The server on the head reads the autoscaler's own config, so
feasibility counts node types before their nodes join.

    needs = cluster_needs(plan, opts)               # pure: region, zones, instance types
    facts = resolve_aws(needs, opts)                # workers.cluster_aws: AMI, subnets, profile, bucket
    config = cluster_config(plan, opts, facts)      # pure: a dict Ray's validate_config accepts
    text = to_yaml(config, notes(opts, facts, needs))  # workers.cluster_notes; what ``ray up`` reads
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from catalog.errors import InvalidInput, NoFeasiblePlan
from planner.types import Candidate, Plan
from workers.cluster_net import (
    NETWORK_LABEL,
    NetworkFacts,
    efa_count,
    efa_interfaces,
    gbps_label,
    provided_gbps,
)
from workers.placement import pin_resources

HEAD_INSTANCE = "m5.2xlarge"
RAY_PORT = 6379
SERVER_PORT = 8000
RAY_PIN = "ray[default,train]==2.60.0"  # default: dashboard and job submission; the project's Ray version
VENV = "$HOME/gpuplan-venv"
INSTANCE_PROFILE = "gpuplan-node"
# AWS's public SSM parameters of the current Deep Learning Base AMI (Ubuntu 24.04: Python 3.12, an
# NVIDIA driver for H100/H200/B200) per CPU architecture; they exist in every region that has the AMI.
DLAMI_PARAMETERS: Mapping[str, str] = {
    "x86_64": "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id",
    "arm64": "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id",
}


@dataclass(frozen=True)
class ClusterOptions:
    cluster_name: str | None = None
    head_instance: str = HEAD_INSTANCE
    ami: str | None = None  # one AMI for every node; None: the DLAMI of each architecture through SSM
    ami_parameters: Mapping[str, str] = field(default_factory=lambda: dict(DLAMI_PARAMETERS))
    wheel: str | None = None  # a gpuplan wheel built from this repo (pip wheel --no-deps -w dist .)
    source_dir: str | None = None  # or a gpuplan checkout, synced and installed on every node
    alternatives: int = 2  # extra offers (other GPUs / instance types) to give node types
    # also the chosen instance type in every other zone of the region the plan priced it in, so a
    # zone-switching policy can move the run there (RunRequest.zone); not counted in ``alternatives``
    every_zone: bool = False
    disk_gib: int = 500
    min_workers: int = 0
    idle_timeout_minutes: float = 10  # Ray takes fractions of a minute too
    checkpoint_root: str | None = None  # s3://bucket/prefix: every node reads it; None: each node's disk
    database_url: str | None = None  # the head's server database; None: SQLite on the head
    instance_profile: str = INSTANCE_PROFILE  # IAM instance profile of head and workers (see notes)
    subnets: Mapping[str, str] = field(default_factory=dict)  # zone id -> subnet id; others looked up
    server_port: int = SERVER_PORT
    efa: str = "auto"  # EFA interfaces of multi-node types that have EFA: workers.cluster_net.EFA_MODES


@dataclass(frozen=True)
class WorkerKind:
    """One worker node type: a candidate's offer in one market."""

    candidate: Candidate
    market: str
    zone: str | None  # the plan's zone id; None: the offer is regional (resolve_aws picks one)

    @property
    def instance_type(self) -> str:
        return self.candidate.offer.instance_type

    @property
    def gpu(self) -> str:
        return self.candidate.offer.gpu


@dataclass(frozen=True)
class ClusterNeeds:
    """What the YAML needs from AWS: the region, instance types and zones of its node types."""

    region: str
    kinds: tuple[WorkerKind, ...]
    head_instance: str
    cluster_name: str = "gpuplan"

    @property
    def instance_types(self) -> list[str]:
        return sorted({k.instance_type for k in self.kinds} | {self.head_instance})


@dataclass(frozen=True)
class AwsFacts:
    """What was looked up in the account at config time (workers.cluster_aws.resolve_aws)."""

    images: Mapping[str, str]  # instance type -> AMI id
    subnets: Mapping[str, str]  # zone id -> subnet id
    zones: Mapping[str, str]  # WorkerKind key (instance/market/zone-or-none) -> zone id it runs in
    instance_profile: str  # name or ARN
    sources: Mapping[str, str] = field(default_factory=dict)  # what each value came from, for the notes
    bucket_region: str | None = None  # of the checkpoint bucket: every node's S3 client must use it
    networks: Mapping[str, NetworkFacts] = field(default_factory=dict)  # instance type -> its network
    security_group: str | None = None  # the cluster's group, made at config time when a type has EFA
    placement_groups: Mapping[str, str] = field(default_factory=dict)  # EFA worker type -> its placement group
    nat_subnets: frozenset[str] = frozenset()  # subnets whose default route goes to a NAT gateway
    head_subnet: str | None = None  # when the head zone's worker subnet is behind a NAT: a public one there


def efa_of(kind: WorkerKind, opts: ClusterOptions, facts: AwsFacts) -> int:
    """EFA interfaces per node of ``kind`` (0: none)."""
    subnet = facts.subnets.get(facts.zones.get(kind_key(kind), ""), "")
    return efa_count(kind.candidate.nodes, facts.networks.get(kind.instance_type), opts.efa,
                     subnet in facts.nat_subnets)


def link_gbps(kind: WorkerKind, opts: ClusterOptions, facts: AwsFacts) -> float:
    """The node-to-node Gbit/s that ``kind``'s node type provides as configured."""
    net = facts.networks.get(kind.instance_type)
    return provided_gbps(kind.candidate.offer.network_gbps, efa_of(kind, opts, facts), net)


def kind_key(kind: WorkerKind) -> str:
    return f"{kind.instance_type}/{kind.market}/{kind.zone or '-'}"


def cluster_needs(plan: Plan, opts: ClusterOptions) -> ClusterNeeds:
    """The worker kinds of ``plan``: the chosen offer in each market the plan priced, then alternatives."""
    chosen = plan.chosen
    if chosen is None:
        raise NoFeasiblePlan(
            f"plan {plan.job!r} has no chosen candidate", hint="fix the spec until `gpuplan plan` picks one"
        )
    if chosen.offer.cloud.lower() != "aws":
        raise InvalidInput(
            f"the chosen offer is on {chosen.offer.cloud}, but cluster configs are generated for AWS only",
            hint="restrict the spec with resources.clouds: [aws]",
        )
    region = chosen.offer.region
    same_region = [c for c in plan.candidates if c.offer.cloud.lower() == "aws" and c.offer.region == region]
    # the markets the plan considered for an offer: both under spot: auto, one under always / never
    markets: dict[tuple[str, str | None], set[str]] = {}
    for cand in [chosen, *same_region]:
        markets.setdefault((cand.offer.instance_type, cand.offer.zone), set()).add(cand.cost.market)
    kinds: list[WorkerKind] = []
    seen: set[tuple[str, str, str | None]] = set()

    def add(cand: Candidate) -> None:
        offer = cand.offer
        for market in sorted(markets[(offer.instance_type, offer.zone)], key=lambda m: m != cand.cost.market):
            price = offer.spot_usd_per_h if market == "spot" else offer.on_demand_usd_per_h
            key = (offer.gpu, market, offer.zone)
            if price is None or key in seen:
                continue
            seen.add(key)
            kinds.append(WorkerKind(candidate=cand, market=market, zone=offer.zone))

    add(chosen)
    offers = {(chosen.offer.instance_type, chosen.offer.zone)}
    if opts.every_zone:
        for cand in same_region:
            place = (cand.offer.instance_type, cand.offer.zone)
            if cand.offer.instance_type == chosen.offer.instance_type and place not in offers:
                offers.add(place)
                add(cand.model_copy(update={"nodes": chosen.nodes}))  # the chosen run, moved
    moved = len(offers) - 1
    for cand in same_region:
        if len(offers) - moved > opts.alternatives:
            break
        place = (cand.offer.instance_type, cand.offer.zone)
        if place not in offers:
            offers.add(place)
            add(cand)
    name = opts.cluster_name or re.sub(r"[^a-z0-9-]", "-", f"gpuplan-{plan.job}".lower())[:60]
    return ClusterNeeds(region=region, kinds=tuple(kinds), head_instance=opts.head_instance, cluster_name=name)


def node_type_name(instance_type: str, market: str, zone: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"{instance_type}-{market}-{zone}".lower())


def _worker_type(kind: WorkerKind, zone: str, opts: ClusterOptions, facts: AwsFacts) -> dict[str, Any]:
    offer = kind.candidate.offer
    node_config: dict[str, Any] = {
        "InstanceType": offer.instance_type,
        "ImageId": facts.images[offer.instance_type],
        "SubnetIds": [facts.subnets[zone]],  # the priced zone: one subnet, so every node of a run is there
        "IamInstanceProfile": _profile_ref(facts.instance_profile),
        "BlockDeviceMappings": [
            {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": opts.disk_gib, "VolumeType": "gp3"}}
        ],
    }
    efa = efa_of(kind, opts, facts)
    if efa:  # Ray's provider: subnet and groups only inside the interfaces
        assert facts.security_group is not None, "resolve_aws makes the group of EFA worker types"
        del node_config["SubnetIds"]
        node_config["NetworkInterfaces"] = efa_interfaces(efa, facts.subnets[zone], facts.security_group)
        node_config["Placement"] = {"GroupName": facts.placement_groups[node_type_name(
            offer.instance_type, kind.market, zone)]}
    if kind.market == "spot":
        node_config["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    n = offer.gpu_count
    resources: dict[str, Any] = {"CPU": offer.vcpus, "GPU": n}
    resources.update({k: int(v) for k, v in pin_resources(offer.gpu, kind.market, zone, n).items()})
    return {
        "min_workers": min(opts.min_workers, kind.candidate.nodes),
        "max_workers": kind.candidate.nodes,
        "resources": resources,
        "labels": {"gpuplan/market": kind.market, "gpuplan/gpu": offer.gpu, "gpuplan/zone": zone,
                   NETWORK_LABEL: gbps_label(link_gbps(kind, opts, facts))},
        "node_config": node_config,
    }


def _profile_ref(profile: str) -> dict[str, str]:
    return {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}


def install_commands(opts: ClusterOptions, bucket_region: str | None = None) -> tuple[dict[str, str], list[str]]:
    """File mounts and setup commands: Python >= 3.11 in a venv, Ray pinned, gpuplan from a wheel or checkout."""
    if opts.wheel:
        name = opts.wheel.rstrip("/").rsplit("/", 1)[-1]
        if not name.endswith(".whl"):
            raise InvalidInput(f"{opts.wheel!r} is not a wheel file", path="wheel",
                               hint="build one from the gpuplan checkout: pip wheel --no-deps -w dist .")
        mounts = {f"~/gpuplan-dist/{name}": opts.wheel}
        package = f"~/gpuplan-dist/{name}"
    elif opts.source_dir:
        mounts = {"~/gpuplan": opts.source_dir}
        package = "~/gpuplan"
    else:
        raise InvalidInput(
            "no gpuplan to install on the nodes: gpuplan is not published on PyPI",
            path="wheel",
            hint="give --wheel dist/gpuplan-*.whl (pip wheel --no-deps -w dist . in the checkout) or --source-dir .",
        )
    venv = VENV
    commands = [
        # the DLAMI's python3 is 3.12; Ubuntu keeps venv apart and may still be upgrading at boot
        "sudo apt-get -o DPkg::Lock::Timeout=600 update -q"
        " && sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv",
        f"test -x {venv}/bin/python || python3 -m venv {venv}",
        # Ray runs every command in `bash -i` after `source ~/.bashrc`: the venv first on PATH everywhere
        f"grep -q gpuplan-venv ~/.bashrc || sed -i '1i export PATH={venv}/bin:$PATH' ~/.bashrc",
        *([f"grep -q AWS_DEFAULT_REGION ~/.bashrc || sed -i '1i export AWS_DEFAULT_REGION={bucket_region}' ~/.bashrc"]
          if bucket_region else []),  # boto3 and Ray Train's pyarrow reach the bucket in its region
        f"{venv}/bin/pip install -q -U pip",
        f'{venv}/bin/pip install -q "{RAY_PIN}" {package}',
    ]
    return mounts, commands


def _server_command(opts: ClusterOptions, bucket_region: str | None) -> str:
    """The head's gpuplan server, as a transient systemd service that restarts when it dies."""
    args = ["--executor", "ray", "--host", "0.0.0.0", "--port", str(opts.server_port),
            "--ray-cluster-config", "/home/ubuntu/ray_bootstrap_config.yaml"]
    if opts.checkpoint_root:
        args += ["--checkpoint-root", opts.checkpoint_root]
    env = ["--setenv=RAY_ADDRESS=auto", *([f"--setenv=AWS_DEFAULT_REGION={bucket_region}"] if bucket_region else [])]
    if opts.database_url:
        env.append(f"--setenv=GPUPLAN_DATABASE_URL={opts.database_url}")
    return _supervised("gpuplan-server", [*env, "/home/ubuntu/gpuplan-venv/bin/gpuplan", "server", *args])


def _watcher_command() -> str:
    """The spot-notice watcher of a worker (workers.preemption), restarted when it dies; its node id is
    looked up at each start (``python -m workers.cluster watch``), so a restarted Ray node is watched too."""
    return _supervised("gpuplan-preemption", ["/home/ubuntu/gpuplan-venv/bin/python", "-m", "workers.cluster",
                                              "watch", "--gcs-address", f"$RAY_HEAD_IP:{RAY_PORT}"])


def _supervised(unit: str, argv: list[str]) -> str:
    run = " ".join(a if a.startswith("$RAY_HEAD_IP") else shlex.quote(a) for a in argv)
    return (f"sudo systemctl stop {unit} 2>/dev/null; sudo systemctl reset-failed {unit} 2>/dev/null; "
            f"sudo systemd-run --unit {unit} --uid ubuntu -p Restart=always -p RestartSec=5 {run}")


def cluster_config(plan: Plan, opts: ClusterOptions, facts: AwsFacts) -> dict[str, Any]:
    """The cluster-launcher config (a dict) for ``plan`` with what ``facts`` found in the account."""
    needs = cluster_needs(plan, opts)
    name = needs.cluster_name
    head_zone = facts.zones[kind_key(needs.kinds[0])]
    types: dict[str, dict[str, Any]] = {
        "head": {
            "resources": {},
            "node_config": {
                "InstanceType": opts.head_instance,
                "ImageId": facts.images[opts.head_instance],
                # next to the chosen workers (no cross-zone traffic), reachable by `ray up`
                "SubnetIds": [facts.head_subnet or facts.subnets[head_zone]],
                "IamInstanceProfile": _profile_ref(facts.instance_profile),
            },
        }
    }
    for kind in needs.kinds:
        zone = facts.zones[kind_key(kind)]
        type_name = node_type_name(kind.instance_type, kind.market, zone)
        if type_name not in types:  # a regional offer may resolve to a zone a zoned kind has: the first wins
            types[type_name] = _worker_type(kind, zone, opts, facts)
    mounts, install = install_commands(opts, facts.bucket_region)
    return {
        "cluster_name": name,
        "max_workers": sum(int(t.get("max_workers", 0)) for k, t in types.items() if k != "head"),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": opts.idle_timeout_minutes,
        "provider": {"type": "aws", "region": needs.region, "cache_stopped_nodes": False},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": types,
        "head_node_type": "head",
        "file_mounts": mounts,
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [".venv", "**/.git", "**/.git/**"],
        "rsync_filter": [".gitignore"],
        "initialization_commands": [],
        "setup_commands": install,
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            f"ray start --head --port={RAY_PORT} --object-manager-port=8076"
            " --autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0",
            _server_command(opts, facts.bucket_region),
        ],
        "worker_start_ray_commands": [
            "ray stop",
            f"ray start --address=$RAY_HEAD_IP:{RAY_PORT} --object-manager-port=8076",
            _watcher_command(),
        ],
    }


def to_yaml(config: dict[str, Any], header: list[str] | None = None) -> str:
    lines = ["Ray cluster-launcher config generated by `gpuplan cluster config`; start it with `ray up FILE`.",
             *(header or [])]
    comment = "".join(f"# {line}".rstrip() + "\n" for line in lines)
    return comment + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _watch(argv: list[str]) -> int:
    """``python -m workers.cluster watch --gcs-address HOST:PORT``: the preemption watcher of this node."""
    import argparse
    import logging

    import ray

    from workers import preemption

    parser = argparse.ArgumentParser(prog="python -m workers.cluster watch")
    parser.add_argument("--gcs-address", required=True)
    args, rest = parser.parse_known_args(argv)
    ray.init(address=args.gcs_address, logging_level=logging.ERROR)
    node_id = ray.get_runtime_context().get_node_id()
    ray.shutdown()
    return preemption.main(["--gcs-address", args.gcs_address, "--node-id", node_id, "--provider", "aws", *rest])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["watch"]:
        sys.exit("usage: python -m workers.cluster watch --gcs-address HOST:PORT")
    sys.exit(_watch(sys.argv[2:]))
