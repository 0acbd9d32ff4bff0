"""What the cluster-config tests share: moto's server as the AWS account (an instance profile, a bucket,
a DLAMI parameter per region), the example plans, the options, and generation cached per module."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from catalog.loader import load_catalog
from commands.specfile import load_spec
from planner.calibration import load_calibration
from planner.search import plan
from planner.spec import spec_from_dict
from planner.types import Plan
from tests.moto_server import use_moto
from workers.cluster.aws import generate as generate_config
from workers.cluster.config import ClusterOptions

CAL = load_calibration()  # the shipped constants: the edge reads them, the planner takes them

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROFILE = "gpuplan-test-node"
BUCKET = "gpuplan-test-ckpt"
AMI_PARAMETER = "/gpuplan-test/dlami/x86_64"  # moto refuses /aws/... names; the default names are tested apart
HEAD = {"CPU": 8.0, "node:__internal_head__": 1.0}
ADMIN_SECRET = "gpuplan/admin-token"  # a Secrets Manager secret of the test account
DB_SECRET = "ssm:/gpuplan/database-url"  # an SSM SecureString of the test account
SECRET_VALUES = {"admin": "adm1n-t0ken-value", "db": "postgresql+psycopg://gpuplan:p@ss'w$rd@db:5432/gpuplan"}


def aws_account(url: str, mp: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A fresh account: moto keeps its state per process, across servers, so an earlier module's is reset."""
    import urllib.request

    from ray.autoscaler._private.aws import config as ray_aws_config
    from ray.autoscaler._private.aws import utils as ray_aws_utils

    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=30).close()
    for cache in (ray_aws_utils.resource_cache, ray_aws_utils.client_cache, ray_aws_config._get_subnets_or_die):
        cache.cache_clear()  # Ray keeps its boto3 clients, bound to an earlier module's server
    use_moto(mp, url)
    iam = boto3.client("iam", region_name="us-east-1")
    iam.create_role(RoleName=PROFILE, AssumeRolePolicyDocument=json.dumps({"Statement": []}))
    iam.create_instance_profile(InstanceProfileName=PROFILE)
    iam.add_role_to_instance_profile(InstanceProfileName=PROFILE, RoleName=PROFILE)
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
    for region in ("us-east-1", "eu-north-1"):
        boto3.client("secretsmanager", region_name=region).create_secret(
            Name=ADMIN_SECRET, SecretString=SECRET_VALUES["admin"])
        boto3.client("ssm", region_name=region).put_parameter(
            Name=DB_SECRET.removeprefix("ssm:"), Value=SECRET_VALUES["db"], Type="SecureString")
    for region in ("us-east-1", "eu-north-1"):
        ec2 = boto3.client("ec2", region_name=region)
        image = ec2.register_image(Name="gpuplan-test-dlami", RootDeviceName="/dev/sda1", Architecture="x86_64")
        boto3.client("ssm", region_name=region).put_parameter(
            Name=AMI_PARAMETER, Value=image["ImageId"], Type="String")
    mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))  # Ray's bootstrap writes its SSH key there
    yield boto3.session.Session(region_name="us-east-1")


def example_plan(name: str, **resources: Any) -> Plan:
    spec = load_spec(str(EXAMPLES / name))
    if resources:
        doc = spec.model_dump(mode="json", exclude_none=True)
        doc["resources"] = {**doc.get("resources", {}), **resources}
        spec = spec_from_dict(doc)
    return plan(spec, load_catalog(), calibration=CAL)


def options(**over: Any) -> ClusterOptions:
    base: dict[str, Any] = {"wheel": "dist/gpuplan-0.1.0-py3-none-any.whl", "instance_profile": PROFILE,
                            "checkpoint_root": f"s3://{BUCKET}/runs", "ami_parameters": {"x86_64": AMI_PARAMETER}}
    return ClusterOptions(**{**base, **over})


class FakePlacementGroups:
    """Stands in for EC2's placement groups: moto has no CreatePlacementGroup / DescribePlacementGroups.
    (``Ec2PlacementGroups`` itself is checked against EC2's request model in test_cluster_efa.)"""

    def __init__(self) -> None:
        self.groups: set[str] = set()

    def ensure_cluster(self, name: str) -> str:
        how = "found" if name in self.groups else "created"
        self.groups.add(name)
        return how


PLACEMENT_GROUPS = FakePlacementGroups()
_GENERATED: dict[tuple[int, int, str], tuple[Any, Plan, dict[str, Any], str]] = {}


def generate(session: Any, p: Plan, opts: ClusterOptions) -> tuple[dict[str, Any], str]:
    """``workers.cluster.aws.generate`` once per (account, plan, options): the lookups cost ~1 s each.
    (The entry holds the session and plan, so their ids are not reused by another module's.)"""
    key = (id(session), id(p), repr(opts))
    if key not in _GENERATED:
        _GENERATED[key] = (session, p, *generate_config(p, opts, session, PLACEMENT_GROUPS))
    _, _, config, text = _GENERATED[key]
    return copy.deepcopy(config), text


def subnets_of(node_config: dict[str, Any]) -> list[str]:
    """The subnets a node type launches in: ``SubnetIds``, or its EFA interfaces' (Ray's two forms)."""
    if "NetworkInterfaces" in node_config:
        return sorted({ni["SubnetId"] for ni in node_config["NetworkInterfaces"]})
    return list(node_config["SubnetIds"])
