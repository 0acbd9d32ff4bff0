"""The generated Ray cluster-launcher config passes Ray's own validation and says what the plan says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from catalog.errors import InvalidInput, NoFeasiblePlan
from catalog.loader import load_catalog
from planner.search import plan
from planner.spec import spec_from_dict
from planner.types import Plan
from workers.cluster import ClusterOptions, cluster_config, to_yaml

SPEC = {
    "name": "sft-demo",
    "task": "train",
    "model": "llama-3-8b",
    "train": {"tokens": 2.0e9, "seq_len": 4096},
    "resources": {"clouds": ["aws"], "spot": "auto", "deadline": "24h"},
}


@pytest.fixture(scope="module")
def aws_plan() -> Plan:
    return plan(spec_from_dict(SPEC), load_catalog())


def test_config_passes_ray_validation_before_and_after_defaults(aws_plan: Plan) -> None:
    config = yaml.safe_load(to_yaml(cluster_config(aws_plan)))
    validate_config(config)
    filled = prepare_config(json.loads(json.dumps(config)))
    validate_config(filled)


def test_worker_types_are_spot_with_plan_counts_and_watcher(aws_plan: Plan) -> None:
    chosen = aws_plan.chosen
    assert chosen is not None
    config = cluster_config(aws_plan)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert "InstanceMarketOptions" not in head["node_config"]
    assert head["node_config"]["InstanceType"] == "m5.2xlarge"
    spot_types = {k: t for k, t in types.items() if k.endswith("-spot")}
    assert spot_types, "at least one spot worker type"
    first = spot_types[next(iter(spot_types))]
    assert first["node_config"]["InstanceType"] == chosen.offer.instance_type
    assert first["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert first["min_workers"] == chosen.nodes == first["max_workers"]
    assert first["resources"][f"accelerator_type:{chosen.offer.gpu}"] == chosen.offer.gpu_count
    assert first["resources"]["GPU"] == chosen.offer.gpu_count
    instance_types = [t["node_config"]["InstanceType"] for t in spot_types.values()]
    assert len(instance_types) == len(set(instance_types)), "one node type per instance type"
    od = [t for k, t in types.items() if k.endswith("-on-demand")]
    assert all("InstanceMarketOptions" not in t["node_config"] and t["min_workers"] == 0 for t in od)
    assert config["max_workers"] >= sum(t.get("min_workers", 0) for t in types.values())
    watcher = [c for c in config["worker_start_ray_commands"] if "workers.preemption" in c]
    assert len(watcher) == 1 and "--gcs-address $RAY_HEAD_IP:6379" in watcher[0] and "--node-id" in watcher[0]
    assert any("pip install" in c for c in config["setup_commands"])


def test_source_dir_is_synced_and_installed(aws_plan: Plan, tmp_path: Path) -> None:
    config = cluster_config(aws_plan, ClusterOptions(source_dir=str(tmp_path), alternatives=0))
    assert config["file_mounts"] == {"~/gpuplan": str(tmp_path)}
    assert "pip install -q -e ~/gpuplan" in config["setup_commands"]
    assert len([k for k in config["available_node_types"] if k.endswith("-spot")]) == 1
    validate_config(config)


def test_non_aws_and_empty_plans_are_refused(aws_plan: Plan) -> None:
    chosen = aws_plan.chosen
    assert chosen is not None
    gcp = chosen.model_copy(update={"offer": chosen.offer.model_copy(update={"cloud": "gcp"})})
    with pytest.raises(InvalidInput, match="AWS only"):
        cluster_config(aws_plan.model_copy(update={"chosen": gcp}))
    with pytest.raises(NoFeasiblePlan):
        cluster_config(aws_plan.model_copy(update={"chosen": None}))
