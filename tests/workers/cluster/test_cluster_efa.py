"""Multi-node worker types with EFA: their interfaces and cluster placement group as Ray's AWS provider
requires them (checked by Ray's bootstrap and launch code against moto's server), the link speed each
type provides and the head's server plans with, and offers the catalog prices per region, not zone."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config

from catalog.loader import load_catalog
from commands.specfile import load_spec
from errors import InvalidInput
from planner.calibration import load_calibration
from planner.search import plan
from planner.types import Plan
from tests.workers.cluster_setup import EXAMPLES, PLACEMENT_GROUPS, generate, options, subnets_of
from workers.cluster.aws import generate as generate_uncached
from workers.cluster.aws_net import Ec2PlacementGroups
from workers.cluster.config import cluster_needs, node_type_name
from workers.cluster.net import NETWORK_LABEL, link_speeds, network_facts, provided_gbps, with_link_speeds
from workers.executors.cluster_fit import ZONE_PREFIX
from workers.executors.protocol import RunRequest
from workers.executors.ray_attempt import attempt_infeasibility
from workers.executors.ray_executor import autoscaler_node_types

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

HEAD = {"CPU": 8.0, "node:__internal_head__": 1.0}


def _worker_types(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}


def test_multi_node_types_get_efa_and_a_cluster_placement_group(aws: Any, plans: dict[str, Plan]) -> None:
    """--efa all: the 2-node p4d run gets 4 EFA interfaces (one per network card) in its priced zone's subnet
    and the cluster's security group, and a cluster placement group; single-node types keep a plain one."""
    p = plans["8b-auto"]
    opts = options(efa="all")
    config, text = generate(aws, p, opts)
    ec2 = boto3.client("ec2", region_name="us-east-1")
    zone_of = {s["SubnetId"]: s["AvailabilityZoneId"] for s in ec2.describe_subnets()["Subnets"]}
    needs = cluster_needs(p, opts)
    efa_types = 0
    for kind in needs.kinds:
        assert kind.zone is not None
        node_type = config["available_node_types"][node_type_name(kind.instance_type, kind.market, kind.zone)]
        node = node_type["node_config"]
        if kind.candidate.nodes == 1:
            assert "NetworkInterfaces" not in node and "Placement" not in node
            continue
        efa_types += 1
        assert kind.instance_type == "p4d.24xlarge" and "SubnetIds" not in node and "SecurityGroupIds" not in node
        interfaces = node["NetworkInterfaces"]
        assert [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in interfaces] == [
            (0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
        assert {zone_of[i["SubnetId"]] for i in interfaces} == {kind.zone}
        group = interfaces[0]["Groups"]
        assert all(i["Groups"] == group for i in interfaces)
        assert node["Placement"]["GroupName"] in PLACEMENT_GROUPS.groups
        assert node_type["labels"][NETWORK_LABEL] == "400"  # EFA on every card: what the plan assumed
    # every two-node type (the chosen p4d in both markets, and the pinned plan's alternatives, p4d in other zones)
    assert efa_types == sum(1 for kind in needs.kinds if kind.candidate.nodes > 1) >= 2
    assert "p4d.24xlarge gets 4 EFA interface(s)" in text and "NAT gateway" in text
    # the group: what EFA needs (all traffic within it, both ways) and what Ray's default group has (SSH)
    sg = ec2.describe_security_groups(GroupIds=group)["SecurityGroups"][0]
    assert sg["GroupName"] == f"ray-autoscaler-{needs.cluster_name}"
    assert any(r["IpProtocol"] == "-1" and r["UserIdGroupPairs"][0]["GroupId"] == group[0] for r in sg["IpPermissions"])
    assert any(r["IpProtocol"] == "-1" and any(g["GroupId"] == group[0] for g in r["UserIdGroupPairs"])
               for r in sg["IpPermissionsEgress"])
    assert any(r.get("FromPort") == 22 for r in sg["IpPermissions"])
    # run again: the same group and placement groups are found, not made twice
    _, again = generate_uncached(p, opts, aws, PLACEMENT_GROUPS)
    assert f"{group[0]} (found" in again and "placement group" in again and ": found" in again


def test_rays_bootstrap_puts_every_node_in_the_group_and_launches_an_efa_node(aws: Any, plans: dict[str, Plan]) -> None:
    """Ray's bootstrap copies the interfaces' subnet and group up and reuses the group (same name) for the
    head and the plain types; Ray's provider then launches an EFA node on moto with it."""
    from ray.autoscaler._private.aws.config import bootstrap_aws
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider
    from ray.autoscaler.tags import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    config, _ = generate(aws, plans["8b-auto"], options(efa="all"))
    booted = bootstrap_aws(prepare_config(copy.deepcopy(config)))
    groups = {frozenset(t["node_config"]["SecurityGroupIds"]) for t in booted["available_node_types"].values()}
    assert len(groups) == 1  # head, EFA and plain types: one group, all traffic within it
    name = next(n for n, t in config["available_node_types"].items() if "NetworkInterfaces" in t["node_config"])
    node_config = booted["available_node_types"][name]["node_config"]
    assert sorted(set(node_config["SubnetIds"])) == subnets_of(config["available_node_types"][name]["node_config"])
    provider = AWSNodeProvider(booted["provider"], booted["cluster_name"])
    provider.create_node(copy.deepcopy(node_config), {TAG_RAY_NODE_KIND: "worker", TAG_RAY_USER_NODE_TYPE: name}, 2)
    ec2 = boto3.client("ec2", region_name="us-east-1")
    launched = [i for r in ec2.describe_instances(Filters=[
        {"Name": f"tag:{TAG_RAY_USER_NODE_TYPE}", "Values": [name]}])["Reservations"] for i in r["Instances"]]
    assert launched  # Ray asks for MinCount 1, MaxCount 2; moto launches the minimum
    for instance in launched:
        assert instance["InstanceType"] == "p4d.24xlarge" and instance["SubnetId"] == node_config["SubnetIds"][0]
        # moto keeps the interfaces' groups and subnet (not their EFA type, nor the placement group)
        assert {g["GroupId"] for n in instance["NetworkInterfaces"] for g in n["Groups"]} == set(
            node_config["SecurityGroupIds"])


def test_without_efa_the_head_plans_with_one_interfaces_speed(aws: Any, plans: dict[str, Plan], tmp_path: Path) -> None:
    """--efa off: the p4d types say they provide 100 Gbit/s (one network card), the header says so, and the
    catalog the head's server plans with (``with_link_speeds``) holds that speed: the run is estimated slower."""
    p = plans["8b-auto"]
    config, text = generate(aws, p, options(efa="off"))
    p4d = [t for t in _worker_types(config).values() if t["node_config"]["InstanceType"] == "p4d.24xlarge"]
    assert p4d and all("NetworkInterfaces" not in t["node_config"] for t in p4d)
    assert {t["labels"][NETWORK_LABEL] for t in p4d} == {"100"}
    assert "p4d.24xlarge: 2 nodes, 100 Gbit/s (the plan: 400)" in text
    file = tmp_path / "cluster.yaml"
    file.write_text(text)
    shipped = load_catalog()
    cluster = with_link_speeds(shipped, file)
    assert {o.network_gbps for o in cluster.offers if o.instance_type == "p4d.24xlarge"} == {100.0}
    in_cluster = link_speeds(config)
    assert in_cluster == {"p4d.24xlarge": 100}  # the single-node p6-b200 types say nothing about a multi-node run
    assert all(a == b for a, b in zip(shipped.offers, cluster.offers, strict=True) if a.instance_type not in in_cluster)
    spec = load_spec(str(EXAMPLES / "llama3-8b-sft.yaml"))

    def two_node_p4d(catalog: Any) -> float:
        got = plan(spec, catalog, calibration=CAL)
        return min(c.estimate.hours for c in got.candidates
                   if c.offer.instance_type == "p4d.24xlarge" and c.nodes == 2 and c.offer.zone == "use1-az1")

    assert two_node_p4d(cluster) > two_node_p4d(shipped)
    with pytest.raises(InvalidInput, match="cannot read the Ray cluster config"):
        with_link_speeds(shipped, tmp_path / "missing.yaml")
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump({"available_node_types": {}}))
    assert with_link_speeds(shipped, tmp_path / "plain.yaml") is shipped  # not a gpuplan cluster: as shipped


def test_auto_gives_every_card_behind_a_nat_gateway_and_one_public_interface_elsewhere(
        aws: Any, plans: dict[str, Plan]) -> None:
    """--efa auto (the default): the default VPC's subnets route to an internet gateway, where a node with
    several interfaces gets no public IP and could not install: one EFA interface, with a public IP, at one
    card's speed. A subnet whose default route goes to a NAT gateway gets an interface per card, and the head
    then goes to the zone's public subnet."""
    p = plans["8b-auto"]
    chosen = p.chosen
    assert chosen is not None
    name = node_type_name("p4d.24xlarge", "spot", "use1-az1")
    public, text = generate(aws, p, options())
    interfaces = public["available_node_types"][name]["node_config"]["NetworkInterfaces"]
    assert [(i["NetworkCardIndex"], i["InterfaceType"], i.get("AssociatePublicIpAddress")) for i in interfaces] == [
        (0, "efa", True)]
    assert public["available_node_types"][name]["labels"][NETWORK_LABEL] == "100"
    assert "p4d.24xlarge: 2 nodes, 100 Gbit/s (the plan: 400), one EFA interface" in text
    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.7.0.0/16")["Vpc"]["VpcId"]
    outside = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.0.0/24", AvailabilityZoneId="use1-az1")["Subnet"]
    private = ec2.create_subnet(VpcId=vpc, CidrBlock="10.7.1.0/24", AvailabilityZoneId="use1-az1")["Subnet"]
    ec2.modify_subnet_attribute(SubnetId=outside["SubnetId"], MapPublicIpOnLaunch={"Value": True})
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc)
    public_table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=public_table, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    ec2.associate_route_table(RouteTableId=public_table, SubnetId=outside["SubnetId"])
    nat = ec2.create_nat_gateway(SubnetId=outside["SubnetId"])["NatGateway"]["NatGatewayId"]
    table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", NatGatewayId=nat)
    ec2.associate_route_table(RouteTableId=table, SubnetId=private["SubnetId"])
    behind = options(subnets={"use1-az1": private["SubnetId"]}, alternatives=0)
    with pytest.raises(InvalidInput, match="does not map public IPs, so Ray's bootstrap refuses it"):
        generate_uncached(p, behind, aws, PLACEMENT_GROUPS)
    ec2.modify_subnet_attribute(SubnetId=private["SubnetId"], MapPublicIpOnLaunch={"Value": True})
    behind_nat, text = generate(aws, p, behind)
    node_type = behind_nat["available_node_types"][name]
    assert len(node_type["node_config"]["NetworkInterfaces"]) == 4
    assert not any("AssociatePublicIpAddress" in i for i in node_type["node_config"]["NetworkInterfaces"])
    assert node_type["labels"][NETWORK_LABEL] == "400" and "the plan: 400" not in text
    head = behind_nat["available_node_types"]["head"]["node_config"]
    assert head["SubnetIds"] == [outside["SubnetId"]]  # the head stays reachable: the zone's public subnet
    from ray.autoscaler._private.aws.config import bootstrap_aws

    booted = bootstrap_aws(prepare_config(copy.deepcopy(behind_nat)))  # Ray takes both subnets
    assert booted["available_node_types"][name]["node_config"]["SubnetIds"][0] == private["SubnetId"]
    with pytest.raises(InvalidInput, match="--efa 'most' is not one of auto, all, one, off"):
        generate(aws, p, options(efa="most"))


