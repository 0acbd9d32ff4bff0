"""Ray cluster-launcher YAML for AWS from a plan: on-demand head, spot GPU workers, preemption watcher.

One worker node type per chosen GPU instance type (the plan's pick and, as fallbacks, the next
distinct AWS instance types among its ranked candidates) on the spot market
(``InstanceMarketOptions: {MarketType: spot}``), plus an on-demand node type of the chosen instance
for the policy's safety net (min 0: it only starts when the scheduler asks for ``market:on-demand``).
Every worker starts the spot-notice watcher (``python -m workers.preemption``) next to Ray, so a
2-minute notice drains the node and Ray Train checkpoints before the instance goes.

    config = cluster_config(plan)            # a dict; ray's validate_config accepts it
    text = to_yaml(config)                   # what ``ray up`` reads
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from catalog.errors import InvalidInput, NoFeasiblePlan
from planner.types import Candidate, Plan

HEAD_INSTANCE = "m5.2xlarge"
RAY_PORT = 6379
_AZ_NAME = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
NODE_ID_CMD = (
    "python -c 'import ray; ray.init(address=\"auto\", logging_level=\"ERROR\"); "
    "print(ray.get_runtime_context().get_node_id())'"
)


@dataclass(frozen=True)
class ClusterOptions:
    cluster_name: str | None = None
    head_instance: str = HEAD_INSTANCE
    image_id: str = "latest_dlami"  # Ray resolves this to the region's latest Deep Learning AMI
    source_dir: str | None = None  # a local gpuplan checkout to sync and install; None: from the index
    package: str = "gpuplan"
    alternatives: int = 2  # extra spot instance types to fall back on
    disk_gib: int = 500
    on_demand_fallback: bool = True
    idle_timeout_minutes: int = 10


def _node_type_name(instance_type: str, market: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"{instance_type}-{market}".lower())


def _spot_and_fallback_candidates(plan: Plan, alternatives: int) -> list[Candidate]:
    if plan.chosen is None:
        raise NoFeasiblePlan(
            f"plan {plan.job!r} has no chosen candidate", hint="fix the spec until `gpuplan plan` picks one"
        )
    if plan.chosen.offer.cloud.lower() != "aws":
        raise InvalidInput(
            f"the chosen offer is on {plan.chosen.offer.cloud}, but cluster configs are generated for AWS only",
            hint="restrict the spec with resources.clouds: [aws]",
        )
    picked = [plan.chosen]
    seen = {plan.chosen.offer.instance_type}
    for cand in plan.candidates:
        if len(picked) > alternatives:
            break
        same_place = cand.offer.cloud.lower() == "aws" and cand.offer.region == plan.chosen.offer.region
        if same_place and cand.offer.instance_type not in seen and cand.offer.spot_usd_per_h is not None:
            picked.append(cand)
            seen.add(cand.offer.instance_type)
    return picked


def _worker_type(cand: Candidate, market: str, *, min_workers: int, opts: ClusterOptions) -> dict[str, Any]:
    offer = cand.offer
    node_config: dict[str, Any] = {
        "InstanceType": offer.instance_type,
        "ImageId": opts.image_id,
        "BlockDeviceMappings": [
            {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": opts.disk_gib, "VolumeType": "gp3"}}
        ],
    }
    if market == "spot":
        node_config["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    gpus_per_node = offer.gpu_count
    return {
        "min_workers": min_workers,
        "max_workers": cand.nodes,
        "resources": {
            "CPU": offer.vcpus,
            "GPU": gpus_per_node,
            f"accelerator_type:{offer.gpu}": gpus_per_node,
            f"market:{market}": 1,
        },
        "labels": {"ray.io/market-type": market, "gpuplan/gpu": offer.gpu},
        "node_config": node_config,
    }


def cluster_config(plan: Plan, opts: ClusterOptions | None = None) -> dict[str, Any]:
    """The cluster-launcher config (a dict) for ``plan``."""
    opts = opts or ClusterOptions()
    cands = _spot_and_fallback_candidates(plan, opts.alternatives)
    chosen = cands[0]
    name = opts.cluster_name or re.sub(r"[^a-z0-9-]", "-", f"gpuplan-{plan.job}".lower())[:60]
    types: dict[str, dict[str, Any]] = {
        "head": {
            "resources": {},
            "node_config": {"InstanceType": opts.head_instance, "ImageId": opts.image_id},
        }
    }
    for i, cand in enumerate(cands):
        types[_node_type_name(cand.offer.instance_type, "spot")] = _worker_type(
            cand, "spot", min_workers=cand.nodes if i == 0 else 0, opts=opts
        )
    if opts.on_demand_fallback and chosen.offer.on_demand_usd_per_h is not None:
        types[_node_type_name(chosen.offer.instance_type, "on-demand")] = _worker_type(
            chosen, "on-demand", min_workers=0, opts=opts
        )
    provider: dict[str, Any] = {"type": "aws", "region": chosen.offer.region, "cache_stopped_nodes": False}
    if chosen.offer.zone and _AZ_NAME.match(chosen.offer.zone):
        # Ray's AWS provider takes zone names (us-east-1a), not zone ids (use1-az6).
        provider["availability_zone"] = chosen.offer.zone
    if opts.source_dir:
        file_mounts = {"~/gpuplan": opts.source_dir}
        install = "pip install -q -e ~/gpuplan"
    else:
        file_mounts = {}
        install = f"pip install -q {shlex.quote(opts.package)}"
    watcher = (
        f"nohup python -m workers.preemption --gcs-address $RAY_HEAD_IP:{RAY_PORT} --node-id $({NODE_ID_CMD})"
        " --provider aws > /tmp/gpuplan-preemption.log 2>&1 &"
    )
    return {
        "cluster_name": name,
        "max_workers": sum(int(t.get("max_workers", 0)) for k, t in types.items() if k != "head"),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": opts.idle_timeout_minutes,
        "provider": provider,
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": types,
        "head_node_type": "head",
        "file_mounts": file_mounts,
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [".venv", "**/.git", "**/.git/**"],
        "rsync_filter": [".gitignore"],
        "initialization_commands": [],
        "setup_commands": ['pip install -q "ray[train]==2.60.0"', install],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            f"ray start --head --port={RAY_PORT} --object-manager-port=8076"
            " --autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            f"ray start --address=$RAY_HEAD_IP:{RAY_PORT} --object-manager-port=8076",
            watcher,
        ],
    }


def to_yaml(config: dict[str, Any]) -> str:
    header = "# Ray cluster-launcher config generated by `gpuplan cluster config`; start it with `ray up FILE`.\n"
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
