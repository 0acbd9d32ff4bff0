"""The generated Ray cluster-launcher config: Ray's own validation and AWS bootstrap accept it (against
moto's server), and Ray's own node-type selection, given what the executor really asks for, launches
the plan's GPU, market and zone. No cloud is contacted."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from ray._private.label_utils import validate_label_key, validate_label_value, validate_node_labels
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer, _fits, get_nodes_for
from ray.autoscaler._private.util import prepare_config, validate_config

from commands.specfile import load_spec
from errors import InvalidInput, NoFeasiblePlan
from planner.types import Plan
from tests.workers.cluster_setup import (
    ADMIN_SECRET,
    AMI_PARAMETER,
    BUCKET,
    DB_SECRET,
    EXAMPLES,
    PROFILE,
    SECRET_VALUES,
    generate,
    subnets_of,
)
from tests.workers.cluster_setup import options as _opts
from workers.cluster.config import FALLBACK_LABEL, ClusterOptions, cluster_needs, node_type_name
from workers.cluster.install import CONSTRAINTS
from workers.cluster.notes import iam_policy
from workers.executors.cluster_fit import MARKET_PREFIX, ZONE_PREFIX
from workers.executors.protocol import RunRequest
from workers.executors.ray_attempt import attempt_infeasibility, request_placement, scaling_config
from workers.executors.ray_executor import autoscaler_node_types

HEAD = {"CPU": 8.0, "node:__internal_head__": 1.0}


def _request(p: Plan, market: str, zone: str | None, cand: Any = None) -> RunRequest:
    cand = cand or p.chosen
    spec = load_spec(str(EXAMPLES / "llama3-8b-sft.yaml"))
    return RunRequest(job_id="j1", attempt=1, spec=spec, strategy=cand.estimate.strategy, checkpoint_uri="s3://b/j1",
                      run_name="j1", market=market, zone=zone)


def _bundles(request: RunRequest, node_types: Any) -> list[dict[str, float]]:
    """The placement-group bundles Ray Train asks the autoscaler for: one per worker."""
    placement = request_placement(request, [HEAD], node_types)
    per_worker = scaling_config(placement)._resources_per_worker_not_none
    return [dict(per_worker) for _ in range(placement.num_workers)]


def _ray_picks(config: dict[str, Any], bundles: list[dict[str, float]]) -> dict[str, int]:
    filled = prepare_config(copy.deepcopy(config))
    scorer = functools.partial(_default_utilization_scorer,
                               node_availability_summary=NodeAvailabilitySummary(node_availabilities={}))
    picked, unfulfilled = get_nodes_for(filled["available_node_types"], {}, "head", 100, bundles, scorer)
    assert not unfulfilled, unfulfilled
    return dict(picked)


def _ray_v2_picks(config: dict[str, Any], bundles: list[dict[str, float]]) -> dict[str, int]:
    """What autoscaler v2 (``ray up``'s default in Ray 2.60) launches for one placement group of ``bundles``."""
    from ray.autoscaler.v2.instance_manager.config import AutoscalingConfig
    from ray.autoscaler.v2.scheduler import ResourceDemandScheduler, SchedulingRequest
    from ray.autoscaler.v2.utils import ResourceRequestUtil
    from ray.core.generated.autoscaler_pb2 import GangResourceRequest

    auto = AutoscalingConfig(prepare_config(copy.deepcopy(config)), skip_content_hash=True)
    gang = GangResourceRequest(requests=[ResourceRequestUtil.make(b) for b in bundles], details="train")
    reply = ResourceDemandScheduler().schedule(SchedulingRequest(
        disable_launch_config_check=True, node_type_configs=auto.get_node_type_configs(),
        max_num_nodes=auto.get_max_num_nodes(), gang_resource_requests=[gang]))
    assert not reply.infeasible_gang_resource_requests
    picked: dict[str, int] = {}
    for launch in reply.to_launch:
        picked[launch.instance_type] = picked.get(launch.instance_type, 0) + launch.count
    return picked


def test_config_passes_ray_validation_and_bootstrap_on_moto(aws: Any, plans: dict[str, Plan],
                                                              tmp_path: Path) -> None:
    from ray.autoscaler._private.aws.config import bootstrap_aws

    for key, p in plans.items():
        config, text = generate(aws, p, _opts())
        loaded = yaml.safe_load(text)
        assert loaded == json.loads(json.dumps(config))
        validate_config(loaded)
        filled = prepare_config(copy.deepcopy(loaded))
        validate_config(filled)
        for node_type in loaded["available_node_types"].values():  # what `ray start` checks on each node
            labels = node_type.get("labels", {})
            validate_node_labels(labels)
            assert all(validate_label_key(k) is None for k in labels), labels
            for value in labels.values():
                validate_label_value(value)
        booted = bootstrap_aws(filled)  # Ray's real code: key pair, subnets, security groups, AMI check
        for name, node_type in booted["available_node_types"].items():
            node = node_type["node_config"]
            planned = config["available_node_types"][name]["node_config"]
            assert sorted(set(node["SubnetIds"])) == subnets_of(planned), key  # Ray: one entry per EFA interface
            assert node["ImageId"].startswith("ami-") and node["SecurityGroupIds"], key
            assert node["IamInstanceProfile"] == {"Name": PROFILE}, (key, name)


def test_every_planned_kind_is_launched_as_exactly_its_node_type(aws: Any, plans: dict[str, Plan],
                                                                  tmp_path: Path) -> None:
    """What the executor asks for, fed to Ray's own node-type selection, picks the planned (GPU, market,
    zone), for the chosen offer and every alternative; each bundle fits one node type only."""
    for key, p in plans.items():
        config, text = generate(aws, p, _opts())
        file = tmp_path / f"{key}.yaml"
        file.write_text(text)
        node_types = autoscaler_node_types(file)
        ec2 = boto3.client("ec2", region_name=config["provider"]["region"])
        zone_of = {s["SubnetId"]: s["AvailabilityZoneId"] for s in ec2.describe_subnets()["Subnets"]}
        for kind in cluster_needs(p, _opts()).kinds:
            assert kind.zone is not None
            expected = node_type_name(kind.instance_type, kind.market, kind.zone)
            node_type = config["available_node_types"][expected]
            assert [zone_of[s] for s in subnets_of(node_type["node_config"])] == [kind.zone]
            spot = "InstanceMarketOptions" in node_type["node_config"]
            assert spot == (kind.market == "spot"), expected
            bundles = _bundles(_request(p, kind.market, kind.zone, kind.candidate), node_types)
            fitting = [name for name, t in config["available_node_types"].items() if _fits(t["resources"], bundles[0])]
            assert fitting == [expected], (key, bundles[0])
            assert _ray_picks(config, bundles) == {expected: kind.candidate.nodes}, key
            assert _ray_v2_picks(config, bundles) == {expected: kind.candidate.nodes}, key


def test_markets_follow_the_spec(aws: Any, plans: dict[str, Plan]) -> None:
    def markets(config: dict[str, Any]) -> set[str]:
        return {k.split(":", 1)[1] for t in config["available_node_types"].values() for k in t["resources"]
                if k.startswith(MARKET_PREFIX)}

    auto, _ = generate(aws, plans["8b-auto"], _opts())
    always, _ = generate(aws, plans["8b-always"], _opts())
    never, _ = generate(aws, plans["8b-never"], _opts())
    assert markets(auto) == {"spot", "on-demand"}
    assert markets(always) == {"spot"}
    assert markets(never) == {"on-demand"}
    assert all(t.get("min_workers", 0) == 0 for t in auto["available_node_types"].values())
    # the chosen p4d in use1-az1, where the plan priced spot at $2.47/h: both markets pinned there
    chosen = plans["8b-auto"].chosen
    assert chosen is not None and chosen.offer.zone == "use1-az1" and chosen.nodes == 2
    for market in ("spot", "on-demand"):
        name = node_type_name(chosen.offer.instance_type, market, "use1-az1")
        assert auto["available_node_types"][name]["max_workers"] == 2
        assert auto["available_node_types"][name]["resources"][ZONE_PREFIX + "use1-az1"] == 8


def test_every_zone_that_offers_the_instance_type_gets_a_node_type_in_fallback_order(
        aws: Any, plans: dict[str, Plan], tmp_path: Path) -> None:
    """The 2-node p4d run, priced in use1-az1 only, may also launch in every other zone of the region that
    offers p4d (moto: az1, az2, az4, az6), on spot first and then on-demand: each type one zone and one
    placement group, ranked (``gpuplan/fallback``) priced zone first, and an attempt moved to a zone
    (RunRequest.zone) launches all its nodes in exactly that zone's type."""
    p = plans["8b-auto"]
    chosen = p.chosen
    assert chosen is not None and chosen.offer.zone == "use1-az1" and chosen.cost.market == "spot"
    config, text = generate(aws, p, _opts(alternatives=0, efa="all"))
    workers = {k: t for k, t in config["available_node_types"].items() if k != "head"}
    zones = ("use1-az1", "use1-az2", "use1-az4", "use1-az6")
    order = [node_type_name("p4d.24xlarge", m, z) for m in ("spot", "on-demand") for z in zones]
    assert sorted(workers, key=lambda k: int(workers[k]["labels"][FALLBACK_LABEL])) == order
    ec2 = boto3.client("ec2", region_name="us-east-1")
    zone_of = {s["SubnetId"]: s["AvailabilityZoneId"] for s in ec2.describe_subnets()["Subnets"]}
    groups = set()
    for name, node_type in workers.items():
        node = node_type["node_config"]
        assert [zone_of[s] for s in subnets_of(node)] == [node_type["labels"]["gpuplan/zone"]], name
        assert node_type["max_workers"] == chosen.nodes
        groups.add(node["Placement"]["GroupName"])
    assert len(groups) == len(workers)  # a placement group per type: a run never spans two zones
    (tmp_path / "c.yaml").write_text(text)
    node_types = autoscaler_node_types(tmp_path / "c.yaml")
    for market in ("spot", "on-demand"):
        for zone in zones:
            bundles = _bundles(_request(p, market, zone), node_types)
            assert _ray_v2_picks(config, bundles) == {node_type_name("p4d.24xlarge", market, zone): chosen.nodes}


def test_an_on_demand_attempt_of_a_spot_always_plan_is_infeasible(aws: Any, plans: dict[str, Plan],
                                                                   tmp_path: Path) -> None:
    p = plans["8b-always"]
    _, text = generate(aws, p, _opts())
    (tmp_path / "c.yaml").write_text(text)
    node_types = autoscaler_node_types(tmp_path / "c.yaml")
    chosen = p.chosen
    assert chosen is not None
    assert attempt_infeasibility(_request(p, "spot", chosen.offer.zone), [HEAD], node_types) is None
    reason = attempt_infeasibility(_request(p, "on-demand", chosen.offer.zone), [HEAD], node_types)
    assert reason is not None and "gpuplan-market:on-demand" in reason
    # without the autoscaler's node types, a job submitted before workers join could never run
    assert attempt_infeasibility(_request(p, "spot", chosen.offer.zone), [HEAD]) is not None


def test_install_setup_and_start_commands(aws: Any, plans: dict[str, Plan], tmp_path: Path) -> None:
    config, _ = generate(aws, plans["8b-auto"], _opts(database_url="postgresql://u@db/gpuplan"))
    setup = " ; ".join(config["setup_commands"])
    assert "pip install gpuplan" not in setup and "ray[default,train]==2.60.0" in setup
    assert config["file_mounts"] == {"~/gpuplan-dist/gpuplan-0.1.0-py3-none-any.whl":
                                     "dist/gpuplan-0.1.0-py3-none-any.whl",
                                     "~/gpuplan-dist/constraints.txt": str(CONSTRAINTS)}
    server = config["head_start_ray_commands"][-1]
    assert "gpuplan server" in server and f"--checkpoint-root s3://{BUCKET}/runs" in server
    assert "--ray-cluster-config" in server and "GPUPLAN_DATABASE_URL=postgresql://u@db/gpuplan" in server
    assert "Restart=always" in server
    watcher = config["worker_start_ray_commands"][-1]
    assert "workers.cluster.config watch --gcs-address $RAY_HEAD_IP:6379" in watcher and "Restart=always" in watcher
    source, _ = generate(aws, plans["8b-auto"], _opts(wheel=None, source_dir=str(tmp_path)))
    assert source["file_mounts"] == {"~/gpuplan": str(tmp_path), "~/gpuplan-dist/constraints.txt": str(CONSTRAINTS)}
    with pytest.raises(InvalidInput, match="not published"):
        generate(aws, plans["8b-auto"], _opts(wheel=None))


def test_secrets_are_named_in_the_yaml_never_their_values(aws: Any, plans: dict[str, Plan]) -> None:
    """The admin token and the database URL: the head reads them from Secrets Manager / SSM (names in the YAML),
    the nodes' role may read those two and nothing else, and a password in --database-url is refused."""
    opts = _opts(admin_token_secret=ADMIN_SECRET, database_url_secret=DB_SECRET)
    config, text = generate(aws, plans["8b-auto"], opts)
    assert all(value not in text for value in SECRET_VALUES.values())
    server = config["head_start_ray_commands"][-1]
    assert (f"scheduler.head --region us-east-1 --admin-token-secret {ADMIN_SECRET} --database-url-secret {DB_SECRET}"
            " --" in server)
    assert "GPUPLAN_DATABASE_URL" not in server and "--backup" not in server  # PostgreSQL: no SQLite to keep
    reads = [s for s in iam_policy(opts, "123456789012")["Statement"]
             if "secretsmanager" in str(s["Action"]) or "ssm" in str(s["Action"])]
    assert reads == [
        {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
         "Resource": f"arn:aws:secretsmanager:*:123456789012:secret:{ADMIN_SECRET}-??????"},
        {"Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": "arn:aws:ssm:*:123456789012:parameter/gpuplan/database-url"}]
    assert not [s for s in iam_policy(_opts())["Statement"] if "secret" in str(s) or "ssm" in str(s)]
    with pytest.raises(InvalidInput, match="password") as err:
        generate(aws, plans["8b-auto"], _opts(database_url="postgresql://u:hunter2@db/gpuplan"))
    assert "--database-url-secret" in str(err.value.hint)
    with pytest.raises(InvalidInput, match="gpuplan/nope' does not exist in us-east-1"):
        generate(aws, plans["8b-auto"], _opts(admin_token_secret="gpuplan/nope"))
    with pytest.raises(InvalidInput, match="not the name of a secret"):
        generate(aws, plans["8b-auto"], _opts(database_url_secret="postgresql://u:pw@db/x"))
    # no database URL: the SQLite file is restored from and backed up to the checkpoint root
    plain, text = generate(aws, plans["8b-auto"], _opts())
    assert (f"--backup s3://{BUCKET}/runs/_server/gpuplan.db --db /home/ubuntu/.gpuplan/gpuplan.db --every 300"
            in plain["head_start_ray_commands"][-1])
    assert "cat ~/.gpuplan/admin-token" in text


def test_bad_input_is_refused_before_any_yaml(aws: Any, plans: dict[str, Plan]) -> None:
    p = plans["70b"]
    with pytest.raises(InvalidInput, match="region eu-north-1 has no GPU AMI"):
        generate(aws, p, _opts(ami_parameters=ClusterOptions().ami_parameters))  # AWS's names: none in moto
    with pytest.raises(InvalidInput, match="does not exist"):
        generate(aws, p, _opts(checkpoint_root="s3://no-such-gpuplan-bucket/x"))
    with pytest.raises(InvalidInput, match="ami-0000000000000000f does not exist in eu-north-1"):
        generate(aws, p, _opts(ami="ami-0000000000000000f"))
    with pytest.raises(InvalidInput, match="instance profile 'nobody'"):
        generate(aws, p, _opts(instance_profile="nobody"))
    chosen = p.chosen
    assert chosen is not None
    moved = chosen.model_copy(update={"offer": chosen.offer.model_copy(update={"zone": "eun1-az9"})})
    with pytest.raises(InvalidInput, match=r"zone eun1-az9 .* has no usable subnet"):
        generate(aws, p.model_copy(update={"chosen": moved}), _opts())
    gcp = chosen.model_copy(update={"offer": chosen.offer.model_copy(update={"cloud": "gcp"})})
    with pytest.raises(InvalidInput, match="AWS only"):
        generate(aws, p.model_copy(update={"chosen": gcp}), _opts())
    with pytest.raises(NoFeasiblePlan):
        generate(aws, p.model_copy(update={"chosen": None}), _opts())


def test_explicit_subnet_and_ami(aws: Any, plans: dict[str, Plan]) -> None:
    p = plans["8b-auto"]
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24", AvailabilityZoneId="use1-az1")["Subnet"]
    image = boto3.client("ssm", region_name="us-east-1").get_parameter(Name=AMI_PARAMETER)["Parameter"]["Value"]
    config, text = generate(aws, p, _opts(ami=image, subnets={"use1-az1": subnet["SubnetId"]}, alternatives=0))
    chosen = p.chosen
    assert chosen is not None
    name = node_type_name(chosen.offer.instance_type, "spot", "use1-az1")
    assert subnets_of(config["available_node_types"][name]["node_config"]) == [subnet["SubnetId"]]
    assert f"{image} (--ami" in text
    with pytest.raises(InvalidInput, match="is in zone"):
        generate(aws, p, _opts(subnets={"use1-az2": subnet["SubnetId"]}))


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body + "\n")
    path.chmod(0o755)