def test_network_facts_from_ec2s_instance_types(aws: Any) -> None:
    """moto serves EC2's own instance-type data: p4d has 4 EFA cards of 100 Gbit/s, p5 32, g5 no EFA."""
    ec2 = boto3.client("ec2", region_name="us-east-1")
    found = {t["InstanceType"]: network_facts(t) for t in ec2.describe_instance_types(
        InstanceTypes=["p4d.24xlarge", "p5.48xlarge", "g5.xlarge"])["InstanceTypes"]}
    assert (found["p4d.24xlarge"].efa_interfaces, found["p4d.24xlarge"].network_cards) == (4, 4)
    assert found["p4d.24xlarge"].primary_gbps == 100.0
    assert (found["p5.48xlarge"].efa_interfaces, found["p5.48xlarge"].network_cards) == (32, 32)
    assert found["g5.xlarge"].efa_interfaces == 0
    assert provided_gbps(400, 4, found["p4d.24xlarge"]) == 400
    assert provided_gbps(400, 2, found["p4d.24xlarge"]) == 200
    assert provided_gbps(400, 0, found["p4d.24xlarge"]) == 100
    assert provided_gbps(10, 0, found["g5.xlarge"]) == 10  # one card: the catalog's speed is that card's


def test_ec2_placement_groups_send_requests_ec2_accepts() -> None:
    """moto has no placement-group API; botocore's Stubber checks each request against EC2's own model."""
    import botocore.session
    from botocore.stub import Stubber

    ec2 = botocore.session.get_session().create_client(
        "ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    groups = Ec2PlacementGroups(ec2, "c1")
    describe = {"Filters": [{"Name": "group-name", "Values": ["c1-p4d"]}]}
    with Stubber(ec2) as stub:
        stub.add_response("describe_placement_groups", {"PlacementGroups": []}, describe)
        stub.add_response("create_placement_group", {}, {"GroupName": "c1-p4d", "Strategy": "cluster",
                          "TagSpecifications": [{"ResourceType": "placement-group",
                                                 "Tags": [{"Key": "ray-cluster-name", "Value": "c1"}]}]})
        assert groups.ensure_cluster("c1-p4d") == "created"
        stub.add_response("describe_placement_groups",
                          {"PlacementGroups": [{"GroupName": "c1-p4d", "Strategy": "cluster"}]}, describe)
        assert groups.ensure_cluster("c1-p4d") == "found"
        stub.add_response("describe_placement_groups",
                          {"PlacementGroups": [{"GroupName": "c1-p4d", "Strategy": "spread"}]}, describe)
        with pytest.raises(InvalidInput, match="strategy 'spread'"):
            groups.ensure_cluster("c1-p4d")
        stub.assert_no_pending_responses()


def _regional(p: Plan, **offer: Any) -> Plan:
    chosen = p.chosen
    assert chosen is not None
    moved = chosen.model_copy(update={"offer": chosen.offer.model_copy(update={"zone": None, **offer})})
    return p.model_copy(update={"chosen": moved, "candidates": [moved]})


def test_a_regional_offer_gets_the_first_zone_that_offers_it(aws: Any, plans: dict[str, Plan], tmp_path: Path) -> None:
    """An offer priced per region (no zone): its node type goes to the first zone id that offers the instance
    type and has a subnet, and a run that names no zone launches there."""
    p = _regional(plans["8b-auto"])
    config, text = generate(aws, p, options(alternatives=0))
    assert list(_worker_types(config)) == [node_type_name("p4d.24xlarge", "spot", z)
                                           for z in ("use1-az1", "use1-az2", "use1-az4", "use1-az6")]
    node_type = next(iter(_worker_types(config).values()))
    assert node_type["resources"][ZONE_PREFIX + "use1-az1"] == 8 and node_type["labels"]["gpuplan/fallback"] == "0"
    (tmp_path / "c.yaml").write_text(text)
    chosen = p.chosen
    assert chosen is not None
    request = RunRequest(job_id="j", attempt=1, spec=load_spec(str(EXAMPLES / "llama3-8b-sft.yaml")),
                         strategy=chosen.estimate.strategy, checkpoint_uri="s3://b/j", run_name="j", market="spot")
    assert attempt_infeasibility(request, [HEAD], autoscaler_node_types(tmp_path / "c.yaml")) is None


def test_a_regional_offer_no_zone_offers_is_refused(aws: Any, plans: dict[str, Plan]) -> None:
    p = _regional(plans["70b"], instance_type="p4de.24xlarge")  # moto: no zone of eu-north-1 offers it
    with pytest.raises(InvalidInput, match=r"no zone of eu-north-1 with a usable subnet offers p4de\.24xlarge"):
        generate(aws, p, options(alternatives=0))


def test_no_right_to_make_placement_groups_is_a_clear_error(aws: Any, plans: dict[str, Plan]) -> None:
    from botocore.exceptions import ClientError

    class Denied:
        def ensure_cluster(self, name: str) -> str:
            raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "not allowed"}},
                              "CreatePlacementGroup")

    with pytest.raises(InvalidInput, match="ec2:CreatePlacementGroup") as err:
        generate_uncached(plans["8b-auto"], options(efa="all"), aws, Denied())
    assert "--efa off" in str(err.value.hint)


