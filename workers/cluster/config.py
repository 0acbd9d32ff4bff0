"""Ray cluster-launcher YAML for AWS from a plan: on-demand head running the gpuplan server, GPU
worker node types that are exactly what the plan priced, preemption watcher on every worker.

Worker node types, one per (GPU, market, zone) the plan can run on:

- the chosen offer, in each market the plan considered for it (``spot: auto`` plans price both;
  ``spot: always`` has no on-demand type, ``spot: never`` no spot type);
- as alternatives, the next distinct offers of the same region among the ranked candidates.

Each type is pinned to its zone's subnet (AWS zone ids map to subnets at config time) and carries
the custom resources of ``workers.executors.cluster_fit`` (``gpuplan-gpu:<gpu>``, ``gpuplan-market:<market>``,
``gpuplan-zone:<zone id>``, each equal to its GPU count). The executor asks for one of each per GPU
worker, so a run fits exactly the node type it was planned on: an on-demand attempt never lands
on spot, a multi-node run stays in one zone, and Ray's tie-break between node types never decides
the market. Falling back from spot to on-demand is the scheduler's policy (a new attempt with
``market: on-demand``), not the autoscaler's.

A multi-node type whose instance type has EFA gets EFA interfaces (``--efa``: one per network card
where its subnet routes through a NAT gateway, else one with a public IP) and a cluster placement
group (``workers.cluster.net``); every type labels the link speed it provides
(``gpuplan/network-gbps``), which the head's server plans with.

Node types start at ``min_workers: 0`` (no idle GPUs billed) and the autoscaler stops idle nodes
after ``idle_timeout_minutes``. The server on the head reads the autoscaler's own config, so
feasibility counts node types before their nodes join.

    needs = cluster_needs(plan, opts)               # pure: region, zones, instance types
    facts = resolve_aws(needs, opts)                # workers.cluster.aws: AMI, subnets, profile, bucket
    config = cluster_config(plan, opts, facts)      # pure: a dict Ray's validate_config accepts
    text = to_yaml(config, notes(opts, facts, needs))  # workers.cluster.notes; what ``ray up`` reads
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from errors import InvalidInput, NoFeasiblePlan
from planner.types import Candidate, Plan
from workers.cluster import install as cluster_install
from workers.cluster import nccl_net
from workers.cluster.net import (
    NETWORK_LABEL,
    NetworkFacts,
    efa_count,
    efa_interfaces,
    gbps_label,
    provided_gbps,
)
from workers.cluster.secrets import check_ref
from workers.executors.cluster_fit import pin_resources

SERVER_DB_BACKUP = "_server/gpuplan.db"  # under the checkpoint root: scheduler.store.backup.BACKUP_NAME


def backup_uri(checkpoint_root: str) -> str:
    """Where the head keeps its SQLite database's backup (the S3 checkpoint root, which outlives the head)."""
    return f"{checkpoint_root.rstrip('/')}/{SERVER_DB_BACKUP}"

HEAD_INSTANCE = "m5.2xlarge"
RAY_PORT = 6379
SERVER_PORT = 8000
RAY_PIN = cluster_install.RAY_PIN
VENV = cluster_install.VENV
INSTANCE_PROFILE = "gpuplan-node"
FALLBACK_LABEL = "gpuplan/fallback"  # a worker type's rank in the order a waiting run tries them (launch_places)
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
    database_url: str | None = None  # the head's server database, without a password; None: SQLite on the head
    # secrets the head reads at start (workers.cluster.secrets: a Secrets Manager name/ARN or ssm:NAME), never
    # their values: the admin token (None: one made on the head) and a database URL with its password
    admin_token_secret: str | None = None
    database_url_secret: str | None = None
    backup_every_s: int = 300  # the head's SQLite database to the S3 checkpoint root (scheduler.store.backup)
    instance_profile: str = INSTANCE_PROFILE  # IAM instance profile of head and workers (see notes)
    subnets: Mapping[str, str] = field(default_factory=dict)  # zone id -> subnet id; others looked up
    server_port: int = SERVER_PORT
    efa: str = "auto"  # EFA interfaces of multi-node types that have EFA: workers.cluster.net.EFA_MODES


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
    """What was looked up in the account at config time (workers.cluster.aws.resolve_aws)."""

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
    # WorkerKind key -> the region's other zones (by id) that offer its instance type and have a subnet: where
    # the same run may launch when its own zone has no capacity
    fallback_zones: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def efa_of(kind: WorkerKind, opts: ClusterOptions, facts: AwsFacts, zone: str | None = None) -> int:
    """EFA interfaces per node of ``kind`` in ``zone`` (default: its own) (0: none)."""
    subnet = facts.subnets.get(zone or facts.zones.get(kind_key(kind), ""), "")
    return efa_count(kind.candidate.nodes, facts.networks.get(kind.instance_type), opts.efa,
                     subnet in facts.nat_subnets)