def test_setup_and_start_commands_survive_rays_ssh_wrapping(aws: Any, plans: dict[str, Plan], tmp_path: Path) -> None:
    """Each command as Ray's updater sends it (RAY_HEAD_IP and resource exports, then `bash --login -c -i
    'source ~/.bashrc; ... (cmd)'`), run by bash as sshd would, with recording stubs for the programs."""
    import subprocess

    from ray.autoscaler._private.command_runner import _with_environment_variables, _with_interactive
    from ray.autoscaler._private.util import with_head_node_ip

    config, _ = generate(aws, plans["8b-auto"], _opts(admin_token_secret=ADMIN_SECRET, database_url_secret=DB_SECRET))
    home, stubs = tmp_path / "home", tmp_path / "bin"
    venv = home / "gpuplan-venv" / "bin"
    for folder in (home, stubs, venv):
        folder.mkdir(parents=True)
    # Ubuntu's ~/.bashrc stops early in a non-interactive shell: the venv line must come before that. (The
    # stubs stand in for the system's programs; a login shell's /etc/profile resets PATH, so they go here.)
    (home / ".bashrc").write_text(f"export PATH={stubs}:$PATH\ncase $- in *i*) ;; *) return;; esac\n")
    record = 'printf "%s\\n" "--- $(basename $0)" "$@" >> "$HOME/calls"'
    for name in ("apt-get", "systemctl", "systemd-run", "aws"):
        _stub(stubs / name, record)
    _stub(stubs / "sudo", 'exec "$@"')
    for name in ("python", "pip", "ray"):
        _stub(venv / name, record)
    env = {"HOME": str(home), "PATH": f"{stubs}:/usr/bin:/bin"}
    commands = config["setup_commands"] + config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    for cmd in commands:
        wrapped = with_head_node_ip([cmd], "10.0.0.7")[0]
        wrapped = _with_environment_variables(wrapped, {"RAY_OVERRIDE_RESOURCES": {"CPU": 8}})
        remote = " ".join(_with_interactive(wrapped))  # ssh hands the remote shell one string
        done = subprocess.run(["bash", "-c", remote], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (cmd, done.stderr)
    calls = [block.strip().split("\n") for block in (home / "calls").read_text().split("--- ")[1:]]
    ray_calls = [c[1:] for c in calls if c[0] == "ray"]
    assert ray_calls[:2] == [["stop"], ["start", "--head", "--port=6379", "--object-manager-port=8076",
                                        "--autoscaling-config=~/ray_bootstrap_config.yaml", "--dashboard-host=0.0.0.0"]]
    assert ["start", "--address=10.0.0.7:6379", "--object-manager-port=8076"] in ray_calls  # the venv's ray, via PATH
    runs = {c[2]: c[1:] for c in calls if c[0] == "systemd-run"}
    assert runs["gpuplan-server"][-22:] == [
        "/home/ubuntu/gpuplan-venv/bin/python", "-m", "scheduler.head", "--region", "us-east-1",
        "--admin-token-secret", ADMIN_SECRET,
        "--database-url-secret", DB_SECRET, "--", "/home/ubuntu/gpuplan-venv/bin/gpuplan", "server",
        "--executor", "ray", "--host", "0.0.0.0", "--port", "8000", "--ray-cluster-config",
        "/home/ubuntu/ray_bootstrap_config.yaml", "--checkpoint-root", f"s3://{BUCKET}/runs"]
    assert runs["gpuplan-preemption"][-6:] == ["/home/ubuntu/gpuplan-venv/bin/python", "-m", "workers.cluster.config",
                                               "watch", "--gcs-address", "10.0.0.7:6379"]
    assert runs["gpuplan-server"][:8] == ["--unit", "gpuplan-server", "--uid", "ubuntu", "-p", "Restart=always", "-p",
                                          "RestartSec=5"]
    assert "--setenv=AWS_DEFAULT_REGION=us-east-1" in runs["gpuplan-server"]  # the bucket's region
    assert (home / ".bashrc").read_text().splitlines()[:2] == [
        "export AWS_DEFAULT_REGION=us-east-1", "export PATH=$HOME/gpuplan-venv/bin:$PATH"]
    pip = [c[1:] for c in calls if c[0] == "pip"]
    assert ["install", "-q", "--no-index", "--find-links", f"{home}/gpuplan-wheels", "-c",
            f"{home}/gpuplan-dist/constraints.txt", "ray[default,train]==2.60.0",
            f"{home}/gpuplan-dist/gpuplan-0.1.0-py3-none-any.whl"] in pip
