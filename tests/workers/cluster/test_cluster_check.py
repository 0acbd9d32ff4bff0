"""`gpuplan cluster check` against moto's server as the account: each prerequisite a launch needs is ok,
or an item saying what to do; where moto has no answer (EC2's quotas) the item says it could not check."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from planner.types import Plan
from tests.workers.cluster_setup import BUCKET, PROFILE, options
from workers.cluster.check import FIX, OK, SPOT_ROLE, UNKNOWN, WARN, Item, check_account, vcpu_needs
from workers.cluster.notes import iam_policy

P_SPOT, P_ON_DEMAND, STANDARD_ON_DEMAND = "L-7212CCBC", "L-417A185B", "L-1216C47A"


def _by_name(items: list[Item]) -> dict[str, Item]:
    return {item.name: item for item in items}


@pytest.fixture
def ready(aws: Any) -> Iterator[Any]:
    """The account of ``aws`` with what a fresh one lacks: the spot service-linked role and the nodes' policy."""
    iam = aws.client("iam")
    iam.create_role(RoleName=SPOT_ROLE, Path="/aws-service-role/spot.amazonaws.com/",
                    AssumeRolePolicyDocument=json.dumps({"Statement": []}))
    iam.put_role_policy(RoleName=PROFILE, PolicyName="gpuplan", PolicyDocument=json.dumps(iam_policy(options())))
    yield aws
    iam.delete_role_policy(RoleName=PROFILE, PolicyName="gpuplan")
    iam.delete_role(RoleName=SPOT_ROLE)


@pytest.fixture
def quotas(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """EC2's vCPU quotas served by moto's service-quotas (which answers only for vpc): code -> value."""
    from moto.servicequotas.models import ServiceQuotasBackend

    values: dict[str, float] = {}
    original = ServiceQuotasBackend.get_service_quota

    def get(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        if service_code == "ec2" and quota_code in values:
            return {"ServiceCode": "ec2", "QuotaCode": quota_code, "QuotaName": quota_code, "Value": values[quota_code]}
        return original(self, service_code, quota_code)

    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", get)
    return values


def test_a_ready_account_passes_and_unknown_quotas_say_why(ready: Any, plans: dict[str, Plan]) -> None:
    items = _by_name(check_account(plans["8b-auto"], options(), ready))
    for name in ("credentials and region", "instance types", "GPU AMI", "spot service-linked role", "subnets",
                 "instance profile", "checkpoint bucket"):
        assert items[name].status == OK, items[name]
    assert "us-east-1" in items["credentials and region"].detail
    quota_items = [item for item in items.values() if item.name.startswith("vCPU quota")]
    assert {item.name for item in quota_items} == {"vCPU quota P spot", "vCPU quota P on-demand",
                                                   "vCPU quota Standard (A, C, D, H, I, M, R, T, Z) on-demand"}
    assert all(item.status == UNKNOWN and "NoSuchResource" in item.detail for item in quota_items)  # moto: vpc only
    assert not any(k.startswith(".gpuplan-check") for k in _keys(ready))  # the probe object is gone


def _keys(session: Any) -> list[str]:
    listed = session.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="runs/")
    return [o["Key"].split("/")[-1] for o in listed.get("Contents", [])]


def test_a_fresh_account_lacks_the_spot_role_and_the_policy(aws: Any, plans: dict[str, Plan]) -> None:
    items = _by_name(check_account(plans["8b-auto"], options(), aws))
    assert items["spot service-linked role"].status == FIX
    assert "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com" in items[
        "spot service-linked role"].detail
    assert items["instance profile"].status == FIX and "s3:ListBucket" in items["instance profile"].detail
    # an on-demand-only plan needs no spot role
    assert _by_name(check_account(plans["8b-never"], options(), aws))["spot service-linked role"].status == OK


def test_the_issues_policy_is_refused(ready: Any, plans: dict[str, Plan]) -> None:
    """A role whose ListBucket holds only under an s3:prefix condition (the policy of issue 43) lacks the
    bucket listing every store starts with."""
    iam = ready.client("iam")
    old = iam_policy(options())
    for statement in old["Statement"]:
        if statement["Action"] == "s3:ListBucket":
            statement["Condition"] = {"StringLike": {"s3:prefix": ["runs/*", "runs"]}}
    iam.put_role_policy(RoleName=PROFILE, PolicyName="gpuplan", PolicyDocument=json.dumps(old))
    item = _by_name(check_account(plans["8b-auto"], options(), ready))["instance profile"]
    assert item.status == FIX and "arn:aws:s3:::gpuplan-test-ckpt" in item.detail


def test_quotas_against_the_plans_largest_node_type(ready: Any, plans: dict[str, Plan],
                                                    quotas: dict[str, float]) -> None:
    p = plans["8b-auto"]  # 2 x p4d.24xlarge (96 vCPUs each) on spot and on-demand, an m5.2xlarge head (8)
    quotas.update({P_SPOT: 0.0, P_ON_DEMAND: 192.0, STANDARD_ON_DEMAND: 5.0})
    items = _by_name(check_account(p, options(), ready))
    spot = items["vCPU quota P spot"]
    assert spot.status == FIX and "needs 192" in spot.detail and f"--quota-code {P_SPOT}" in spot.detail
    assert "--desired-value 192" in spot.detail
    assert items["vCPU quota P on-demand"].status == OK
    assert items["vCPU quota Standard (A, C, D, H, I, M, R, T, Z) on-demand"].status == FIX  # 5 < the head's 8


def test_vcpu_needs_are_per_family_and_market() -> None:
    from tests.workers.cluster_setup import example_plan
    from workers.cluster.config import cluster_needs

    p = example_plan("llama3-8b-sft.yaml", clouds=["aws"], accelerators=["A100-40GB:16"], regions=["us-east-1"])
    needs = cluster_needs(p, options())
    got = vcpu_needs(needs, {"p4d.24xlarge": 96, "m5.2xlarge": 8})
    assert got[("P", "spot")] == (192, "2 x p4d.24xlarge")
    assert got[("Standard (A, C, D, H, I, M, R, T, Z)", "on-demand")] == (8, "1 x m5.2xlarge")


def test_missing_subnet_ami_and_bucket_are_items_to_fix(ready: Any, plans: dict[str, Plan]) -> None:
    p = plans["8b-auto"]
    items = _by_name(check_account(p, options(subnets={"use1-az1": "subnet-0nope"}, ami="ami-0nope",
                                                      checkpoint_root="s3://no-such-bucket-gpuplan/x"), ready))
    assert items["subnets"].status == FIX and "subnet-0nope" in items["subnets"].detail
    assert items["GPU AMI"].status == FIX and "ami-0nope" in items["GPU AMI"].detail
    assert items["checkpoint bucket"].status == FIX and "does not exist" in items["checkpoint bucket"].detail


def test_a_bucket_in_another_region_is_a_warning(ready: Any, plans: dict[str, Plan]) -> None:
    s3 = boto3.client("s3", region_name="eu-north-1")
    s3.create_bucket(Bucket="gpuplan-test-far", CreateBucketConfiguration={"LocationConstraint": "eu-north-1"})
    items = check_account(plans["8b-auto"], options(checkpoint_root="s3://gpuplan-test-far/runs"), ready)
    far = _by_name(items)["bucket region"]
    assert far.status == WARN and "eu-north-1" in far.detail and "us-east-1" in far.detail


def test_efa_all_needs_a_nat_subnet(ready: Any, plans: dict[str, Plan]) -> None:
    items = _by_name(check_account(plans["8b-auto"], options(efa="all"), ready))
    assert items["EFA subnets"].status == FIX and "NAT" in items["EFA subnets"].detail
    assert _by_name(check_account(plans["8b-auto"], options(efa="auto"), ready))["EFA subnets"].status == WARN


def test_config_warns_of_a_bucket_in_another_region(ready: Any, plans: dict[str, Plan]) -> None:
    from tests.workers.cluster_setup import generate

    s3 = boto3.client("s3", region_name="eu-north-1")
    s3.create_bucket(Bucket="gpuplan-test-far2", CreateBucketConfiguration={"LocationConstraint": "eu-north-1"})
    _, text = generate(ready, plans["8b-auto"], options(checkpoint_root="s3://gpuplan-test-far2/runs"))
    assert "# Warning: the checkpoint bucket is in eu-north-1, the cluster in us-east-1" in text
    _, near = generate(ready, plans["8b-auto"], options())
    assert "# Warning:" not in near


def test_calls_the_credentials_may_not_make_are_items_not_crashes(aws: Any, plans: dict[str, Plan],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As a user who may only describe EC2 and read SSM (moto enforcing IAM): what it may not ask is
    'could not check' with AWS's reason, the bucket it may not reach an item to fix."""
    import os

    from tests.moto_server import as_policy_user

    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["ec2:Describe*", "ssm:GetParameter"], "Resource": "*"}]}
    with as_policy_user(os.environ["AWS_ENDPOINT_URL"], policy, monkeypatch):
        items = _by_name(check_account(plans["8b-auto"], options(), boto3.session.Session(region_name="us-east-1")))
    assert items["instance types"].status == OK and items["GPU AMI"].status == OK and items["subnets"].status == OK
    for name in ("spot service-linked role", "instance profile", "vCPU quota P spot"):
        assert items[name].status == UNKNOWN and "denied" in items[name].detail, items[name]
    assert items["checkpoint bucket"].status == FIX and "denied" in items["checkpoint bucket"].detail