def link_gbps(kind: WorkerKind, opts: ClusterOptions, facts: AwsFacts, zone: str | None = None) -> float:
    """The node-to-node Gbit/s that ``kind``'s node type (in ``zone``) provides as configured."""
    net = facts.networks.get(kind.instance_type)
    return provided_gbps(kind.candidate.offer.network_gbps, efa_of(kind, opts, facts, zone), net)


def launch_places(needs: ClusterNeeds, facts: AwsFacts) -> list[tuple[WorkerKind, str, str]]:
    """(kind, zone, node type name) of every worker type, in the order a waiting run falls back along:
    the planner's order of the kinds (the chosen offer in its priced market first, then its other market,
    so on-demand after spot under ``spot: auto``, then the alternatives), and within a kind its priced zone
    before the region's other zones that offer the instance type. A type's rank in this list is its
    ``gpuplan/fallback`` label; a run (one zone, one placement group) launches all its nodes in one type.

    One type per (GPU, market, zone), the resources a run's workers ask for (workers.executors.cluster_fit), so they fit
    one type only (p5.48xlarge and p5.4xlarge in one zone would split a run's nodes over two placement groups).
    A kind's priced zone is its own; another zone goes to the first kind in that order that falls back there."""
    def pins(kind: WorkerKind, zone: str) -> tuple[str, str, str]:
        return kind.gpu, kind.market, zone

    own: dict[tuple[str, str, str], str] = {}
    for kind in needs.kinds:
        own.setdefault(pins(kind, facts.zones[kind_key(kind)]), kind_key(kind))
    places: list[tuple[WorkerKind, str, str]] = []
    taken: set[tuple[str, str, str]] = set()
    for kind in needs.kinds:
        key = kind_key(kind)
        for zone in (facts.zones[key], *facts.fallback_zones.get(key, ())):
            if pins(kind, zone) in taken or own.get(pins(kind, zone), key) != key:
                continue
            taken.add(pins(kind, zone))
            places.append((kind, zone, node_type_name(kind.instance_type, kind.market, zone)))
    return places


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


def _worker_type(kind: WorkerKind, zone: str, rank: int, opts: ClusterOptions, facts: AwsFacts) -> dict[str, Any]:
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
    efa = efa_of(kind, opts, facts, zone)
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
        **({"worker_setup_commands": nccl_setup(kind, zone, opts, facts)} if kind.candidate.nodes > 1 else {}),
        "resources": resources,
        "labels": {"gpuplan/market": kind.market, "gpuplan/gpu": offer.gpu, "gpuplan/zone": zone,
                   NETWORK_LABEL: gbps_label(link_gbps(kind, opts, facts, zone)), FALLBACK_LABEL: str(rank)},
        "node_config": node_config,
    }


def nccl_setup(kind: WorkerKind, zone: str, opts: ClusterOptions, facts: AwsFacts) -> list[str]:
    """A multi-node type's NCCL environment, sourced first by ~/.bashrc (so by ``ray start`` and every
    worker): NCCL's INFO log per process (each rank reads which network it chose), the node's TCP and EFA
    link speeds, and on an EFA type the variables that make pip torch's NCCL load aws-ofi-nccl."""
    net = facts.networks.get(kind.instance_type)
    env = dict(nccl_net.DEBUG_ENV)
    env[nccl_net.SOCKET_GBPS_VAR] = gbps_label(provided_gbps(kind.candidate.offer.network_gbps, 0, net))
    if efa_of(kind, opts, facts, zone):
        env.update(nccl_net.EFA_ENV)
        env[nccl_net.EFA_GBPS_VAR] = gbps_label(link_gbps(kind, opts, facts, zone))
    lines = " ".join(shlex.quote(line) for line in nccl_net.export_lines(env))
    return [f"printf '%s\\n' {lines} > ~/gpuplan-nccl.env",
            "grep -q gpuplan-nccl.env ~/.bashrc || sed -i '1i . ~/gpuplan-nccl.env' ~/.bashrc"]


