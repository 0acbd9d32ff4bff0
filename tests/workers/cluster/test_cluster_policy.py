"""`gpuplan cluster check` judges the nodes' role by all its policies (workers.cluster.policy), on moto's IAM:
inline ones, attached customer managed ones at their default version, and AWS managed ones (AmazonS3FullAccess
grants the checkpoint bucket's statements through its wildcards); what none of them grants is the item to fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.workers.cluster_setup import PROFILE, options
from workers.cluster.check import FIX, OK, Item, profile_items
from workers.cluster.notes import node_statements, s3_statements
from workers.cluster.policy import covers

S3_FULL_ACCESS = "arn:aws:iam::aws:policy/AmazonS3FullAccess"
ROOT = options().checkpoint_root


def policy(statements: list[dict[str, Any]]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def profile_item(session: Any) -> Item:
    [item] = profile_items(session, options())
    return item


@pytest.fixture(scope="module")
def aws_managed_policies() -> Iterator[None]:
    """moto's IAM with AWS's managed policies, as every account has them (moto loads them when asked, as its
    backends start: so before this module's account is made)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
        yield


@pytest.fixture
def account(aws_managed_policies: None, aws: Any) -> Iterator[tuple[Any, Any]]:
    """(session, IAM client) of the account; the nodes' role is left with no policy at the end, as it began."""
    client = aws.client("iam")
    yield aws, client
    for name in client.list_role_policies(RoleName=PROFILE)["PolicyNames"]:
        client.delete_role_policy(RoleName=PROFILE, PolicyName=name)
    for attached in client.list_attached_role_policies(RoleName=PROFILE)["AttachedPolicies"]:
        client.detach_role_policy(RoleName=PROFILE, PolicyArn=attached["PolicyArn"])


def test_an_attached_customer_policy_counts_at_its_default_version(account: tuple[Any, Any]) -> None:
    aws, iam = account
    everything = node_statements(options()) + s3_statements(ROOT)
    nodes = policy(node_statements(options()))
    arn = iam.create_policy(PolicyName="gpuplan-nodes", PolicyDocument=nodes)["Policy"]["Arn"]
    iam.attach_role_policy(RoleName=PROFILE, PolicyArn=arn)
    item = profile_item(aws)
    assert item.status == FIX and "(inline and attached)" in item.detail, item
    assert "s3:ListBucket on arn:aws:s3:::gpuplan-test-ckpt" in item.detail and "iam:PassRole" not in item.detail
    v2 = iam.create_policy_version(PolicyArn=arn, PolicyDocument=policy(everything), SetAsDefault=True)
    assert profile_item(aws).status == OK
    iam.set_default_policy_version(PolicyArn=arn, VersionId="v1")  # v2 kept, but not the one in force
    assert profile_item(aws).status == FIX
    iam.detach_role_policy(RoleName=PROFILE, PolicyArn=arn)
    iam.delete_policy_version(PolicyArn=arn, VersionId=v2["PolicyVersion"]["VersionId"])
    iam.delete_policy(PolicyArn=arn)


def test_aws_s3_full_access_grants_the_bucket_by_its_wildcards(account: tuple[Any, Any]) -> None:
    aws, iam = account
    iam.put_role_policy(RoleName=PROFILE, PolicyName="nodes", PolicyDocument=policy(node_statements(options())))
    item = profile_item(aws)
    assert item.status == FIX and "s3:PutObject" in item.detail, item
    iam.attach_role_policy(RoleName=PROFILE, PolicyArn=S3_FULL_ACCESS)
    assert profile_item(aws).status == OK


def test_a_wildcard_grants_only_what_it_matches() -> None:
    [listing, objects] = s3_statements(ROOT)
    bucket_wide = ({"s3:*"}, {"arn:aws:s3:::gpuplan-test-ckpt", "arn:aws:s3:::gpuplan-test-ckpt/*"})
    assert covers(bucket_wide, listing) and covers(bucket_wide, objects)
    assert covers(({"S3:putobject", "s3:Get*", "s3:Delete*", "s3:*Multipart*"}, {"*"}),
                  {"Action": ["s3:PutObject", "s3:GetObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                   "Resource": "arn:aws:s3:::b/runs/*"})
    other_prefix = ({"s3:*"}, {"arn:aws:s3:::gpuplan-test-ckpt/other/*"})
    assert not covers(other_prefix, objects)
    assert not covers(({"s3:Get*"}, {"*"}), objects)  # PutObject is no Get
    assert not covers(({"s3:*"}, {"arn:aws:s3:::gpuplan-test-ckpt/*"}), listing)  # the bucket is not an object