def test_a_cluster_yaml_is_checked_as_written(ready: Any, plans: dict[str, Plan], quotas: dict[str, float]) -> None:
    from tests.workers.cluster_setup import generate
    from workers.cluster.check_yaml import check_cluster_config, checkpoint_root_of

    config, _ = generate(ready, plans["8b-auto"], options())
    assert checkpoint_root_of(config) == f"s3://{BUCKET}/runs"
    quotas.update({P_SPOT: 96.0, P_ON_DEMAND: 1000.0, STANDARD_ON_DEMAND: 100.0})
    items = _by_name(check_cluster_config(config, ready))
    for name in ("credentials and region", "instance types", "AMIs", "spot service-linked role", "subnets",
                 "instance profile", "checkpoint bucket", "vCPU quota P on-demand"):
        assert items[name].status == OK, items[name]
    assert items["vCPU quota P spot"].status == FIX and "needs 192" in items["vCPU quota P spot"].detail

    worker = next(t["node_config"] for n, t in config["available_node_types"].items() if n != "head")
    worker["ImageId"] = "ami-0gone"
    subnet = (worker.get("SubnetIds") or [worker["NetworkInterfaces"][0]["SubnetId"]])[0]
    worker["NetworkInterfaces"] = [{"SubnetId": subnet, "DeviceIndex": 0, "NetworkCardIndex": i,
                                    "InterfaceType": "efa"} for i in range(2)]
    worker.pop("SubnetIds", None)
    items = _by_name(check_cluster_config(config, ready))
    assert items["AMIs"].status == FIX and "ami-0gone" in items["AMIs"].detail
    assert items["EFA subnets"].status == FIX and subnet in items["EFA subnets"].detail
    worker["NetworkInterfaces"][0]["SubnetId"] = "subnet-0gone"
    assert _by_name(check_cluster_config(config, ready))["subnets"].status == FIX