def _nccl_env(node_type: dict[str, Any], home: Path) -> dict[str, str]:
    """What a worker of ``node_type`` sees after its setup: run its commands, then a shell as Ray's."""
    import subprocess

    home.mkdir()
    (home / ".bashrc").write_text("case $- in *i*) ;; *) return;; esac\n")  # Ubuntu's: stops when not interactive
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}
    for cmd in node_type["worker_setup_commands"]:
        subprocess.run(["bash", "-c", cmd], env=env, check=True, timeout=30)
    out = subprocess.run(["bash", "-c", "source ~/.bashrc; env"], env=env, check=True, capture_output=True, text=True,
                         timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_efa_worker_types_get_the_environment_for_nccl_over_efa(aws: Any, plans: dict[str, Plan],
                                                                 tmp_path: Path) -> None:
    """pip torch's NCCL loads aws-ofi-nccl only when told where: an EFA type's workers get the DLAMI's
    plugin and libfabric folders, the EFA provider and RDMA; every multi-node type logs NCCL's choice per process
    and states its TCP link speed; without EFA (--efa off) none of the EFA variables."""
    p = plans["8b-auto"]
    chosen = p.chosen
    assert chosen is not None
    name = node_type_name(chosen.offer.instance_type, "spot", "use1-az1")
    efa, _ = generate(aws, p, options(efa="all"))
    env = _nccl_env(efa["available_node_types"][name], tmp_path / "efa")
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["LD_LIBRARY_PATH"].split(":")[:3] == ["/opt/amazon/ofi-nccl/lib", "/opt/aws-ofi-nccl/lib",
                                                     "/opt/amazon/efa/lib"]
    assert env["LD_LIBRARY_PATH"].endswith(":/usr/local/cuda/lib64")  # what the node had stays
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"] == "/tmp/gpuplan-nccl.%h.%p.log"
    assert float(env["GPUPLAN_EFA_GBPS"]) == chosen.offer.network_gbps  # all cards: what the plan priced
    assert 0 < float(env["GPUPLAN_SOCKET_GBPS"]) < chosen.offer.network_gbps
    off, _ = generate(aws, p, options(efa="off"))
    plain = _nccl_env(off["available_node_types"][name], tmp_path / "off")
    assert "FI_PROVIDER" not in plain and "GPUPLAN_EFA_GBPS" not in plain and plain["NCCL_DEBUG"] == "INFO"
    single = [t for t in _worker_types(efa).values() if t["max_workers"] == 1]
    assert all("worker_setup_commands" not in t for t in single)  # one node: no network to log