def _profile_ref(profile: str) -> dict[str, str]:
    return {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}


def install_commands(opts: ClusterOptions, bucket_region: str | None = None) -> tuple[dict[str, str], list[str]]:
    """File mounts and setup commands: Python >= 3.11 in a venv, Ray and gpuplan pinned (workers.cluster.install)."""
    return cluster_install.install_commands(opts.wheel, opts.source_dir, opts.checkpoint_root, bucket_region)


def check_database_url(url: str | None) -> None:
    """A password in ``--database-url`` would sit in the YAML and in ``ps``: it belongs in a secret."""
    if url and re.match(r"^[^:/]+://[^/@]*:[^/@]*@", url):
        raise InvalidInput("the --database-url has a password, which would be written into the cluster YAML",
                           path="database_url", hint="store the URL in Secrets Manager (aws secretsmanager "
                           "create-secret --name gpuplan/database-url --secret-string 'postgresql+psycopg://...') "
                           "and give --database-url-secret gpuplan/database-url")


def _server_command(opts: ClusterOptions, bucket_region: str | None, region: str) -> str:
    """The head's gpuplan server, as a transient systemd service that restarts when it dies, started by
    ``scheduler.head``: the secrets it names reach the server's environment only, and without a database
    URL its SQLite file is restored from and backed up to the checkpoint root."""
    check_database_url(opts.database_url)
    args = ["--executor", "ray", "--host", "0.0.0.0", "--port", str(opts.server_port),
            "--ray-cluster-config", "/home/ubuntu/ray_bootstrap_config.yaml"]
    if opts.checkpoint_root:
        args += ["--checkpoint-root", opts.checkpoint_root]
    env = ["--setenv=RAY_ADDRESS=auto", f"--setenv=AWS_DEFAULT_REGION={bucket_region or region}"]
    if opts.database_url:
        env.append(f"--setenv=GPUPLAN_DATABASE_URL={opts.database_url}")
    head = ["/home/ubuntu/gpuplan-venv/bin/python", "-m", "scheduler.head", "--region", region]
    for flag, ref in (("--admin-token-secret", opts.admin_token_secret),
                      ("--database-url-secret", opts.database_url_secret)):
        if ref:
            head += [flag, check_ref(ref, flag[2:].replace("-", " "))]
    if not (opts.database_url or opts.database_url_secret) and (opts.checkpoint_root or "").startswith("s3://"):
        head += ["--backup", backup_uri(opts.checkpoint_root or ""), "--db", "/home/ubuntu/.gpuplan/gpuplan.db",
                 "--every", str(opts.backup_every_s)]
    return _supervised("gpuplan-server", [*env, *head, "--", "/home/ubuntu/gpuplan-venv/bin/gpuplan", "server",
                                          *args])


def _watcher_command() -> str:
    """The spot-notice watcher of a worker (workers.executors.preemption), restarted when it dies; its node id is
    looked up at each start (``python -m workers.cluster.config watch``), so a restarted Ray node is watched too."""
    return _supervised("gpuplan-preemption", ["/home/ubuntu/gpuplan-venv/bin/python", "-m", "workers.cluster.config",
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
    for rank, (kind, zone, type_name) in enumerate(launch_places(needs, facts)):
        types[type_name] = _worker_type(kind, zone, rank, opts, facts)
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
            _server_command(opts, facts.bucket_region, needs.region),
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
    """``python -m workers.cluster.config watch --gcs-address HOST:PORT``: the preemption watcher of this node."""
    import argparse
    import logging

    import ray

    from workers.executors import preemption

    parser = argparse.ArgumentParser(prog="python -m workers.cluster.config watch")
    parser.add_argument("--gcs-address", required=True)
    args, rest = parser.parse_known_args(argv)
    ray.init(address=args.gcs_address, logging_level=logging.ERROR)
    node_id = ray.get_runtime_context().get_node_id()
    ray.shutdown()
    return preemption.main(["--gcs-address", args.gcs_address, "--node-id", node_id, "--provider", "aws", *rest])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["watch"]:
        sys.exit("usage: python -m workers.cluster.config watch --gcs-address HOST:PORT")
    sys.exit(_watch(sys.argv[2:]))
